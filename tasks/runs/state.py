"""A run's record from its first second: ``running`` at start, rewritten as it moves from stage
to stage, final (``completed``/``failed``) at the end; a run whose process died shows as
``crashed``, with the last stage it entered.

Who is alive: from before its first record until after its final one, a run holds an
``fcntl.flock`` on ``<home>/locks/runs/<run_id>.lock``; the kernel drops it when the process ends
in any way (SIGKILL, OOM kill, machine stop on a local disk). A ``running`` record whose lock is free
belongs to a dead process. :func:`settle_crashed` takes that lock itself, re-reads the record
under it (a run that finished in between keeps its final record: it writes that record before it
lets go of the lock) and rewrites it as ``crashed``. Every flow run settles at its start, and
``imagebench runs`` before it reads. A run id is new for every run, so the lock is only ever
contended between a live run and a reader.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import Any

from tasks.runs.record import RunRecord
from tasks.store import lockfile

RUNNING, CRASHED = "running", "crashed"
CHECKPOINT_MIN_S = 1.0  # between two unforced checkpoint writes (each is an fsynced Parquet file)


def lease_path(home: Path, run_id: str) -> Path:
    return Path(home) / "locks" / "runs" / f"{run_id}.lock"


def _try_lock(path: Path) -> int | None:
    """A descriptor holding an exclusive flock on ``path`` (a private lock file: no other user
    can hold a lease and make a dead run look alive), or None when another holds it."""
    return lockfile.try_acquire(path)


def _unlock(fd: int, path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()  # before letting go: a reader that opened it takes the lock and sees it gone (lockfile)
    lockfile.release(fd)


class RunJournal:
    """Writes one run's record to the lake while it runs, holding the run's lease."""

    def __init__(self, home: Path, lake_dir: Path, record: RunRecord):
        from tasks.lake.tables import Lake

        self.path = lease_path(home, record.run_id)
        self.lake = Lake(lake_dir)
        self.record = record
        self._fh = None
        self._last = float("-inf")
        self._failed = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Take the lease, then write the ``running`` record (in that order: a reader never sees
        a running record without its lease)."""
        fh = _try_lock(self.path)
        if fh is None:
            raise RuntimeError(f"run {self.record.run_id} is already running ({self.path} is locked)")
        self._fh = fh
        self.record.journal = self
        self.checkpoint(force=True)

    def checkpoint(self, force: bool = False) -> None:
        """Rewrite the ``running`` record. A failed write (disk full) is logged once and never
        stops the run: its final record, or its crash, still says what happened."""
        with self._lock:
            now = time.monotonic()
            if self._fh is None or (not force and now - self._last < CHECKPOINT_MIN_S):
                return
            self._last = now
            try:
                self.lake.write_run(self.record.row(RUNNING))
            except Exception as exc:  # noqa: BLE001
                if not self._failed:
                    self._failed = True
                    from tasks.store.redact import redact

                    logging.getLogger(__name__).warning(
                        "run %s: could not update its running record: %s", self.record.run_id, redact(str(exc)))

    def release(self) -> None:
        """After the final record is written (or could not be): let go of the lease."""
        with self._lock:
            fh, self._fh = self._fh, None
            self.record.journal = None
        if fh is not None:
            _unlock(fh, self.path)


def crashed_error(row: dict[str, Any]) -> str:
    return (
        f"crashed during stage '{row.get('stage') or 'start'}': the run's process ended without finishing "
        f"(killed, or its machine stopped); last recorded at {row['finished_at']:%Y-%m-%d %H:%M:%S} UTC, "
        f"{row['total_s']:.0f} s after its start. What it committed is kept; the next run resumes the rest."
    )


def settle_crashed(home: Path, lake_dir: Path, persist: bool = True) -> list[dict[str, Any]]:
    """The ``running`` records whose process is gone, rewritten as ``crashed`` (unless
    ``persist`` is false, or the lake cannot be written: then only returned as such)."""
    from tasks.lake.tables import Lake

    lake = Lake(lake_dir)
    table = lake.read_runs()
    crashed = []
    for run_id, status in zip(table.column("run_id").to_pylist(), table.column("status").to_pylist()):
        if status != RUNNING:
            continue
        path = lease_path(home, run_id)
        try:
            fh = _try_lock(path)
        except OSError:  # a read-only workspace: nothing can be known or settled from here
            continue
        if fh is None:
            continue  # alive
        try:
            row = lake.read_run(run_id)  # again, under the lock: it may have finished meanwhile
            if row is None or row["status"] != RUNNING:
                continue
            row.update(status=CRASHED, error=crashed_error(row))
            if persist:
                with contextlib.suppress(OSError):
                    lake.write_run(row)
            crashed.append(row)
        finally:
            _unlock(fh, path)
    return crashed


def describe(row: dict[str, Any]) -> str:
    """One line for a terminal or a log: which run crashed, when it started, how far it got."""
    return (
        f"run {row['run_id']} ({row['flow']}, started {row['started_at']:%Y-%m-%d %H:%M:%S} UTC) "
        f"crashed during stage '{row.get('stage') or 'start'}'; recorded as crashed (imagebench runs)"
    )
