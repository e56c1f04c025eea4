"""The warm server (flows/warm.py): heavy commands fork from a process that paid the imports once.

Most tests share one server (its imports take tens of seconds on a busy machine), started the way a
user starts it: by a first command, which runs cold beside it. Liveness checks wait with generous
deadlines, never on how fast something is. Order matters at the end of the module: the SIGKILL test
kills the shared server, and the stale-code test starts servers of its own on a copy of the code.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from flows import warm

REPO = Path(__file__).resolve().parents[2]
ENTRY = Path(sys.executable).parent / "imagebench"  # the installed entry point, as a user runs it
LAUNCH = [str(ENTRY)] if ENTRY.exists() else [sys.executable, "-m", "flows.launch"]

# Set in this process by earlier in-process commands (flows/env.py): a spawned command must pick
# its own from its workspace, as on a terminal.
_LEAKED = ("PREFECT_HOME", "PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "PREFECT_SERVER_API_AUTH_STRING")


def _base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LEAKED}
    env.update({"IMAGEBENCH_WARM": "auto", "IMAGEBENCH_WARM_IDLE_S": "600", "COLUMNS": "200",
                "PYTHONPATH": str(REPO),
                # a machine shared with other jobs can take minutes to start a Prefect API
                "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "900", **extra})
    return env


def _run(args: list[str], env: dict[str, str], timeout: float = 400, cwd: Path = REPO, launch=None) -> subprocess.CompletedProcess:
    return subprocess.run([*(launch or LAUNCH), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _server_pid(env: dict[str, str]) -> int | None:
    path = warm.socket_path(warm.server_key(env))
    reply = warm._ask(path, "ping") if path.exists() else None
    return (reply or {}).get("pid")


def _wait(predicate, what: str, deadline_s: float = 900.0):
    end = time.monotonic() + deadline_s
    while not (value := predicate()):
        if time.monotonic() > end:
            raise AssertionError(f"still waiting after {deadline_s:.0f} s: {what}")
        time.sleep(0.1)
    return value


def _state(pid: int) -> str | None:
    """The process's state letter (Z: a zombie), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _commands(server: int) -> list[int]:
    """The server's forked commands (its other children run Prefect APIs through flows.ephemeral)."""
    return [c for c in _children(server) if b"flows.ephemeral" not in Path(f"/proc/{c}/cmdline").read_bytes()]


def _stop_server(env: dict[str, str]) -> None:
    pid = _server_pid(env)
    if pid:
        os.kill(pid, signal.SIGTERM)
        _wait(lambda: _state(pid) in (None, "Z"), "the server exits on SIGTERM", 60)


