"""Issue 24 items 2 and 3 through the real commands: a private workspace, locks no one else can hold.

A lab's workspace (under /tmp, reachable by every local account) is made by real cold commands run
with umask 022: `imagebench score` on the tiny model (ingest, HPSv3, lake, catalog, Prefect's
database, the log, the model's lock) and `study init` + `study open` (the study's panel.sqlite,
which maps every blinded image to its tool and prompt). Then a second, unprivileged account
(tests/otheruser.py) tries to list every folder and read every file of it, and to open and lock
every lock file; with `IMAGEBENCH_SHARE_GROUP` a member of that group reads the lake and the
catalog (a real DuckDB query, read-only) and nothing else.

Lock waits with real commands: a model's lock or the lake's compaction lock held by another
process of ours makes `score` stop after its bounded wait, naming the lock and the live process
that holds it (and saying that the run recorded in the lock file has ended).
"""

from __future__ import annotations

import grp
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.flows.conftest import IMAGEBENCH, PROMPT_IDS, REPO, image_bytes, put_model
from tests.otheruser import OtherUser, reachable_dir

pytestmark = pytest.mark.slow

TOOLS = ("tool-a", "tool-b")
COMMAND_TIMEOUT_S = 600  # a cold command on a loaded machine (load 10): minutes, never a hang
# What the other account runs against a list of paths (one per line in argv[1]): which folders
# it can list and which files it can read (the kernel decides, not a mode check).
SCAN = """
import json, os, sys
listed, read = [], []
for line in open(sys.argv[1]).read().splitlines():
    kind, path = line.split(" ", 1)
    try:
        if kind == "d":
            os.listdir(path)
            listed.append(path)
        else:
            with open(path, "rb") as fh:
                fh.read(1)
            read.append(path)
    except OSError:
        pass
print(json.dumps({"listed": listed, "read": read}))
"""
# What the other account runs against lock files: open each (read-only is enough for flock on
# Linux) and take the lock.
LOCK_ATTACK = """
import fcntl, json, os, sys
held = []
for path in sys.argv[1:]:
    try:
        fd = os.open(path, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.append(path)
    except OSError:
        pass
print(json.dumps(held))
"""
# Another process of ours holding a lock file (as a stuck run, or anything else of this user).
HOLD = """
import fcntl, sys, time
fh = open(sys.argv[1], "rb")
fcntl.flock(fh, fcntl.LOCK_EX if sys.argv[2] == "ex" else fcntl.LOCK_SH)
print("held", flush=True)
time.sleep(3600)
"""


@dataclass
class Lab:
    parent: Path
    home: Path
    store: Path
    env: dict[str, str]

    def run(self, *args: str, timeout: float = COMMAND_TIMEOUT_S, **extra: str) -> subprocess.CompletedProcess:
        """``imagebench ARGS`` cold, umask 022, in this workspace."""
        return subprocess.run([*IMAGEBENCH, *args], cwd=REPO, env={**self.env, **extra}, umask=0o022,
                              capture_output=True, text=True, timeout=timeout)


def _lab_env(home: Path, refdir: Path, store: Path, tiny_model) -> dict[str, str]:
    base, ckpt = tiny_model
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "IMAGEBENCH_"))}
    env.update(
        IMAGEBENCH_HOME=str(home), IMAGEBENCH_REFERENCE_DIR=str(refdir), IMAGEBENCH_REFERENCE_VERSION="t1",
        IMAGEBENCH_STORE=str(store), IMAGEBENCH_HPSV3_BASE_MODEL=str(base), IMAGEBENCH_HPSV3_CHECKPOINT=str(ckpt),
        IMAGEBENCH_DEVICE="cpu", IMAGEBENCH_BATCH_SIZE="8", IMAGEBENCH_TASK_BATCH_SIZE="48", IMAGEBENCH_WARM="off",
        PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING", COLUMNS="10000",
    )
    return env


