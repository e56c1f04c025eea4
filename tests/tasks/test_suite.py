"""The frozen prompt suite imagebench-v1: its published shape, and the loader's refusals."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from schemas.suite import CATEGORIES, EPS_EXCLUDED_SUBCATEGORIES, PROMPT_ID_RE
from tasks.scores.suite import SuiteError, load_suite, parse_suite

REPO = Path(__file__).resolve().parents[2]
SUITE_PATH = REPO / "reference" / "suite-imagebench-v1.jsonl"
SHA256SUMS = REPO / "reference" / "SHA256SUMS"

KEYS = ["prompt_id", "category", "subcategory", "tag", "difficulty", "prompt", "question", "eps_eligible"]
# The published ImageBench V1 numbers, written out here rather than read back from schemas.suite,
# so that a change to the constants there cannot silently change what this test expects.
PUBLISHED_TAGS = {
    "Text Rendering": 5,
    "Spatial Reasoning": 19,
    "Human Realism": 14,
    "Professional Studio": 9,
    "Graphical Design": 8,
    "Truthfulness": 9,
}
ABBREV = {
    "Text Rendering": "tr",
    "Spatial Reasoning": "sr",
    "Human Realism": "hr",
    "Professional Studio": "ps",
    "Graphical Design": "gd",
    "Truthfulness": "tf",
}
# One yes/no question: a leading "In ...,"/"From ...,"/"With ...," clause at most, then the auxiliary.
YES_NO_RE = re.compile(r"^(?:(?:In|From|With) [^?]*?, (?:is|are|does|do)|Is|Are|Does|Do)\b")


@pytest.fixture(scope="module")
def suite():
    return load_suite(SUITE_PATH)


@pytest.fixture(scope="module")
def raw_lines() -> list[str]:
    return SUITE_PATH.read_text(encoding="utf-8").split("\n")[:-1]


# --------------------------------------------------------------------------- the committed file


def test_file_is_clean_jsonl(raw_lines):
    data = SUITE_PATH.read_bytes()
    assert data.endswith(b"\n") and not data.endswith(b"\n\n")
    assert b"\r" not in data
    assert len(raw_lines) == 192
    for n, line in enumerate(raw_lines, start=1):
        obj = json.loads(line)
        assert list(obj) == KEYS, f"line {n}: keys {list(obj)}"


def test_version_and_size(suite):
    assert suite.version == "imagebench-v1"
    assert len(suite.prompts) == 192
    assert len({p.tag for p in suite.prompts}) == 64


def test_tags_per_category_match_published(suite):
    tags: dict[str, set[str]] = {}
    for p in suite.prompts:
        tags.setdefault(p.category, set()).add(p.tag)
    assert {c: len(t) for c, t in tags.items()} == PUBLISHED_TAGS
    assert Counter(p.tag for p in suite.prompts) == {t: 3 for ts in tags.values() for t in ts}


def test_subcategories_per_category(suite):
    subs: dict[str, set[str]] = {}
    for p in suite.prompts:
        subs.setdefault(p.category, set()).add(p.subcategory)
    for cat in CATEGORIES:
        assert 2 <= len(subs[cat]) <= 5, (cat, subs[cat])
    assert set(EPS_EXCLUDED_SUBCATEGORIES) <= subs["Graphical Design"]
    assert len(subs["Graphical Design"]) > len(EPS_EXCLUDED_SUBCATEGORIES)


def test_eps_eligibility(suite):
    non = [p for p in suite.prompts if not p.eps_eligible]
    assert len(non) == 27
    assert len(suite.eligible_ids) == 165
    non_tags = {p.tag for p in non}
    tr_tags = {p.tag for p in suite.prompts if p.category == "Text Rendering"}
    gd_excluded = {
        p.tag
        for p in suite.prompts
        if p.category == "Graphical Design" and p.subcategory in ("Layout & Design", "Data Visualisation")
    }
    assert len(tr_tags) == 5 and len(gd_excluded) == 4
    assert non_tags == tr_tags | gd_excluded
    # a tag is either wholly eligible or wholly excluded
    for tag in {p.tag for p in suite.prompts}:
        assert len({p.eps_eligible for p in suite.prompts if p.tag == tag}) == 1, tag
    # and every other Graphical Design tag is eligible
    gd_eligible = {p.tag for p in suite.prompts if p.category == "Graphical Design" and p.eps_eligible}
    assert len(gd_eligible) == 4


def test_ids_unique_and_shaped(suite):
    ids = [p.prompt_id for p in suite.prompts]
    assert len(set(ids)) == len(ids)
    slug_of_tag: dict[str, str] = {}
    for p in suite.prompts:
        assert PROMPT_ID_RE.match(p.prompt_id), p.prompt_id
        m = re.fullmatch(r"([a-z]{2})-([a-z0-9-]+)-(\d{2})", p.prompt_id)
        assert m, p.prompt_id
        assert m.group(1) == ABBREV[p.category], p.prompt_id
        assert slug_of_tag.setdefault(p.tag, m.group(2)) == m.group(2), p.prompt_id
    # one slug per tag, and each tag numbered 01, 02, 03
    assert len(set(slug_of_tag.values())) == len(slug_of_tag)
    for tag in slug_of_tag:
        nums = sorted(p.prompt_id[-2:] for p in suite.prompts if p.tag == tag)
        assert nums == ["01", "02", "03"], tag


def test_stable_order(suite):
    key = [(CATEGORIES.index(p.category), p.subcategory, p.tag, p.prompt_id) for p in suite.prompts]
    assert key == sorted(key)


def _norm(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def test_prompts_and_questions_unique(suite):
    prompts = [_norm(p.prompt) for p in suite.prompts]
    questions = [_norm(p.question) for p in suite.prompts]
    assert len(set(prompts)) == 192
    assert len(set(questions)) == 192


def test_questions_are_single_yes_no(suite):
    for p in suite.prompts:
        q = p.question
        assert q.endswith("?"), p.prompt_id
        assert q.count("?") == 1, p.prompt_id
        assert YES_NO_RE.match(q), (p.prompt_id, q)


def test_difficulty_mixed_within_tags(suite):
    by_tag: dict[str, list[str]] = {}
    for p in suite.prompts:
        by_tag.setdefault(p.tag, []).append(p.difficulty)
    for tag, diffs in by_tag.items():
        assert len(set(diffs)) >= 2, (tag, diffs)
    # "usually one of each": at most a handful of tags may repeat a difficulty
    assert sum(len(set(d)) == 3 for d in by_tag.values()) >= 56
    totals = Counter(p.difficulty for p in suite.prompts)
    assert set(totals) == {"easy", "medium", "hard"}
    assert min(totals.values()) >= 50, totals


def test_text_rendering_questions_quote_the_requested_text(suite):
    for p in suite.prompts:
        if p.category != "Text Rendering":
            continue
        wanted = re.findall(r'"([^"]+)"', p.prompt)
        assert wanted, p.prompt_id
        for text in wanted:
            assert f"'{text}'" in p.question, (p.prompt_id, text)


def test_pinned_sha256_matches_if_listed():
    if not SHA256SUMS.is_file():
        pytest.skip("reference/SHA256SUMS not written yet")
    pins = {}
    for line in SHA256SUMS.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            pins[Path(name.lstrip("*")).name] = digest
    if SUITE_PATH.name not in pins:
        pytest.skip(f"{SUITE_PATH.name} not pinned in reference/SHA256SUMS yet")
    assert hashlib.sha256(SUITE_PATH.read_bytes()).hexdigest() == pins[SUITE_PATH.name]


# --------------------------------------------------------------------------- malformed suites


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "suite-imagebench-v1.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _edit(raw_lines: list[str], index: int, fn) -> list[str]:
    lines = list(raw_lines)
    obj = json.loads(lines[index])
    fn(obj)
    lines[index] = json.dumps(obj, ensure_ascii=False)
    return lines


def test_copy_of_real_file_loads(tmp_path, raw_lines):
    s = load_suite(_write(tmp_path, raw_lines))
    assert len(s.prompts) == 192 and len(s.eligible_ids) == 165


def test_rejects_duplicate_id(tmp_path, raw_lines):
    first = json.loads(raw_lines[3])["prompt_id"]
    lines = _edit(raw_lines, 4, lambda o: o.update(prompt_id=first))
    path = _write(tmp_path, lines)
    with pytest.raises(SuiteError, match="duplicate prompt ids") as exc:
        load_suite(path)
    assert str(path) in str(exc.value) and first in str(exc.value)


@pytest.mark.parametrize("category", ["Text Rendering", "Graphical Design", "Truthfulness"])
def test_rejects_wrong_eps_flag(tmp_path, raw_lines, category):
    idx = next(i for i, line in enumerate(raw_lines) if json.loads(line)["category"] == category)
    pid = json.loads(raw_lines[idx])["prompt_id"]
    lines = _edit(raw_lines, idx, lambda o: o.update(eps_eligible=not o["eps_eligible"]))
    path = _write(tmp_path, lines)
    with pytest.raises(SuiteError, match="eps_eligible") as exc:
        load_suite(path)
    assert str(path) in str(exc.value) and pid in str(exc.value)


def test_rejects_tag_with_two_prompts(tmp_path, raw_lines):
    tag = json.loads(raw_lines[10])["tag"]
    lines = raw_lines[:10] + raw_lines[11:]
    path = _write(tmp_path, lines)
    with pytest.raises(SuiteError, match="exactly 3 prompts") as exc:
        load_suite(path)
    assert str(path) in str(exc.value) and tag in str(exc.value)


def test_rejects_tag_with_four_prompts(tmp_path, raw_lines):
    tag = json.loads(raw_lines[50])["tag"]
    extra = json.loads(raw_lines[50])
    extra.update(prompt_id=extra["prompt_id"][:-2] + "04", prompt=extra["prompt"] + " Seen at night.")
    path = _write(tmp_path, raw_lines + [json.dumps(extra, ensure_ascii=False)])
    with pytest.raises(SuiteError, match="exactly 3 prompts") as exc:
        load_suite(path)
    assert str(path) in str(exc.value) and tag in str(exc.value)


def test_rejects_missing_tag_of_a_category(tmp_path, raw_lines):
    tag = json.loads(raw_lines[0])["tag"]
    lines = [line for line in raw_lines if json.loads(line)["tag"] != tag]
    path = _write(tmp_path, lines)
    with pytest.raises(SuiteError, match="tags per category") as exc:
        load_suite(path)
    assert str(path) in str(exc.value)


def test_rejects_tag_split_across_subcategories(tmp_path, raw_lines):
    lines = _edit(raw_lines, 100, lambda o: o.update(subcategory=o["subcategory"] + " Extra"))
    path = _write(tmp_path, lines)
    with pytest.raises(SuiteError, match="several categories/subcategories") as exc:
        load_suite(path)
    assert str(path) in str(exc.value)


def _drop_question(o):
    del o["question"]


BAD_LINES = {
    "missing key": (_drop_question, "question"),
    "extra key": (lambda o: o.update(notes="draft"), "notes"),
    "bad difficulty": (lambda o: o.update(difficulty="expert"), "difficulty"),
    "not a question": (lambda o: o.update(question=o["question"].rstrip("?") + "."), "question"),
    "bad id": (lambda o: o.update(prompt_id="TR Signage 01"), "prompt_id"),
    "unknown category": (lambda o: o.update(category="Typography"), "category"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_rejects_malformed_line_naming_file_and_line(tmp_path, raw_lines, case):
    fn, field = BAD_LINES[case]
    lines = _edit(raw_lines, 41, fn)  # line 42 of the file
    path = _write(tmp_path, lines)
    with pytest.raises(SuiteError) as exc:
        load_suite(path)
    assert f"{path}:42:" in str(exc.value)
    assert field in str(exc.value)


def test_rejects_bad_json_line(tmp_path, raw_lines):
    lines = list(raw_lines)
    lines[119] = lines[119][:-5]  # truncated object on line 120
    path = _write(tmp_path, lines)
    with pytest.raises(SuiteError) as exc:
        load_suite(path)
    assert f"{path}:120:" in str(exc.value)


def test_rejects_missing_file(tmp_path):
    with pytest.raises(SuiteError, match="not found"):
        load_suite(tmp_path / "suite-nope.jsonl")


def test_parse_suite_reports_source(raw_lines):
    data = ("\n".join(raw_lines[:-1]) + "\n").encode()
    with pytest.raises(SuiteError, match=r"^my-source: "):
        parse_suite(data, "imagebench-v1", source="my-source")
