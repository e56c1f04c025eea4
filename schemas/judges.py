"""Judges: the routing (part of the benchmark definition, pinned like the suite) and the
endpoints (deployment settings: where each judge runs)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.suite import CATEGORIES

VERDICTS = ("PASS", "FAIL", "ERROR", "UNPARSABLE")
JUDGE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")

# Which environment variables a judge may send as its Bearer key (issue 24 item 9): names that
# hold an API key by the convention of the OpenAI-compatible services (OPENAI_API_KEY,
# OPENROUTER_API_KEY, GEMINI_API_KEY, AZURE_OPENAI_API_KEY, ...), never imagebench's own settings
# (IMAGEBENCH_*: the panel database URL and its password), Prefect's (PREFECT_API_KEY) nor AWS's
# (the object store's credentials). Google and Azure credentials (GOOGLE_APPLICATION_CREDENTIALS,
# AZURE_CLIENT_SECRET, AZURE_STORAGE_KEY) and passwords do not end in _API_KEY. Every allowed name
# is also one tasks.store.redact masks by name. docs/JUDGES.md, "Keys".
API_KEY_ENV_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,119}_API_KEY$")
API_KEY_ENV_REFUSED_PREFIXES = ("IMAGEBENCH_", "PREFECT_", "AWS_")


def api_key_env_problem(name: str) -> str | None:
    """Why ``name`` may not be a judge's ``api_key_env`` (None: it may)."""
    if not API_KEY_ENV_RE.fullmatch(name):
        return f"api_key_env {name!r} is not an API key variable: use a name like OPENAI_API_KEY ({API_KEY_ENV_RE.pattern})"
    if name.startswith(API_KEY_ENV_REFUSED_PREFIXES):
        return (f"api_key_env {name!r} names a setting of imagebench, Prefect or AWS "
                f"({', '.join(p + '*' for p in API_KEY_ENV_REFUSED_PREFIXES)}), never sent to a judge")
    return None


class Route(BaseModel):
    """How one category is judged."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preferred: str  # judge name (a key of the endpoints config, or the built-in "ocr")
    fallback: str | None = None  # used when the preferred judge is unavailable or stays unparsable
    template: str = "verdict-v1"  # judge prompt template version (tasks/judges/templates/<template>.txt)
    ocr_evidence: bool = False  # the OCR judge must also PASS (exact text prompts)


class Routing(BaseModel):
    """``reference/judges-routing-<version>.yaml``: frozen, pinned in SHA256SUMS."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str
    routes: dict[str, Route]
    unparsable_retries: int = Field(default=1, ge=0, le=5)  # re-asks before the fallback

    @field_validator("routes")
    @classmethod
    def _categories(cls, routes: dict[str, Route]) -> dict[str, Route]:
        unknown = sorted(set(routes) - set(CATEGORIES))
        if unknown:
            raise ValueError(f"unknown categories {unknown}; known: {list(CATEGORIES)}")
        missing = sorted(set(CATEGORIES) - set(routes))
        if missing:
            raise ValueError(f"no route for categories {missing}")
        return routes


class Endpoint(BaseModel):
    """One judge's deployment: an OpenAI-compatible server, a local transformers VLM, or OCR."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["openai", "transformers", "ocr"]
    model: str  # model name sent to / expected from the server, HF id or dir, or "tesseract"
    base_url: str | None = None  # openai: e.g. http://127.0.0.1:8000/v1
    api_key_env: str | None = None  # name of the env var holding the key (never the key itself)
    concurrency: int = Field(default=8, ge=1, le=512)  # requests in flight, across the whole run
    # The endpoint's rate limits (a paid API's), across the whole run: at most this many requests
    # per minute (spaced 60/N s apart) and tokens per minute (usage: prompt + completion).
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=4, ge=0, le=20)  # on 429/5xx/timeouts, with backoff
    max_image_side: int = Field(default=2048, ge=64)  # larger images are refused with a clear error
    max_tokens: int = Field(default=512, ge=16)

    @field_validator("api_key_env")
    @classmethod
    def _key_variable(cls, name: str | None) -> str | None:
        problem = None if name is None else api_key_env_problem(name)
        if problem:
            raise ValueError(problem)
        return name

    @model_validator(mode="after")
    def _openai_needs_url(self) -> "Endpoint":
        if self.backend == "openai" and not self.base_url:
            raise ValueError("backend 'openai' needs base_url")
        return self


class JudgesConfig(BaseModel):
    """``IMAGEBENCH_JUDGES_CONFIG`` (YAML): judge name -> endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    judges: dict[str, Endpoint] = Field(default_factory=dict)

    @field_validator("judges")
    @classmethod
    def _names(cls, judges: dict[str, Endpoint]) -> dict[str, Endpoint]:
        bad = [n for n in judges if not JUDGE_NAME_RE.fullmatch(n)]
        if bad:
            raise ValueError(f"invalid judge names {bad}: use {JUDGE_NAME_RE.pattern}")
        return judges
