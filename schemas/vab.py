"""Contracts of the Visual Aesthetic Benchmark (issue 10): task sets, trials, judge answers and
the lake tables of VAB runs. No I/O here (ARCHITECTURE.md section 2).

A *set collection* (``--sets S``) is a named, pinned list of tasks. Each task is 2 to 6 images of
matched subject with expert labels: the best image, and for 3+ images the worst. Positions are
1-based in the task's *stored* order. A judge sees each task in 3 trials: trial 0 in the stored
order, trials 1 and 2 in permutations seeded by the task id under the collection's trial scheme
(tasks.vab.trials); its answers are mapped back to stored positions before scoring. A trial asks
our combined question or one of the official toolkit's three prompt types (``prompt_type``).
"""

from __future__ import annotations

import re
from typing import Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DOMAINS = ("fine_art", "photography", "illustration")
# The official release's domain names -> ours (one way; docs/VAB.md). Inverted only to write the
# official summary, whose keys are the release's names.
RELEASE_DOMAINS = {"fine-art": "fine_art", "illustration": "illustration", "photograph": "photography"}
OFFICIAL_DOMAIN_OF = {ours: rel for rel, ours in RELEASE_DOMAINS.items()}
MIN_IMAGES, MAX_IMAGES = 2, 6
TRIALS = 3
SET_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
TASK_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
# One rule for every judge name (runs, imports, experts): a safe charset, no "/" and no "..", so a
# name can never be a path and sorts/prints cleanly.
JUDGE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")


def check_judge_name(judge: object) -> str:
    """``judge`` if it is a valid judge name, else ValueError naming it and the rule."""
    if not isinstance(judge, str) or not JUDGE_NAME_RE.fullmatch(judge) or ".." in judge:
        raise ValueError(f"judge name {judge!r} is not allowed: letters, digits and . _ : @ + - only "
                         f"(no '/', no '..'), starting with a letter or digit, at most 128 characters")
    return judge


# How the three trials of a task are ordered (recorded in each collection's pin; docs/VAB.md).
# "vab-official-v1": as the authors' eval.py (trial 0 identity; trials 1-2 random.Random(task_id)
# shuffles, drawn again until distinct unless n = 2). "imagebench-sha256-v1": our first scheme,
# kept for collections pinned before the official one existed (a pin without the field).
TRIAL_SCHEME_OFFICIAL = "vab-official-v1"
TRIAL_SCHEME_LEGACY = "imagebench-sha256-v1"
TRIAL_SCHEMES = (TRIAL_SCHEME_OFFICIAL, TRIAL_SCHEME_LEGACY)

# What a trial asked. Ours: one combined question (best and, for 3+ images, worst). Official:
# eval.py's three prompt types, each in 3 trials (pick_best_and_worst for 3+ images only; for 2
# images it is derived from pick_best).
PROMPT_COMBINED = "best_worst"
PICK_BEST, PICK_WORST, PICK_BEST_AND_WORST = "pick_best", "pick_worst", "pick_best_and_worst"
OFFICIAL_PROMPT_TYPES = (PICK_BEST, PICK_WORST, PICK_BEST_AND_WORST)
PROMPT_TYPES = (PROMPT_COMBINED, *OFFICIAL_PROMPT_TYPES)

# Per-domain criteria (the paper's rubrics), shown to experts and written into our combined prompt.
RUBRIC_AVOID = "Do not consider: your personal taste for the subject, the artist's background, the tools used."
RUBRICS: dict[str, tuple[str, ...]] = {
    "fine_art": ("Composition", "Colour and tone", "Technique", "Completion", "Expression"),
    "photography": ("Composition", "Colour and tone", "Light", "Focus", "Expression"),
    "illustration": ("Focus and clarity", "Form and proportion", "Colour design", "Detail control and finish",
                     "Stylistic fit"),
}

# The published figures, drawn beside ours (strict best-and-worst accuracy over 400 tasks).
PUBLISHED_BEST_MODEL_STRICT = 26.5
PUBLISHED_EXPERT_STRICT = 68.9


