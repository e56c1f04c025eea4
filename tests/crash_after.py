"""Run the `imagebench` CLI and die like a SIGKILL (``os._exit``: no cleanup, no ``finally``) at one
exact point of a run: just before or just after the Nth atomic rename (``os.replace``) whose
destination path contains a given text. Every durable write of imagebench (staging shards, lake
partitions, the catalog) ends with such a rename, so these are all the points at which the state
on disk can differ.

    CRASH_REPLACE=<text in the destination>[|<another>...]  CRASH_NTH=<n, default 1>  CRASH_WHEN=before|after
    CRASH_LOG=<file>: append every rename destination (to list the points of a clean run)
    CRASH_ACTION=stop: instead of dying, freeze (SIGSTOP) after the rename, for the test to kill
"""

from __future__ import annotations

import os
import sys
import threading

CRASH_EXIT = 137  # what a shell reports for SIGKILL

_real_replace = os.replace
_lock = threading.Lock()
_seen = 0


def _replace(src, dst, *args, **kwargs):
    global _seen
    needle, when, log = os.environ.get("CRASH_REPLACE"), os.environ.get("CRASH_WHEN", "after"), os.environ.get("CRASH_LOG")
    hit = False
    if needle and any(n in os.fspath(dst) for n in needle.split("|")):
        with _lock:
            _seen += 1
            hit = _seen == int(os.environ.get("CRASH_NTH", "1"))
    if hit and when == "before":
        os._exit(CRASH_EXIT)  # the temp file is written and fsynced, the rename never happens
    _real_replace(src, dst, *args, **kwargs)
    if log:
        with _lock, open(log, "a") as fh:
            fh.write(os.fspath(dst) + "\n")
    if hit:
        if os.environ.get("CRASH_ACTION") == "stop":
            import signal

            os.kill(os.getpid(), signal.SIGSTOP)  # every thread stops here; the test sends SIGKILL
        os._exit(CRASH_EXIT)


if __name__ == "__main__":
    os.replace = _replace
    from flows.cli import main

    sys.argv = ["imagebench", *sys.argv[1:]]
    sys.exit(main())
