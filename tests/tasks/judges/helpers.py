"""Helpers for the judge tests: tiny images, routings built in code, endpoints of fake servers,
per-prompt scripted replies, a fast retry policy."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import numpy as np
from PIL import Image

from schemas.judges import Endpoint, JudgesConfig
from schemas.suite import CATEGORIES
from tasks.judges.config import parse_routing
from tasks.judges.router import RetryPolicy
from tests.fake_openai import FakeOpenAI, RecordedRequest, Reply

FAST = RetryPolicy(backoff_base_s=0.01, backoff_max_s=0.05, seed=0)
QUESTION = "Does the image show exactly what the prompt asks for?"


def write_image(path: Path, size: tuple[int, int] = (64, 48), seed: int = 0) -> tuple[Path, str]:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path, format="PNG")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def make_routing(preferred: str = "alpha", fallback: str | None = "beta", unparsable_retries: int = 1, **overrides):
    routes = {c: {"preferred": preferred, "fallback": fallback} for c in CATEGORIES}
    for category, route in overrides.items():
        routes[category.replace("_", " ")] = route
    return parse_routing(
        {"version": "test", "unparsable_retries": unparsable_retries, "routes": routes}, "<test routing>"
    )


def endpoint(server: FakeOpenAI, **kw) -> Endpoint:
    return Endpoint(
        **{
            "backend": "openai",
            "base_url": server.base_url,
            "model": server.model,
            "timeout_s": 5.0,
            "max_retries": 3,
            **kw,
        }
    )


def config(**endpoints: Endpoint) -> JudgesConfig:
    return JudgesConfig(judges=endpoints)


class Script:
    """Per-prompt scripted replies: ``{prompt_substring: [Reply, Reply, ...]}``; the n-th request
    whose generation prompt contains the key gets the n-th reply (the last one repeats)."""

    def __init__(self, scripts: dict[str, list[Reply]] | None = None, default: Reply | None = None) -> None:
        self.scripts = scripts or {}
        self.default = default or Reply()
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, req: RecordedRequest) -> Reply:
        prompt = req.generation_prompt
        for key, replies in self.scripts.items():
            if key in prompt:
                with self.lock:
                    n = self.seen.get(key, 0)
                    self.seen[key] = n + 1
                return replies[min(n, len(replies) - 1)]
        return self.default
