"""A command told to stop ends within its grace period (flows/stopping.py), even while its main
thread waits for a task that will not finish: the shape Prefect gives a flow told to stop (the
signal raises in the flow's thread, then its task runner joins the tasks still running).

Each case runs a small program in a process of its own and signals it; the control case shows
the same program, unwatched, is still waiting long after the signal, so the watched cases can fail.
Then a real cold `score` whose judge requests hang (the warm one: tests/flows/test_warm.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flows import stopping
from tests.flows.conftest import REPO, StalledEndpoint, put_model, runs_of, score_cli

# The program: a task thread that does not end for minutes, a main thread that waits for it once
# told to stop, a second signal included (as Prefect's flow does: its task runner waits for the
# running tasks), and a SIGTERM handler that raises (as Prefect's does).
PROGRAM = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    from pathlib import Path
    from flows import stopping

    class Terminated(Exception):
        pass

    def raise_terminated(signum, frame):
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, raise_terminated)
    out = Path(sys.argv[1])
    if sys.argv[2] != "unwatched":
        stopping.stop_within(float(sys.argv[2]), lambda status: out.write_text(json.dumps({"told": status})))
    task = threading.Thread(target=time.sleep, args=(600,))
    task.start()
    try:
        print("ready", flush=True)  # inside: a signal sent as soon as it is read lands in the try
        time.sleep(600)
    except (Terminated, KeyboardInterrupt):
        while task.is_alive():  # the running task is waited for, whatever comes: minutes
            try:
                time.sleep(0.1)
            except (Terminated, KeyboardInterrupt):
                pass  # a second signal is only noted (Prefect logs "Crash detected" and waits on)
""")


def _start(tmp_path: Path, grace: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "told.json"
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM, str(out), grace], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.stdout.readline().strip() == "ready"
    return proc, out


def _end(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"still running {timeout:g} s after it was told to stop") from None
    return proc.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_command_waiting_for_a_running_task_stops_after_the_grace(tmp_path, sig):
    proc, out = _start(tmp_path, "1")
    proc.send_signal(sig)
    status, err = _end(proc)
    assert status == 128 + sig, err
    assert f"still running 1 s after {sig.name}: stopping now (status {128 + sig})" in err
    assert "the next run resumes" in err
    assert json.loads(out.read_text()) == {"told": 128 + sig}  # before_exit heard the status


def test_a_second_signal_stops_at_once(tmp_path):
    proc, out = _start(tmp_path, "600")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)  # the first one has raised; the main thread now waits for the task
    proc.send_signal(signal.SIGTERM)
    status, err = _end(proc)
    assert status == 128 + signal.SIGTERM and "SIGTERM again: stopping now" in err, err


def test_control_unwatched_the_same_program_is_still_waiting(tmp_path):
    proc, _ = _start(tmp_path, "unwatched")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=5)  # the watched program ended 1 s after one signal, at once after two
    finally:
        proc.kill()
        proc.communicate()


def test_grace_setting_and_the_commands_with_their_own_shutdown():
    assert stopping.grace_s({}) == stopping.DEFAULT_GRACE_S
    assert stopping.grace_s({stopping.GRACE_ENV: "2.5"}) == 2.5
    assert stopping.grace_s({stopping.GRACE_ENV: "soon"}) == stopping.DEFAULT_GRACE_S
    assert stopping.grace_s({stopping.GRACE_ENV: "-1"}) == stopping.DEFAULT_GRACE_S
    assert not stopping.applies_to(["serve", "--local-server"])
    assert not stopping.applies_to(["--debug", "serve"])
    assert stopping.applies_to(["score", "--model", "serve"])
    assert stopping.applies_to(["panel", "serve"])  # the judging panel's server stops within the grace too


# ---- a real command: cold `score` whose judge requests hang --------------------------------------


@pytest.mark.slow
def test_sigterm_while_a_judge_request_hangs_ends_within_the_grace_then_the_run_resumes(built_reference, tmp_path):
    """SIGTERM to a cold `score` whose judge requests hang (600 s timeout): Prefect raises in the
    flow, then its task runner would wait for the hanging requests; the command ends within its
    grace period instead (flows/stopping.py), and the next run completes the model."""
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.scores.suite import load_suite
    from tests.fake_openai import FakeOpenAI, Reply

    home, objects, _ = built_reference
    suite = load_suite(load_settings().suite_path)
    ids = [p.prompt_id for p in suite.prompts if p.category != "Text Rendering"][:6]
    put_model(objects, "stopped", ids, seed=61)
    cfg = tmp_path / "judges.yaml"
    stalled = StalledEndpoint()
    try:
        stalled.judges_config(cfg)
        proc = score_cli(home, "stopped", IMAGEBENCH_JUDGES_CONFIG=str(cfg), IMAGEBENCH_STOP_GRACE_S="3")
        deadline = time.monotonic() + 300
        while not stalled.held and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stalled.held, "no judge request reached the endpoint: " + proc.log_path.read_text()[-3000:]
        os.kill(proc.pid, signal.SIGTERM)  # the command's process only, as `kill PID` or a supervisor's first signal
        try:
            status = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError("still running 120 s after SIGTERM: " + proc.log_path.read_text()[-3000:]) from None
    finally:
        stalled.close()
    log = proc.log_path.read_text()
    assert status == 128 + signal.SIGTERM, log[-3000:]
    assert "still running 3 s after SIGTERM: stopping now (status 143)" in log, log[-3000:]

    passing = lambda req: Reply(text="Checked.\nVERDICT: PASS")  # noqa: E731
    with FakeOpenAI(model="qwen3-vl", responder=passing) as qwen:
        cfg.write_text(json.dumps({"judges": {name: {"backend": "openai", "base_url": qwen.base_url, "model": name}
                                              for name in ("qwen3-vl", "gemma")}}))
        done = score_cli(home, "stopped", IMAGEBENCH_JUDGES_CONFIG=str(cfg))
        assert done.wait(timeout=600) == 0, done.log_path.read_text()[-3000:]
    stopped, record = [r for r in runs_of(load_settings()) if r["flow"] == "score-model"][-2:]
    assert stopped["status"] != "completed" and record["status"] == "completed", (stopped, record)
    verdicts = Lake(load_settings().lake_dir).read("verdicts", ["stopped"]).to_pylist()
    assert sorted(v["prompt_id"] for v in verdicts) == sorted(ids) and {v["verdict"] for v in verdicts} == {"PASS"}
