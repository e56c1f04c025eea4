"""Fixtures for the judge tests: items with tiny images, and fake OpenAI-compatible servers
(tests/fake_openai.py) over loopback, stopped after each test."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

import pytest

from tasks.judges.router import JudgeItem
from tests.fake_openai import FakeOpenAI
from tests.tasks.judges.helpers import QUESTION, write_image


@pytest.fixture
def make_item(tmp_path: Path) -> Callable[..., JudgeItem]:
    counter = iter(range(10_000))

    def make(
        prompt: str = "a red fox sitting in the snow",
        category: str = "Spatial Reasoning",
        model_id: str = "model-a",
        prompt_id: str | None = None,
        size: tuple[int, int] = (64, 48),
        image: Path | None = None,
    ) -> JudgeItem:
        n = next(counter)
        if image is None:
            path, sha = write_image(tmp_path / f"img-{n}.png", size, seed=n)
        else:
            path, sha = image, hashlib.sha256(image.read_bytes()).hexdigest()
        return JudgeItem(
            model_id=model_id,
            prompt_id=prompt_id or f"p-{n:03d}",
            suite_version="test-v1",
            category=category,
            image_path=path,
            image_sha256=sha,
            prompt=prompt,
            question=QUESTION,
        )

    return make


@pytest.fixture(autouse=True)
def fresh_limiters():
    """Each test starts with no endpoint limiter, as a new process would (a pause one test's
    server asked for must not reach a later server that got the same port)."""
    from tasks.judges.limits import reset_limiters

    reset_limiters()
    yield
    reset_limiters()


@pytest.fixture
def servers():
    """Start fake servers on demand; all stopped at the end of the test."""
    started: list[FakeOpenAI] = []

    def start(model: str = "fake-vlm", responder=None, api_key: str | None = None) -> FakeOpenAI:
        srv = FakeOpenAI(model=model, responder=responder, api_key=api_key).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