def _same_lines(text: str, *names: str) -> list[str]:
    """Output lines with what differs between two runs of one command (model names, run ids,
    times, counts of seconds) masked."""
    for name in names:
        text = text.replace(name, "<model>")
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<id>", text)
    text = re.sub(r"\d+(\.\d+)?\s*(s|ms|min)\b", "<t>", text)
    text = re.sub(r"\b\d+:\d\d:\d\d\b", "<t>", text)  # progress bars' elapsed time
    text = re.sub(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[^ ]*", "<time>", text)
    text = re.sub("[\u2500-\u257f]+", " ", text)  # table rules: their widths follow the names' lengths
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


# ---- the key: content, and only what the server imported --------------------------------------


def test_server_key_follows_content_not_times_nor_runtime_settings(tmp_path, monkeypatch):
    base = {"IMAGEBENCH_HOME": "/a", "TERM": "xterm", "PATH": "/bin"}
    same = (
        {"TERM": "dumb", "OLDPWD": "/x"},  # not import-relevant
        {"IMAGEBENCH_WARM": "auto", "IMAGEBENCH_WARM_IDLE_S": "5", "IMAGEBENCH_WARM_MAX_SERVERS": "3"},
        {"IMAGEBENCH_HOME": "/b", "IMAGEBENCH_TASK_RUNNER": "dask"},  # read by each command, in its child
    )
    for extra in same:
        assert warm.server_key(base) == warm.server_key({**base, **extra}), extra
    assert warm.server_key(base) != warm.server_key({**base, "PREFECT_API_URL": "http://x"})
    assert warm.server_key(base) != warm.server_key({**base, "IMAGEBENCH_TESSERACT": "/x"})  # read at import
    code = tmp_path / "code"
    for d in ("flows", "tasks", "schemas", "expectations"):
        (code / d).mkdir(parents=True)
    src, suite = code / "flows" / "m.py", code / "expectations" / "images.json"
    src.write_text("x = 1\n")
    suite.write_text('{"name": "images", "expectations": []}\n')
    monkeypatch.setattr(warm, "code_root", lambda: code)
    before = warm.server_key(base)
    os.utime(src, ns=(1, 1))
    assert warm.server_key(base) == before  # touched, not changed: the same server
    src.write_text("x = 2\n")
    edited = warm.server_key(base)
    assert edited != before
    src.write_text("x = 1\n")
    assert warm.server_key(base) == before  # an edit and its revert: back to the first server
    suite.write_text('{"name": "images", "expectations": [{"type": "expect_column_to_exist"}]}\n')
    assert warm.server_key(base) != before  # the GX suites it built at start


@pytest.mark.parametrize("value", ["off", "0", "false"])
def test_warm_off_means_cold(value, monkeypatch):
    monkeypatch.setenv("IMAGEBENCH_WARM", value)
    assert warm.mode() == "off"


def test_prefect_settings_follow_the_workspace_when_prefect_was_imported_first(tmp_path):
    """A warm child imported Prefect before its command set PREFECT_HOME: the settings are read again."""
    import prefect.context

    from flows.env import prepare_prefect_env

    saved = dict(os.environ)  # prepare_prefect_env sets variables of its own: all are put back
    for var in _LEAKED:
        os.environ.pop(var, None)
    try:
        prepare_prefect_env(tmp_path / "home")
        # the process-wide settings (a test harness may have its own on top: not what a command sees)
        settings = prefect.context.GLOBAL_SETTINGS_CONTEXT.settings
        assert Path(settings.home) == (tmp_path / "home" / "prefect").resolve()
        secret = (tmp_path / "home" / "prefect" / "api-auth")
        assert secret.stat().st_mode & 0o777 == 0o600
        assert settings.api.auth_string.get_secret_value() == secret.read_text().strip()
    finally:
        os.environ.clear()
        os.environ.update(saved)
        prefect.context.refresh_global_settings_context()


# ---- the cold command's own ephemeral API --------------------------------------------------------


def test_cold_commands_ephemeral_api_requires_the_workspace_secret(tmp_path):
    """The ephemeral API a cold command starts refuses a request without the workspace's secret;
    the command's own flow run records through it."""
    import httpx

    script = (
        "import sys\nfrom pathlib import Path\nfrom flows.env import prepare_prefect_env\n"
        "prepare_prefect_env(Path(sys.argv[1]))\nfrom prefect import flow\n"
        "@flow(name='auth-probe')\ndef probe():\n    return 1\n"
        "probe()\nfrom prefect.client.orchestration import get_client\n"
        "with get_client(sync_client=True) as c:\n    print(c.api_url, flush=True)\n    sys.stdin.read()\n"
    )
    env = _base_env(IMAGEBENCH_WARM="off", PREFECT_LOGGING_LEVEL="WARNING", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "home")], env=env, cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip().rstrip("/")
        assert url.startswith("http://127.0.0.1:"), url
        secret = (tmp_path / "home" / "prefect" / "api-auth").read_text().strip()
        body = {"flows": {"name": {"any_": ["auth-probe"]}}}
        assert httpx.post(f"{url}/flow_runs/filter", json=body).status_code == 401
        assert httpx.post(f"{url}/flows/", json={"name": "intruder"}).status_code == 401
        wrong = {"Authorization": "Basic " + base64.b64encode(b"guess").decode()}
        assert httpx.post(f"{url}/flow_runs/filter", json=body, headers=wrong).status_code == 401
        right = {"Authorization": "Basic " + base64.b64encode(secret.encode()).decode()}
        runs = httpx.post(f"{url}/flow_runs/filter", json=body, headers=right)
        assert runs.status_code == 200 and [r["state_type"] for r in runs.json()] == ["COMPLETED"]
    finally:
        proc.stdin.close()
        proc.wait(60)


