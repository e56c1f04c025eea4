"""What a VLM judge is asked on a VAB trial, and how its answer is read. Two prompt versions
(the version and the text's sha256 are part of every VLM judge's identity, hence of its cache):

- ``vab-best-worst-v2`` (ours): one combined question per trial, images numbered ("Image 1:"
  before each), the domain's rubric (schemas.vab.RUBRICS), ``BEST: <n>`` and, for 3+ images,
  ``WORST: <n>`` on the final lines. Greedy (temperature 0).
- ``vab-official-v1``: the authors' eval.py prompts, word for word (they have to be, for our
  numbers to sit beside theirs): three prompt types (pick_best, pick_worst, pick_best_and_worst
  for 3+ images), letter labels, the question first, then ``Image A:`` before each image;
  ``BEST: X`` / ``WORST: Y`` found anywhere in the answer (first match, letter case ignored),
  temperature 1.0 unless asked otherwise, up to 3 attempts when the answer cannot be read. A
  pick_best_and_worst answer naming one image best and worst is read as eval.py reads it (an
  answer: right on best or on worst at most, never on both). What goes out with these prompts is
  tasks.vab.official_request's.
"""

from __future__ import annotations

import hashlib
import re

from schemas.vab import OFFICIAL_PROMPT_TYPES, PICK_BEST, PICK_BEST_AND_WORST, PICK_WORST, PROMPT_COMBINED, RUBRIC_AVOID, RUBRICS

VAB_PROMPT_VERSION = "vab-best-worst-v2"  # v1 repeated the fine-art rubric for every domain
OFFICIAL_PROMPT_VERSION = "vab-official-v1"
PROMPT_VERSIONS = (VAB_PROMPT_VERSION, OFFICIAL_PROMPT_VERSION)
OFFICIAL_TEMPERATURE = 1.0  # eval.py's default
OFFICIAL_ATTEMPTS = 3  # eval.py asks again (up to 3 times in all) when the answer cannot be read

_QUESTION = (
    "You are an expert judge of visual aesthetics. The {n} images above (Image 1 to Image {n}) show "
    "the same subject in the {domain} domain. Judge them on: {criteria}. {avoid}\n"
)
_ASK_BOTH = ("Which image is aesthetically the BEST, and which is the WORST? Explain briefly, then end your "
             "answer with exactly these two lines:\nBEST: <image number>\nWORST: <image number>")
_ASK_BEST = ("Which image is aesthetically the BEST? Explain briefly, then end your answer with exactly this "
             "line:\nBEST: <image number>")

# eval.py's three prompts (its PICK_BEST_PROMPT, PICK_WORST_PROMPT, PICK_BEST_AND_WORST_PROMPT)
_OFFICIAL_INTRO = ("You will be shown {n} images labeled {labels}. Evaluate the overall aesthetic quality of each "
                   "image, considering composition, color, technique, and artistic expression.\n\n")
_OFFICIAL = {
    PICK_BEST: _OFFICIAL_INTRO + (
        "Which image has the best overall aesthetic quality?\n{options}\n\n"
        "You may reason step by step. Then, on the very last line of your response, write your final answer "
        "in exactly this format:\nBEST: X\nwhere X is the letter label of the best image."),
    PICK_WORST: _OFFICIAL_INTRO + (
        "Which image has the worst overall aesthetic quality?\n{options}\n\n"
        "You may reason step by step. Then, on the very last line of your response, write your final answer "
        "in exactly this format:\nWORST: X\nwhere X is the letter label of the worst image."),
    PICK_BEST_AND_WORST: _OFFICIAL_INTRO + (
        "Which image has the best overall aesthetic quality, and which has the worst?\n{options}\n\n"
        "You may reason step by step. Then, on the very last lines of your response, write your final answers "
        "in exactly this format:\nBEST: X\nWORST: Y\nwhere X and Y are the letter labels."),
}


def prompt_sha256(version: str) -> str:
    if version == VAB_PROMPT_VERSION:
        body = _QUESTION + _ASK_BOTH + _ASK_BEST + repr(sorted(RUBRICS.items())) + RUBRIC_AVOID
    elif version == OFFICIAL_PROMPT_VERSION:
        body = "".join(_OFFICIAL[p] for p in OFFICIAL_PROMPT_TYPES)
    else:
        raise ValueError(f"unknown VAB prompt version {version!r}; versions: {', '.join(PROMPT_VERSIONS)}")
    return hashlib.sha256((version + body).encode()).hexdigest()


def letters(n: int) -> list[str]:
    return [chr(65 + i) for i in range(n)]


