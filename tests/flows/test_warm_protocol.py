"""The warm server's protocol (flows/warm.py): one live server per key, a busy server never
stopped, every exit and its reason in a log that survives the server (issue 24 item 4).

Real servers and real commands: `imagebench import-scores` of a small CSV (a warm command that
exits 0 and prints a table). A command is held running, deterministically, by its own output:
its stdout is a pipe the test filled beforehand, so the command blocks on its last write until
the test reads. Each test has a warm-server directory of its own ($TMPDIR: the cap never stops
anyone else's server) and runs a snapshot of the code (an edit elsewhere in the tree changes no
key mid-test). Waits are generous deadlines, never how fast something is.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from flows import warm

REPO = Path(__file__).resolve().parents[2]
_LEAKED = ("PREFECT_HOME", "PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "PREFECT_SERVER_API_AUTH_STRING")
_SETTINGS = ("IMAGEBENCH_STORE", "IMAGEBENCH_CONFIG", "IMAGEBENCH_JUDGES_CONFIG", "IMAGEBENCH_TASK_RUNNER",
             "IMAGEBENCH_DASK_ADDRESS", "IMAGEBENCH_DASK_WORKERS", "IMAGEBENCH_REFERENCE_VERSION")
GONE = "the warm server stopped while running this command"


# ---- set-up --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def code(tmp_path_factory) -> Path:
    """A snapshot of the code the servers import (their key is its contents)."""
    root = tmp_path_factory.mktemp("warm-code")
    for d in ("flows", "tasks", "schemas", "expectations"):
        shutil.copytree(REPO / d, root / d)
    return root


@pytest.fixture()
def rt(monkeypatch):
    """A warm-server directory of this test's own (short: a socket path holds 107 bytes); every
    server started in it is killed at the end."""
    d = Path(tempfile.mkdtemp(prefix="ibw-", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    try:
        yield d
    finally:
        _kill_servers(d)
        shutil.rmtree(d, ignore_errors=True)


def _kill_servers(d: Path) -> None:
    """Every warm-server process whose $TMPDIR is ``d``, with its process group (its keeper leads
    it: the server, its commands and Prefect APIs)."""
    for proc in Path("/proc").iterdir():
        try:
            if b"flows.warm_server" in (proc / "cmdline").read_bytes() and \
                    f"TMPDIR={d}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                os.killpg(os.getpgid(int(proc.name)), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def _env(code: Path, rt: Path, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LEAKED and k not in _SETTINGS}
    env.update({"IMAGEBENCH_WARM": "auto", "IMAGEBENCH_WARM_IDLE_S": "600", "PYTHONPATH": str(code),
                "TMPDIR": str(rt), "IMAGEBENCH_HOME": str(home), "IMAGEBENCH_REFERENCE_DIR": str(REPO / "reference"),
                "COLUMNS": "200", **extra})
    return env


def _key(code: Path, env: dict[str, str]) -> str:
    """The server key a command with ``env`` computes in the code tree ``code``."""
    return subprocess.run([sys.executable, "-c", "import os;from flows import warm;print(warm.server_key(dict(os.environ)))"],
                          env=env, cwd=code, capture_output=True, text=True, check=True).stdout.strip()


def _csv(path: Path, model: str) -> Path:
    from tests.flows.conftest import PROMPT_IDS

    path.write_text("model_id,prompt_id,mu\n" + "".join(f"{model},{p},{i / 10}\n" for i, p in enumerate(PROMPT_IDS[:3])))
    return path


def _command(code: Path, env: dict[str, str], args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flows.launch", *args], env=env, cwd=code, **kw)


def _run(code: Path, env: dict[str, str], args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.launch", *args], env=env, cwd=code, capture_output=True,
                          text=True, timeout=timeout)


def _start_by_hand(code: Path, env: dict[str, str], key: str) -> subprocess.Popen:
    """`python -m flows.warm_server KEY`, as a starter that decided to start one runs it."""
    with open(warm.log_path(key), "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "flows.warm_server", key], env=env, cwd=code,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


def _ping(path: Path) -> dict:
    return warm._ask(path, "ping") or {}


def _log(key: str) -> str:
    try:
        return warm.log_path(key).read_text()
    except FileNotFoundError:
        return ""


def _wait(predicate, what: str, deadline_s: float = 900.0):
    end = time.monotonic() + deadline_s
    while not (value := predicate()):
        if time.monotonic() > end:
            raise AssertionError(f"still waiting after {deadline_s:.0f} s: {what}")
        time.sleep(0.1)
    return value


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class HeldOutput:
    """A pipe filled to the brim: a command writing its output there blocks until ``release``."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.write_end, False)
        for chunk in (65536, 1):
            try:
                while True:
                    os.write(self.write_end, b"." * chunk)
            except BlockingIOError:
                pass
        os.set_blocking(self.write_end, True)  # the command's writes block (the flag is the pipe's, shared)
        self.data = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        while chunk := os.read(self.read_end, 65536):
            self.data.extend(chunk)

    def given(self) -> None:
        """The command has its own copy: the test's is closed, so EOF comes when the command ends."""
        os.close(self.write_end)

    def release(self) -> None:
        self._reader.start()

    def text(self, timeout: float = 300) -> str:
        self._reader.join(timeout)
        return self.data.decode(errors="replace").lstrip(".")


