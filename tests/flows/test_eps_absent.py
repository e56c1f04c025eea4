"""EPS with nothing behind it is absent, never 0 (the bar "absent is never 0").

A model whose images are all for prompts that are not EPS-eligible (Text Rendering) has no HPSv3 mu
on any eligible prompt: its lost images would each count 0, and the leaderboard used to publish
``eps 0.0 [0.0, 2.3]`` and an Overall from that 0. As Capability with no judged verdict, EPS with no
eligible prompt scored is no figure: null in the lake and JSON, empty in CSV, the absent mark in the
tables and pages, no Overall and no rank band. A model with at least one eligible prompt scored keeps
the documented rule (a lost image counts 0), and a breakdown group with no eligible prompt scored
has no EPS either. Real `imagebench score` runs on a reference built by a real flow run."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from typer.testing import CliRunner

from tests.flows.conftest import put_model

pytestmark = pytest.mark.slow

TEXT_ONLY = "text-only"  # images only for non-eligible prompts
ONE_ELIGIBLE = "one-eligible"  # one eligible prompt scored, the rest of the eligible ones lost


def invoke(*args: str) -> str:
    from flows.cli import app

    r = CliRunner().invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "240"})
    assert r.exit_code == 0, r.output
    return r.stdout


def test_a_model_with_no_eligible_prompt_scored_has_no_eps_overall_or_band(built_reference):
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.runs import pinned
    from tasks.scores.display import ABSENT, interval

    home, objects, _ = built_reference
    settings = load_settings()
    suite = pinned.load_pinned_suite(settings)
    not_eligible = [p.prompt_id for p in suite.prompts if not p.eps_eligible]
    eligible = [p.prompt_id for p in suite.prompts if p.eps_eligible]
    assert not_eligible and len(eligible) > 1
    put_model(objects, TEXT_ONLY, not_eligible, seed=7)
    put_model(objects, ONE_ELIGIBLE, [eligible[0], *not_eligible], seed=8)
    invoke("score", "--model", TEXT_ONLY)
    invoke("score", "--model", ONE_ELIGIBLE)

    # The lake: null, not 0.
    row = Lake(settings.lake_dir).read("model_scores", [TEXT_ONLY]).to_pylist()[-1]
    assert row["eps_prompts_scored"] == 0 and row["eps_prompts_lost"] == len(eligible)
    assert (row["eps"], row["eps_lo"], row["eps_hi"]) == (None, None, None)
    assert (row["overall"], row["overall_lo"], row["overall_hi"]) == (None, None, None)

    board = {r["model_id"]: r for r in json.loads(invoke("leaderboard", "--format", "json"))}
    text = board[TEXT_ONLY]
    assert (text["eps"], text["eps_lo"], text["eps_hi"]) == (None, None, None)
    assert (text["overall"], text["overall_lo"], text["overall_hi"]) == (None, None, None)
    assert (text["rank"], text["rank_worst"]) == (None, None)  # nothing to rank it on
    # One eligible prompt scored: the documented rule stands, its lost images count 0.
    one = board[ONE_ELIGIBLE]
    assert one["eps_prompts_scored"] == 1 and one["eps"] is not None
    assert 0.0 < one["eps"] <= 100.0 / len(eligible) + 1e-9
    assert one["eps_lo"] is not None and one["eps_hi"] is not None and one["rank"] is not None
    # The other models are ranked among themselves, the bands unaffected by a model without a figure.
    ranked = [r for r in board.values() if r["model_id"] != TEXT_ONLY]
    assert all(1 <= r["rank"] <= r["rank_worst"] <= len(ranked) for r in ranked)
    assert list(board)[-1] == TEXT_ONLY  # listed last, not as the worst figure

    cells = {r["model_id"]: r for r in csv.DictReader(io.StringIO(invoke("leaderboard", "--format", "csv")))}
    assert cells[TEXT_ONLY]["eps"] == cells[TEXT_ONLY]["eps_lo"] == cells[TEXT_ONLY]["overall"] == ""

    line = next(x for x in invoke("leaderboard", "--wide").splitlines() if TEXT_ONLY in x)
    band, model, overall, capability, eps = re.split(r"\s{2,}", line.strip())[:5]
    assert model == TEXT_ONLY and (band, overall, eps) == (ABSENT, ABSENT, ABSENT), line  # not "0.0 [0.0, 2.3]"
    assert capability == interval(text["capability"], text["capability_lo"], text["capability_hi"])  # its own figure

    # breakdown: every group of the model, and its total, has no EPS.
    groups = json.loads(invoke("breakdown", "--model", TEXT_ONLY, "--format", "json"))
    assert groups and all(g["eps"] is None for g in groups), groups
    # ONE_ELIGIBLE: its group with the scored prompt has an EPS; a group whose eligible prompts
    # were all lost has none, though the model's EPS counts them 0.
    by_cat = {g["category"]: g for g in json.loads(invoke("breakdown", "--model", ONE_ELIGIBLE, "--format", "json"))}
    scored_cat = suite.by_id[eligible[0]].category
    assert by_cat[scored_cat]["eps"] is not None and by_cat[scored_cat]["eps"] > 0.0
    lost_cats = {suite.by_id[p].category for p in eligible} - {scored_cat}
    assert lost_cats and all(by_cat[c]["eps"] is None for c in lost_cats)
    assert all(by_cat[c]["eps_prompts"] > 0 for c in lost_cats)

    # The static site: no 0.0 EPS for the model, the absent mark instead.
    out = home.parent / "site"
    invoke("report", "--out", str(out))
    page = next(p for p in out.rglob("*.html") if TEXT_ONLY in p.name)
    html = page.read_text(encoding="utf-8")
    assert f"<dt>EPS</dt><dd>{ABSENT}</dd>" in html and f"<dt>Overall</dt><dd>{ABSENT}</dd>" in html
    site_row = next(r for r in json.loads((out / "leaderboard.json").read_text())["rows"] if r["model_id"] == TEXT_ONLY)
    assert (site_row["eps"], site_row["overall"], site_row["rank"]) == (None, None, None)