# ---- one shared server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared(built_reference_template, tiny_model, tmp_path_factory):
    """A workspace (a copy of the built reference "t1", tiny model) and the environment of its
    commands. Its server is started by the first test, as a first command starts it."""
    from tests.flows.conftest import eligible_ids, put_model

    root = tmp_path_factory.mktemp("warm")
    shutil.copytree(built_reference_template / "home", root / "home")
    shutil.copytree(built_reference_template / "reference", root / "reference")
    base, ckpt = tiny_model
    env = _base_env(IMAGEBENCH_HOME=str(root / "home"), IMAGEBENCH_REFERENCE_DIR=str(root / "reference"),
                    IMAGEBENCH_REFERENCE_VERSION="t1", IMAGEBENCH_HPSV3_BASE_MODEL=str(base),
                    IMAGEBENCH_HPSV3_CHECKPOINT=str(ckpt), IMAGEBENCH_DEVICE="cpu", IMAGEBENCH_BATCH_SIZE="8",
                    IMAGEBENCH_TASK_BATCH_SIZE="48", IMAGEBENCH_TESSERACT=str(root / "no-tesseract"))
    for k in ("IMAGEBENCH_STORE", "IMAGEBENCH_CONFIG", "IMAGEBENCH_JUDGES_CONFIG", "IMAGEBENCH_TASK_RUNNER",
              "IMAGEBENCH_DASK_ADDRESS", "IMAGEBENCH_DASK_WORKERS"):
        env.pop(k, None)
    catalog = root / "home" / "catalog.duckdb"
    catalog.unlink(missing_ok=True)  # rebuilt by the first command, with this workspace's lake
    os.chmod(root / "home", 0o700)  # private, as imagebench makes it: no command says it tightened it
    prompts = eligible_ids()[:12]
    for model in ("cold", "first", "warm-1", "warm-2", "after"):
        put_model(root / "home" / "objects", model, prompts, seed=5)  # the same bytes: the same mu
    # A warm-server directory of this module's own ($TMPDIR): its logs start empty (a server's log
    # outlives it), and the cap never stops a server of anyone else's.
    rt = Path(tempfile.mkdtemp(prefix="ibw-", dir="/tmp"))  # short: a socket path holds 107 bytes
    env["TMPDIR"] = str(rt)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(rt))
        try:
            yield {"root": root, "home": root / "home", "env": env, "prompts": prompts}
        finally:
            _stop_server(env)
            shutil.rmtree(rt, ignore_errors=True)


def _warm_api(home: Path, env: dict[str, str]) -> str:
    log = warm.log_path(warm.server_key(env)).read_text()
    (port,) = re.findall(rf"Prefect API for {re.escape(str((home / 'prefect').resolve()))} on port (\d+)", log)
    return f"http://127.0.0.1:{port}/api"


def test_first_command_runs_cold_then_warm_equals_cold(shared):
    """No server yet: the first command runs cold (not waiting) while the server starts beside it.
    Then warm commands print what the cold one prints (no extra Prefect lines), give its mu bit
    for bit, and record their flow runs in the workspace's database, through one API kept for that
    home, which refuses a request without the workspace's secret."""
    import httpx

    from tasks.lake.tables import Lake

    env, home = shared["env"], shared["home"]
    key = warm.server_key(env)
    assert not warm.socket_path(key).exists()
    cold = _run(["score", "--model", "cold"], {**env, "IMAGEBENCH_WARM": "off"})
    assert cold.returncode == 0, cold.stderr[-3000:]
    first = _run(["score", "--model", "first"], env)
    assert first.returncode == 0, first.stderr[-3000:]
    # it ran cold, in its own process: its own ephemeral API, never the server's
    assert (warm.runtime_dir() / f"warm-{key}.starting").exists() or warm.socket_path(key).exists()
    server = _wait(lambda: _server_pid(env), "the server started beside the first command becomes ready")
    runs = {}
    for model in ("warm-1", "warm-2"):
        runs[model] = done = _run(["score", "--model", model], env)
        assert done.returncode == 0 and "running cold" not in done.stderr, done.stderr[-3000:]
    assert _server_pid(env) == server
    for res, model in ((first, "first"), (runs["warm-1"], "warm-1"), (runs["warm-2"], "warm-2")):
        assert _same_lines(res.stdout, model) == _same_lines(cold.stdout, "cold")
        assert _same_lines(res.stderr, model) == _same_lines(cold.stderr, "cold"), res.stderr
    mu = {m: sorted((r["prompt_id"], r["mu"]) for r in Lake(home / "lake").read("hps_scores", [m]).to_pylist())
          for m in ("cold", "first", "warm-1", "warm-2")}
    assert len(mu["cold"]) == len(shared["prompts"]) and mu["first"] == mu["warm-1"] == mu["warm-2"] == mu["cold"]
    with sqlite3.connect(home / "prefect" / "prefect.db") as db:
        done = db.execute("SELECT count(*) FROM flow_run WHERE state_type = 'COMPLETED'").fetchone()[0]
    assert done >= 4  # the cold, first and both warm commands' flow runs, in this workspace's database
    log = warm.log_path(key).read_text()
    assert log.count("Prefect API for") == 1, log[-2000:]  # started by the first warm command, reused
    # the server began only once the first command's process had ended (tests/flows/test_warm_after.py)
    assert re.search(r"starting at [\d.]+: process \d+ ended\n", log), log[:2000]

    api = _warm_api(home, env)
    secret = (home / "prefect" / "api-auth").read_text().strip()
    assert httpx.post(f"{api}/flow_runs/filter", json={}).status_code == 401
    assert httpx.post(f"{api}/flows/", json={"name": "intruder"}).status_code == 401
    right = {"Authorization": "Basic " + base64.b64encode(secret.encode()).decode()}
    listed = httpx.post(f"{api}/flow_runs/filter", json={}, headers=right)
    assert listed.status_code == 200 and sum(r["state_type"] == "COMPLETED" for r in listed.json()) >= 4


