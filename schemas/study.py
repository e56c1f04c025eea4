"""Contracts of the Beauty Index (issue 9): the study file, its pre-registration, the prompt suite
``beauty-index-v1`` and the lake tables of a study. No I/O here (ARCHITECTURE.md section 2).

Where things live (docs/BEAUTY.md): a study's working state is under
``$IMAGEBENCH_HOME/studies/<study_id>/``: ``study.yaml`` (a copy of the definition as opened),
``preregistration.json`` (create-once, pinned in that folder's ``SHA256SUMS``), ``images/``
(blinded copies under opaque ids), ``panel-store.json`` (which panel database the study lives in:
``schemas.panel.PanelStoreRecord``) and ``panel.sqlite`` (the panel store: judges, queues, answers, memos'
metadata; or PostgreSQL). Memos go to the object store beside the study: ``studies/<study_id>/memos/``.
"""

from __future__ import annotations

import re
from typing import Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

BEAUTY_SUITE_VERSION = "beauty-index-v1"
BEAUTY_QUESTION = "Did this make you feel something?"
MEMO_MAX_SECONDS = 10
# The voice memo's two consents, as the judge's page words them. Keeping a memo with the answer
# needs the first; publishing the recording needs the second, given separately by the judge on
# that memo and recorded in the panel store with its time (issue 27 item 1). The datasheet quotes both.
MEMO_KEEP_CONSENT = "I agree that a voice memo I record is kept with my answer"
MEMO_PUBLISH_CONSENT = ("I also agree that this recording is published in the open data (CC BY 4.0), "
                        "without my answers: anyone may hear it")