@pytest.fixture(scope="module")
def lab(other_user, built_reference_template, tiny_model, tmp_path_factory):
    """A workspace another account can reach, made by real cold commands under umask 022: a
    scored model and an opened study. The inputs (reference, object store) live elsewhere:
    everything under the workspace is imagebench's own."""
    from tasks.beauty.suite import load_beauty_suite
    from tasks.scores.reference import pin_suite

    private = tmp_path_factory.mktemp("lab-inputs")
    refdir, store = private / "reference", private / "store"
    shutil.copytree(built_reference_template / "reference", refdir)
    beauty = REPO / "reference" / "suite-beauty-index-v1.jsonl"
    shutil.copyfile(beauty, refdir / beauty.name)
    pin_suite(refdir, refdir / beauty.name)
    put_model(store, "m1", PROMPT_IDS[:16], seed=41)
    for t, tool in enumerate(TOOLS):
        for k, p in enumerate(load_beauty_suite(refdir).prompts):
            path = store / "models" / tool / f"{p.prompt_id}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(image_bytes(300 + 10 * t + k, side=64))
    with reachable_dir("ib-lab-") as parent:
        home = parent / "ws"
        lab = Lab(parent, home, store, _lab_env(home, refdir, store, tiny_model))
        for args in (("score", "--model", "m1", "--format", "json"), ("study", "init", "s1", "--tools", ",".join(TOOLS)),
                     ("study", "open", "s1")):
            r = lab.run(*args)
            assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-3000:])
        yield lab


def _walk(home: Path) -> list[Path]:
    out = [home]
    for root, dirs, files in os.walk(home):
        out += [Path(root) / n for n in dirs + files]
    return out


def _scan_as(user: OtherUser, parent: Path, paths: list[Path]) -> dict[str, list[str]]:
    listing = parent / f"scan-{secrets.token_hex(4)}.txt"  # in the reachable parent, readable by the other account
    listing.write_text("".join(f"{'d' if p.is_dir() and not p.is_symlink() else 'f'} {p}\n" for p in paths))
    listing.chmod(0o644)
    try:
        r = user.run(SCAN, str(listing), timeout=300)
    finally:
        listing.unlink()
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _modes(paths: list[Path], home: Path) -> dict[str, str]:
    return {p.relative_to(home).as_posix() or ".": f"{stat.S_IMODE(os.lstat(p).st_mode):04o}" for p in paths}


def _locks(home: Path) -> list[Path]:
    return sorted(p for p in _walk(home) if p.name.endswith(".lock"))


# ---- item 2: private files -----------------------------------------------------------------------


def test_nothing_imagebench_made_is_readable_or_listable_by_another_user(lab, other_user):
    paths = _walk(lab.home)
    modes = _modes(paths, lab.home)
    for made in ("prefect/prefect.db", "imagebench.duckdb", "logs/imagebench.log", "studies/s1/panel.sqlite",
                 "studies/s1/study.yaml", "locks/m1.lock", "lake/_compact/.refresh.lock", "lake/_compact/.gens.lock",
                 "lake/hps_scores/model_id=m1/data.parquet", "lake/model_scores/model_id=m1/data.parquet"):
        assert made in modes, f"{made} not in the workspace: {sorted(modes)[:40]}"
    # 0700 folders, 0600 files (0400: the study's create-once records), whatever the umask.
    wide = {p: m for p, m in modes.items() if m not in ("0700", "0600", "0400")}
    assert not wide, f"open to others under umask 022: {wide}"
    got = _scan_as(other_user, lab.parent, paths)
    assert got == {"listed": [], "read": []}, got


def test_files_beside_open_databases_are_private(lab, other_user):
    """While `panel serve` has the study's SQLite open (WAL): its -wal and -shm are private too."""
    from tests.fake_openai import free_port

    port = free_port()
    log = lab.parent / "panel-serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*IMAGEBENCH, "panel", "serve", "s1", "--port", str(port)], cwd=REPO, env=lab.env,
                                umask=0o022, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        beside = [lab.home / "studies" / "s1" / f"panel.sqlite{s}" for s in ("-wal", "-shm")]
        deadline = time.monotonic() + 300
        while not all(p.exists() for p in beside) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(p.exists() for p in beside), log.read_text()[-3000:]
        assert {p.name: f"{stat.S_IMODE(os.stat(p).st_mode):04o}" for p in beside} == {p.name: "0600" for p in beside}
        assert _scan_as(other_user, lab.parent, [*beside, beside[0].parent]) == {"listed": [], "read": []}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_workspace_left_open_is_made_private_in_one_line(lab, other_user):
    """A workspace an older imagebench made under umask 022: the next command closes it, and says so once."""
    db = lab.home / "prefect" / "prefect.db"
    lab.home.chmod(0o755)
    (lab.home / "prefect").chmod(0o755)
    db.chmod(0o644)
    try:
        assert other_user.can_read(db)  # the attack, before
        r = lab.run("runs")
        assert r.returncode == 0, r.stderr
        said = [line for line in r.stderr.splitlines() if str(lab.home) in line and "other users" in line]
        assert len(said) == 1, r.stderr
        assert stat.S_IMODE(os.stat(lab.home).st_mode) == 0o700
        assert not other_user.can_read(db)
        again = lab.run("runs")
        assert again.returncode == 0 and "other users" not in again.stderr, again.stderr
    finally:
        (lab.home / "prefect").chmod(0o700)
        db.chmod(0o600)
        lab.home.chmod(0o700)


