"""A command told to stop (SIGTERM, SIGHUP, Ctrl-C) ends within a grace period, not when its
running tasks happen to finish.

Why: Prefect turns SIGTERM into an exception in the flow's thread, and the flow's task runner then
waits for every task already running (a batch of HPSv3 forwards, a judge's HTTP request with its
timeout) before the process can end: minutes after systemd, a container runtime or CI asked it to
stop, and a second signal is only logged. Everything a run writes is durable and a run resumes
where it was killed (docs/RELIABILITY.md), so ending at once loses no finished work.

How: Python writes the number of every signal it handles to a wake-up file descriptor
(``signal.set_wakeup_fd``); a daemon thread reads it. On the first stop signal the command's own
handling goes on (Prefect marks the run, logs are flushed); if the process is still alive
``grace_s`` later, or at a second stop signal, it says so and ends with the status the signal
gives (128 + its number), after ``before_exit`` (the warm child tells its client the status).
Standard library only: the launcher installs it before anything heavy is imported.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from flows.warm import command_of, flush_stdio

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGHUP, signal.SIGINT})
GRACE_ENV = "IMAGEBENCH_STOP_GRACE_S"
DEFAULT_GRACE_S = 10.0
# Commands with a shutdown of their own that must not be cut short: `serve` stops its deployments,
# then the Prefect server it started (flows/cli/scoring.py).
OWN_SHUTDOWN = frozenset({"serve"})


def grace_s(env: dict[str, str] | os._Environ = os.environ) -> float:
    """The grace period in seconds (IMAGEBENCH_STOP_GRACE_S, default 10); a bad value is the default."""
    try:
        value = float(env.get(GRACE_ENV, DEFAULT_GRACE_S))
    except ValueError:
        return DEFAULT_GRACE_S
    return value if value >= 0 else DEFAULT_GRACE_S


def applies_to(argv: list[str]) -> bool:
    """False for the commands that run their own shutdown (``serve``)."""
    return command_of(argv) not in OWN_SHUTDOWN


def stop_within(grace: float, before_exit: Callable[[int], None] | None = None) -> bool:
    """Watch for stop signals from now on (call from the main thread). False where Python cannot
    (not the main thread)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # the signal handler must never block
    try:
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:
        os.close(read_fd)
        os.close(write_fd)
        return False
    threading.Thread(target=_watch, args=(read_fd, grace, before_exit), name="imagebench-stop-watch",
                     daemon=True).start()
    return True


def _watch(read_fd: int, grace: float, before_exit: Callable[[int], None] | None) -> None:
    first: int | None = None
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        for number in data:
            if number not in STOP_SIGNALS:
                continue
            if first is not None:  # asked twice: now
                _end(number, f"{signal.Signals(number).name} again", before_exit)
            first = number
            threading.Thread(target=_after_grace, args=(number, grace, before_exit), name="imagebench-stop-grace",
                             daemon=True).start()


def _after_grace(number: int, grace: float, before_exit: Callable[[int], None] | None) -> None:
    time.sleep(grace)
    _end(number, f"still running {grace:g} s after {signal.Signals(number).name}", before_exit)


def _end(number: int, why: str, before_exit: Callable[[int], None] | None) -> None:
    status = 128 + number
    try:
        sys.stderr.write(f"\nimagebench: {why}: stopping now (status {status}); what was already written is "
                         "kept, and the next run resumes from it\n")
        flush_stdio()
        if before_exit is not None:
            before_exit(status)
    finally:
        os._exit(status)