class VabTask(BaseModel):
    """One task of a set collection, as validated on import."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    task_id: str
    domain: str
    substyle: str | None = None
    images: list[str] = Field(min_length=MIN_IMAGES, max_length=MAX_IMAGES)  # URIs or paths, stored order
    image_sha256: list[str] = Field(default_factory=list)  # filled by the import (same order)
    best: int  # 1-based position in `images`
    worst: int | None = None  # 1-based; None exactly for 2-image tasks
    expert_labels: list[dict] | None = None  # optional per-expert {"expert": id, "best": n, "worst": n}
    labels: list[str] | None = None  # the release's letters of the images (stored order); None for our manifest

    @field_validator("task_id")
    @classmethod
    def _task_id(cls, v: str) -> str:
        if not TASK_ID_RE.fullmatch(v):
            raise ValueError(f"task_id {v!r} must match {TASK_ID_RE.pattern}")
        return v

    @model_validator(mode="after")
    def _labels(self) -> "VabTask":
        n = len(self.images)
        where = f"task {self.task_id!r}"
        if not 1 <= self.best <= n:
            raise ValueError(f"{where}: best={self.best} is out of range 1..{n}")
        if n == 2 and self.worst is not None:
            raise ValueError(f"{where}: a 2-image task has no worst label (got worst={self.worst})")
        if n >= 3:
            if self.worst is None:
                raise ValueError(f"{where}: a task of {n} images needs a worst label")
            if not 1 <= self.worst <= n:
                raise ValueError(f"{where}: worst={self.worst} is out of range 1..{n}")
            if self.worst == self.best:
                raise ValueError(f"{where}: best and worst are the same image ({self.best})")
        if len(set(self.images)) != n:
            raise ValueError(f"{where}: the same image appears twice")
        if self.image_sha256 and len(set(self.image_sha256)) != n:
            raise ValueError(f"{where}: two images have the same content (sha256)")
        if self.labels is not None and (len(self.labels) != n or len(set(self.labels)) != n):
            raise ValueError(f"{where}: labels {self.labels} must name each of the {n} images once")
        return self


# ---- lake tables (partitioned by set collection: <lake>/<table>/sets=<S>/data.parquet) ----------
TS = pa.timestamp("us", tz="UTC")

VAB_TASKS = pa.schema(
    [
        pa.field("sets", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("domain", pa.string(), nullable=False),
        pa.field("substyle", pa.string()),
        pa.field("n_images", pa.int32(), nullable=False),
        pa.field("image_uris", pa.list_(pa.string()), nullable=False),
        pa.field("image_sha256", pa.list_(pa.string()), nullable=False),
        pa.field("best", pa.int32(), nullable=False),
        pa.field("worst", pa.int32()),
    ]
)

# One row per (judge, task, trial): what the judge named, mapped back to stored positions.
VAB_TRIALS = pa.schema(
    [
        pa.field("sets", pa.string(), nullable=False),
        pa.field("judge", pa.string(), nullable=False),  # judge name (model, scorer or person id)
        pa.field("judge_kind", pa.string(), nullable=False),  # "vlm" | "scalar" | "human" | "import"
        pa.field("judge_identity", pa.string()),  # JSON: model, endpoint, template hash, sampling / scorer id
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("trial", pa.int8(), nullable=False),  # 0, 1, 2
        # PROMPT_TYPES; null in rows written before the column existed = PROMPT_COMBINED
        pa.field("prompt_type", pa.string()),
        pa.field("order", pa.list_(pa.int8()), nullable=False),  # stored positions as shown (1-based)
        pa.field("best_shown", pa.int8()),  # position in the shown order the judge named; null = no valid answer
        pa.field("worst_shown", pa.int8()),
        pa.field("best", pa.int8()),  # mapped back to the stored order
        pa.field("worst", pa.int8()),
        pa.field("state", pa.string(), nullable=False),  # "ok" | "unparsable" | "error" | "tie"
        pa.field("detail", pa.string()),
        pa.field("decided_at", TS, nullable=False),
        # a VLM's full answer (the last one read), as eval.py keeps model_response; null for scorers,
        # people, our imports of CSV answers and rows written before the column existed
        pa.field("response", pa.string()),
    ]
)

VAB_TRIAL_STATES = ("ok", "unparsable", "error", "tie")

# The lake tables of VAB, partitioned by set collection: <lake>/<table>/sets=<S>/data.parquet.
VAB_TABLES = {"vab_tasks": VAB_TASKS, "vab_trials": VAB_TRIALS}
JudgeKind = Literal["vlm", "scalar", "human", "import"]