def test_a_workspace_another_user_made_is_refused(lab, other_user):
    """Another account creates the lab's workspace folder first (it knows the path): nothing is written into it."""
    theirs = lab.parent / "planted"
    theirs.mkdir()
    os.chown(theirs, other_user.uid, other_user.gid)
    theirs.chmod(0o777)
    r = lab.run("score", "--model", "m1", IMAGEBENCH_HOME=str(theirs), PREFECT_HOME=str(theirs / "prefect"))
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if str(theirs) in line]
    assert len(lines) == 1 and other_user.name in lines[0], r.stderr
    assert os.listdir(theirs) == []


@pytest.fixture()
def share_group(other_user):
    """A Unix group for the lab's analysts, and the other account as its member."""
    name = f"ibshare{secrets.token_hex(3)}"
    subprocess.run(["groupadd", "--system", name], check=True, capture_output=True)
    try:
        yield name, grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], capture_output=True, timeout=30)


DUCKDB_QUERY = """
import json, sys
import duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
print(json.dumps(sorted(r[0] for r in con.execute("SELECT DISTINCT model_id FROM model_scores").fetchall())))
"""


def _duckdb_path(parent: Path) -> Path:
    """The venv's DuckDB for Debian's python3 (same CPython 3.11 ABI), in a folder the other account can read."""
    import duckdb

    site = Path(duckdb.__file__).resolve().parents[1]
    d = parent / f"duckdb-{secrets.token_hex(3)}"
    d.mkdir()
    d.chmod(0o755)
    for entry in site.iterdir():
        if entry.name == "duckdb" or entry.name.startswith(("_duckdb.", "duckdb-")) and entry.name.endswith((".so", ".dist-info")):
            (d / entry.name).symlink_to(entry)
    return d


def test_the_share_group_reads_the_lake_and_catalog_and_nothing_else(lab, other_user, share_group):
    name, gid = share_group
    put_model(lab.store, "m2", PROMPT_IDS[:8], seed=43)
    r = lab.run("score", "--model", "m2", "--format", "json", IMAGEBENCH_SHARE_GROUP=name)
    assert r.returncode == 0, r.stderr[-3000:]
    member = replace(other_user, gid=gid)  # the analyst: in the group
    lake, catalog = lab.home / "lake", lab.home / "imagebench.duckdb"
    paths = _walk(lab.home)
    shared = [p for p in paths if (p == lake or lake in p.parents or p == catalog) and not p.name.endswith(".lock")]
    private = [p for p in paths if p not in shared and p != lab.home]
    modes = _modes(paths, lab.home)
    assert modes["."] == "0710" and os.stat(lab.home).st_gid == gid  # the group may pass, not list
    for p in shared:
        st = os.lstat(p)
        assert st.st_gid == gid, p
        assert stat.S_IMODE(st.st_mode) == (0o2750 if stat.S_ISDIR(st.st_mode) else 0o640), (p, oct(st.st_mode))
    wide = {p.relative_to(lab.home).as_posix(): m for p in private if (m := modes[p.relative_to(lab.home).as_posix()])
            not in ("0700", "0600", "0400", "2700")}
    assert not wide, wide
    # The analyst: lists and reads the lake, queries the catalog with DuckDB (both models, the one
    # scored before the group was set and the one scored after); reads nothing else.
    got = _scan_as(member, lab.parent, paths)
    assert sorted(got["read"]) == sorted(str(p) for p in shared if p.is_file())
    assert sorted(got["listed"]) == sorted(str(p) for p in shared if p.is_dir())
    q = member.run(DUCKDB_QUERY, str(catalog), env=member.environment(PYTHONPATH=str(_duckdb_path(lab.parent))))
    assert q.returncode == 0, q.stderr[-2000:]
    assert json.loads(q.stdout) == ["m1", "m2"]
    # Nobody else, and no lock for the analyst either.
    assert _scan_as(other_user, lab.parent, paths) == {"listed": [], "read": []}
    attack = member.run(LOCK_ATTACK, *map(str, _locks(lab.home)))
    assert json.loads(attack.stdout) == [], attack.stdout
    # The setting removed: the group's door closes at the next command.
    r = lab.run("runs")
    assert r.returncode == 0, r.stderr
    assert _scan_as(member, lab.parent, [lake, catalog]) == {"listed": [], "read": []}
    assert stat.S_IMODE(os.stat(lab.home).st_mode) == 0o700


