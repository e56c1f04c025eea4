"""Run records from the run's start: running -> completed/failed, or crashed when the process
holding the run's lease is gone (tasks/runs/state.py). Plain functions on a real lake directory;
tests/flows/test_lifecycle.py kills a real command."""

from __future__ import annotations

import subprocess
import sys

from tasks.lake.tables import Lake
from tasks.runs.record import RunRecord
from tasks.runs.state import RunJournal, lease_path, settle_crashed


def _record(run_id: str) -> RunRecord:
    return RunRecord(run_id=run_id, flow="score-model", suite_version="s", reference_version="r")


def test_a_live_run_stays_running_a_finished_one_keeps_its_record(tmp_path):
    home, lake_dir = tmp_path / "home", tmp_path / "home" / "lake"
    live, done = _record("live-run"), _record("done-run")
    RunJournal(home, lake_dir, live).start()
    RunJournal(home, lake_dir, done).start()
    live.enter("hpsv3/judge m1", force=True)
    live.enter("commit m1")  # unforced, within a second of the last write: not written yet
    assert Lake(lake_dir).read_run("live-run")["stage"] == "hpsv3/judge m1"

    Lake(lake_dir).write_run(done.row("completed"))  # the final record first, then the lease goes
    done.journal.release()
    assert settle_crashed(home, lake_dir) == []  # the live run holds its lease (another open file)
    assert Lake(lake_dir).read_run("live-run")["status"] == "running"
    assert Lake(lake_dir).read_run("done-run")["status"] == "completed"
    assert not lease_path(home, "done-run").exists()

    live.journal.release()  # as when its process dies: the lease is free, no final record
    (crashed,) = settle_crashed(home, lake_dir)
    assert crashed["run_id"] == "live-run" and crashed["status"] == "crashed"
    stored = Lake(lake_dir).read_run("live-run")
    assert stored["status"] == "crashed" and stored["stage"] == "hpsv3/judge m1"
    assert "crashed during stage 'hpsv3/judge m1'" in stored["error"]
    assert settle_crashed(home, lake_dir) == []  # settled once


def test_the_lease_of_a_killed_process_is_free(tmp_path):
    home, lake_dir = tmp_path / "home", tmp_path / "home" / "lake"
    code = (
        "import sys, time; from pathlib import Path; from tasks.runs.record import RunRecord; "
        "from tasks.runs.state import RunJournal; "
        "r = RunRecord(run_id='victim', flow='nightly', suite_version='s', reference_version='r'); "
        f"RunJournal(Path({str(home)!r}), Path({str(lake_dir)!r}), r).start(); r.enter('discover', force=True); "
        "print('up', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        assert settle_crashed(home, lake_dir) == []
    finally:
        proc.kill()
        proc.wait()
    (crashed,) = settle_crashed(home, lake_dir)
    assert (crashed["run_id"], crashed["stage"]) == ("victim", "discover")


def test_the_ephemeral_server_command_is_guarded_and_nothing_else():
    import prefect.server.api.server as prefect_server

    from flows.ephemeral import guard_ephemeral_server, guarded_command

    cmd = [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app", "--port", "8123"]
    assert guarded_command(cmd, 4242) == [sys.executable, "-m", "flows.ephemeral", "4242", *cmd[2:]]
    assert guarded_command([sys.executable, "-m", "prefect", "server", "start"], 4242)[2] == "prefect"
    assert guard_ephemeral_server() and guard_ephemeral_server()  # idempotent
    assert prefect_server.subprocess.TimeoutExpired is subprocess.TimeoutExpired  # the rest passes through
