"""bench/RESULTS.md stays readable (issue 8, item 12): processes are summarised per program."""

from __future__ import annotations

import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_other_processes_are_summarised_per_program():
    sys.path.insert(0, str(BENCH))
    try:
        from bench_memory import summarise_processes
    finally:
        sys.path.remove(str(BENCH))
    others = [("/venv/bin/python -m uvicorn --app-dir x", 240 * 1024)] + [
        ("tesseract stdin stdout -l eng --psm 11", (30 + i % 5) * 1024) for i in range(1000)]
    assert summarise_processes(others) == ("Other processes in the tree (12-model run), by program: `uvicorn` 1 "
                                           "process, 240 MiB; `tesseract` 1,000 processes (short-lived), at most 34 MiB each.")
    section_c = BENCH.joinpath("RESULTS.md").read_text().split("## (c)")[1].split("\n## ")[0]
    assert all(len(re.findall(r"`tesseract", line)) <= 1 for line in section_c.splitlines())
