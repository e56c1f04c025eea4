"""Lock files that only their owner can open, and waits for them that end (issue 24 item 3).

Every lock imagebench takes is an ``fcntl.flock`` on a file of the workspace (a model's lock,
the lake's compaction and partition locks, a run's lease). Linux grants ``flock`` on a read-only
descriptor, so a lock file another user can open is a lock another user can hold. Here:

- **Private**: a lock file is opened ``O_RDWR | O_CREAT | O_NOFOLLOW`` with mode 0600 (whatever
  the umask). One that is not a regular file of ours with mode 0600 (made by an older version
  under umask 022, planted by someone else, a symlink) is replaced by a new one, in one logged
  line: whoever holds the old one holds nothing we use. After taking a lock, the file is checked
  to still be the one at that path (else it was replaced meanwhile: taken again).
- **Bounded**: every wait has a limit; when it runs out, :class:`LockBusy` names the lock and who
  holds it: the live process (its pid, user, command and start, from ``/proc/locks`` and
  ``/proc/<pid>``), what the lock file records of the holder (a run id, its pid) and whether that
  holder has ended, or that the holder is unknown (another machine on a shared filesystem, or a
  process this one cannot see).
- **Who holds it** is written into the file by an exclusive holder (pid, command, since, host,
  and what the caller adds: a run id). Shared holders write nothing; ``/proc/locks`` lists them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import pwd
import socket
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

logger = logging.getLogger(__name__)

LOCK_MODE = 0o600
LAKE_LOCK_WAIT_ENV = "IMAGEBENCH_LAKE_LOCK_WAIT_S"
DEFAULT_LAKE_LOCK_WAIT_S = 600.0  # the lake's locks, unless the setting says otherwise
SAY_WAITING_AFTER_S = 5.0  # a wait longer than this is logged once, naming the holder
_lake_wait_s: float | None = None


class LockBusy(RuntimeError):
    """A lock stayed held for the whole wait: the message names the lock and who holds it."""


class LockFileError(OSError):
    """A lock file that cannot be made private (a folder of someone else's, a read-only disk)."""


def set_lake_lock_wait(seconds: float | None) -> None:
    """The lake locks' wait in this process (the ``lake_lock_wait_s`` setting; the commands set it)."""
    global _lake_wait_s
    _lake_wait_s = None if seconds is None else float(seconds)


def lake_lock_wait_s() -> float:
    """The set wait, else ``IMAGEBENCH_LAKE_LOCK_WAIT_S`` from the environment (a flow run a
    Prefect worker started), else the default."""
    if _lake_wait_s is not None:
        return _lake_wait_s
    try:
        return max(0.0, float(os.environ[LAKE_LOCK_WAIT_ENV]))
    except (KeyError, ValueError):
        return DEFAULT_LAKE_LOCK_WAIT_S


# ---- opening --------------------------------------------------------------------------------------


def _is_private(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def _replace(path: Path, why: str) -> None:
    """Remove a lock file we will not use (a new private one takes its name)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LockFileError(f"lock file {path} {why} and cannot be replaced: {exc.strerror or exc}") from None
    logger.warning("lock file %s %s: replaced by a private one (whoever holds the old one holds nothing)", path, why)


def _why_not_private(path: Path) -> str | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "was a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "was not a regular file"
    if st.st_uid != os.geteuid():
        return f"belonged to {_user(st.st_uid)}"
    if st.st_mode & 0o077:
        return f"was open to other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def open_lock_file(path: Path) -> int:
    """A descriptor of the lock file ``path`` (created if needed): a regular file of this user,
    mode 0600. Anything else at that name is replaced first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(5):
        why = _why_not_private(path)
        if why is not None:
            _replace(path, why)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, LOCK_MODE)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EACCES, errno.EPERM):
                continue  # replaced between our look and our open: look again
            raise
        if _is_private(os.fstat(fd)):
            return fd
        os.close(fd)
    raise LockFileError(f"lock file {path}: cannot make it a private file of this user")


