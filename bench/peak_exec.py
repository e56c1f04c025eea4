"""Run the `imagebench` command line in this process and, at exit, write this process's own peak
resident memory (VmHWM) to a JSON file.

    .venv/bin/python bench/peak_exec.py OUT.json imagebench score --model M

It calls the same entry point as the `imagebench` console script (``flows.cli:main``), so the
command does exactly what it does when typed. Why not read the peak from the parent: wait4()'s
``ru_maxrss`` of a child started with fork/vfork also counts the PARENT's memory mapped at the
time of the fork (Linux keeps the old mm's high-water mark across exec), so a benchmark process
holding a loaded model would inflate every child's number. VmHWM belongs to the process's own
address space after exec, and sampling it from outside can miss a peak in the last moments.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.environ.get("BENCH_SRC") or str(Path(__file__).resolve().parents[1]))


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(value.split()[0])
    return out


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[2] != "imagebench":
        print("usage: peak_exec.py OUT.json imagebench [ARGS...]", file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    # Registered first, so it runs last: after Prefect's own exit handlers.
    atexit.register(lambda: out.write_text(json.dumps(_status())))
    sys.argv = sys.argv[2:]
    from flows.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
