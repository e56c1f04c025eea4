"""One run at a time per model: an exclusive lock file per model in the workspace.

Two backfills of the same model (or a backfill during the nightly) must not interleave their
writes. The lock is an ``fcntl.flock`` on ``<home>/locks/<model_id>.lock``: held by the flow
process from the model's ingest to its commit, released by the kernel when that process ends in
any way (SIGKILL included), so a killed run never leaves a stale lock. The file is private (0600,
tasks/store/lockfile.py: another user cannot open it, so cannot hold it) and records who has it
(run id, pid, command, host, since); a refusal names the process that holds the lock now and says
when the recorded one has ended. flock works across processes of one machine and on shared
filesystems that support it (NFSv4, Lustre, CephFS); see docs/OPERATIONS.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tasks.store import lockfile
from tasks.store.storage import validate_model_id


class ModelBusy(lockfile.LockBusy):
    """Another run holds the model's lock (the message says which process, run, since when)."""


def lock_path(home: Path, model_id: str) -> Path:
    return Path(home) / "locks" / f"{validate_model_id(model_id)}.lock"


@contextlib.contextmanager
def model_lock(home: Path, model_id: str, run_id: str, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the model's lock for the block; wait up to ``wait_s`` seconds for it, then raise
    :class:`ModelBusy` naming the holder."""
    path = lock_path(home, model_id)
    try:
        fd = lockfile.acquire(path, wait_s=wait_s, what=f"model {model_id!r} is being scored: its lock",
                              setting="IMAGEBENCH_MODEL_LOCK_WAIT_S", record={"run_id": run_id}, busy=ModelBusy)
    except ModelBusy as exc:
        raise ModelBusy(f"{exc}. Retry when it has finished.") from None
    try:
        yield
    finally:
        lockfile.release(fd)