def _kill_starting(key: str) -> None:
    """A server started by a command (importing): killed, to spare the test its CPU."""
    with warm.key_lock(key):
        pid = warm.holder(key, "starting")
    if pid:
        os.killpg(pid, signal.SIGKILL)  # its starter gave it a session: the keeper leads its group
        _wait(lambda: not _alive(pid), "the started server is killed", 60)


# ---- a second server never takes over a live server's socket -----------------------------------


@pytest.mark.slow
def test_a_second_server_never_takes_over_a_live_servers_socket(code, rt, tmp_path):
    """Server S1 runs a command; a second server of the same key (a starter that decided to start
    one while S1 was still importing) leaves without touching S1's socket, and S1's command
    completes. `warm stop` while it runs: S1 drains (no new command) and exits once it ended;
    the reasons stay in the log. A server that becomes ready after another took the key in the
    meantime leaves that socket alone as well."""
    env = _env(code, rt, tmp_path / "home")
    late_env = {**env, "PYTHONIBKEY": "late"}  # another key: its own server, imported beside S1
    key, late_key = _key(code, env), _key(code, late_env)
    late = _start_by_hand(code, late_env, late_key)
    s1 = _start_by_hand(code, env, key)
    # The late server passed its start checks and imports; the test then takes its key as a live
    # server would (the key's mutex, its serving lock, a socket of its own linked to the public name).
    _wait(lambda: f"warm server {late_key} (pid" in _log(late_key) and "importing" in _log(late_key),
          "the late server passed its start checks and imports")
    with warm.key_lock(late_key):
        serving = warm.take_lock(warm.lock_path(late_key, "serving"), 0)
        assert serving is not None, _log(late_key)[-3000:]  # still importing: it has not taken the key
        warm.write_pid(serving, os.getpid())
        mine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        own = warm.own_socket_path(late_key, os.getpid())
        mine.bind(str(own))
        mine.listen(1)
        warm.link_over(own, warm.socket_path(late_key))
    try:
        public = warm.socket_path(key)
        s1_pid = _wait(lambda: _ping(public).get("pid"), "S1 serves")
        held = HeldOutput()
        client = _command(code, env, ["import-scores", str(_csv(tmp_path / "a.csv", "held-a"))], stdout=held.write_end,
                          stderr=subprocess.PIPE, text=True)
        held.given()
        _wait(lambda: _ping(public).get("commands") == 1, "S1 runs the command (held by its output)")
        s2 = _start_by_hand(code, env, key)
        _wait(lambda: s2.poll() is not None or _ping(public).get("pid", s1_pid) != s1_pid,
              "the second server leaves (or takes S1's socket)")
        assert _alive(s1_pid) and _ping(public).get("pid") == s1_pid, _log(key)[-3000:]
        assert s2.returncode == 0
        assert f"not starting: warm server pid {s1_pid} already serves this key" in _log(key), _log(key)[-3000:]

        stopped = _run(code, env, ["warm", "stop"], timeout=300)  # S1 is busy: it drains
        assert stopped.returncode == 0 and "exits when its 1 running end" in stopped.stderr, stopped.stderr
        assert not public.exists()  # the key given up at once: a new command runs cold, or on a new server
        assert _alive(s1_pid) and _ping(warm.own_socket_path(key, s1_pid)).get("draining") is True

        held.release()
        _, err = client.communicate(timeout=600)
        assert client.returncode == 0 and GONE not in err, err[-3000:]
        assert "held-a" in held.text() and "rows_imported" in held.text()
        assert s1.wait(timeout=120) == 0
        log = _log(key)
        assert f"(pid {s1_pid}) takes no new command: imagebench warm stop (1 running)" in log, log[-3000:]
        assert f"(pid {s1_pid}) exiting: imagebench warm stop; 1 commands served" in log, log[-3000:]

        assert late.wait(timeout=900) == 0
        assert warm.same_file(warm.socket_path(late_key), own)
        assert f"exiting: warm server pid {os.getpid()} already serves this key: its socket is left alone" \
            in _log(late_key), _log(late_key)[-3000:]
    finally:
        mine.close()
        os.close(serving)