def question_for(n: int, domain: str) -> str:
    """Our combined question for a set of ``n`` images: best and worst for 3+, best only for 2."""
    criteria = ", ".join(c.lower() for c in RUBRICS[domain])
    head = _QUESTION.format(n=n, domain=domain.replace("_", " "), criteria=criteria, avoid=RUBRIC_AVOID)
    return head + (_ASK_BOTH if n >= 3 else _ASK_BEST)


def message_parts(version: str, prompt_type: str, n: int, domain: str) -> list[str | int]:
    """The user message as text parts and image slots (0-based, shown order), in order."""
    if version == VAB_PROMPT_VERSION:
        if prompt_type != PROMPT_COMBINED:
            raise ValueError(f"prompt version {version} asks the combined question, not {prompt_type!r}")
        parts: list[str | int] = []
        for i in range(n):
            parts += [f"Image {i + 1}:", i]
        return parts + [question_for(n, domain)]
    if version != OFFICIAL_PROMPT_VERSION:
        raise ValueError(f"unknown VAB prompt version {version!r}; versions: {', '.join(PROMPT_VERSIONS)}")
    if prompt_type not in OFFICIAL_PROMPT_TYPES or (prompt_type == PICK_BEST_AND_WORST and n == 2):
        raise ValueError(f"prompt version {version} has no prompt type {prompt_type!r} for {n} images")
    labs = letters(n)
    header = _OFFICIAL[prompt_type].format(n=n, labels=", ".join(labs), options="\n".join(f"{la}. Image {la}" for la in labs))
    parts = [header]
    for i, la in enumerate(labs):
        parts += [f"\nImage {la}:", i]
    return parts


# ---- reading answers -------------------------------------------------------------------------------
_MARKDOWN = re.compile(r"[*_`#>]")
_LINE = re.compile(r"^(best|worst)\s*:\s*(?:image\s*)?\[?(\d+)\]?\s*\.?$", re.IGNORECASE)


def parse_best_worst(text: str | None, n: int) -> tuple[int | None, int | None, str | None]:
    """Our combined prompt: the final ``BEST: <n>`` / ``WORST: <n>`` lines of an answer about ``n``
    images. Only the last non-empty lines count (2 for 3+ images, in either order; 1 for 2 images,
    ``BEST``). Returns ``(best, worst, None)`` or ``(None, None, why)``; numbers in 1..n, distinct."""
    if not text or not text.strip():
        return None, None, "empty answer"
    lines = [_MARKDOWN.sub("", ln).strip() for ln in text.strip().splitlines()]
    lines = [ln for ln in lines if ln]
    need = 2 if n >= 3 else 1
    found: dict[str, int] = {}
    for ln in lines[-need:]:
        m = _LINE.match(ln)
        if not m:
            return None, None, f"final line {ln[:80]!r} is not 'BEST: <n>'" + (" / 'WORST: <n>'" if need == 2 else "")
        key = m.group(1).lower()
        if key in found:
            return None, None, f"two {key.upper()} lines"
        found[key] = int(m.group(2))
    if "best" not in found or (need == 2 and "worst" not in found):
        return None, None, "missing " + ("BEST" if "best" not in found else "WORST") + " line"
    best, worst = found["best"], found.get("worst")
    for label, v in (("BEST", best), ("WORST", worst)):
        if v is not None and not 1 <= v <= n:
            return None, None, f"{label}: {v} is out of range 1..{n}"
    if worst is not None and worst == best:
        return None, None, f"BEST and WORST name the same image ({best})"
    return best, worst, None


def _official_find(tag: str, text: str) -> str | None:
    m = re.search(rf"\b{tag}:\s*([A-Za-z])\b", text)
    return m.group(1).upper() if m else None


def parse_official(text: str | None, prompt_type: str, n: int) -> tuple[int | None, int | None, str | None]:
    """eval.py's reading of an answer to ``prompt_type`` about ``n`` images (letters -> slots 1..n):
    the first ``BEST: X`` (``WORST: X``) anywhere, X a label of the set; best and worst may name
    the same image (eval.py accepts it and scores it)."""
    text = text or ""
    labs = letters(n)
    got: dict[str, int | None] = {}
    for tag in ("BEST", "WORST"):
        if (tag == "BEST" and prompt_type == PICK_WORST) or (tag == "WORST" and prompt_type == PICK_BEST):
            got[tag] = None
            continue
        letter = _official_find(tag, text)
        if letter not in labs:
            return None, None, f"no '{tag}: X' with X one of {', '.join(labs)}"
        got[tag] = labs.index(letter) + 1
    return got["BEST"], got["WORST"], None


def parse_answer(version: str, prompt_type: str, text: str | None, n: int) -> tuple[int | None, int | None, str | None]:
    if version == OFFICIAL_PROMPT_VERSION:
        return parse_official(text, prompt_type, n)
    return parse_best_worst(text, n)
