"""The verdict protocol: judge prompt templates, the verdict-line parser, and identity hashing.

The judge sees the image, the generation prompt and the prompt's binary question; it writes a
short rationale and ends with a line ``VERDICT: PASS`` or ``VERDICT: FAIL``. Only the final
non-empty line is read (see :func:`parse_verdict`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

PASS, FAIL, ERROR, UNPARSABLE = "PASS", "FAIL", "ERROR", "UNPARSABLE"
Outcome = Literal["PASS", "FAIL", "UNPARSABLE"]

SAMPLING_SEED = 0  # fixed seed sent to servers that take one (greedy decoding does not need it)
TEMPLATE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
PROMPT_SLOT = "{{prompt}}"
QUESTION_SLOT = "{{question}}"


@dataclass(frozen=True)
class Template:
    name: str  # e.g. "verdict-v1" (file tasks/judges/templates/<name>.txt)
    text: str
    sha256: str  # of the file's bytes

    def render(self, prompt: str, question: str) -> str:
        """The user text: slots replaced literally (no format-string parsing of prompts)."""
        return self.text.replace(PROMPT_SLOT, prompt.strip()).replace(QUESTION_SLOT, question.strip())


def template_names() -> list[str]:
    root = resources.files(__package__) / "templates"
    return sorted(p.name.removesuffix(".txt") for p in root.iterdir() if p.name.endswith(".txt"))


@functools.lru_cache(maxsize=None)
def load_template(name: str) -> Template:
    """``tasks/judges/templates/<name>.txt``; its sha256 is part of every verdict's identity."""
    if not TEMPLATE_NAME_RE.fullmatch(name or ""):
        raise ValueError(f"invalid judge template name {name!r}")
    path = resources.files(__package__) / "templates" / f"{name}.txt"
    if not path.is_file():
        raise ValueError(f"unknown judge template {name!r}; known: {template_names()}")
    data = path.read_bytes()
    return Template(name=name, text=data.decode("utf-8"), sha256=hashlib.sha256(data).hexdigest())


# --- parsing ------------------------------------------------------------------------------------
# The final line, after removing markdown emphasis/code markers (* _ `) and surrounding space:
# "VERDICT", optional spaces, ":", optional spaces, PASS or FAIL, nothing else. Case-insensitive.
_VERDICT_LINE = re.compile(r"^verdict\s*:\s*(pass|fail)$", re.IGNORECASE)
_MARKDOWN = re.compile(r"[*_`]")


def parse_verdict(text: str | None) -> tuple[Outcome, str]:
    """``(PASS | FAIL | UNPARSABLE, rationale)``. Reads ONLY the last non-empty line; it must be
    ``VERDICT: PASS`` or ``VERDICT: FAIL`` (any case, surrounding whitespace and markdown bold /
    italics / backticks tolerated, no other text). The rationale is everything before that line
    (stripped); for UNPARSABLE it is the whole text, stripped."""
    if not text or not text.strip():
        return UNPARSABLE, ""
    lines = text.strip().splitlines()
    last = lines[-1]
    candidate = _MARKDOWN.sub("", last).strip()
    m = _VERDICT_LINE.match(candidate)
    if not m:
        return UNPARSABLE, text.strip()
    return m.group(1).upper(), "\n".join(lines[:-1]).strip()  # type: ignore[return-value]


def verdict_text(rationale: str, verdict: str) -> str:
    """An answer in the protocol's shape (used by the OCR judge)."""
    return f"{rationale.rstrip()}\nVERDICT: {verdict}"


# --- hashing ------------------------------------------------------------------------------------
def canonical_json(obj: Any) -> str:
    """Sorted keys, no spaces, UTF-8 kept: the same settings always give the same string."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def question_sha256(question: str) -> str:
    return sha256_text(question)


def verdict_identity(
    image_sha256: str,
    prompt_id: str,
    question: str,
    judge_model: str,
    template_sha256: str,
    sampling: str,
) -> str:
    """sha256 of the canonical JSON of what a verdict depends on: the ``identity`` skip key."""
    return sha256_text(
        canonical_json(
            {
                "image_sha256": image_sha256,
                "prompt_id": prompt_id,
                "question": question,
                "judge_model": judge_model,
                "template_sha256": template_sha256,
                "sampling": sampling,
            }
        )
    )
