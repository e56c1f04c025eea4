"""A server started by a first command waits for that command's process to end before it imports
anything (flows/warm_server.py --after), so the first command costs what a cold one does."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from flows.warm_server import wait_for_exit
from tests.flows.conftest import REPO


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_waits_until_the_process_ends_reaped_or_not():
    proc = _sleeper()
    try:
        assert wait_for_exit(proc.pid, 0.3) is False  # still running: the wait gives up, says so
        killed_at: list[float] = []

        def kill_later() -> None:
            time.sleep(0.5)
            killed_at.append(time.monotonic())
            proc.kill()

        threading.Thread(target=kill_later).start()
        assert wait_for_exit(proc.pid, 60) is True
        woke = time.monotonic()
        # woken by the exit itself: after the kill, and while the child is still an unreaped zombie
        assert killed_at and woke >= killed_at[0]
        assert open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        proc.kill()
        proc.wait()
    assert wait_for_exit(proc.pid, 1) is True  # gone altogether


def test_polls_where_there_is_no_pidfd(monkeypatch):
    def no_pidfd(_pid):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    proc = _sleeper()
    try:
        assert wait_for_exit(proc.pid, 0.3) is False
        proc.kill()
        proc.wait()  # polling sees a process only once it is reaped
        assert wait_for_exit(proc.pid, 5) is True
    finally:
        proc.kill()


def test_the_server_refuses_a_malformed_command_line():
    for argv in (["k", "--after"], ["k", "--before", "1"], [], ["--after", "1"], ["k", "--starting-fd", "x"]):
        res = subprocess.run([sys.executable, "-m", "flows.warm_server", *argv], cwd=REPO, capture_output=True, text=True)
        assert res.returncode != 0
        assert "usage: python -m flows.warm_server KEY [--after PID] [--starting-fd FD]" in res.stderr
