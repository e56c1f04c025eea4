"""Load and check the frozen prompt suite (``reference/suite-<version>.jsonl``)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from pydantic import ValidationError

from schemas.suite import PROMPTS_PER_TAG, TAGS_PER_CATEGORY, Prompt, expected_eps_eligible


class SuiteError(ValueError):
    """The suite file is malformed or does not have the published shape."""


@dataclass(frozen=True)
class Suite:
    version: str
    sha256: str  # of the file's bytes, as pinned in reference/SHA256SUMS
    prompts: tuple[Prompt, ...] = field(repr=False)

    @cached_property
    def by_id(self) -> dict[str, Prompt]:
        return {p.prompt_id: p for p in self.prompts}

    @cached_property
    def eligible_ids(self) -> tuple[str, ...]:
        return tuple(p.prompt_id for p in self.prompts if p.eps_eligible)

    def rows(self) -> list[dict]:
        return [dict(p.model_dump(), suite_version=self.version) for p in self.prompts]


def parse_suite(data: bytes, version: str, source: str = "<suite>", check_shape: bool = True) -> Suite:
    prompts: list[Prompt] = []
    for lineno, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            prompts.append(Prompt.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise SuiteError(f"{source}:{lineno}: invalid prompt: {exc}") from exc
    suite = Suite(version=version, sha256=hashlib.sha256(data).hexdigest(), prompts=tuple(prompts))
    _check_consistency(suite, source)
    if check_shape:
        check_published_shape(suite, source)
    return suite


def load_suite(path: Path, version: str | None = None, check_shape: bool = True) -> Suite:
    path = Path(path)
    if not path.is_file():
        raise SuiteError(f"{path}: prompt suite file not found")
    if version is None:
        name = path.name
        version = name.removeprefix("suite-").removesuffix(".jsonl")
    return parse_suite(path.read_bytes(), version, source=str(path), check_shape=check_shape)


def _check_consistency(suite: Suite, source: str) -> None:
    dup = [pid for pid, n in Counter(p.prompt_id for p in suite.prompts).items() if n > 1]
    if dup:
        raise SuiteError(f"{source}: duplicate prompt ids: {sorted(dup)[:10]}")
    for p in suite.prompts:
        if p.eps_eligible != expected_eps_eligible(p.category, p.subcategory):
            raise SuiteError(
                f"{source}: prompt {p.prompt_id} ({p.category} / {p.subcategory}) has "
                f"eps_eligible={p.eps_eligible}, the published rule says {not p.eps_eligible}"
            )
    tag_homes: dict[str, set[tuple[str, str]]] = {}
    for p in suite.prompts:
        tag_homes.setdefault(p.tag, set()).add((p.category, p.subcategory))
    split = {t: h for t, h in tag_homes.items() if len(h) > 1}
    if split:
        raise SuiteError(f"{source}: tags filed under several categories/subcategories: {split}")


def check_published_shape(suite: Suite, source: str = "<suite>") -> None:
    """6 categories with 5/19/14/9/8/9 tags, 3 prompts per tag (192 prompts)."""
    tags_by_cat: dict[str, set[str]] = {}
    per_tag = Counter(p.tag for p in suite.prompts)
    for p in suite.prompts:
        tags_by_cat.setdefault(p.category, set()).add(p.tag)
    got = {c: len(tags_by_cat.get(c, ())) for c in TAGS_PER_CATEGORY}
    if got != TAGS_PER_CATEGORY:
        raise SuiteError(f"{source}: tags per category {got}, expected {TAGS_PER_CATEGORY}")
    wrong = {t: n for t, n in per_tag.items() if n != PROMPTS_PER_TAG}
    if wrong:
        raise SuiteError(f"{source}: tags without exactly {PROMPTS_PER_TAG} prompts: {wrong}")


def prompt_ids_by_suite(reference_dir: Path) -> dict[str, frozenset[str]]:
    """Every suite file of ``reference_dir`` (``suite-<version>.jsonl``): version -> its prompt ids."""
    import json

    out: dict[str, frozenset[str]] = {}
    for path in sorted(Path(reference_dir).glob("suite-*.jsonl")):
        ids = {json.loads(line)["prompt_id"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
        out[path.name.removeprefix("suite-").removesuffix(".jsonl")] = frozenset(ids)
    return out


def other_suite_prompt_ids(reference_dir: Path, suite_version: str) -> frozenset[str]:
    """Prompt ids of every other suite in ``reference_dir`` (``suite-*.jsonl``), minus this suite's
    own: objects a model folder may hold for another protocol (Beauty Index images under
    ``models/<id>/``, the layout before issue 26 item 2), left to that protocol."""
    by_suite = prompt_ids_by_suite(reference_dir)
    own = by_suite.get(suite_version, frozenset())
    return frozenset().union(*(ids for v, ids in by_suite.items() if v != suite_version)) - own

