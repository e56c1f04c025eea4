"""The OCR judge: Tesseract (Debian's ``tesseract-ocr``, run as a subprocess) checks that the exact
text a prompt asks for is in the image. Works offline.

Rules (``templates/ocr-v1.txt``; that file's sha256 is this judge's template hash, so a change of
rules must come with a new rules file):
- required strings: the double-quoted strings of the generation prompt; none -> ERROR
  ("no exact text to check");
- readings: grayscale (upscaled 2x when the longer side is under 1600 px), page segmentation
  modes 3 and 11, each also on the inverted image; stops early once everything is found;
- normalisation: NFKC, typographic quotes/dashes/fraction slash to ASCII, case-folded, accents
  removed (Tesseract's ``eng`` model reads "Château" as "Chateau": keeping accents would FAIL
  correct images; accent checks are left to a VLM), split on whitespace, punctuation/symbols
  stripped from word edges (inner ones kept: "2.50", "1/2"), symbol-only words dropped;
- a string is found when its words appear consecutively in one reading; PASS iff all are found.
"""

from __future__ import annotations

import asyncio
import functools
import io
import os
import re
import shutil
import subprocess
import time
import unicodedata
from pathlib import Path
from typing import Any, Sequence

from schemas.judges import Endpoint

from .base import Judge, JudgeAnswer, JudgeInputError, JudgeRequest, JudgeUnavailable, read_image
from .protocol import FAIL, PASS, Template, load_template, verdict_text

OCR_JUDGE = "ocr"  # the built-in judge's name
OCR_TEMPLATE = "ocr-v1"
TESSERACT_CMD = os.environ.get("IMAGEBENCH_TESSERACT", "tesseract")
OCR_LANG = "eng"
PSMS = (3, 11)
UPSCALE_BELOW = 1600
NO_EXACT_TEXT = "no exact text to check: the generation prompt has no double-quoted string"

_QUOTED = re.compile(r'"([^"\n]+)"|\u201c([^\u201d\n]+)\u201d')
_TYPOGRAPHIC = str.maketrans(
    {
        "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
        "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
        "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2015": "-", "\u2212": "-",
        "\u2044": "/", "\u2215": "/",
    }
)  # fmt: skip


def builtin_ocr_endpoint() -> Endpoint:
    """The endpoint of the built-in ``ocr`` judge (used when the endpoints config has none)."""
    return Endpoint(
        backend="ocr", model="tesseract", concurrency=max(1, os.cpu_count() or 1), timeout_s=120.0, max_image_side=8192
    )


# --- text rules ----------------------------------------------------------------------------------
def required_strings(prompt: str) -> list[str]:
    """The double-quoted strings of a generation prompt, in order, without duplicates (strings
    made only of punctuation/symbols are ignored)."""
    out: list[str] = []
    for m in _QUOTED.finditer(prompt or ""):
        s = (m.group(1) or m.group(2) or "").strip()
        if s and normalize_words(s) and s not in out:
            out.append(s)
    return out


def _strip_edges(word: str) -> str:
    start, end = 0, len(word)
    while start < end and not word[start].isalnum():
        start += 1
    while end > start and not word[end - 1].isalnum():
        end -= 1
    return word[start:end]


def normalize_words(text: str) -> list[str]:
    """The OCR rules' normalisation: a list of words to compare."""
    text = unicodedata.normalize("NFKC", text or "").translate(_TYPOGRAPHIC).casefold()
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return [w for w in (_strip_edges(chunk) for chunk in text.split()) if w]


def _contains(haystack: Sequence[str], needle: Sequence[str]) -> bool:
    n = len(needle)
    if n == 0:
        return False
    return any(list(haystack[i : i + n]) == list(needle) for i in range(len(haystack) - n + 1))


def find_strings(required: Sequence[str], readings: Sequence[str]) -> tuple[list[str], list[str]]:
    """(found, missing): a string is found when its words appear consecutively in one reading."""
    words = [normalize_words(r) for r in readings]
    found, missing = [], []
    for s in required:
        needle = normalize_words(s)
        (found if any(_contains(w, needle) for w in words) else missing).append(s)
    return found, missing


def ocr_rationale(
    version: str, required: Sequence[str], found: Sequence[str], missing: Sequence[str], readings: Sequence[str]
) -> str:
    seen = " | ".join(" ".join(r.split()) for r in readings if r.strip())
    if len(seen) > 400:
        seen = seen[:397] + "..."
    lines = [f"OCR ({version}, {OCR_LANG}) checked {len(required)} required string(s) from the prompt."]
    if found:
        lines.append("Found: " + "; ".join(f'"{s}"' for s in found))
    if missing:
        lines.append("Missing: " + "; ".join(f'"{s}"' for s in missing))
    lines.append(f'Read: "{seen}"' if seen else "Read: no text")
    return "\n".join(lines)