def test_usage_errors_and_stale_reference_read_like_cold(shared):
    env, root = shared["env"], shared["root"]
    assert _server_pid(env)
    for args in (["score"], ["score", "--model", "x", "--no-such-option"]):
        cold, hot = _run(args, {**env, "IMAGEBENCH_WARM": "off"}), _run(args, env)
        assert hot.returncode == cold.returncode == 2
        assert hot.stderr == cold.stderr and "Usage: imagebench score" in hot.stderr, hot.stderr
    # The reference and suite files are read by each command: tampered after the server started,
    # the warm command refuses as the cold one does.
    ref = root / "reference" / "eps-reference-t1.json"
    original = ref.read_bytes()
    try:
        ref.write_bytes(original.replace(b"}", b', "tampered": 1}', 1))
        cold, hot = _run(["score", "--model", "after"], {**env, "IMAGEBENCH_WARM": "off"}), _run(["score", "--model", "after"], env)
        assert hot.returncode == cold.returncode == 1 and "running cold" not in hot.stderr
        assert hot.stderr == cold.stderr and "SHA256SUMS" in hot.stderr, hot.stderr
    finally:
        ref.write_bytes(original)


def _raw(path: Path, obj: dict, fds: list[int] | None = None) -> dict | None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        warm.send_json(sock, obj, fds)
        reply, _ = warm.recv_json(sock, bytearray())
        return reply


def test_server_runs_only_authenticated_warm_commands(shared, tmp_path):
    env = shared["env"]
    key = warm.server_key(env)
    path, cookie = warm.socket_path(key), warm.read_cookie(key)
    assert warm.cookie_path(key).stat().st_mode & 0o777 == 0o600 and len(cookie) >= 32
    server = _server_pid(env)
    out = tmp_path / "out"
    mine, theirs = socket.socketpair()
    with open(out, "w") as sink, mine, theirs:
        fds = [0, sink.fileno(), sink.fileno(), theirs.fileno()]
        run = {"op": "run", "argv": ["sql", "SELECT 42"], "env": env, "cwd": str(REPO)}
        assert "not a warm command" in _raw(path, {**run, "cookie": cookie}, fds)["error"]
        no_cookie = {**run, "argv": ["score", "--model", "after"]}
        assert "not authenticated" in _raw(path, no_cookie, fds)["error"]
        assert "not authenticated" in _raw(path, {**no_cookie, "cookie": "0" * 64}, fds)["error"]
        assert "not authenticated" in _raw(path, {"op": "ping"})["error"]
        # the Prefect API operation takes a home of this user's, nothing else: no environment, no app dir
        refused = _raw(path, {"op": "prefect-api", "home": "relative/dir", "cookie": cookie})
        assert "absolute" in refused["error"]
        other_env = {**run, "argv": ["score", "--model", "after"], "env": {**env, "PREFECT_API_URL": "http://x"}, "cookie": cookie}
        assert "another server" in _raw(path, other_env, fds)["error"]
    assert out.read_text() == "" and not _commands(server)  # nothing ran
    assert _server_pid(env) == server