def test_a_command_that_ends_starts_no_server_while_one_serves_or_starts(rt, tmp_path):
    """The command that ran cold decided at its start to start a server; as it ends it looks again
    (under the key's mutex): a server that became ready meanwhile, or one still starting, and it
    starts none. Only with neither does it start one (which then holds the start for its key)."""
    from flows import launch

    env = {**os.environ, "TMPDIR": str(rt)}
    key = "0123456789abcdef"
    for what in ("serving", "starting"):
        with warm.key_lock(key):
            held = warm.take_lock(warm.lock_path(key, what), 0)
        try:
            assert launch._start_server(key, env) is None, what
        finally:
            os.close(held)
    pid = launch._start_server(key, env)
    assert pid is not None
    try:
        with warm.key_lock(key):
            assert warm.holder(key, "starting") == pid  # the process on its way holds the start
        assert launch._start_server(key, env) is None
    finally:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    with warm.key_lock(key):
        assert warm.holder(key, "starting") is None  # its holder died: the start is free again, nothing stale


# ---- the cap: idle servers first, a busy one drains ---------------------------------------------


@pytest.mark.slow
def test_the_cap_stops_idle_servers_first_and_a_busy_one_drains(code, rt, tmp_path):
    """IMAGEBENCH_WARM_MAX_SERVERS=2, servers A (running a command, least recently used) and B
    (idle): a command of a third key asks B to stop, never A. With a cap of 1, a fourth key's
    command asks A: it drains (refuses new commands, its key is free), its command completes, and
    it exits; each reason is in its log after it exited."""
    home = tmp_path / "home"
    env_a = _env(code, rt, home, IMAGEBENCH_WARM_MAX_SERVERS="2")
    env_b, env_c = {**env_a, "PYTHONIBKEY": "b"}, {**env_a, "PYTHONIBKEY": "c"}
    env_d = {**env_a, "PYTHONIBKEY": "d", "IMAGEBENCH_WARM_MAX_SERVERS": "1"}
    key_a, key_b, key_c, key_d = (_key(code, e) for e in (env_a, env_b, env_c, env_d))
    a, b = _start_by_hand(code, env_a, key_a), _start_by_hand(code, env_b, key_b)
    pid_a = _wait(lambda: _ping(warm.socket_path(key_a)).get("pid"), "A serves")
    pid_b = _wait(lambda: _ping(warm.socket_path(key_b)).get("pid"), "B serves")

    held = HeldOutput()
    client = _command(code, env_a, ["import-scores", str(_csv(tmp_path / "a.csv", "held-a"))], stdout=held.write_end,
                      stderr=subprocess.PIPE, text=True)
    held.given()
    _wait(lambda: _ping(warm.socket_path(key_a)).get("commands") == 1, "A runs the command (held by its output)")
    done = _run(code, env_b, ["import-scores", str(_csv(tmp_path / "b.csv", "on-b"))])
    assert done.returncode == 0 and "on-b" in done.stdout, done.stderr[-3000:]
    assert f"(pid {pid_b}) runs import-scores" in _log(key_b)  # B was used last: A is the least recently used

    third = _run(code, env_c, ["import-scores", str(_csv(tmp_path / "c.csv", "on-c"))])  # cold; starts C as it ends
    assert third.returncode == 0 and "on-c" in third.stdout, third.stderr[-3000:]
    _kill_starting(key_c)
    assert b.wait(timeout=120) == 0
    assert f"(pid {pid_b}) exiting: making room for warm server {key_c} (IMAGEBENCH_WARM_MAX_SERVERS=2); 1 commands served" \
        in _log(key_b), _log(key_b)[-3000:]
    assert _ping(warm.socket_path(key_a)) == {"pid": pid_a, "key": key_a, "commands": 1, "draining": False}

    fourth = _run(code, env_d, ["import-scores", str(_csv(tmp_path / "d.csv", "on-d"))])
    assert fourth.returncode == 0 and "on-d" in fourth.stdout, fourth.stderr[-3000:]
    _kill_starting(key_d)
    assert not warm.socket_path(key_a).exists() and _alive(pid_a)  # draining: its key given up, still running
    own = warm.own_socket_path(key_a, pid_a)
    assert _ping(own)["draining"] is True
    refused = warm.request(own, {"op": "run", "argv": ["import-scores", "x.csv"], "env": env_a, "cwd": str(code)})
    assert refused["error"].startswith("refused: draining (making room for warm server")

    held.release()
    _, err = client.communicate(timeout=600)
    assert client.returncode == 0 and GONE not in err, err[-3000:]
    assert "held-a" in held.text() and "rows_imported" in held.text()
    assert a.wait(timeout=120) == 0
    log = _log(key_a)
    assert f"(pid {pid_a}) takes no new command: making room for warm server {key_d} (IMAGEBENCH_WARM_MAX_SERVERS=1) " \
        "(1 running)" in log, log[-3000:]
    assert f"(pid {pid_a}) exiting: making room for warm server {key_d}" in log, log[-3000:]
    assert not own.exists() and not warm.own_cookie_path(key_a, pid_a).exists()  # its own files went with it


