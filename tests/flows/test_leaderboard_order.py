"""The leaderboard lists models by the headline figure, with the rank band beside it (issue 26
item 5): a model with a wide interval (band 1-4) no longer sits above better-scored ones (band 3-4)."""

from __future__ import annotations

import json

import pyarrow as pa

from schemas.lake import MODEL_SCORES
from tests.flows.test_cli import invoke
from tests.tasks.test_lake import model_score

# model: (Overall, lo, hi). "noise" has the widest interval: nobody is above it beyond doubt (band
# 1-4) although three models score higher; "jpeg" has two models above it beyond doubt (band 3-4).
FIELD = {"top": (90.0, 88.0, 92.0), "second": (85.0, 83.0, 87.0), "jpeg": (75.0, 72.0, 78.0), "noise": (68.5, 50.0, 93.0)}


def _workspace(home, monkeypatch) -> None:
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.runs import pinned

    monkeypatch.setenv("IMAGEBENCH_HOME", str(home))
    settings = load_settings()
    suite = pinned.load_pinned_suite(settings)
    lake = Lake(settings.lake_dir)
    for m, (overall, lo, hi) in FIELD.items():
        row = model_score(m, overall, ref=settings.reference_version)
        row.update(suite_version=suite.version, overall=overall, overall_lo=lo, overall_hi=hi,
                   capability=overall, capability_lo=lo, capability_hi=hi)
        lake.write_partition("model_scores", m, pa.Table.from_pylist([row], schema=MODEL_SCORES))


def test_default_order_is_the_headline_figure_with_the_band_beside_it(tmp_path, monkeypatch):
    _workspace(tmp_path / "home", monkeypatch)
    monkeypatch.setenv("COLUMNS", "100")  # the width the table is made to fit (a narrower one folds cells)
    r = invoke("leaderboard", "--format", "json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [row["model_id"] for row in rows] == ["top", "second", "jpeg", "noise"]
    assert [(row["rank"], row["rank_worst"]) for row in rows] == [(1, 2), (2, 3), (3, 4), (1, 4)]
    table = invoke("leaderboard").stdout
    lines = [line for line in table.splitlines() if any(m in line for m in FIELD)]
    assert [next(m for m in FIELD if m in line) for line in lines] == ["top", "second", "jpeg", "noise"]
    noise = next(line for line in lines if "noise" in line)
    assert "1-4" in noise and "68.5 [50.0, 93.0]" in noise  # the band shown with the figure
    # The best-rank order stays one option away.
    by_rank = json.loads(invoke("leaderboard", "--sort", "rank", "--format", "json").stdout)
    assert [row["model_id"] for row in by_rank] == ["top", "noise", "second", "jpeg"]
