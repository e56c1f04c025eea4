"""Issue 24 item 3: lock files no one else can open, and lock waits that end and name the holder.

The attacks run as a second, unprivileged account (tests/otheruser.py) in a folder it can reach:
it opens a lock file read-only (Linux grants ``flock`` on that) and holds the lock. The holders
"of our own" are real processes of this user: one that holds a lock, one whose lock outlived it
in a child it forked. The locks are the real ones: a model's lock (tasks/runs/locks.py), the
lake's compaction and partition locks (tasks/lake), a run's lease (tasks/runs/state.py).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# The other account takes the lock on a file it can open (read-only), prints "held", holds it.
ATTACKER_HOLDS = """
import fcntl, sys, time
fh = open(sys.argv[1], "rb")
fcntl.flock(fh, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _attacker_hold(other_user, path: Path) -> subprocess.Popen:
    proc = other_user.popen(ATTACKER_HOLDS, str(path))
    line = proc.stdout.readline().strip()
    if line != "held":
        proc.kill()
        raise AssertionError(f"the other account could not hold {path}: {proc.stderr.read()[-2000:]}")
    return proc


def _other_can_lock(other_user, path: Path) -> bool:
    r = other_user.run("import fcntl, sys\ntry:\n    fcntl.flock(open(sys.argv[1], 'rb'), fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
                       "except OSError:\n    sys.exit(3)\n", str(path))
    return r.returncode == 0


def _workspace(parent: Path) -> Path:
    """A workspace folder another account can enter (as an older imagebench left it under umask 022)."""
    home = parent / "ws"
    home.mkdir()
    home.chmod(0o755)
    return home


def test_every_lock_file_is_private_whatever_the_umask(reachable_tmp, other_user):
    from tasks.lake.tables import Lake
    from tasks.runs.locks import model_lock
    from tasks.runs.state import _try_lock, lease_path
    from tests.otheruser import umask

    home = _workspace(reachable_tmp)
    with umask(0o022):
        lake = Lake(home / "lake")
        import pyarrow as pa

        from schemas.lake import MODEL_SCORES

        lake.write_partition("model_scores", "m1", pa.Table.from_pylist([], schema=MODEL_SCORES))
        from tasks.lake import compact

        with compact.compacted(lake, {"model_scores": MODEL_SCORES}):  # the compaction and generations locks
            pass
        with model_lock(home, "m1", "run-1"):
            fh = _try_lock(lease_path(home, "run-1"))
            locks = [home / "locks" / "m1.lock", lease_path(home, "run-1"), home / "lake" / "_compact" / ".gens.lock",
                     home / "lake" / "model_scores" / "model_id=m1" / ".lock"]
            for p in locks:
                assert p.exists(), p
                assert _mode(p) == 0o600, (p, oct(_mode(p)))
                assert not _other_can_lock(other_user, p), p
        assert fh is not None


def test_a_lock_file_others_could_open_is_replaced_and_their_hold_is_void(reachable_tmp, other_user, caplog):
    """The issue's attack: a 0644 lock file (an older imagebench's), opened and locked by another
    account. Before: the model was refused ("ModelBusy ... by run ..."). Now: the file is replaced
    by a private one, the run takes its lock, and one line says so."""
    from tasks.runs.locks import model_lock

    home = _workspace(reachable_tmp)
    lock = home / "locks" / "m1.lock"
    lock.parent.mkdir()
    lock.parent.chmod(0o755)
    lock.write_text(json.dumps({"run_id": "fb72d28c", "pid": 22933}))
    lock.chmod(0o644)
    attacker = _attacker_hold(other_user, lock)
    try:
        old_inode = os.stat(lock).st_ino
        with caplog.at_level(logging.WARNING):
            with model_lock(home, "m1", "our-run"):
                assert os.stat(lock).st_ino != old_inode and _mode(lock) == 0o600
                assert json.loads(lock.read_text())["run_id"] == "our-run"
        said = [r.getMessage() for r in caplog.records if str(lock) in r.getMessage()]
        assert len(said) == 1 and "0644" in said[0], said
    finally:
        attacker.kill()
        attacker.wait()


def test_a_lock_file_of_another_owner_or_a_symlink_is_never_used(reachable_tmp, other_user, tmp_path):
    from tasks.store.lockfile import held

    home = _workspace(reachable_tmp)
    theirs = home / "theirs.lock"
    theirs.write_text("")
    os.chown(theirs, other_user.uid, other_user.gid)
    with held(theirs):
        st = os.stat(theirs)
        assert st.st_uid == os.geteuid() and _mode(theirs) == 0o600
    target = tmp_path / "not-a-lock"
    target.write_text("keep me")
    link = home / "link.lock"
    link.symlink_to(target)
    with held(link):
        assert not link.is_symlink() and _mode(link) == 0o600
    assert target.read_text() == "keep me"


def _our_holder(path: Path, code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(path)], stdout=subprocess.PIPE, text=True,
                            cwd=str(Path(__file__).resolve().parents[2]))
    assert proc.stdout.readline().strip() == "held"
    return proc


