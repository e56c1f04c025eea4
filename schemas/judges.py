"""Judges: the routing (part of the benchmark definition, pinned like the suite) and the
endpoints (deployment settings: where each judge runs)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.suite import CATEGORIES

VERDICTS = ("PASS", "FAIL", "ERROR", "UNPARSABLE")
JUDGE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


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
    concurrency: int = Field(default=8, ge=1, le=512)
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=4, ge=0, le=20)  # on 429/5xx/timeouts, with backoff
    max_image_side: int = Field(default=2048, ge=64)  # larger images are refused with a clear error
    max_tokens: int = Field(default=512, ge=16)

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