# ---- old keys' files ----------------------------------------------------------------------------


def test_prune_removes_only_the_files_of_keys_unused_for_a_week(rt):
    """An edited tree leaves a key behind at each edit: their locks and logs go after a week;
    a key whose lock a live process holds, or used recently, stays."""
    d = warm.runtime_dir()
    week_ago = time.time() - warm.PRUNE_AFTER_S - 60
    for key in ("0ld0000000000000", "b05y000000000000", "fresh00000000000"):
        for what in ("lock", "starting", "serving", "log"):
            (d / f"warm-{key}.{what}").write_text("")
        (d / f".warm-{key}.sock.999999999").write_text("")
        if key != "fresh00000000000":
            for p in d.glob(f"*warm-{key}.*"):
                os.utime(p, (week_ago, week_ago))
    with warm.key_lock("b05y000000000000"):
        busy = warm.take_lock(warm.lock_path("b05y000000000000", "serving"), 0)
    try:
        assert warm.prune() == ["0ld0000000000000"]
        assert not list(d.glob("*warm-0ld0000000000000*"))
        assert len(list(d.glob("*warm-b05y000000000000*"))) == 5 and len(list(d.glob("*warm-fresh00000000000*"))) == 5
    finally:
        os.close(busy)


# ---- many commands, several workspaces, a loaded machine ----------------------------------------


def _hog() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)


@pytest.mark.slow
def test_many_commands_from_several_workspaces_on_a_loaded_machine_none_lost(code, rt, tmp_path):
    """Four workspaces, three keys (two checkouts' worth of one, one each of two others),
    IMAGEBENCH_WARM_MAX_SERVERS=2, two CPU hogs beside them, every workspace running its commands
    one after another, all at once. Servers A and B serve at the start; the third key's commands
    run cold and each starts (or finds starting) its server, which makes room while A's and B's
    workspaces keep sending commands (they go on until the third key's are done): servers are
    asked to stop while busy, keys change hands, commands run cold meanwhile. Every command exits
    0 with its output, and none says the warm server stopped under it."""
    base = _env(code, rt, tmp_path / "unused", IMAGEBENCH_WARM_MAX_SERVERS="2")
    envs = [{**base, "IMAGEBENCH_HOME": str(tmp_path / f"ws{i}"), **({"PYTHONIBKEY": k} if k else {})}
            for i, k in enumerate(("", "", "b", "c"))]
    keys = [_key(code, e) for e in envs]
    assert keys[0] == keys[1] and len(set(keys)) == 3
    for env, key in ((envs[0], keys[0]), (envs[2], keys[2])):
        _start_by_hand(code, env, key)
    for key in (keys[0], keys[2]):
        _wait(lambda key=key: _ping(warm.socket_path(key)).get("pid"), f"server {key} serves")

    results: dict[tuple[int, int], subprocess.CompletedProcess] = {}
    third_done = threading.Event()

    def workspace(i: int, least: int, until: threading.Event | None) -> None:
        r = 0
        while r < least or (until is not None and not until.is_set() and r < 40):
            csv = _csv(tmp_path / f"ws{i}-{r}.csv", f"w{i}-r{r}")
            results[i, r] = _run(code, envs[i], ["import-scores", str(csv)])
            r += 1
        if until is None:
            third_done.set()

    hogs = [_hog(), _hog()]
    try:
        threads = [threading.Thread(target=workspace, args=(i, 3, third_done)) for i in range(3)]
        threads.append(threading.Thread(target=workspace, args=(3, 2, None)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=1500)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    logs = "".join(_log(key) for key in sorted(set(keys)))
    print(logs)  # what the servers did (pytest shows it with a failure; -s shows it always)
    assert not any(t.is_alive() for t in threads)
    assert sorted({i for i, _r in results}) == [0, 1, 2, 3] and len(results) >= 11
    for (i, r), res in sorted(results.items()):
        assert res.returncode == 0, (i, r, res.stderr[-3000:])
        assert f"w{i}-r{r}" in res.stdout and "rows_imported" in res.stdout, (i, r, res.stdout[-2000:])
        assert GONE not in res.stderr and "Traceback" not in res.stderr, (i, r, res.stderr[-3000:])
