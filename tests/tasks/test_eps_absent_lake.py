"""EPS absent (null) in the lake: the math, the schema, the expectation suite, and a lake written
before EPS could be null (the bar "absent is never 0"; docs/STATISTICS.md section 2).

The schema's nullability is part of a table's identity for the compacted copy (tasks/lake/compact.py
fingerprints the schema): a lake compacted when `eps` was required must still read, and rank,
after the change, beside a new row whose `eps` is null."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from schemas import lake as lake_schemas
from tasks.lake import tables as lake_tables
from tasks.lake.tables import Lake, query, refresh_catalog
from tests.tasks.test_lake import model_score, small_suite


def test_eps_with_no_eligible_prompt_scored_is_nan_and_lost_images_count_0_beside_one_scored():
    from tasks.scores import stats
    from tasks.scores.eps import eps

    ids = ["a", "b", "c", "d"]
    ref = dict.fromkeys(ids, 0.0)
    none = eps({"x": 1.0}, ref, ids)  # "x": a non-eligible prompt
    assert math.isnan(none.eps) and none.prompts_scored == 0 and none.prompts_lost == 4
    one = eps({"a": 0.0}, ref, ids)
    assert one.eps == pytest.approx(100 * 0.5 / 4)  # the lost three count 0

    prompts = [*ids, "x"]
    elig = [True, True, True, True, False]
    contrib_none = stats.eps_contributions({"x": 1.0}, ref, prompts, ids)
    assert np.isnan(contrib_none).all()
    contrib_one = stats.eps_contributions({"a": 0.0}, ref, prompts, ids)
    assert contrib_one[:4].tolist() == [0.5, 0.0, 0.0, 0.0]
    cis = stats.bootstrap_scores(["none", "one"], [["PASS"] * 5, ["PASS"] * 5], [contrib_none, contrib_one], elig,
                                 n_resamples=200)
    assert math.isnan(cis["none"].estimate.eps) and math.isnan(cis["none"].estimate.overall)
    assert all(math.isnan(x) for x in (*cis["none"].eps, *cis["none"].overall))
    assert cis["none"].estimate.capability == 100.0  # Capability is its own figure
    assert cis["one"].estimate.eps == pytest.approx(12.5) and not math.isnan(cis["one"].eps[0])
    with pytest.raises(ValueError, match="eps is undefined for A"):
        stats.compare(contrib_none, contrib_one, axis="eps", eligible=elig, n_resamples=50)
    # A row NaN on only some eligible prompts is still refused: a lost image is 0.0.
    with pytest.raises(ValueError, match="a lost image contributes 0.0"):
        stats.bootstrap_scores(["m"], [["PASS"] * 5], [[0.5, math.nan, 0.0, 0.0, math.nan]], elig)


def test_group_eps_is_absent_without_a_scored_eligible_prompt():
    from tasks.scores.breakdown import group_eps

    contributions = [0.5, 0.0, 0.0, math.nan]
    scored = [True, False, False, False]
    assert group_eps(contributions, scored, [0, 1]) == pytest.approx(25.0)
    assert group_eps(contributions, scored, [1, 2]) is None  # all lost: no figure, not 0
    assert group_eps(contributions, scored, []) is None


def _no_eps_row(model: str) -> dict:
    row = model_score(model, 0.0, lost=3)
    row.update(eps=None, eps_lo=None, eps_hi=None, eps_prompts_scored=0, overall=None, overall_lo=None, overall_hi=None)
    return row


def test_the_expectation_suite_wants_eps_null_exactly_when_nothing_was_scored():
    from tasks.lake.validation import validate_table

    rows = [model_score("ok", 40.0), _no_eps_row("none")]
    assert validate_table("model_scores", pa.Table.from_pylist(rows, schema=lake_schemas.MODEL_SCORES)).success
    zero = _no_eps_row("zero")
    zero.update(eps=0.0, eps_lo=0.0, eps_hi=2.28)  # the old figure: 0 with nothing behind it
    report = validate_table("model_scores", pa.Table.from_pylist([zero], schema=lake_schemas.MODEL_SCORES))
    assert not report.success and "expect_column_values_to_be_null(eps) where eps_prompts_scored == 0" in report.summary()
    lost = model_score("lost", 40.0)
    lost.update(eps=None)  # something scored: EPS must be a figure
    report = validate_table("model_scores", pa.Table.from_pylist([lost], schema=lake_schemas.MODEL_SCORES))
    assert not report.success and "expect_column_values_to_not_be_null(eps) where eps_prompts_scored > 0" in report.summary()


def test_a_lake_written_when_eps_was_required_reads_and_ranks_beside_a_null_eps(tmp_path, monkeypatch):
    old = pa.schema([f.with_nullable(False) if f.name in ("eps", "eps_lo", "eps_hi") else f
                     for f in lake_schemas.MODEL_SCORES]).with_metadata(lake_schemas.MODEL_SCORES.metadata)
    assert not old.equals(lake_schemas.MODEL_SCORES)  # nullability is part of the schema's identity
    root, cat = tmp_path / "lake", tmp_path / "ib.duckdb"
    with monkeypatch.context() as mp:  # the lake as the previous release wrote and compacted it
        mp.setitem(lake_schemas.TABLES, "model_scores", old)
        mp.setitem(lake_tables.COMPACTED_TABLES, "model_scores", old)
        lake = Lake(root)
        for m, e in (("old-a", 60.0), ("old-b", 30.0)):
            lake.write_partition("model_scores", m, pa.Table.from_pylist([model_score(m, e, ref="r1")], schema=old))
        refresh_catalog(root, cat, small_suite(), "r1")
        assert [r[0] for r in query(cat, "SELECT model_id FROM leaderboard")[1]] == ["old-a", "old-b"]

    lake = Lake(root)  # today's schema: eps nullable
    assert lake.read("model_scores", ["old-a"]).schema == lake_schemas.MODEL_SCORES
    lake.write_partition("model_scores", "new-none", pa.Table.from_pylist([_no_eps_row("new-none")],
                                                                          schema=lake_schemas.MODEL_SCORES))
    got = {r["model_id"]: r for r in lake.read("model_scores").to_pylist()}
    assert got["old-a"]["eps"] == 60.0 and got["new-none"]["eps"] is None
    refresh_catalog(root, cat, small_suite(), "r1")  # not --full: the compacted copy of the old schema
    cols, rows = query(cat, "SELECT model_id, eps, eps_lo, overall, rank, rank_worst FROM leaderboard")
    board = [dict(zip(cols, r)) for r in rows]
    assert [r["model_id"] for r in board] == ["old-a", "old-b", "new-none"]
    assert [(r["rank"], r["rank_worst"]) for r in board] == [(1, 1), (2, 2), (None, None)]
    assert (board[2]["eps"], board[2]["eps_lo"], board[2]["overall"]) == (None, None, None)
