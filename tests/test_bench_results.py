"""bench/RESULTS.md stays readable (issue 11): section (c) carries no per-process list."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _nightly_run(models: int) -> dict:
    return {
        "models": models, "ingested": 192 * models, "scored": 165 * models, "peak_kib": 1_000_000, "tree_peak_kib": 1_200_000,
        "max_ingest_concurrent": 1, "max_hps_concurrent": 1, "hps": {"busy_fraction": 0.9}, "wall_s": 60.0,
        "profile_kib": [200_000, 900_000],
        # What an older bench_memory recorded per process: it must not reach the page.
        "others": [("/venv/bin/python -m uvicorn", 240 * 1024)] + [("tesseract stdin stdout", 30 * 1024)] * 700,
    }  # fmt: skip


def test_section_c_lists_no_processes():
    sys.path.insert(0, str(BENCH))
    try:
        from bench_memory import markdown
    finally:
        sys.path.remove(str(BENCH))
    scorer = {"after_load_hwm_kib": 500_000, "peak_kib": 510_000, "score_wall_s": 10.0, "rss_trace": [(10, 500_000)]}
    res = {
        "nightly": [_nightly_run(1), _nightly_run(4), _nightly_run(12)], "nightly_ratio": 1.0, "nightly_ratio_4_12": 1.0,
        "scorer": {200: scorer, 2000: scorer}, "scorer_small": 200, "scorer_big": 2000,
        "scorer_growth_kib": (0, 0), "scorer_ratio": 1.0,
    }  # fmt: skip
    page = "\n".join(markdown(res))
    assert "| **ratio 12 / 1 model** |" in page  # the section itself is still written
    assert "tesseract" not in page and "Other processes in the tree" not in page
    section_c = BENCH.joinpath("RESULTS.md").read_text().split("## (c)")[1].split("\n## ")[0]
    assert "Other processes in the tree" not in section_c and "tesseract" not in section_c


def _bench_module(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))


def _import_run(models: int, total: float, cpu: float) -> dict:
    phases = {"phases": {"bootstrap": 3.0, "catalog refresh": 2.0}, "fsync_thread_s": 1.5, "start_s": 1.0, "total_s": total / 2}
    return {"models": models, "scores_s": total / 2, "verdicts_s": total / 2, "total_s": total, "cpu_s": cpu,
            "ms_per_row": 1000 * total / (384 * models), "others_cpu": 0.0,
            "phases": {"import-scores": phases, "import-verdicts": phases}}  # fmt: skip


def test_section_h_reports_new_over_old_and_over_the_floor_and_where_the_time_goes():
    bench_import = _bench_module("bench_import")
    old, new = _import_run(1000, 80.0, 90.0), _import_run(1000, 40.0, 45.0)
    res = {"prompts": 192, "old_models_n": 1000, "old": old, "new_same_n": new, "new": new,
           "ratio_old_over_new_per_row": 2.0, "ratio_new_over_old": 0.5, "same_rows_as_old": {"hps_scores": True},
           "rows_compared": {"hps_scores": 192000}, "floor": {"s": 2.0, "cpu_s": 2.5, "rows": 384000},
           "ratio_new_over_floor": 20.0, "refresh_s_full_lake": 0.4}  # fmt: skip
    page = "\n".join(bench_import.markdown(res))
    assert "now / before **0.50x** wall, 0.50x CPU at 1,000 models" in page
    assert "now / floor **20.0x** wall (18.0x CPU)" in page
    assert "| bootstrap | - | - | 3.0 | 3.0 |" not in page  # before and now both have phases: 4 cells
    assert "| bootstrap | 3.0 | 3.0 | 3.0 | 3.0 |" in page and "| os.fsync (thread-seconds) | 1.5 |" in page
    assert page.count("| now | 1,000 |") == 1  # the run at the same N is the big run: listed once


def test_section_i_nightly_reports_the_overhead_ratio_of_the_two_lakes():
    nightly_lake = _bench_module("bench_nightly_lake")
    run = lambda n, overhead, label: {  # noqa: E731
        "label": label, "lake_models": n, "files_in_lake": 4 * n, "total_s": 20.0 + overhead, "own_work_s": 20.0,
        "overhead_s": overhead, "stage_s": {"catalog": 1.0}, "wall_s": 40.0, "others": 0.0, "listing_ms": 2.0}
    runs = [run(100, 5.0, "100-new-0"), run(10000, 6.0, "10000-new-0"), run(100, 9.0, "100-before"), run(10000, 60.0, "10000-before")]
    res = {"small_n": 100, "big_n": 10000, "runs": runs, "ratio": 1.2, "overhead_big_s": 6.0,
           "best": {"new-100": runs[0], "new-10000": runs[1], "before-100": runs[2], "before-10000": runs[3]}}
    page = "\n".join(nightly_lake.markdown(res))
    assert "**6.0 s at 10,000 models vs 5.0 s at 100: ratio 1.20x**" in page
    assert "9.0 s and 60.0 s (6.67x)" in page


def test_section_j_reports_p99_on_both_stores_and_nothing_lost_or_doubled():
    """(j), issue 16: the panel load benchmark's section names both stores with their p99 and
    shows no answer lost or doubled, and its summary row is in the summary table."""
    import re

    text = BENCH.joinpath("RESULTS.md").read_text()
    section = text.split("## (j)")[1].split("\n## ")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| SQLite") or line.startswith("| PostgreSQL")]
    assert [r[0].split()[0] for r in rows] == ["SQLite", "PostgreSQL"]
    for store, recorded, lost, doubled, _codes, _rate, _p50, _p95, p99, _max, *_load in rows:
        got, expected = recorded.replace(",", "").split(" / ")
        assert got == expected and lost == "0" and doubled == "0", store
        assert re.fullmatch(r"\*\*\d+ ms\*\*", p99), p99
    assert "100 judges at once" in section
    summary = text.split("## Summary")[1].split("<!--")[0]
    assert "| (j) panel: p99 answer latency, 100 judges at once, PostgreSQL / SQLite |" in summary