def test_gone_and_silent_clients_never_affect_another_command(shared, tmp_path):
    """A client that sends `run` and exits at once, and one that connects and says nothing: the
    server lives on and another command completes meanwhile."""
    env = shared["env"]
    key = warm.server_key(env)
    path, cookie = warm.socket_path(key), warm.read_cookie(key)
    server = _server_pid(env)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(str(path))  # held open, nothing sent, for the whole test
    try:
        for _ in range(3):  # run and hang up before the server answers with the pid
            mine, theirs = socket.socketpair()
            with open(os.devnull, "w") as sink, mine, theirs:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(str(path))
                warm.send_json(sock, {"op": "run", "argv": ["score", "--model", "no-such-model"], "env": env,
                                      "cwd": str(REPO), "cookie": cookie}, [0, sink.fileno(), sink.fileno(), theirs.fileno()])
                sock.close()
        done = _run(["score", "--model", "no-such-model"], env, timeout=120)
        cold = _run(["score", "--model", "no-such-model"], {**env, "IMAGEBENCH_WARM": "off"})
        assert done.returncode == cold.returncode == 1 and done.stderr == cold.stderr, done.stderr
        assert _server_pid(env) == server
    finally:
        silent.close()
    _wait(lambda: not _commands(server), "the gone clients' commands end", 120)


def _mute_s3(env: dict[str, str]) -> tuple[socket.socket, dict[str, str]]:
    """An S3 endpoint that takes connections and never answers: an ingest from it blocks for minutes."""
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(64)
    return mute, {**env, "IMAGEBENCH_S3_ENDPOINT": f"http://127.0.0.1:{mute.getsockname()[1]}",
                  "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1"}


SLOW = ["ingest", "--model", "slow", "--source", "s3://bucket/models/"]


def _past_interpreter_start(pid: int) -> bool:
    """The launcher's first line (its SIGINT handler) has run: it has loaded _socket, which nothing
    before it loads. Before that the interpreter is still starting (site, the venv's .pth files),
    where Python's own start-up decides what a Ctrl-C does: no code of ours has run yet."""
    try:
        return "/_socket." in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return True  # already gone: it ended on its own, which the assertions below look at


