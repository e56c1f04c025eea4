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
