"""The frozen EPS reference file and the scorer identity it is bound to."""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Format 2: the scorer identity names the model only; the runtime that built the reference and the
# golden-set mu that the canary compares against are stored beside it (docs/REFERENCE.md).
REFERENCE_FORMAT = "imagebench-eps-reference/2"


class ScorerIdentity(BaseModel):
    """The model that decides what mu an image gets: checkpoint, base config, tokenizer,
    preprocessing, instruction. A reference is only valid for the identity that built it. How
    the model is run (library versions, device, dtype: :class:`ScorerRuntime`) may change; the
    golden-set canary checks that the run's runtime still gives the reference's mu."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scorer_name: str  # "hpsv3" for the built-in scorer, or the name given to import-scores
    source: Literal["hpsv3", "import"]
    checkpoint_sha256: str | None = None
    base_model: str | None = None  # HF id or directory name of the config/processor source
    base_config_sha256: str | None = None  # sha256 of the canonical config.json content
    preprocessing: str | None = None  # e.g. "smart_resize(min=max=200704)+qwen2vl-image-processor"
    instruction_sha256: str | None = None
    tokenizer_sha256: str | None = None  # tokenizer files + chat template of the base model
    uncalibrated: bool = False  # demo (random) weights

    @property
    def scorer_id(self) -> str:
        """Short stable hash of the identity: the key that says 'same scorer'."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class ScorerRuntime(BaseModel):
    """How mu was computed beyond the model itself: the software, device and arithmetic of one
    run. It may change between runs (an upgrade, another GPU); the golden-set canary
    (tasks/scores/golden.py) checks that it still gives the reference's mu within tolerance. Within one
    runtime, the same images in the same forward batches give the same bits (docs/RELIABILITY.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    torch_version: str
    transformers_version: str
    device: str  # "cpu", or "cuda:<device name>"
    dtype: str  # compute dtype of the backbone ("float32", "bfloat16")
    rope_mode: str  # "official" (bf16-rounded rotary frequencies, as trained) or "float32"
    attention: str  # the attention kernel the backbone called ("sdpa", "flash_attention_2", ...)
    batch_size: int = Field(ge=1)  # images per forward pass (padding and GEMM shapes follow it)
    intra_op_threads: int = Field(ge=1)  # torch intra-op threads (CPU reductions may split by it)

    @property
    def runtime_id(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


class SuiteRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    version: str
    sha256: str


class ReferencePrompt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    prompt_id: str
    mu_ref: float
    n_models: int = Field(ge=1)


class GoldenItem(BaseModel):
    """One line of ``reference/golden-<set>.jsonl``: an image shipped in ``reference/`` (path
    relative to it, pinned by sha256) and the prompt it is scored with."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    item_id: str
    file: str
    sha256: str
    prompt_id: str
    prompt: str


class GoldenMu(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    item_id: str
    image_sha256: str
    mu: float


class GoldenRecord(BaseModel):
    """The golden set's mu as the reference's scorer gave them when the reference was built."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    set: str  # e.g. "golden-v1": reference/golden-v1.jsonl
    manifest_sha256: str
    runtime: ScorerRuntime
    items: list[GoldenMu] = Field(min_length=1)


class ReferenceFile(BaseModel):
    """``reference/eps-reference-<version>.json``: written once, never rewritten."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["imagebench-eps-reference/2"] = REFERENCE_FORMAT
    version: str
    suite: SuiteRef
    scorer: ScorerIdentity
    scorer_id: str
    statistic: Literal["median"] = "median"
    baseline_models: list[str] = Field(min_length=1)
    created_at: str
    prompts: list[ReferencePrompt] = Field(min_length=1)
    # The golden-set canary's expected mu; None only for imported scores (nothing to run here).
    golden: GoldenRecord | None = None
