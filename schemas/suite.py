"""The frozen prompt suite: one JSON object per line in ``reference/suite-<version>.jsonl``."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

CATEGORIES = (
    "Text Rendering",
    "Spatial Reasoning",
    "Human Realism",
    "Professional Studio",
    "Graphical Design",
    "Truthfulness",
)
# Tags per category in the published ImageBench V1 shape (64 in all, 3 prompts each).
TAGS_PER_CATEGORY = {
    "Text Rendering": 5,
    "Spatial Reasoning": 19,
    "Human Realism": 14,
    "Professional Studio": 9,
    "Graphical Design": 8,
    "Truthfulness": 9,
}
PROMPTS_PER_TAG = 3
# Graphical Design subcategories excluded from EPS (with all of Text Rendering).
EPS_EXCLUDED_SUBCATEGORIES = ("Layout & Design", "Data Visualisation")

PROMPT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


class Prompt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_id: str
    category: Literal[
        "Text Rendering",
        "Spatial Reasoning",
        "Human Realism",
        "Professional Studio",
        "Graphical Design",
        "Truthfulness",
    ]
    subcategory: str = Field(min_length=1)
    tag: str = Field(min_length=1)
    difficulty: Literal["easy", "medium", "hard"]
    prompt: str = Field(min_length=10)
    question: str = Field(min_length=10)
    eps_eligible: bool

    @field_validator("prompt_id")
    @classmethod
    def _id_shape(cls, v: str) -> str:
        if not PROMPT_ID_RE.fullmatch(v):
            raise ValueError(f"prompt_id {v!r} must match {PROMPT_ID_RE.pattern}")
        return v

    @field_validator("question")
    @classmethod
    def _is_question(cls, v: str) -> str:
        if not v.rstrip().endswith("?"):
            raise ValueError(f"question {v!r} must be a yes/no question ending with '?'")
        return v


def expected_eps_eligible(category: str, subcategory: str) -> bool:
    """The published EPS eligibility rule, as a function of the prompt's place in the taxonomy."""
    if category == "Text Rendering":
        return False
    return not (category == "Graphical Design" and subcategory in EPS_EXCLUDED_SUBCATEGORIES)
