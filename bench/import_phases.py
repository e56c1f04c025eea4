"""Run one `imagebench` command in this process and write where its time went (bench (h)).

    import_phases.py OUT.json import-scores FILE --scorer NAME

Wraps, before the command runs, the functions an import spends its time in and sums the wall
seconds spent inside each (outermost calls only: a function called from another wrapped one is
counted in both; see the markdown of bench_import.py for which contains which), plus the
thread-seconds inside ``os.fsync`` (the writes run on 8 threads: fsync seconds overlap each other).
A function the tree under test does not have is skipped. Run with PYTHONPATH = the tree under test.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
import time
from pathlib import Path

# (module, function) -> label; each function under its module in this layout (tasks/ by area) and in
# the flat layout before it (a baseline tree): the one the tree under test has is wrapped.
PHASES = {
    ("tasks.lake.imports", "_read_any"): "read the file",
    ("tasks.lake.imports", "parse_scores"): "parse + check rows",
    ("tasks.lake.imports", "parse_verdicts"): "parse + check rows",
    ("tasks.lake.imports", "_check_all"): "validation (Great Expectations) of the new rows",
    ("tasks.runs.units_aggregate", "for_each_model"): "write partitions (8 threads)",
    ("tasks.runs.units_aggregate", "aggregate_models"): "aggregate (EPS, Capability, intervals)",
    ("tasks.runs.units_aggregate", "read_models"): "read partitions back",
    ("tasks.scores.stats", "bootstrap_scores"): "bootstrap",
    ("tasks.lake.validation", "require_valid"): "validation (all Great Expectations calls)",
    ("tasks.runs.units_aggregate", "refresh"): "catalog refresh",
}
FLAT_LAYOUT = {  # module in this layout -> the same module before issue 19
    "tasks.lake.imports": "tasks.imports", "tasks.runs.units_aggregate": "tasks.work", "tasks.scores.stats": "tasks.stats",
    "tasks.lake.validation": "tasks.validation",
}


def main(argv: list[str]) -> int:
    import importlib

    t0 = time.perf_counter()
    out = Path(argv[0])
    acc: dict[str, float] = {}
    lock = threading.Lock()
    fsync_s = [0.0]

    def wrap(module, name: str, label: str) -> None:
        f = getattr(module, name, None)
        if f is None:
            return

        @functools.wraps(f)
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                with lock:
                    acc[label] = acc.get(label, 0.0) + time.perf_counter() - t

        setattr(module, name, timed)

    for (mod, name), label in PHASES.items():
        for candidate in (mod, FLAT_LAYOUT.get(mod)):
            try:
                module = importlib.import_module(candidate) if candidate else None
            except ModuleNotFoundError:
                continue
            if module is not None:
                wrap(module, name, label)
                break
    real_fsync = os.fsync

    def fsync(fd):
        t = time.perf_counter()
        try:
            return real_fsync(fd)
        finally:
            with lock:
                fsync_s[0] += time.perf_counter() - t

    os.fsync = fsync
    t_ready = time.perf_counter()

    def write() -> None:
        out.write_text(json.dumps({"phases": acc, "fsync_thread_s": fsync_s[0], "start_s": t_ready - t0,
                                   "total_s": time.perf_counter() - t0}))

    atexit.register(write)
    sys.argv = ["imagebench", *argv[1:]]
    from flows.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