def test_a_share_group_that_does_not_exist_is_refused_in_one_line(lab):
    r = lab.run("runs", IMAGEBENCH_SHARE_GROUP="ibnosuchgroup")
    assert r.returncode == 1
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "IMAGEBENCH_SHARE_GROUP=ibnosuchgroup" in lines[0] and "no such group" in lines[0], r.stderr
    assert stat.S_IMODE(os.stat(lab.home).st_mode) == 0o700  # nothing opened


def test_a_warm_command_makes_private_files_too(lab):
    """A warm command is a fork of the warm server: it has the server's umask, not its client's."""
    import tempfile

    # A warm server of this test's own (no other test's server is stopped for it); a short path:
    # a socket's path has at most 107 bytes (flows/warm.py runtime_dir).
    runtime = Path(tempfile.mkdtemp(prefix="ibw", dir="/tmp"))
    env = {"IMAGEBENCH_WARM": "auto", "IMAGEBENCH_WARM_IDLE_S": "300", "TMPDIR": str(runtime)}
    put_model(lab.store, "warm1", PROMPT_IDS[:4], seed=53)
    put_model(lab.store, "warm2", PROMPT_IDS[4:8], seed=59)
    try:
        first = lab.run("ingest", "--model", "warm1", **env)  # cold; starts the server as it ends
        assert first.returncode == 0, first.stderr[-3000:]
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while not list(runtime.glob(f"imagebench-{os.getuid()}/warm-*.sock")):
            assert time.monotonic() < deadline, "no warm server ready"
            time.sleep(0.5)
        second = lab.run("ingest", "--model", "warm2", **env)
        assert second.returncode == 0 and "running cold" not in second.stderr, second.stderr[-3000:]
    finally:
        lab.run("warm", "stop", "--all", **env)
        shutil.rmtree(runtime, ignore_errors=True)
    made = [p for p in _walk(lab.home) if "warm2" in p.as_posix()]
    assert made, "the warm command wrote nothing of warm2"
    wide = {p: m for p, m in _modes(made, lab.home).items() if m not in ("0700", "0600")}
    assert not wide, wide


# ---- item 3: locks -------------------------------------------------------------------------------


def test_another_user_can_open_no_lock_file(lab, other_user):
    locks = _locks(lab.home)
    assert {p.name for p in locks} >= {"m1.lock", ".refresh.lock", ".gens.lock", ".lock"}
    for p in locks:  # private even if the folders above were opened
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p
    attack = other_user.run(LOCK_ATTACK, *map(str, locks))
    assert json.loads(attack.stdout) == []


def _hold(path: Path, mode: str = "ex") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), mode], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_busy_model_names_the_live_holder_and_says_the_recorded_run_ended(lab):
    """The lock file still names the run that scored m1 (its process ended long ago); another
    process of ours holds the lock now. `score` says who really holds it."""
    lock = lab.home / "locks" / "m1.lock"
    recorded = json.loads(lock.read_text())
    holder = _hold(lock)
    try:
        r = lab.run("score", "--model", "m1", IMAGEBENCH_MODEL_LOCK_WAIT_S="2")
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 1, r.stderr
    line = " ".join(r.stderr.split())
    assert str(lock) in line and f"process {holder.pid}" in line and "python" in line, line
    assert f"pid {recorded['pid']}" in line and "has ended" in line, line


def test_a_held_compaction_lock_ends_the_wait_and_names_its_holder(lab):
    """Before: `score` waited on the lake's compaction lock with no limit (a nightly too)."""
    put_model(lab.store, "m3", PROMPT_IDS[:4], seed=47)
    lock = lab.home / "lake" / "_compact" / ".refresh.lock"
    holder = _hold(lock)
    try:
        try:
            r = lab.run("score", "--model", "m3", timeout=COMMAND_TIMEOUT_S, IMAGEBENCH_LAKE_LOCK_WAIT_S="3")
        except subprocess.TimeoutExpired:
            raise AssertionError(f"`score` still waiting for {lock} after {COMMAND_TIMEOUT_S} s") from None
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 1, r.stderr
    line = " ".join(r.stderr.split())
    assert str(lock) in line and f"process {holder.pid}" in line and "IMAGEBENCH_LAKE_LOCK_WAIT_S" in line, line