# --- tesseract --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def tesseract_version(cmd: str = TESSERACT_CMD) -> str | None:
    """``tesseract 5.3.0`` (the first line of ``tesseract --version``), or None when absent."""
    exe = shutil.which(cmd)
    if not exe:
        return None
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    first = (proc.stdout or proc.stderr).strip().splitlines()
    return first[0].strip() if first and proc.returncode == 0 else None


def _ocr_inputs(path: Path) -> list[bytes]:
    """PNG bytes of the grayscale (maybe upscaled) image and of its inversion."""
    from PIL import Image, ImageOps

    with Image.open(path) as img:
        gray = img.convert("L")
    if max(gray.size) < UPSCALE_BELOW:
        gray = gray.resize((gray.width * 2, gray.height * 2), Image.BICUBIC)
    out = []
    for im in (gray, ImageOps.invert(gray)):
        buf = io.BytesIO()
        im.save(buf, format="PNG", compress_level=1)
        out.append(buf.getvalue())
    return out


def _tesseract_env() -> dict[str, str]:
    # One thread per tesseract process: the judge runs several processes side by side.
    return dict(os.environ, OMP_THREAD_LIMIT="1")


async def _run_tesseract(cmd: str, png: bytes, psm: int, timeout_s: float) -> str:
    proc = await asyncio.create_subprocess_exec(
        cmd, "stdin", "stdout", "-l", OCR_LANG, "--psm", str(psm),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=_tesseract_env(),
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(png), timeout_s)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise JudgeUnavailable(f"tesseract timed out after {timeout_s:g} s") from None
    if proc.returncode != 0:
        raise JudgeUnavailable(
            f"tesseract exited with {proc.returncode}: {err.decode('utf-8', 'replace').strip()[:200]}", retryable=False
        )
    return out.decode("utf-8", "replace")


async def read_all(cmd: str, path: Path, required: Sequence[str], timeout_s: float) -> list[str]:
    """Readings in order (psm 3, 11; then the inverted image), stopping once all are found."""
    pngs = await asyncio.to_thread(_ocr_inputs, path)
    readings: list[str] = []
    for png in pngs:
        for psm in PSMS:
            readings.append(await _run_tesseract(cmd, png, psm, timeout_s))
            if not find_strings(required, readings)[1]:
                return readings
    return readings


def ocr_check(image_path: str | Path, prompt: str, cmd: str = TESSERACT_CMD) -> tuple[str, str]:
    """Synchronous convenience: ``(PASS | FAIL, rationale)``; raises JudgeInputError when the
    prompt has no quoted string, JudgeUnavailable when tesseract is missing."""
    version = tesseract_version(cmd)
    if version is None:
        raise JudgeUnavailable(f"tesseract not found ({cmd!r}): apt-get install tesseract-ocr", retryable=False)
    required = required_strings(prompt)
    if not required:
        raise JudgeInputError(NO_EXACT_TEXT)
    readings = asyncio.run(read_all(cmd, Path(image_path), required, 120.0))
    found, missing = find_strings(required, readings)
    return (PASS if not missing else FAIL), ocr_rationale(version, required, found, missing, readings)


class OCRJudge(Judge):
    backend = "ocr"

    def __init__(self, name: str = OCR_JUDGE, endpoint: Endpoint | None = None, *, cmd: str | None = None) -> None:
        super().__init__(name, endpoint or builtin_ocr_endpoint())
        self.cmd = cmd or TESSERACT_CMD
        self._sem: asyncio.Semaphore | None = None

    @property
    def judge_model(self) -> str:
        return tesseract_version(self.cmd) or "tesseract (not installed)"

    def sampling(self) -> dict[str, Any]:
        return {"engine": "tesseract", "lang": OCR_LANG, "psm": list(PSMS), "upscale_below": UPSCALE_BELOW}

    def template_for(self, route_template: str) -> Template:
        return load_template(OCR_TEMPLATE)  # OCR has its own rules, whatever the route's VLM template

    def unavailable_reason(self) -> str | None:
        if tesseract_version(self.cmd) is None:
            return f"tesseract not found ({self.cmd!r}): install Debian's tesseract-ocr"
        return None

    async def ask(self, request: JudgeRequest) -> JudgeAnswer:
        reason = self.unavailable_reason()
        if reason:
            raise JudgeUnavailable(reason, retryable=False, judge_down=True)
        required = required_strings(request.prompt)
        if not required:
            raise JudgeInputError(NO_EXACT_TEXT)
        path = Path(request.image_path)
        await asyncio.to_thread(read_image, path, request.image_sha256, self.name, self.endpoint.max_image_side)
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.endpoint.concurrency)
        async with self._sem:
            t0 = time.perf_counter()
            readings = await read_all(self.cmd, path, required, self.endpoint.timeout_s)
            latency = time.perf_counter() - t0
        found, missing = find_strings(required, readings)
        version = self.judge_model
        text = verdict_text(ocr_rationale(version, required, found, missing, readings), PASS if not missing else FAIL)
        return JudgeAnswer(raw_text=text, reported_model=version, latency_s=latency)
