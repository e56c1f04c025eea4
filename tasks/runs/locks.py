"""One run at a time per model: an exclusive lock file per model in the workspace.

Two backfills of the same model (or a backfill during the nightly) must not interleave their
writes. The lock is an ``fcntl.flock`` on ``<home>/locks/<model_id>.lock``: held by the flow
process from the model's ingest to its commit, released by the kernel when that process ends in
any way (SIGKILL included), so a killed run never leaves a stale lock. The file holds who has it
(run id, pid, host, since) for the refusal message. flock works across processes of one machine
and on shared filesystems that support it (NFSv4, Lustre, CephFS); see docs/OPERATIONS.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from tasks.store.storage import validate_model_id


class ModelBusy(RuntimeError):
    """Another run holds the model's lock (the message says which run, where, since when)."""


def lock_path(home: Path, model_id: str) -> Path:
    return Path(home) / "locks" / f"{validate_model_id(model_id)}.lock"


def _holder(fh) -> str:
    fh.seek(0)
    try:
        info = json.loads(fh.read() or "{}")
    except ValueError:
        return "another run"
    return f"run {info.get('run_id', '?')} (pid {info.get('pid', '?')} on {info.get('host', '?')}, since {info.get('since', '?')})"


@contextlib.contextmanager
def model_lock(home: Path, model_id: str, run_id: str, wait_s: float = 0.0, poll_s: float = 0.2) -> Iterator[None]:
    """Hold the model's lock for the block; wait up to ``wait_s`` seconds for it, then raise
    :class:`ModelBusy` naming the holder."""
    path = lock_path(home, model_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a+")
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ModelBusy(
                        f"model {model_id!r} is being scored by {_holder(fh)}; "
                        f"waited {wait_s:.0f} s (IMAGEBENCH_MODEL_LOCK_WAIT_S). Retry when it has finished."
                    ) from None
                time.sleep(poll_s)
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({
            "run_id": run_id, "pid": os.getpid(), "host": socket.gethostname(),
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }))
        fh.flush()
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    finally:
        fh.close()
