"""Absent is never 0 (issue 25 item 6): a collection of photographs only, and an eval.py run that
asked the combined prompt alone (``--prompt-type pick_best_and_worst``). Nothing was asked about
best alone or worst alone, and no task is a fine-art or an illustration one: those figures are
absent (JSON null, '-' / '–' in the tables, on the page and in the catalog's view), never 0.0, and
what the same trials give agrees between `vab summarize`, `vab leaderboard` and the page."""

from __future__ import annotations

import json

import pytest

from schemas.settings import load_settings
from tests.vab.test_official import FIX, _invoke, home, write_release  # noqa: F401 (home: a fixture)

PHOTOS = ("vab-0001", "vab-0004", "vab-0007", "vab-0008")


@pytest.fixture
def combined(home, tmp_path):  # noqa: F811
    tasks = [t for t in json.loads((FIX / "tasks.json").read_text()) if t["task_id"] in PHOTOS]
    assert {t["domain"] for t in tasks} == {"photograph"}
    assert _invoke("vab", "import-sets", write_release(tmp_path / "release", tasks), "--name", "photos").exit_code == 0
    one = json.loads((FIX / "results" / "judge-one.json").read_text())
    rows = [r for r in one["results"] if r["task_id"] in PHOTOS and r["prompt_type"] == "pick_best_and_worst" and "derived_from" not in r]
    assert rows and all(r["n_images"] >= 3 for r in rows)  # eval.py asks it of 3+ images; 2-image rows come from pick_best
    results = tmp_path / "combined.json"
    results.write_text(json.dumps({"metadata": {**one["metadata"], "model": "org/combined"}, "summary": {}, "results": rows}))
    r = _invoke("vab", "import-results", results, "--sets", "photos")
    assert r.exit_code == 0, r.output
    return load_settings()


def test_a_combined_prompt_run_has_no_best_or_worst_figure(combined) -> None:
    board = json.loads(_invoke("vab", "leaderboard", "--sets", "photos", "--format", "json").stdout)
    (b,) = board
    assert b["strict_both"] is not None and b["single_both"] is not None
    assert (b["strict_best"], b["strict_worst"], b["single_best"], b["single_worst"]) == (None, None, None, None)
    table = _invoke("vab", "leaderboard", "--sets", "photos", "--format", "csv").stdout.splitlines()
    row = dict(zip(table[0].split(","), table[1].split(",")))
    assert row["strict_best"] == row["strict_worst"] == ""  # CSV: empty, never 0.0
    from typer.testing import CliRunner

    from flows.cli import app

    text = CliRunner().invoke(app, ["vab", "leaderboard", "--sets", "photos"], env={"COLUMNS": "250"}).stdout
    head, line = (next(ln for ln in text.splitlines() if key in ln) for key in ("strict best", "combined"))
    cells = dict(zip((c.strip() for c in head.split("┃")), (c.strip() for c in line.split("│"))))
    assert (cells["strict best"], cells["strict worst"]) == ("–", "–") and cells["strict both, 3 trials [95% Wilson]"] != "–", text
    # vab summarize: no pick_best answer behind top-1, no fine-art or illustration task: absent
    s = json.loads(_invoke("vab", "summarize", "--sets", "photos", "--format", "json").stdout)["combined"]
    assert s["pick_best"] == {"accuracy": None} and s["avg_pass_at_1"]["pick_best"] is None
    assert s["by_domain"]["fine-art"] == s["by_domain"]["illustration"] == {"pick_best": None, "pick_best_and_worst_both": None}
    assert s["by_domain"]["photograph"]["pick_best"] is None
    summary = _invoke("vab", "summarize", "--sets", "photos").stdout
    overall = next(ln for ln in summary.splitlines() if ln.startswith("   combined "))
    cells = [c.strip() for c in overall.split("|")]
    assert cells[1] == "-" and cells[2] == "-" and cells[3] != "-", overall  # top1, bot1 absent; tb1 there
    assert "0.0%" not in summary.split("By Domain (top1)")[1].split("By Domain (bot1)")[0].split("combined")[1].splitlines()[0]
    # the same trials, the same figures: the page's p^3 best of pick_best_and_worst is summarize.py's accuracy_best
    from tasks.lake.tables import Lake
    from tasks.report.vab import page_context
    from tasks.vab.sets import load_sets
    from tasks.vab.tables import read_partition

    settings = combined
    tasks = load_sets(settings, "photos")
    ctx = page_context("photos", tasks, read_partition(Lake(settings.lake_dir), "vab_trials", "photos"), None, n_resamples=50)
    official = [r for r in ctx["official"] if r["judge"] == "combined"]
    assert [r["prompt_type"] for r in official] == ["pick_best_and_worst"]  # no pick_best row at 0
    assert official[0]["p3_best"] == f"{100 * s['pick_best_and_worst']['accuracy_best']:.1f}"
    assert official[0]["p3_both"] == f"{100 * s['pick_best_and_worst']['accuracy_both']:.1f}"
    (ours,) = [r for r in ctx["rows"] if r["judge"] == "combined"]
    assert (ours["best"], ours["worst"]) == ("–", "–") and ours["both"] != "–"


def test_by_domain_lists_the_collections_domains_only(combined) -> None:
    rows = json.loads(_invoke("vab", "leaderboard", "--sets", "photos", "--by", "domain", "--format", "json").stdout)
    assert [r["domain"] for r in rows] == ["photography"]
    assert rows[0]["strict_best"] is None and rows[0]["strict_both"] is not None


def test_the_catalog_view_has_no_zero_for_what_was_never_asked(combined) -> None:
    from pathlib import Path

    from tasks.lake.tables import query, refresh_catalog
    from tasks.scores.suite import load_suite

    suite = load_suite(Path(__file__).resolve().parents[2] / "reference" / "suite-imagebench-v1.jsonl")
    catalog = refresh_catalog(combined.lake_dir, combined.catalog_path, suite, "test")
    _, rows = query(catalog, "SELECT strict_best, strict_worst, strict_both, tasks FROM vab_leaderboard WHERE sets = 'photos'")
    board = json.loads(_invoke("vab", "leaderboard", "--sets", "photos", "--format", "json").stdout)[0]
    assert rows == [(None, None, pytest.approx(board["strict_both"]), 4)]