def _still_at(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (a lock file may be replaced, or a run's lease removed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


# ---- who holds it ---------------------------------------------------------------------------------


def lock_owner_pids(proc_locks: str, dev: int, ino: int) -> list[int]:
    """The pids ``/proc/locks`` (its text) gives for the FLOCK locks held on the file (dev, ino).

    A line is ``N: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE START END`` (device numbers in hex);
    ``N: -> FLOCK ...`` lines are waiters, not holders. A pid of 0 or less (a holder in another
    pid namespace) is left out: unknown."""
    want = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"
    pids = []
    for line in proc_locks.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->" or fields[1] != "FLOCK":
            continue
        if fields[5] == want:
            try:
                pid = int(fields[4])
            except ValueError:
                continue
            if pid > 0 and pid not in pids:
                pids.append(pid)
    return pids


@dataclass(frozen=True)
class Process:
    pid: int
    user: str
    command: str
    started: str  # UTC, to the second

    def __str__(self) -> str:
        return f"process {self.pid} ({self.command}; user {self.user}; running since {self.started})"


def _boot_time() -> float:
    with open("/proc/stat") as fh:
        for line in fh:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def process(pid: int) -> Process | None:
    """What ``/proc`` says of a live process; None when it has ended (or is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            return None
        started = _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")
        uid = os.stat(f"/proc/{pid}").st_uid
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except (OSError, IndexError, ValueError):
        return None
    command = " ".join([os.path.basename(argv[0]), *argv[1:]]) if argv else "?"
    if len(command) > 160:
        command = command[:157] + "..."
    when = datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return Process(pid, _user(uid), command, when)


def _keepers(dev: int, ino: int) -> list[int]:
    """Processes of this user with the file (dev, ino) open: who keeps a lock whose taker has
    ended (a child it forked inherited the descriptor)."""
    me, found = os.getpid(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            fds = os.scandir(f"/proc/{entry.name}/fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    st = os.stat(fd.path)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) == (dev, ino):
                    found.append(int(entry.name))
                    break
    return found


def _recorded(fd: int) -> dict:
    try:
        data = os.pread(fd, 4096, 0)
        record = json.loads(data or b"{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def describe_holder(fd: int) -> str:
    """Who holds the lock on ``fd``'s file, in words (for the message of a wait that ran out)."""
    st = os.fstat(fd)
    try:
        with open("/proc/locks") as fh:
            pids = lock_owner_pids(fh.read(), st.st_dev, st.st_ino)
    except OSError:
        pids = []
    pids = [p for p in pids if p != os.getpid()] or pids
    live = [p for p in map(process, pids) if p is not None]
    gone = [pid for pid in pids if not any(p.pid == pid for p in live)]
    parts = []
    record = _recorded(fd)
    rec_pid = record.get("pid") if isinstance(record.get("pid"), int) else None
    run = f"run {record['run_id']}, " if record.get("run_id") else ""
    for p in live:
        parts.append(f"{run if p.pid == rec_pid else ''}{p}")
    if not live:
        keepers = [p for p in map(process, _keepers(st.st_dev, st.st_ino)) if p is not None]
        if gone:
            parts.append(f"process {', '.join(map(str, gone))}, which took it, has ended")
        if keepers:
            parts.append("kept open by " + "; ".join(map(str, keepers)))
        else:
            parts.append("an unknown holder (a process of another machine on a shared filesystem, "
                         "or one this process cannot see)")
    if rec_pid is not None and not any(p.pid == rec_pid for p in live):
        if rec_pid == os.getpid():
            state = "is this process, which no longer holds it"
        else:
            state = "is alive but no longer holds it" if process(rec_pid) is not None else "has ended"
        parts.append(f"its last recorded holder, {run}pid {rec_pid} ({record.get('command', '?')}, since "
                     f"{record.get('since', '?')}), {state}")
    return "; ".join(parts)


# ---- taking it ------------------------------------------------------------------------------------


def _write_holder(fd: int, extra: dict | None) -> None:
    argv = sys.argv or ["?"]
    record = {"pid": os.getpid(), "command": " ".join([os.path.basename(argv[0]), *argv[1:]])[:300],
              "since": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": socket.gethostname(),
              **(extra or {})}
    with contextlib.suppress(OSError):  # only a description: a full disk must not stop the run
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)


def acquire(path: Path, *, exclusive: bool = True, wait_s: float = 0.0, what: str = "lock",
            setting: str | None = None, record: dict | None = None, busy: type[LockBusy] = LockBusy) -> int:
    """Take the lock on ``path`` and return its descriptor (release with :func:`release`). Waits up
    to ``wait_s`` seconds, then raises ``busy`` naming ``what``, the file and who holds it."""
    path = Path(path)
    start = time.monotonic()
    deadline = start + wait_s
    said = False
    pause = 0.02
    while True:
        fd = open_lock_file(path)
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            now = time.monotonic()
            if now >= deadline:
                holder = describe_holder(fd)
                os.close(fd)
                bound = f" (waited {wait_s:.0f} s{f': {setting}' if setting else ''})"
                raise busy(f"{what} {path} is held by {holder}{bound}") from None
            if not said and now - start >= SAY_WAITING_AFTER_S:  # a long wait says why, once
                said = True
                logger.warning("waiting up to %.0f s more for %s %s, held by %s", deadline - now, what, path,
                               describe_holder(fd))
            os.close(fd)
            time.sleep(min(pause, max(0.0, deadline - now)))
            pause = min(pause * 2, 0.5)
            continue
        except BaseException:
            os.close(fd)
            raise
        if not _still_at(fd, path):  # replaced (or a lease removed) while we waited: take the new one
            os.close(fd)
            continue
        if exclusive:
            _write_holder(fd, record)
        return fd


def try_acquire(path: Path, record: dict | None = None) -> int | None:
    """The exclusive lock on ``path`` at once, or None when another holds it."""
    try:
        return acquire(path, wait_s=0.0, record=record)
    except LockBusy:
        return None


def release(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    with contextlib.suppress(OSError):
        os.close(fd)


@contextlib.contextmanager
def held(path: Path, *, exclusive: bool = True, wait_s: float = 0.0, what: str = "lock", setting: str | None = None,
         record: dict | None = None, busy: type[LockBusy] = LockBusy) -> Iterator[int]:
    """The lock on ``path`` for the block (see :func:`acquire`)."""
    fd = acquire(path, exclusive=exclusive, wait_s=wait_s, what=what, setting=setting, record=record, busy=busy)
    try:
        yield fd
    finally:
        release(fd)


def lake_lock(path: Path, what: str, exclusive: bool = True) -> contextlib.AbstractContextManager[int]:
    """A lock of the lake (compaction, a partition): waits ``lake_lock_wait_s()``, then names its holder."""
    return held(path, exclusive=exclusive, wait_s=lake_lock_wait_s(), what=what, setting=LAKE_LOCK_WAIT_ENV)