@pytest.mark.parametrize("warm_mode", ["auto", "off"])
def test_ctrl_c_at_any_moment_exits_130_without_traceback(shared, warm_mode):
    env = shared["env"]
    assert warm_mode == "off" or _server_pid(env)
    mute, slow_env = _mute_s3({**env, "IMAGEBENCH_WARM": warm_mode})
    try:
        for delay in (0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2):
            proc = subprocess.Popen([*LAUNCH, *SLOW], env=slow_env, cwd=REPO, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            _wait(lambda proc=proc: _past_interpreter_start(proc.pid), "the launcher's first line", 60)
            time.sleep(delay)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 130, (delay, proc.returncode, err)
            assert "Traceback" not in err and "KeyboardInterrupt" not in err and "Aborted" not in err, (delay, err)
    finally:
        mute.close()


def test_a_killed_client_ends_its_command(shared):
    env = shared["env"]
    server = _server_pid(env)
    mute, slow_env = _mute_s3(env)
    try:
        client = subprocess.Popen([*LAUNCH, *SLOW], env=slow_env, cwd=REPO, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        (child,) = _wait(lambda: _commands(server), "the warm server forks the command")
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=30)
        _wait(lambda: _state(child) is None, "the command's process ends after its client was killed", 60)
    finally:
        mute.close()


def test_sigterm_to_a_warm_command_whose_judge_hangs_ends_within_the_grace(shared, tmp_path):
    """As cold (tests/flows/test_stopping.py): the forked command's stop watch ends it 3 s after
    the SIGTERM its client forwarded, although its judge requests would wait 600 s, and tells the
    client its status; the server keeps serving."""
    from tests.flows.conftest import StalledEndpoint, put_model

    env, home = shared["env"], shared["home"]
    server = _server_pid(env)
    put_model(home / "objects", "stopped-warm", shared["prompts"], seed=7)
    stalled = StalledEndpoint()
    try:
        cfg = stalled.judges_config(tmp_path / "judges.yaml")
        client = subprocess.Popen([*LAUNCH, "score", "--model", "stopped-warm"], cwd=REPO, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True,
                                  env={**env, "IMAGEBENCH_JUDGES_CONFIG": str(cfg), "IMAGEBENCH_STOP_GRACE_S": "3"})
        (child,) = _wait(lambda: _commands(server), "the warm server forks the command")
        _wait(lambda: stalled.held or client.poll() is not None, "a judge request in flight", 300)
        assert stalled.held, client.communicate()[1][-3000:]
        client.send_signal(signal.SIGTERM)
        try:
            _, err = client.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            client.kill()
            os.kill(child, signal.SIGKILL)
            raise AssertionError("still running 120 s after SIGTERM") from None
    finally:
        stalled.close()
    assert client.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "still running 3 s after SIGTERM: stopping now (status 143)" in err, err[-3000:]
    _wait(lambda: _state(child) is None, "the command's process is reaped", 60)
    assert _server_pid(env) == server


def test_workspace_task_runner_is_honoured_warm(shared, tmp_path):
    """`task_runner: dask` in the workspace's imagebench.yaml: the warm command's flow runs on a
    local Dask cluster (its worker leaves its scratch space where the command's Dask config says)."""
    env = shared["env"]
    server = _server_pid(env)
    settings_file = shared["home"] / "imagebench.yaml"
    settings_file.write_text("task_runner: dask\ndask_workers: 1\n")
    scratch = tmp_path / "dask-tmp"
    try:
        done = _run(["score", "--model", "after"], {**env, "DASK_TEMPORARY_DIRECTORY": str(scratch)})
        assert done.returncode == 0 and "running cold" not in done.stderr, done.stderr[-3000:]
        assert _server_pid(env) == server
        assert (scratch / "dask-scratch-space").is_dir()
    finally:
        settings_file.unlink()


def test_server_killed_mid_command_client_says_so_at_once_and_no_zombie(shared):
    """SIGKILL of the server while a command runs: the client says so in one line within seconds,
    its command is stopped and reaped (the server's keeper is a child subreaper), nothing is left."""
    env = shared["env"]
    server = _server_pid(env)
    mute, slow_env = _mute_s3(env)
    try:
        client = subprocess.Popen([*LAUNCH, *SLOW], env=slow_env, cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        (child,) = _wait(lambda: _commands(server), "the warm server forks the command")
        apis = [c for c in _children(server) if c != child]
        os.kill(server, signal.SIGKILL)
        _out, err = client.communicate(timeout=60)  # the command alone would block for minutes
        assert client.returncode == 1
        assert err.strip().splitlines()[-1].startswith("imagebench: error: the warm server stopped"), err
        assert str(warm.log_path(warm.server_key(env))) in err  # where to read why
        assert "Traceback" not in err
        for pid in (child, server, *apis):
            _wait(lambda pid=pid: _state(pid) is None, f"process {pid} ends and is reaped (no zombie)", 60)
    finally:
        mute.close()
    # Its keeper said how it ended, in the log that outlives it, and removed the files it left.
    key = warm.server_key(env)
    assert f"warm server {key} (pid {server}) killed by SIGKILL" in warm.log_path(key).read_text()
    assert not warm.socket_path(key).exists() and not warm.own_socket_path(key, server).exists()
    # The next command finds the stale files, runs cold and starts a new server.
    again = _run(["score", "--model", "no-such-model"], env, timeout=120)
    assert again.returncode == 1 and "running cold" not in again.stderr, again.stderr
    _wait(lambda: _server_pid(env), "a new server after the killed one")


def _key_in(code: Path, env: dict[str, str]) -> str:
    """The server key a command in the code tree ``code`` computes."""
    return subprocess.run([sys.executable, "-c", "import os;from flows import warm;print(warm.server_key(dict(os.environ)))"],
                          env=env, cwd=code, capture_output=True, text=True, check=True).stdout.strip()


def _failed_runs_logs(home: Path, model: str, n: int) -> list[list[tuple[int, str]]]:
    """The log records of the last ``n`` failed flow runs of ``model`` in the workspace's Prefect
    database, oldest first: (level, first line, its ids, names and numbers made alike)."""
    def alike(message: str) -> str:
        line = message.splitlines()[0] if message else ""
        return re.sub(r"'[a-z]+-[a-z]+'|[0-9a-f-]{36}|\d+(\.\d+)?", "#", line)

    with sqlite3.connect(home / "prefect" / "prefect.db") as db:
        runs = [r[0] for r in db.execute(
            "SELECT id FROM flow_run WHERE state_type = 'FAILED' AND json_extract(parameters, '$.model_id') = ? "
            "ORDER BY created DESC LIMIT ?", (model, n))][::-1]
        return [[(level, alike(msg)) for level, msg in db.execute(
            "SELECT level, message FROM log WHERE flow_run_id = ? ORDER BY timestamp", (run,))] for run in runs]


def test_stale_code_never_serves_and_servers_are_capped(shared, tmp_path, monkeypatch):
    """An always-failing expectation added to expectations/images.json after the server started:
    the next command does not use that server (its code key changed) and fails as the cold one
    does; the new server replaces the old one (IMAGEBENCH_WARM_MAX_SERVERS=1), whose files go with it."""
    code = tmp_path / "code"
    for d in ("flows", "tasks", "schemas", "expectations"):
        shutil.copytree(REPO / d, code / d, ignore=shutil.ignore_patterns("__pycache__"))
    # Its own $TMPDIR, so its own warm directory: the cap of 1 never stops a server of anyone else.
    rt = Path(tempfile.mkdtemp(prefix="ibw-", dir="/tmp"))  # short: a socket path holds 107 bytes
    monkeypatch.setattr(tempfile, "tempdir", str(rt))
    env = {**shared["env"], "PYTHONPATH": str(code), "IMAGEBENCH_WARM_MAX_SERVERS": "1", "TMPDIR": str(rt)}
    launch = [sys.executable, "-m", "flows.launch"]
    old_key = _key_in(code, env)
    first = _run(["score", "--model", "no-such-model"], env, cwd=code, launch=launch)
    assert first.returncode == 1
    old_pid = _wait(lambda: (warm._ask(warm.socket_path(old_key), "ping") or {}).get("pid"), "the first server", 900)
    suite = code / "expectations" / "images.json"
    config = json.loads(suite.read_text())
    config["expectations"].append({"type": "expect_column_values_to_be_in_set",
                                   "kwargs": {"column": "prompt_id", "value_set": ["nothing-is-in-this-set"]}})
    suite.write_text(json.dumps(config))
    cold = _run(["score", "--model", "after"], {**env, "IMAGEBENCH_WARM": "off"}, cwd=code, launch=launch)
    assert cold.returncode == 1 and "ValidationFailed" in cold.stderr, cold.stderr[-2000:]
    hot = _run(["score", "--model", "after"], env, cwd=code, launch=launch)
    assert hot.returncode == 1 and "ValidationFailed" in hot.stderr, hot.stderr[-2000:]
    # the old server was stopped to make room for the new one, its files removed, its log kept
    _wait(lambda: _state(old_pid) in (None, "Z"), "the least recently used server stops")
    new_key = _key_in(code, env)
    assert new_key != old_key
    assert not warm.socket_path(old_key).exists() and not warm.cookie_path(old_key).exists()
    assert f"(pid {old_pid}) exiting: making room for warm server {new_key} (IMAGEBENCH_WARM_MAX_SERVERS=1)" \
        in warm.log_path(old_key).read_text()
    new_pid = _wait(lambda: (warm._ask(warm.socket_path(new_key), "ping") or {}).get("pid"), "the new server", 900)
    try:
        again = _run(["score", "--model", "after"], env, cwd=code, launch=launch)
        assert again.returncode == 1 and "running cold" not in again.stderr
        # the same one-line error as the cold command (the traceback Prefect prints above it: not compared)
        assert _same_lines(again.stderr)[-1] == _same_lines(cold.stderr)[-1], again.stderr[-2000:]
        assert "ValidationFailed: suite 'images'" in _same_lines(again.stderr)[-1]
        # The flow run's last log records reach the workspace's Prefect API from the warm child as
        # from a cold process (Prefect sends them from a worker drained at exit).
        cold_logs, hot_logs, again_logs = _failed_runs_logs(shared["home"], "after", 3)
        assert any(level >= 40 and "Failed" in msg for level, msg in cold_logs), cold_logs
        assert again_logs == hot_logs == cold_logs
    finally:
        os.kill(new_pid, signal.SIGTERM)
        _wait(lambda: _state(new_pid) in (None, "Z"), "the new server exits on SIGTERM", 60)
        shutil.rmtree(rt, ignore_errors=True)
