"""The frozen reference: create-once, pinned, verified; tamper, scorer and suite checks."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import polars as pl
import pytest

from schemas.reference import ReferenceFile, ScorerIdentity
from tasks.scores.reference import (
    BaselineIncomplete,
    ReferenceError,
    ReferenceExists,
    ReferenceInvalid,
    ReferenceMissing,
    ReferenceTampered,
    ScorerMismatch,
    SuiteMismatch,
    SuiteTampered,
    build_reference,
    canonical_json,
    load_reference_mu,
    pin_suite,
    read_sha256sums,
    verify_reference,
    verify_suite,
)
from tasks.scores.eps import eps
from tasks.scores.suite import parse_suite

SCORER = ScorerIdentity(scorer_name="hpsv3", source="hpsv3", checkpoint_sha256="c" * 64,
                        base_model="Qwen/Qwen2-VL-7B-Instruct")
OTHER = ScorerIdentity(scorer_name="hpsv3", source="hpsv3", checkpoint_sha256="d" * 64,
                       base_model="Qwen/Qwen2-VL-7B-Instruct")
CREATED = "2026-11-25T00:00:00Z"


def _prompt(pid, cat, sub, elig):
    return {"prompt_id": pid, "category": cat, "subcategory": sub, "tag": sub.lower(), "difficulty": "medium",
            "prompt": f"a careful picture of {pid}", "question": f"Does it show {pid}?", "eps_eligible": elig}


SUITE_ROWS = [
    _prompt("tr-1", "Text Rendering", "Signs", False),
    _prompt("sr-1", "Spatial Reasoning", "Counting", True),
    _prompt("sr-2", "Spatial Reasoning", "Counting", True),
    _prompt("gd-1", "Graphical Design", "Layout & Design", False),
    _prompt("gd-2", "Graphical Design", "Illustration", True),
]


def suite_bytes(rows=SUITE_ROWS) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture
def refdir(tmp_path):
    d = tmp_path / "reference"
    d.mkdir()
    (d / "suite-t1.jsonl").write_bytes(suite_bytes())
    return d


@pytest.fixture
def suite():
    return parse_suite(suite_bytes(), "t1", check_shape=False)


BASE = {
    "b1": {"sr-1": 1.0, "sr-2": 4.0, "gd-2": -1.0, "tr-1": 50.0},
    "b2": {"sr-1": 2.0, "sr-2": 5.0, "gd-2": -2.0},
    "b3": {"sr-1": 3.0, "sr-2": 7.0, "gd-2": -4.0},
    "b4": {"sr-1": 10.0, "sr-2": 8.0, "gd-2": 0.0},
}


def scores(data=BASE, scorer_id=None):
    sid = scorer_id or SCORER.scorer_id
    rows = [{"model_id": m, "prompt_id": p, "mu": v, "scorer_id": sid} for m, d in data.items() for p, v in d.items()]
    return pl.DataFrame(rows)


def build(refdir, suite, version="v1", baseline=("b1", "b2", "b3", "b4"), data=BASE, **kw):
    return build_reference(version=version, baseline_models=list(baseline), scores=kw.pop("scores", scores(data)),
                           suite=suite, scorer=kw.pop("scorer", SCORER), reference_dir=refdir, created_at=CREATED, **kw)


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_build_writes_canonical_pinned_readonly_file(refdir, suite):
    path = build(refdir, suite)
    assert path == refdir / "eps-reference-v1.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o444
    raw = path.read_bytes()
    assert raw.endswith(b"}\n") and raw.startswith(b'{\n "baseline_models"')  # sorted keys, indent 1
    ref = ReferenceFile.model_validate_json(raw)
    assert canonical_json(ref) == raw
    # medians of 4 models: mean of the two middle values
    assert load_reference_mu(ref) == {"sr-1": 2.5, "sr-2": 6.0, "gd-2": -1.5}
    assert [p.prompt_id for p in ref.prompts] == list(suite.eligible_ids)
    assert {p.n_models for p in ref.prompts} == {4}
    assert ref.scorer == SCORER and ref.scorer_id == SCORER.scorer_id
    assert (ref.suite.version, ref.suite.sha256) == ("t1", suite.sha256)
    assert (refdir / "SHA256SUMS").read_text() == f"{sha(path)}  eps-reference-v1.json\n"
    assert sorted(p.name for p in refdir.iterdir()) == ["SHA256SUMS", "eps-reference-v1.json", "suite-t1.jsonl"]
    assert verify_reference(refdir, "v1", suite, SCORER.scorer_id) == ref


def test_second_build_of_same_version_refused_bytes_untouched(refdir, suite):
    path = build(refdir, suite)
    before, sums_before = sha(path), (refdir / "SHA256SUMS").read_bytes()
    changed = {m: {p: v + 1 for p, v in d.items()} for m, d in BASE.items()}
    with pytest.raises(ReferenceExists, match="immutable.*new version"):
        build(refdir, suite, data=changed)
    assert sha(path) == before and (refdir / "SHA256SUMS").read_bytes() == sums_before
    # a new version is the way to change it; both coexist and are pinned
    path2 = build(refdir, suite, version="v2", data=changed)
    assert read_sha256sums(refdir) == {"eps-reference-v1.json": before, "eps-reference-v2.json": sha(path2)}


def test_build_refused_when_sums_already_names_the_file(refdir, suite):
    (refdir / "SHA256SUMS").write_text(f"{'0' * 64}  eps-reference-v1.json\n")
    with pytest.raises(ReferenceExists, match="already pins eps-reference-v1.json"):
        build(refdir, suite)
    assert not (refdir / "eps-reference-v1.json").exists()


def test_link_race_refused(refdir, suite, monkeypatch):
    """If another builder creates the file between the check and the link, os.link refuses."""
    import tasks.scores.reference as mod

    real_link = os.link

    def racing_link(src, dst):
        with open(dst, "w") as fh:
            fh.write("the other builder's bytes")
        return real_link(src, dst)

    monkeypatch.setattr(mod.os, "link", racing_link)
    with pytest.raises(ReferenceExists):
        build(refdir, suite)
    assert (refdir / "eps-reference-v1.json").read_text() == "the other builder's bytes"
    assert not (refdir / "SHA256SUMS").read_text()  # nothing pinned
    assert not [p for p in refdir.iterdir() if p.name.endswith(".tmp")]


def test_tampering_detected(refdir, suite):
    path = build(refdir, suite)
    data = json.loads(path.read_text())
    data["prompts"][0]["mu_ref"] += 0.01
    os.chmod(path, 0o644)
    path.write_text(json.dumps(data, sort_keys=True, indent=1) + "\n")
    with pytest.raises(ReferenceTampered) as ei:
        verify_reference(refdir, "v1", suite)
    msg = str(ei.value)
    pinned = (refdir / "SHA256SUMS").read_text().split()[0]
    assert "eps-reference-v1.json" in msg and pinned in msg and sha(path) in msg
    # A reference outside the checkout's reference/ is not under version control (issue 8, item 12).
    assert "Restore the file from version control" not in msg
    assert "restore the file from where this reference was published or backed up" in msg


def test_tampered_demo_reference_says_how_to_rebuild_it(refdir, suite):
    path = build(refdir, suite, version="demo")
    os.chmod(path, 0o644)
    path.write_text(path.read_text().replace('"mu_ref": ', '"mu_ref": 1', 1))
    with pytest.raises(ReferenceTampered) as ei:
        verify_reference(refdir, "demo", suite)
    msg = str(ei.value)
    assert "Restore the file from version control" not in msg
    assert "the demo's reference" in msg and f"delete {refdir} and run `make demo` again" in msg


def test_unpinned_reference_is_not_trusted(refdir, suite):
    build(refdir, suite)
    (refdir / "SHA256SUMS").write_text("")
    with pytest.raises(ReferenceTampered, match="not pinned"):
        verify_reference(refdir, "v1", suite)


def test_missing_reference_says_how_to_build(refdir, suite):
    with pytest.raises(ReferenceMissing, match="imagebench reference build --version v9"):
        verify_reference(refdir, "v9", suite)


def test_scorer_mismatch_refused_at_build(refdir, suite):
    mixed = pl.concat([scores(), scores({"b5": {"sr-1": 1.0}}, scorer_id=OTHER.scorer_id)])
    with pytest.raises(ScorerMismatch, match=OTHER.scorer_id):
        build(refdir, suite, scores=mixed)
    assert not (refdir / "eps-reference-v1.json").exists()


def test_scorer_mismatch_refused_at_verify(refdir, suite):
    build(refdir, suite)
    with pytest.raises(ScorerMismatch) as ei:
        verify_reference(refdir, "v1", suite, OTHER.scorer_id)
    assert SCORER.scorer_id in str(ei.value) and OTHER.scorer_id in str(ei.value)
    with pytest.raises(ScorerMismatch, match=r"checkpoint_sha256: reference 'c{64}' vs scorer 'd{64}'"):
        verify_reference(refdir, "v1", suite, expected_scorer=OTHER)
    assert verify_reference(refdir, "v1", suite, expected_scorer=SCORER).version == "v1"


def test_missing_baseline_coverage_refused_naming_model(refdir, suite):
    partial = {**BASE, "b3": {"sr-1": 3.0}}
    with pytest.raises(BaselineIncomplete, match=r"'b3' lacks 2 of 3 eligible prompts.*sr-2"):
        build(refdir, suite, data=partial)
    with pytest.raises(BaselineIncomplete, match="'b9' lacks 3 of 3"):
        build(refdir, suite, baseline=("b1", "b9"))
    assert not (refdir / "eps-reference-v1.json").exists() and not (refdir / "SHA256SUMS").exists()


def test_bad_versions_refused(refdir, suite):
    for bad in ("v1\n", "", "../v1", "v 1", "-v1", "x" * 65):
        with pytest.raises(ValueError, match="invalid reference version"):
            build(refdir, suite, version=bad)


def test_insane_mu_fails_the_expectation_suite(refdir, suite):
    huge = {m: {p: v * 1e6 for p, v in d.items()} for m, d in BASE.items()}
    with pytest.raises(ReferenceInvalid, match="expect_column_values_to_be_between"):
        build(refdir, suite, data=huge)
    assert not (refdir / "eps-reference-v1.json").exists()


def test_reference_for_another_suite_refused(refdir, suite):
    build(refdir, suite)
    other_rows = [*SUITE_ROWS, _prompt("sr-3", "Spatial Reasoning", "Counting", True)]
    other = parse_suite(suite_bytes(other_rows), "t1", check_shape=False)
    with pytest.raises(SuiteMismatch, match="built for suite t1"):
        verify_reference(refdir, "v1", other)


def test_suite_pin_and_tamper(refdir, suite):
    path = refdir / "suite-t1.jsonl"
    digest = pin_suite(refdir, path)
    assert digest == suite.sha256
    assert pin_suite(refdir, path) == digest  # idempotent
    assert (refdir / "SHA256SUMS").read_text().count("suite-t1.jsonl") == 1
    verify_suite(refdir, suite)
    path.write_bytes(path.read_bytes().replace(b"careful", b"sloppy"))
    with pytest.raises(SuiteTampered, match="does not match the pinned"):
        verify_suite(refdir, suite)  # the file on disk changed
    edited = parse_suite(path.read_bytes(), "t1", check_shape=False)
    with pytest.raises(SuiteTampered, match="does not match the pinned"):
        verify_suite(refdir, edited)
    with pytest.raises(SuiteTampered, match="immutable"):
        pin_suite(refdir, path)
    unpinned = parse_suite(suite_bytes(), "t2", check_shape=False)
    with pytest.raises(SuiteTampered, match="not pinned"):
        verify_suite(refdir, unpinned)


def test_sums_file_is_sha256sum_compatible(refdir, suite):
    import shutil
    import subprocess

    pin_suite(refdir, refdir / "suite-t1.jsonl")
    build(refdir, suite)
    if shutil.which("sha256sum") is None:
        pytest.skip("no sha256sum binary")
    out = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=refdir, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_errors_share_a_base_class():
    for cls in (ReferenceExists, ReferenceMissing, ReferenceTampered, ReferenceInvalid, SuiteMismatch,
                SuiteTampered, ScorerMismatch, BaselineIncomplete):
        assert issubclass(cls, ReferenceError) and issubclass(cls, RuntimeError)


def test_eps_against_built_reference(refdir, suite):
    ref = verify_reference(refdir, "v1", suite) if (refdir / "eps-reference-v1.json").exists() else None
    assert ref is None
    build(refdir, suite)
    mu_ref = load_reference_mu(verify_reference(refdir, "v1", suite))
    r = eps(mu_ref, mu_ref, suite.eligible_ids)
    assert r.eps == 50.0 and r.prompts_eligible == 3
