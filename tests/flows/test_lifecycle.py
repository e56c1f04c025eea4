"""The real `imagebench` command as a newcomer meets it: a workspace that does not exist yet, a
command killed with SIGKILL (its Prefect server must die with it, its run must show as crashed),
and user errors (one line, the traceback in the workspace log). Few processes: each costs the
~8-14 s of a Prefect start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.flows.conftest import REPO, eligible_ids, put_model

CRASH_AFTER = [sys.executable, "-m", "tests.crash_after"]
IMAGEBENCH = [str(Path(sys.executable).parent / "imagebench")]


def _env(home: Path, **extra: str) -> dict[str, str]:
    """The test's IMAGEBENCH_* settings, no PREFECT_HOME: the default (inside the workspace) is
    what a newcomer gets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "IMAGEBENCH_DEBUG"}
    env.update(IMAGEBENCH_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", **extra)
    return env


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, T, Z, ...), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _children(pid: int) -> list[tuple[int, str]]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append((int(stat.parent.name), (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_fresh_workspace_then_sigkill_leaves_no_server_and_a_crashed_run(built_reference, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app
    from tasks.lake.tables import Lake

    _, objects, _ = built_reference
    put_model(objects, "victim", eligible_ids()[:24], seed=31)
    home = tmp_path / "new" / "workspace"  # neither exists: the command creates what it needs
    monkeypatch.setenv("IMAGEBENCH_HOME", str(home))
    monkeypatch.setenv("IMAGEBENCH_STORE", str(objects))
    log = tmp_path / "score.log"
    with open(log, "wb") as out:
        # Frozen (SIGSTOP) right after its run record is rewritten for its first stage after the
        # start (the run is under way, its Prefect server up), then killed from outside.
        proc = subprocess.Popen(
            [*CRASH_AFTER, "score", "--model", "victim"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            env=_env(home, IMAGEBENCH_STORE=str(objects), CRASH_REPLACE="/runs/run_id=", CRASH_NTH="2",
                     CRASH_ACTION="stop"),
            start_new_session=True,  # only for the cleanup below; the test kills the pid alone
        )
    server = None
    try:
        deadline = time.monotonic() + 240  # the bug: a 97 s wait, then a failed Prefect start
        while _state(proc.pid) != "T":
            assert proc.poll() is None, f"the command ended ({proc.returncode}): {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "its run never got under way: " + log.read_text()[-3000:]
            time.sleep(0.1)
        (running,) = Lake(home / "lake").read_runs().to_pylist()
        assert running["status"] == "running" and running["stage"] not in (None, "start"), running
        servers = [(pid, cmd) for pid, cmd in _children(proc.pid) if "uvicorn" in cmd]
        assert len(servers) == 1, _children(proc.pid)
        server, cmd = servers[0]
        port = int(cmd.split("--port", 1)[1].split()[0])
        assert _listening(port)

        os.kill(proc.pid, signal.SIGKILL)  # the command alone, not its process group
        proc.wait(30)
        deadline = time.monotonic() + 30
        while _state(server) not in (None, "Z") or _listening(port):
            assert time.monotonic() < deadline, f"the Prefect server {server} outlived its command: {_state(server)}"
            time.sleep(0.2)
    finally:
        for pid in [proc.pid] + ([server] if server else []):
            if _state(pid) not in (None, "Z"):
                os.kill(pid, signal.SIGKILL)  # only what this test started

    # The next reader shows the killed run as crashed, with how far it got, and records it so.
    result = CliRunner().invoke(app, ["runs", "--format", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (crashed,) = json.loads(result.stdout)
    assert (crashed["run_id"], crashed["status"]) == (running["run_id"], "crashed"), crashed
    assert crashed["stage"] == running["stage"] and f"crashed during stage '{running['stage']}'" in crashed["error"]
    assert Lake(home / "lake").read_run(running["run_id"])["status"] == "crashed"
    assert not list((home / "locks" / "runs").glob("*.lock"))


def test_user_errors_are_one_line_with_the_traceback_in_the_workspace_log(built_reference, tmp_path):
    home, objects, reference = built_reference
    refdir = str(reference.parent)
    base = dict(IMAGEBENCH_REFERENCE_DIR=refdir, IMAGEBENCH_REFERENCE_VERSION="t1")
    logfile = home / "logs" / "imagebench.log"

    def run(*args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([*IMAGEBENCH, *args], cwd=REPO, env=_env(home, **base, **env), capture_output=True,
                              text=True, timeout=300)

    def one_error_line(r: subprocess.CompletedProcess) -> str:
        assert r.returncode == 1, r.stdout + r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
        assert "Traceback" not in r.stdout + r.stderr
        return lines[0]

    # Checked before the flow (no Prefect start, printed once): a bad model id, a tampered reference.
    line = one_error_line(run("score", "--model", "../lab-a"))
    assert "../lab-a" in line
    original = reference.read_bytes()
    reference.write_bytes(original.replace(b'"mu_ref":', b'"mu_ref" :', 1))
    try:
        line = one_error_line(run("score", "--model", "base-a"))
        assert "ReferenceTampered" in line and str(logfile) in line
        debug = run("--debug", "score", "--model", "base-a")
        assert debug.returncode != 0 and "Traceback" in debug.stderr and "ReferenceTampered" in debug.stderr
    finally:
        reference.write_bytes(original)

    # Failing inside the flow (a closed S3 port in the nightly): still one line; Prefect's
    # record of the failed run and the traceback are in the log file.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    line = one_error_line(run("nightly", IMAGEBENCH_STORE="s3://bench/models-root",
                              IMAGEBENCH_S3_ENDPOINT=f"http://127.0.0.1:{closed}", AWS_ACCESS_KEY_ID="x",
                              AWS_SECRET_ACCESS_KEY="y", AWS_MAX_ATTEMPTS="1"))
    assert f"127.0.0.1:{closed}" in line and str(logfile) in line
    text = logfile.read_text()
    assert "ReferenceTampered" in text and f"127.0.0.1:{closed}" in text and text.count("Traceback") >= 3
