"""Great Expectations suites: each passes good data and fails bad data, naming the expectation."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from schemas.lake import TABLES
from tasks.lake.validation import EXPECTATIONS_DIR, SUITE_NAMES, ValidationFailed, require_valid, validate_table

NOW = datetime(2026, 11, 1, tzinfo=timezone.utc)
SHA = "0f" * 32
SID = "0123456789abcdef"


def image(pid, state="ok", **kw):
    row = dict(model_id="m1", prompt_id=pid, suite_version="v1", state=state, reason=None,
               object_uri=f"s3://b/models/m1/{pid}.png", image_sha256=SHA, image_path=f"images/{pid}.png",
               format="PNG", width=1024, height=768, source_mode="RGBA", byte_size=12345,
               source_fingerprint=SHA, ingested_at=NOW)
    if state == "quarantined":
        row.update(reason="truncated", image_path=None, format=None, width=None, height=None, source_mode=None)
    if state == "missing":
        row.update(object_uri=None, image_sha256=None, image_path=None, format=None, width=None, height=None,
                   source_mode=None, byte_size=None)
    row.update(kw)
    return row


def quarantine(uri, **kw):
    row = dict(model_id="m1", object_uri=uri, prompt_id="p-1", reason="not_decodable", detail="cannot identify image",
               byte_size=10, image_sha256=SHA, quarantined_at=NOW)
    row.update(kw)
    return row


def score(pid, **kw):
    row = dict(model_id="m1", prompt_id=pid, suite_version="v1", image_sha256=SHA, scorer_name="hpsv3",
               scorer_id=SID, checkpoint_sha256=SHA, mu=9.5, sigma=1.2, source="hpsv3", uncalibrated=False,
               scored_at=NOW)
    row.update(kw)
    return row


def model_score(model, **kw):
    row = dict(model_id=model, suite_version="v1", reference_version="v1", reference_sha256=SHA,
               scorer_name="hpsv3", scorer_id=SID, eps=51.5, eps_prompts_scored=164, eps_prompts_eligible=165,
               eps_prompts_lost=1, images_ok=191, images_quarantined=1, images_missing=0, complete=False,
               uncalibrated=False, source_fingerprint=SHA, run_id="run-1", scored_at=NOW,
               eps_lo=48.0, eps_hi=55.0, capability=40.0, capability_lo=33.0, capability_hi=47.0,
               verdicts_pass=76, verdicts_fail=114, verdicts_undecided=2, judge_coverage=190 / 192,
               overall=45.75, overall_lo=41.0, overall_hi=50.5, provisional=True)
    row.update(kw)
    return row


def table(name, rows):
    return pa.Table.from_pylist(rows, schema=TABLES[name])


GOOD = {
    "images": lambda: table("images", [image("p-1"), image("p-2", "quarantined"), image("p-3", "missing")]),
    "quarantine": lambda: table("quarantine", [quarantine("s3://b/x.png"), quarantine("s3://b/y.gif", prompt_id=None,
                                                                                    reason="bad_key", image_sha256=None)]),
    "hps_scores": lambda: table("hps_scores", [score("p-1"), score("p-2"), score("p-1", scorer_id="fedcba9876543210"),
                                               score("p-3", source="import", image_sha256=None, checkpoint_sha256=None)]),
    "model_scores": lambda: table("model_scores", [model_score("m1"), model_score("m2", eps=100.0, eps_prompts_lost=0,
                                                   eps_prompts_scored=165, images_ok=192, images_quarantined=0,
                                                   complete=True)]),
    "eps_reference": lambda: pd.DataFrame({"prompt_id": ["p-1", "p-2"], "mu_ref": [10.25, -3.5], "n_models": [5, 5]}),
}

# suite -> [(a row that breaks it, expectation expected in the message, a value expected in the message)].
# All broken rows of a suite are validated together (GX takes ~0.5 s per run); each row has its own
# key so that it breaks only its own expectation.
BAD = {
    "images": [
        (image("p-1", state="broken"), "expect_column_values_to_be_in_set(state", "broken"),
        (image("p-2", "quarantined", reason=None), "expect_column_values_to_not_be_null(reason) where state == 'quarantined'", "None"),
        (image("p-3", "quarantined", reason="cosmic_rays"), "expect_column_values_to_be_in_set(reason", "cosmic_rays"),
        (image("p-4"), "expect_compound_columns_to_be_unique", "'prompt_id': 'p-4'"),
        (image("p-4"), "expect_compound_columns_to_be_unique", "'prompt_id': 'p-4'"),
        (image("p-5", width=0), "expect_column_values_to_be_between(width", "[0"),
        (image("p-6", image_sha256="ABC"), "expect_column_values_to_match_regex(image_sha256", "ABC"),
        (image("p-7", height=None), "expect_column_values_to_not_be_null(height) where state == 'ok'", ""),
        (image("p-8", format="GIF"), "expect_column_values_to_be_in_set(format", "GIF"),
        (image("P_9"), "expect_column_values_to_match_regex(prompt_id", "P_9"),
    ],
    "quarantine": [
        (quarantine("u1", reason="because"), "expect_column_values_to_be_in_set(reason", "because"),
        (quarantine("u2", detail=""), "expect_column_value_lengths_to_be_between(detail", ""),
        (quarantine("u3"), "expect_compound_columns_to_be_unique", "'object_uri': 'u3'"),
        (quarantine("u3"), "expect_compound_columns_to_be_unique", "'object_uri': 'u3'"),
        (quarantine("u4", byte_size=-1), "expect_column_values_to_be_between(byte_size", "-1"),
    ],
    "hps_scores": [
        (score("p-1", mu=float("inf")), "expect_column_values_to_be_between(mu", "inf"),
        (score("p-2", mu=float("nan")), "expect_column_values_to_not_be_null(mu)", ""),
        (score("p-3"), "expect_compound_columns_to_be_unique", "'prompt_id': 'p-3'"),
        (score("p-3", mu=1.0), "expect_compound_columns_to_be_unique", "'prompt_id': 'p-3'"),
        (score("p-4", source="guess"), "expect_column_values_to_be_in_set(source", "guess"),
        (score("p-5", checkpoint_sha256=None), "expect_column_values_to_not_be_null(checkpoint_sha256) where source == 'hpsv3'", ""),
        (score("p-6", scorer_id="xyz"), "expect_column_values_to_match_regex(scorer_id", "xyz"),
    ],
    "model_scores": [
        (model_score("m1", eps=100.5), "expect_column_values_to_be_between(eps", "100.5"),
        (model_score("m2", eps=-1.0), "expect_column_values_to_be_between(eps", "-1.0"),
        (model_score("m3", images_missing=-2), "expect_column_values_to_be_between(images_missing", "-2"),
        (model_score("m4", eps_prompts_scored=200), "expect_column_pair_values_a_to_be_greater_than_b(eps_prompts_eligible, eps_prompts_scored", ""),
        (model_score("m5", complete=True, images_ok=192, images_quarantined=0), "expect_column_values_to_be_in_set(eps_prompts_lost", "[1]"),
        # complete: every suite prompt has an ok image (docs/LAKE.md), not only the eligible ones
        (model_score("m7", complete=True, eps_prompts_lost=0, eps_prompts_scored=165, images_ok=191, images_quarantined=0,
                     images_missing=1), "expect_column_values_to_be_in_set(images_missing", "[1]"),
        (model_score("m6"), "expect_compound_columns_to_be_unique", "'model_id': 'm6'"),
        (model_score("m6", eps=3.0), "expect_compound_columns_to_be_unique", "'model_id': 'm6'"),
    ],
}


# judge_calls and verdicts are exercised in tests/tasks/judges/test_expectations.py.
@pytest.mark.parametrize("suite", sorted(GOOD))
def test_good_data_passes(suite):
    report = require_valid(suite, GOOD[suite]())
    assert report.success and report.evaluated >= 5 and not report.failures


@pytest.mark.parametrize("suite", ["images", "quarantine", "hps_scores", "model_scores"])
def test_empty_tables_pass(suite):
    assert validate_table(suite, TABLES[suite].empty_table()).success


@pytest.mark.parametrize("suite", list(BAD))
def test_bad_data_fails_naming_the_expectation(suite):
    with pytest.raises(ValidationFailed) as ei:
        require_valid(suite, table(suite, [row for row, _, _ in BAD[suite]]))
    msg = str(ei.value)
    assert msg.startswith(f"suite {suite!r}")
    lines = msg.splitlines()[1:]
    for _, expectation, value in BAD[suite]:
        hits = [ln for ln in lines if expectation in ln]
        assert hits and any(value in ln for ln in hits), f"{expectation} / {value!r} not in:\n{msg}"
    # nothing else failed: every failure line is one of the expected ones
    expected = {e for _, e, _ in BAD[suite]}
    assert all(any(e in ln for e in expected) for ln in lines), msg
    assert not ei.value.report.success


def test_each_bad_row_alone_fails():
    """Each broken row fails on its own too (sampled: one per suite, to keep the run short)."""
    for suite, cases in BAD.items():
        row, expectation, _ = cases[0]
        report = validate_table(suite, table(suite, [row]))
        assert not report.success and expectation in report.summary()


def test_eps_reference_suite_fails_bad_prompt_tables():
    frame = pd.DataFrame({
        "prompt_id": ["p-1", "p-1", None, "p-4", "p-5", "p-6", "p-7"],
        "mu_ref": [1.0, 2.0, 3.0, float("nan"), -float("inf"), 1e9, 1.0],
        "n_models": [3, 3, 3, 3, 3, 3, 0],
    })
    with pytest.raises(ValidationFailed, match="suite 'eps_reference'") as ei:
        require_valid("eps_reference", frame)
    msg = str(ei.value)
    for expectation in (
        "expect_column_values_to_be_unique(prompt_id): 2 unexpected",
        "expect_column_values_to_not_be_null(prompt_id): 1 unexpected",
        "expect_column_values_to_not_be_null(mu_ref): 1 unexpected",
        "expect_column_values_to_be_between(mu_ref, min_value=-1000.0, max_value=1000.0): 2 unexpected, e.g. [-inf, 1000000000.0]",
        "expect_column_values_to_be_between(n_models, min_value=1.0): 1 unexpected, e.g. [0]",
    ):
        assert expectation in msg, msg
    empty = validate_table("eps_reference", pd.DataFrame({"prompt_id": [], "mu_ref": [], "n_models": []}))
    assert "expect_table_row_count_to_be_between" in empty.summary()
    no_col = validate_table("eps_reference", pd.DataFrame({"prompt_id": ["p-1"], "mu_ref": [1.0]}))
    assert "expect_table_columns_to_match_set" in no_col.summary() and "n_models" in no_col.summary()


def test_polars_and_arrow_inputs():
    good = GOOD["hps_scores"]()
    assert validate_table("hps_scores", pl.from_arrow(good)).success
    bad = pl.from_arrow(table("hps_scores", [score("p-1", source="guess")]))
    report = validate_table("hps_scores", bad)
    assert not report.success and report.failures[0].unexpected_sample == ("guess",)


def test_missing_column_reported():
    report = validate_table("hps_scores", GOOD["hps_scores"]().drop_columns(["mu"]))
    assert not report.success
    text = report.summary()
    assert "expect_table_columns_to_match_set" in text and "'missing': ['mu']" in text


def test_suite_files_are_complete_and_valid():
    files = sorted(p.stem for p in EXPECTATIONS_DIR.glob("*.json"))
    assert files == sorted(SUITE_NAMES)
    for name in SUITE_NAMES:
        data = json.loads((EXPECTATIONS_DIR / f"{name}.json").read_text())
        assert data["name"] == name and data["expectations"]
    # every column that the schema requires is checked for nulls
    for name, schema in TABLES.items():
        data = json.loads((EXPECTATIONS_DIR / f"{name}.json").read_text())
        checked = {e["kwargs"]["column"] for e in data["expectations"]
                   if e["type"] == "expect_column_values_to_not_be_null" and "row_condition" not in e["kwargs"]}
        assert checked == {f.name for f in schema if not f.nullable}, name


def test_unknown_suite():
    with pytest.raises(ValueError, match="unknown expectation suite"):
        validate_table("nope", pd.DataFrame())


def test_judge_calls_uniqueness_is_the_key_the_commit_deduplicates_on():
    from schemas.lake import JUDGE_CALLS_KEY

    data = json.loads((EXPECTATIONS_DIR / "judge_calls.json").read_text())
    (unique,) = [e["kwargs"]["column_list"] for e in data["expectations"] if e["type"] == "expect_compound_columns_to_be_unique"]
    assert tuple(unique) == JUDGE_CALLS_KEY
