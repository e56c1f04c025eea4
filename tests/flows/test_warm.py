"""The warm server (flows/warm.py): heavy commands fork from a process that paid the imports once.

One server per test (its imports take seconds); liveness checks wait with generous deadlines,
never on how fast something is.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows import warm

REPO = Path(__file__).resolve().parents[2]
LAUNCH = [sys.executable, "-m", "flows.launch"]


# Set in this process by earlier in-process commands (flows/env.py): a spawned command must pick
# its own from its workspace, as on a terminal.
_LEAKED = ("PREFECT_HOME", "PREFECT_API_URL")


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMAGEBENCH_") and k not in _LEAKED}
    env.update({"IMAGEBENCH_HOME": str(home), "IMAGEBENCH_WARM": "auto", "IMAGEBENCH_WARM_IDLE_S": "120",
                "IMAGEBENCH_REFERENCE_DIR": str(home / "reference"), "COLUMNS": "200", **extra})
    return env


def _run(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*LAUNCH, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _server_pid(env: dict[str, str]) -> int | None:
    path = warm.socket_path(warm.server_key(env))
    reply = warm._ask(path, "ping") if path.exists() else None
    return (reply or {}).get("pid")


def _wait(predicate, what: str, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"still waiting after {deadline_s:.0f} s: {what}")
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


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


def test_server_key_follows_workspace_environment_and_code(tmp_path, monkeypatch):
    base = {"IMAGEBENCH_HOME": "/a", "TERM": "xterm", "PATH": "/bin"}
    assert warm.server_key(base) == warm.server_key({**base, "TERM": "dumb", "OLDPWD": "/x"})  # not import-relevant
    assert warm.server_key(base) != warm.server_key({**base, "IMAGEBENCH_HOME": "/b"})
    assert warm.server_key(base) != warm.server_key({**base, "PREFECT_API_URL": "http://x"})
    code = tmp_path / "code"
    (code / "flows").mkdir(parents=True)
    src = code / "flows" / "m.py"
    src.write_text("x = 1\n")
    monkeypatch.setattr(warm, "code_root", lambda: code)
    before = warm.server_key(base)
    os.utime(src, ns=(1, 1))
    assert warm.server_key(base) != before  # an edited source file: another server


def test_heavy_command_runs_warm_like_cold_and_dies_with_its_client(tmp_path):
    # an S3 endpoint that takes connections and never answers: an ingest from it blocks for
    # minutes of read timeouts (IMAGEBENCH_S3_ENDPOINT is part of the server's key: set it first)
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)
    env = _env(tmp_path / "home", IMAGEBENCH_S3_ENDPOINT=f"http://127.0.0.1:{mute.getsockname()[1]}",
               AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s", AWS_DEFAULT_REGION="us-east-1")
    try:
        cold = _run(["score", "--model", "no-such-model"], {**env, "IMAGEBENCH_WARM": "off"})
        first = _run(["score", "--model", "no-such-model"], env)
        server = _server_pid(env)
        assert server is not None, first.stderr
        second = _run(["score", "--model", "no-such-model"], env)
        # same exit status and the same one-line error as the cold command, from the same server
        assert cold.returncode == first.returncode == second.returncode == 1
        assert cold.stderr.strip() and first.stderr.strip() == cold.stderr.strip() == second.stderr.strip()
        assert "running cold" not in first.stderr
        assert _server_pid(env) == server

        # `warm status` knows it; light commands stay in the client's own process
        status = _run(["warm", "status"], env)
        assert status.returncode == 0 and f"pid {server}" in status.stdout and "this environment" in status.stdout

        # a command whose client is killed with SIGKILL does not run on
        client = subprocess.Popen([*LAUNCH, "ingest", "--model", "slow", "--source", "s3://bucket/models/"],
                                  env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(lambda: _children(server), "the warm server forks the command")
        (child,) = _children(server)
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=30)
        _wait(lambda: not _alive(child), "the command's process ends after its client was killed")

        stopped = _run(["warm", "stop"], env)
        assert stopped.returncode == 0 and "stopped" in stopped.stderr
        _wait(lambda: not _alive(server), "the server exits on `warm stop`")
        assert not warm.socket_path(warm.server_key(env)).exists()
    finally:
        mute.close()
        pid = _server_pid(env)
        if pid:
            os.kill(pid, signal.SIGTERM)


def test_idle_server_exits_by_itself(tmp_path):
    env = _env(tmp_path / "home", IMAGEBENCH_WARM_IDLE_S="1")
    done = _run(["score", "--model", "no-such-model"], env)
    assert done.returncode == 1 and "running cold" not in done.stderr
    path = warm.socket_path(warm.server_key(env))
    _wait(lambda: not path.exists(), "an idle server removes its socket and exits")


@pytest.mark.parametrize("value", ["off", "0", "false"])
def test_warm_off_means_cold(value, monkeypatch):
    monkeypatch.setenv("IMAGEBENCH_WARM", value)
    assert warm.mode() == "off"


def test_prefect_settings_follow_the_workspace_when_prefect_was_imported_first(tmp_path, monkeypatch):
    """A warm child imported Prefect before its command set PREFECT_HOME: the settings are read again."""
    import prefect.context

    from flows.env import prepare_prefect_env

    monkeypatch.delenv("PREFECT_HOME", raising=False)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    prepare_prefect_env(tmp_path / "home")
    try:  # the process-wide settings (a test harness may have its own on top: not what a command sees)
        assert Path(prefect.context.GLOBAL_SETTINGS_CONTEXT.settings.home) == (tmp_path / "home" / "prefect").resolve()
    finally:
        monkeypatch.undo()
        prefect.context.refresh_global_settings_context()


def test_warm_score_equals_cold_and_reuses_one_prefect_api(built_reference, tmp_path):
    """`score` forked from the warm server gives the cold command's mu bit for bit; its flow runs
    are recorded in the workspace's own Prefect database, through one API kept for that home."""
    import sqlite3

    from tests.flows.conftest import eligible_ids, put_model

    from tasks.lake import Lake

    home, objects, _ = built_reference
    prompts = eligible_ids()[:12]
    for model in ("cold", "warm-1", "warm-2"):
        put_model(objects, model, prompts, seed=5)  # the same bytes: the same mu
    env = {**{k: v for k, v in os.environ.items() if k not in _LEAKED}, "IMAGEBENCH_WARM": "auto", "IMAGEBENCH_WARM_IDLE_S": "120",
           "IMAGEBENCH_TESSERACT": str(tmp_path / "no-tesseract"), "COLUMNS": "200"}
    try:
        cold = _run(["score", "--model", "cold"], {**env, "IMAGEBENCH_WARM": "off"})
        assert cold.returncode == 0, cold.stderr[-3000:]
        for model in ("warm-1", "warm-2"):
            done = _run(["score", "--model", model], env)
            assert done.returncode == 0 and "running cold" not in done.stderr, done.stderr[-3000:]
        mu = {m: sorted((r["prompt_id"], r["mu"]) for r in Lake(home / "lake").read("hps_scores", [m]).to_pylist())
              for m in ("cold", "warm-1", "warm-2")}
        assert len(mu["cold"]) == len(prompts) and mu["warm-1"] == mu["cold"] and mu["warm-2"] == mu["cold"]
        with sqlite3.connect(home / "prefect" / "prefect.db") as db:
            runs = db.execute("SELECT count(*) FROM flow_run WHERE name IS NOT NULL AND state_type = 'COMPLETED'").fetchone()[0]
        assert runs >= 3  # the cold run's and both warm runs' flow runs, in this workspace's database
        key = warm.server_key(env)
        log = (warm.runtime_dir() / f"warm-{key}.log").read_text()
        assert log.count("Prefect API for") == 1, log[-2000:]  # started by the first, reused by the second
    finally:
        pid = _server_pid(env)
        if pid:
            os.kill(pid, signal.SIGTERM)
