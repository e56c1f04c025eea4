"""The frozen EPS reference file and the scorer identity it is bound to."""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

REFERENCE_FORMAT = "imagebench-eps-reference/1"


class ScorerIdentity(BaseModel):
    """Everything that decides what mu a scorer gives an image. Two scorers with equal identity
    give equal scores; a reference is only valid for the scorer identity that built it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scorer_name: str  # "hpsv3" for the built-in scorer, or the name given to import-scores
    source: Literal["hpsv3", "import"]
    checkpoint_sha256: str | None = None
    base_model: str | None = None  # HF id or directory name of the config/processor source
    base_config_sha256: str | None = None  # sha256 of the canonical config.json content
    transformers_version: str | None = None
    preprocessing: str | None = None  # e.g. "smart_resize(min=max=200704)+qwen2vl-image-processor"
    instruction_sha256: str | None = None
    tokenizer_sha256: str | None = None  # tokenizer files + chat template of the base model
    numerics: str | None = None  # e.g. "bfloat16+rope-official": dtype changes mu in the 2nd decimal
    uncalibrated: bool = False  # demo (random) weights

    @property
    def scorer_id(self) -> str:
        """Short stable hash of the identity: the key that says 'same scorer'."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class SuiteRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    version: str
    sha256: str


class ReferencePrompt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    prompt_id: str
    mu_ref: float
    n_models: int = Field(ge=1)


class ReferenceFile(BaseModel):
    """``reference/eps-reference-<version>.json``: written once, never rewritten."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["imagebench-eps-reference/1"] = REFERENCE_FORMAT
    version: str
    suite: SuiteRef
    scorer: ScorerIdentity
    scorer_id: str
    statistic: Literal["median"] = "median"
    baseline_models: list[str] = Field(min_length=1)
    created_at: str
    prompts: list[ReferencePrompt] = Field(min_length=1)