STUDY_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Names and texts of a study are published (answers.csv, beauty_index.csv, study.json,
# datasheet.md): none may begin like a spreadsheet formula (issue 24 item 7, docs/BEAUTY.md).
GROUP_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
TOOL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # a model id (tasks.store.storage.MODEL_ID_RE)
FORMULA_START = ("=", "+", "-", "@")  # OWASP's list; a leading tab or CR is refused with them


def text_problem(text: str) -> str | None:
    """Why a free text of a study (title, question, a group's description or selection criteria)
    cannot be published (None: it can): it begins like a spreadsheet formula, after any blanks,
    or holds a control character other than a line break."""
    if text[:1] in ("\t", "\r") or text.lstrip()[:1] in FORMULA_START:
        return (f"{text[:40]!r} begins like a spreadsheet formula (=, +, -, @, a tab or CR): "
                "it would run in whoever opens the study's exports; start it with a letter, a digit or a quote")
    bad = next((c for c in text if c != "\n" and (ord(c) < 32 or 127 <= ord(c) < 160)), None)
    if bad is not None:
        return f"{text[:40]!r} holds the control character {bad!r}"
    return None


def _check_text(v: str) -> str:
    problem = text_problem(v)
    if problem:
        raise ValueError(problem)
    return v

# The published panel (20 judges in five declared groups).
PUBLISHED_GROUPS: dict[str, str] = {
    "photographers": "working photographers",
    "art-therapists": "art therapists",
    "aphantasia": "people with aphantasia",
    "tbi-survivors": "traumatic brain injury survivors",
    "non-ai-artists": "visual artists who don't use AI",
}
PUBLISHED_GROUP_SIZES = {"photographers": 6, "art-therapists": 4, "aphantasia": 4, "tbi-survivors": 3, "non-ai-artists": 3}

# The hypotheses written before the study (the published protocol), copied into every
# pre-registration with the analysis settings.
HYPOTHESES: dict[str, str] = {
    "H1": "The tools best on FID are not best on the Beauty Index.",
    "H2": "Judges with aphantasia say yes more often than the others.",
    "H3": "The variance between tools is smaller than the variance between prompts.",
    "H4": "At least one tool praised for 'aesthetics' underperforms on these emotional prompts.",
    "H5": "The host lab's own tool does not win on every prompt; if it places 5th or worse that is the headline.",
}


class BeautyPrompt(BaseModel):
    """One line of ``reference/suite-beauty-index-v1.jsonl``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    prompt_id: str
    prompt: str = Field(min_length=3)


class PanelGroup(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    description: str = ""
    # How judges were selected (published; identities never are).
    selection_criteria: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not GROUP_NAME_RE.fullmatch(v):
            raise ValueError(f"panel group name {v!r} must match {GROUP_NAME_RE.pattern} (it is published in every export)")
        return v

    _texts = field_validator("description", "selection_criteria")(_check_text)


class JudgeSpec(BaseModel):
    """A judge as the study file names them: an anonymous label and a declared group. The label
    is never exported (the bundle carries a salted hash)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    label: str
    group: str

    @field_validator("label")
    @classmethod
    def _label(cls, v: str) -> str:
        if not LABEL_RE.fullmatch(v):
            raise ValueError(f"judge label {v!r} must match {LABEL_RE.pattern}")
        return v


class AnalysisSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    bootstrap_resamples: int = Field(default=2000, ge=100)
    permutations: int = Field(default=10000, ge=100)
    alpha: float = Field(default=0.05, gt=0, lt=1)
    correction: Literal["holm"] = "holm"
    seed: int = 20261126


class QualitySettings(BaseModel):
    """Quality control of answers (docs/BEAUTY.md): an answer is flagged when the server never sent
    its image to the judge before it, or when it came faster than ``min_seconds_on_screen`` after
    the image was sent. Flagged answers are kept; the analysis runs with and without them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    min_seconds_on_screen: float = Field(default=1.0, ge=0)


ASPECT_RE = re.compile(r"^([1-9][0-9]?):([1-9][0-9]?)$")


class BlindingSettings(BaseModel):
    """How the images of a study with mixed aspect ratios are made one shape before any judge sees
    them (issue 27 item 7; required then, ``study open`` refuses without it): ``letterbox`` fits
    each whole picture inside a canvas of ``aspect`` on grey bands (the bands' shape can still tell
    a tool apart: the blinding report counts the tools it does), ``crop`` cuts each picture's centre
    to ``aspect`` and fills the canvas (nothing of a source's shape is left). ``aspect``: "W:H",
    e.g. "1:1", "4:3", "3:4"; between 1:4 and 4:1. Recorded in the pre-registration."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    shape: Literal["letterbox", "crop"]
    aspect: str

    @field_validator("aspect", mode="before")
    @classmethod
    def _aspect(cls, v) -> str:
        m = ASPECT_RE.fullmatch(v) if isinstance(v, str) else None
        if m is None or not 0.25 <= int(m.group(1)) / int(m.group(2)) <= 4:
            raise ValueError(f"{v!r} is not an aspect ratio W:H between 1:4 and 4:1 (e.g. \"1:1\", \"4:3\", \"3:4\"; quote it in YAML)")
        return v


class StudyDefinition(BaseModel):
    """``study.yaml``: what a lab declares before its study opens."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    study_id: str
    title: str = ""
    suite: str = BEAUTY_SUITE_VERSION
    question: str = BEAUTY_QUESTION
    memo: bool = True  # the optional 10-second voice memo (never used for scoring)
    tools: list[str] = Field(min_length=2)  # model ids in the object store (models/<id>/<prompt_id>.<ext>)
    host_tool: str | None = None  # H5
    praised_for_aesthetics: list[str] = Field(default_factory=list)  # H4
    groups: list[PanelGroup] = Field(default_factory=lambda: [PanelGroup(name=k, description=v) for k, v in PUBLISHED_GROUPS.items()])
    judges: list[JudgeSpec] = Field(min_length=1)
    # FID/KID need a reference image folder (the user's), CLIP/IS their weights: local paths.
    reference_images: str | None = None
    analysis: AnalysisSettings = Field(default_factory=AnalysisSettings)
    simulated: bool = False  # answers made up by `make demo`: labelled SIMULATED on every output
    licence: str = "CC-BY-4.0"
    quality: QualitySettings = Field(default_factory=QualitySettings)
    blinding: BlindingSettings | None = None  # the shape decision, needed when the images' aspects differ

    @field_validator("study_id")
    @classmethod
    def _study_id(cls, v: str) -> str:
        if not STUDY_ID_RE.fullmatch(v):
            raise ValueError(f"study_id {v!r} must match {STUDY_ID_RE.pattern}")
        return v

    _texts = field_validator("title", "question", "licence")(_check_text)

    @field_validator("tools", "praised_for_aesthetics")
    @classmethod
    def _tool_ids(cls, tools: list[str]) -> list[str]:
        bad = [t for t in tools if not TOOL_ID_RE.fullmatch(t) or ".." in t]
        if bad:
            raise ValueError(f"tool(s) {bad} must match {TOOL_ID_RE.pattern} (model ids)")
        return tools

    @model_validator(mode="after")
    def _consistent(self) -> "StudyDefinition":
        groups = {g.name for g in self.groups}
        if len(groups) != len(self.groups):
            raise ValueError("a panel group is declared twice")
        unknown = sorted({j.group for j in self.judges} - groups)
        if unknown:
            raise ValueError(f"judges in unknown panel group(s) {unknown}; declared groups: {sorted(groups)}")
        labels = [j.label for j in self.judges]
        if len(set(labels)) != len(labels):
            raise ValueError("a judge label appears twice")
        if len(set(self.tools)) != len(self.tools):
            raise ValueError("a tool appears twice")
        for name, tools in (("host_tool", [self.host_tool] if self.host_tool else []), ("praised_for_aesthetics", self.praised_for_aesthetics)):
            missing = [t for t in tools if t not in self.tools]
            if missing:
                raise ValueError(f"{name} names tool(s) {missing} not in tools {self.tools}")
        return self


class BlindingRecord(BaseModel):
    """What the pre-registration records of the blinding's shape (issue 27 item 7): the decision
    (``decided`` False: every picture already had one shape, the default letterbox on the square was
    used), the served canvas, how many picture shapes the tools' images had inside it and how many
    tools, and which, the shape alone tells apart (a shape only that tool's images have)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    shape: Literal["letterbox", "crop"]
    aspect: str
    canvas: str  # "1024x768"
    decided: bool
    tools: int
    picture_shapes: int  # distinct sizes of the picture inside the canvas (1 after crop)
    tools_told_apart_by_shape: int
    told_apart_by_shape: list[str]


class PreRegistration(BaseModel):
    """``preregistration.json``: written once at ``study open``, sha256-pinned; ``analyze``
    refuses a plan whose bytes changed after the first answer arrived."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # /1 published the order seed itself (studies opened before issue 16; still read and analysed);
    # /2 publishes only the sha256 commitment of a private order secret (tasks/beauty/prereg.py).
    format: Literal["imagebench-preregistration/1", "imagebench-preregistration/2"] = "imagebench-preregistration/2"
    study_id: str
    created_at: str  # UTC ISO timestamp
    definition_sha256: str  # of the canonical JSON of the StudyDefinition as opened
    suite: str
    suite_sha256: str
    hypotheses: dict[str, str]
    analysis: AnalysisSettings
    host_tool: str | None
    praised_for_aesthetics: list[str]
    # /1 only: the seed of the per-judge orders (with a guessed label it regenerates an order, so
    # an export withholds it). /2: sha256 of the private order secret in studies/<id>/order-secret.
    order_seed: int | None = None
    order_commitment: str | None = None
    # Set only in an exported copy of a /1 file: the sha256 of the original (seed withheld).
    redacted_from_sha256: str | None = None
    # How the images were made one shape, with the blinding report's figure (plans written since
    # issue 27 item 7; absent in older ones).
    blinding: BlindingRecord | None = None

    @model_validator(mode="after")
    def _one_order_source(self) -> "PreRegistration":
        if self.redacted_from_sha256 is None and (self.order_seed is None) == (self.order_commitment is None):
            raise ValueError("a pre-registration records exactly one of order_seed (format /1) or order_commitment (/2)")
        return self

    def to_json_bytes(self) -> bytes:
        """The file's bytes: fields that are None and optional are left out (a /1 file stays /1)."""
        d = self.model_dump(mode="json")
        for k in ("order_seed", "order_commitment", "redacted_from_sha256", "blinding"):
            if d.get(k) is None:
                d.pop(k, None)
        import json

        return (json.dumps(d, sort_keys=True, indent=1) + "\n").encode()


# ---- lake tables of a study (partitioned by study: <lake>/<table>/study_id=<id>/data.parquet) ----
TS = pa.timestamp("us", tz="UTC")

STUDY_ANSWERS = pa.schema(
    [
        pa.field("study_id", pa.string(), nullable=False),
        pa.field("judge_id", pa.string(), nullable=False),  # salted hash of the label (never the label)
        pa.field("panel_group", pa.string(), nullable=False),
        pa.field("tool", pa.string(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("image_id", pa.string()),  # the opaque id the judge saw; null for imported answers
        pa.field("position", pa.int32()),  # place in the judge's queue (0-based); null when imported
        pa.field("answer", pa.bool_(), nullable=False),  # True = yes
        pa.field("shown_at", TS, nullable=False),
        pa.field("answered_at", TS, nullable=False),
        pa.field("memo", pa.bool_(), nullable=False),  # a memo exists and consent was given
        pa.field("source", pa.string(), nullable=False),  # "panel" | "import" | "simulated"
        # Quality control (panel answers; null when unknown, e.g. imported): the server had sent the
        # image before the answer; seconds from then to the answer; why the answer is flagged (null: not).
        pa.field("image_loaded", pa.bool_()),
        pa.field("seconds_on_screen", pa.float64()),
        pa.field("qc_flag", pa.string()),
    ]
)

STUDY_RATES = pa.schema(  # one row per (tool, prompt): % of judges who said yes
    [
        pa.field("study_id", pa.string(), nullable=False),
        pa.field("tool", pa.string(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("answers", pa.int32(), nullable=False),
        pa.field("yes", pa.int32(), nullable=False),
        pa.field("yes_rate", pa.float64(), nullable=False),  # 0-100
    ]
)

STUDY_INDEX = pa.schema(  # one row per tool (panel_group "all") and per (tool, panel group)
    [
        pa.field("study_id", pa.string(), nullable=False),
        pa.field("tool", pa.string(), nullable=False),
        pa.field("panel_group", pa.string(), nullable=False),
        pa.field("beauty_index", pa.float64()),  # mean over prompts of the (tool, prompt) % yes
        pa.field("beauty_index_lo", pa.float64()),  # two-way cluster bootstrap (judges x prompts)
        pa.field("beauty_index_hi", pa.float64()),
        pa.field("rank", pa.int32()),
        pa.field("answers", pa.int32(), nullable=False),
        pa.field("simulated", pa.bool_(), nullable=False),
        # The same index without the answers flagged by quality control (study.yaml `quality`).
        pa.field("flagged_answers", pa.int32()),
        pa.field("beauty_index_unflagged", pa.float64()),
        pa.field("beauty_index_unflagged_lo", pa.float64()),
        pa.field("beauty_index_unflagged_hi", pa.float64()),
    ]
)

STUDY_HYPOTHESES = pa.schema(  # one row per pre-registered hypothesis (H1-H5), Holm across the five
    [
        pa.field("study_id", pa.string(), nullable=False),
        pa.field("hypothesis", pa.string(), nullable=False),  # "H1" .. "H5"
        pa.field("statement", pa.string(), nullable=False),  # as pre-registered
        pa.field("test", pa.string(), nullable=False),  # what was computed (e.g. "Kendall tau, FID vs BI ranks")
        pa.field("effect_name", pa.string()),  # what the effect is (e.g. "Kendall tau")
        pa.field("effect", pa.float64()),
        pa.field("effect_lo", pa.float64()),
        pa.field("effect_hi", pa.float64()),
        pa.field("p_value", pa.float64()),
        pa.field("p_holm", pa.float64()),  # Holm-adjusted across the five
        pa.field("verdict", pa.string(), nullable=False),  # "supported" | "not supported" | "not tested"
        pa.field("detail", pa.string()),  # one or two sentences: what was found, or why it was not tested
        pa.field("headline", pa.string()),  # H5's headline sentence when the host tool places 5th or worse
        pa.field("simulated", pa.bool_(), nullable=False),
    ]
)

# Said wherever an HPSv3 mu of uncalibrated weights is shown (the study page also marks its column).
HPS_UNCALIBRATED_NOTE = ("UNCALIBRATED DEMO WEIGHTS: the HPSv3 mu column comes from randomly initialised "
                         "HPSv3-architecture weights, not from HPSv3: it shows the pipeline, not the tools' quality.")

STUDY_PIXEL_METRICS = pa.schema(  # one row per tool: the metrics the protocol argues against (item 6)
    [
        pa.field("study_id", pa.string(), nullable=False),
        pa.field("tool", pa.string(), nullable=False),
        pa.field("fid", pa.float64()),
        pa.field("fid_lo", pa.float64()),
        pa.field("fid_hi", pa.float64()),
        pa.field("kid", pa.float64()),
        pa.field("clip_score", pa.float64()),
        pa.field("inception_score", pa.float64()),
        pa.field("hps_mu", pa.float64()),
        pa.field("n_images", pa.int32()),
        pa.field("weights", pa.string()),  # "real" | "TINY RANDOM" (every output says which)
        # hps_mu from uncalibrated (demo, randomly initialised) HPSv3 weights: marked UNCALIBRATED on
        # every output; null without hps_mu (and in rows written before issue 26 item 7)
        pa.field("hps_uncalibrated", pa.bool_()),
    ]
)

STUDY_TABLES: dict[str, pa.Schema] = {
    "study_answers": STUDY_ANSWERS,
    "study_rates": STUDY_RATES,
    "study_index": STUDY_INDEX,
    "study_hypotheses": STUDY_HYPOTHESES,
    "study_pixel_metrics": STUDY_PIXEL_METRICS,
}
ANSWER_SOURCES = ("panel", "import", "simulated")
HYPOTHESIS_VERDICTS = ("supported", "not supported", "not tested")


def salted_judge_id(salt: str, label: str) -> str:
    """The judge id every table and export carries: sha256 hex of the study's secret salt followed
    by the judge's label (as ``tasks.beauty.store.PanelStore.answers_table`` computes it). The salt
    never leaves the study folder, so the id cannot be recomputed from a guessed label."""
    import hashlib

    return hashlib.sha256((salt + label).encode()).hexdigest()