HOLDS_MODEL_LOCK = """
import sys, time
from pathlib import Path
from tasks.runs.locks import model_lock
with model_lock(Path(sys.argv[1]), "m1", "run-holding"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_busy_model_lock_names_its_live_holder(tmp_path):
    from tasks.runs.locks import ModelBusy, model_lock

    holder = _our_holder(tmp_path, HOLDS_MODEL_LOCK)
    try:
        with pytest.raises(ModelBusy) as err:
            with model_lock(tmp_path, "m1", "our-run", wait_s=0.5):
                pass
    finally:
        holder.kill()
        holder.wait()
    text = str(err.value)
    assert f"process {holder.pid}" in text and "run run-holding" in text and "-c" in text and "running since" in text
    assert str(tmp_path / "locks" / "m1.lock") in text and "IMAGEBENCH_MODEL_LOCK_WAIT_S" in text


# The holder takes the model's lock, forks a child that keeps the descriptor (as a worker pool
# forked during a run does), and ends: the lock file records a process that is gone.
HOLDS_THEN_LEAVES_IT_TO_A_CHILD = """
import os, sys, time
from pathlib import Path
from tasks.runs.locks import model_lock
cm = model_lock(Path(sys.argv[1]), "m1", "run-gone")
cm.__enter__()
child = os.fork()
if child == 0:
    time.sleep(600)
    os._exit(0)
print(child, flush=True)
os._exit(0)
"""


def test_a_holder_that_ended_is_said_to_be_gone_and_the_keeper_is_named(tmp_path):
    from tasks.runs.locks import ModelBusy, model_lock

    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDS_THEN_LEAVES_IT_TO_A_CHILD), str(tmp_path)],
                            stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).resolve().parents[2]))
    child = int(proc.stdout.readline())
    proc.wait()
    try:
        with pytest.raises(ModelBusy) as err:
            with model_lock(tmp_path, "m1", "our-run"):
                pass
    finally:
        os.kill(child, 9)
    text = str(err.value)
    assert f"pid {proc.pid}" in text and "has ended" in text and "run run-gone" in text, text
    assert f"process {child}" in text, text


HOLDS_GENS_LOCK = """
import sys, time
from pathlib import Path
from tasks.store.lockfile import held
with held(Path(sys.argv[1]) / "_compact" / ".gens.lock"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_lake_lock_waits_are_bounded_and_name_the_holder(tmp_path, monkeypatch, caplog):
    """Before: a writer and a catalog refresh waited on the compaction lock with no limit."""
    import pyarrow as pa

    from schemas.lake import MODEL_SCORES
    from tasks.lake import compact
    from tasks.lake.tables import Lake
    from tasks.store.lockfile import LockBusy, set_lake_lock_wait

    lake = Lake(tmp_path / "lake")
    empty = pa.Table.from_pylist([], schema=MODEL_SCORES)
    lake.write_partition("model_scores", "m1", empty)
    with compact.compacted(lake, {"model_scores": MODEL_SCORES}):  # a generation to publish into
        pass
    holder = _our_holder(lake.root, HOLDS_GENS_LOCK)
    set_lake_lock_wait(0.5)
    try:
        # A writer: its file is written; the link into the catalog's fresh files waits, gives up, says so.
        with caplog.at_level(logging.WARNING):
            lake.write_partition("model_scores", "m2", empty)
        assert lake.partition_path("model_scores", "m2").exists()
        assert any(f"process {holder.pid}" in r.getMessage() for r in caplog.records), caplog.text
        # A refresh: refused, naming the lock and its holder.
        with pytest.raises(LockBusy) as err:
            with compact.compacted(lake, {"model_scores": MODEL_SCORES}):
                pass
    finally:
        set_lake_lock_wait(None)
        holder.kill()
        holder.wait()
    text = str(err.value)
    assert ".gens.lock" in text and f"process {holder.pid}" in text and "IMAGEBENCH_LAKE_LOCK_WAIT_S" in text


def test_who_holds_a_lock_is_read_from_proc_locks():
    from tasks.store.lockfile import lock_owner_pids

    dev = os.makedev(0xFE, 0x01)
    text = (
        "1: FLOCK  ADVISORY  WRITE 4242 fe:01:77 0 EOF\n"
        "1: -> FLOCK  ADVISORY  WRITE 5151 fe:01:77 0 EOF\n"  # a waiter, not a holder
        "2: FLOCK  ADVISORY  READ 4343 fe:01:77 0 EOF\n"
        "3: FLOCK  ADVISORY  WRITE 6060 fe:01:78 0 EOF\n"  # another file
        "4: POSIX  ADVISORY  WRITE 7070 fe:01:77 0 EOF\n"  # not a flock
        "5: FLOCK  ADVISORY  WRITE 0 fe:01:77 0 EOF\n"  # a holder in another pid namespace: unknown
    )
    assert lock_owner_pids(text, dev, 77) == [4242, 4343]
    assert lock_owner_pids(text, dev, 99) == []


def test_an_unknown_holder_is_said_to_be_unknown(tmp_path, monkeypatch):
    """A holder /proc/locks does not show (another machine on NFS, another pid namespace): what
    this machine's /proc says is replaced by nothing, as there."""
    from tasks.store import lockfile

    path = tmp_path / "x.lock"
    holder = _our_holder(path, "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(600)\n")
    monkeypatch.setattr(lockfile, "lock_owner_pids", lambda *a: [])  # as /proc/locks reads on such a machine
    monkeypatch.setattr(lockfile, "_keepers", lambda *a: [])
    try:
        with pytest.raises(lockfile.LockBusy, match="unknown holder"):
            with lockfile.held(path):
                pass
    finally:
        holder.kill()
        holder.wait()
