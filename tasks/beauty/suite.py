"""The pinned Beauty Index prompt suite (``reference/suite-beauty-index-v1.jsonl``).

The same rule as ``imagebench-v1``: the file is pinned by sha256 in ``reference/SHA256SUMS``
(tasks.scores.reference.pin_suite) and verified before every use; a change is a new version. The
returned object is a :class:`tasks.scores.suite.Suite` (prompts are ``BeautyPrompt``), so the existing
ingest validation (tasks.store.ingest.ingest_model) applies to a study's tools unchanged.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

from pydantic import ValidationError

from schemas.study import BEAUTY_SUITE_VERSION, BeautyPrompt
from schemas.suite import PROMPT_ID_RE
from tasks.scores.suite import Suite, SuiteError

# The ten published prompts, in the published order: the v1 file must hold exactly these.
PUBLISHED_PROMPTS = (
    "A kitchen on a Sunday morning",
    "Grief, but in color",
    "The moment before something changes",
    "Your mother when she was twenty-four",
    "A place that doesn't exist but you've been there",
    "The last minute of summer",
    "A stranger who feels like home",
    "Joy, unposed",
    "A small miracle",
    "What it felt like when you finally understood",
)


def parse_beauty_suite(data: bytes, version: str, source: str = "<suite>") -> Suite:
    prompts: list[BeautyPrompt] = []
    for lineno, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            p = BeautyPrompt.model_validate(json.loads(line))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise SuiteError(f"{source}:{lineno}: invalid prompt: {exc}") from exc
        if not PROMPT_ID_RE.fullmatch(p.prompt_id):  # it becomes an object key: models/<tool>/<id>.png
            raise SuiteError(f"{source}:{lineno}: prompt_id {p.prompt_id!r} must match {PROMPT_ID_RE.pattern}")
        prompts.append(p)
    dup = sorted(pid for pid, n in Counter(p.prompt_id for p in prompts).items() if n > 1)
    if dup:
        raise SuiteError(f"{source}: duplicate prompt ids: {dup}")
    if not prompts:
        raise SuiteError(f"{source}: no prompts")
    if version == BEAUTY_SUITE_VERSION and tuple(p.prompt for p in prompts) != PUBLISHED_PROMPTS:
        raise SuiteError(f"{source}: {version} must hold exactly the 10 published prompts, in order")
    return Suite(version=version, sha256=hashlib.sha256(data).hexdigest(), prompts=tuple(prompts))  # type: ignore[arg-type]


def load_beauty_suite(reference_dir: str | Path, version: str = BEAUTY_SUITE_VERSION) -> Suite:
    """``reference/suite-<version>.jsonl``, parsed and verified against its SHA256SUMS line."""
    from tasks.scores.reference import suite_filename, verify_suite

    path = Path(reference_dir) / suite_filename(version)
    if not path.is_file():
        raise SuiteError(f"{path}: prompt suite file not found (suite {version!r})")
    suite = parse_beauty_suite(path.read_bytes(), version, source=str(path))
    verify_suite(reference_dir, suite)
    return suite
