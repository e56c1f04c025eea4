"""`imagebench panel serve` and Ctrl-C (issue 26 item 8): one Ctrl-C stopped the panel with
"SIGINT again: stopping now" (uvicorn, having shut down, raised the SIGINT once more, and the
launcher's stop watcher counted it as a second one). One Ctrl-C: a graceful stop, one calm line;
a second Ctrl-C while it stops: at once."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

import httpx
import pytest

from tests.panel.conftest import open_new_study
from tests.panel.servers import panel_serve_cli, request_head

EXIT_WAIT_S = 120  # generous: a loaded machine (load 10)


@pytest.fixture(scope="module")
def ctrl_c_study(panel_settings):
    return open_new_study(panel_settings, "ctrl-c", [(f"c{i}", "photographers") for i in range(2)], memo=False)


def _stopped(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(timeout=EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"panel serve still running {EXIT_WAIT_S} s after Ctrl-C") from None


def test_one_ctrl_c_stops_the_panel_gracefully_in_one_calm_line(ctrl_c_study, panel_home, tmp_path):
    with panel_serve_cli(panel_home, "ctrl-c", tmp_path) as server:
        assert httpx.get(f"{server.url}/healthz", timeout=60).status_code in (200, 404)  # it answers
        before = server.log()
        server.proc.send_signal(signal.SIGINT)  # what the terminal sends on Ctrl-C
        status = _stopped(server.proc)
        said = server.log()[len(before):]
    assert status == 128 + signal.SIGINT, said
    assert "again" not in said and "stopping now" not in said, said
    assert "Traceback" not in said, said
    ours = [line for line in said.splitlines() if line.startswith("imagebench:") or "panel of study" in line]
    assert len(ours) == 1 and "ctrl-c" in ours[0] and "stopped" in ours[0], said
    with socket.socket() as s:  # the port is free again
        s.bind(("127.0.0.1", server.port))


def test_a_second_ctrl_c_while_it_stops_ends_it_at_once(ctrl_c_study, panel_home, tmp_path):
    """A judge's answer still arriving keeps uvicorn's graceful shutdown waiting (up to its limit,
    tasks/panel/limits.py); a second Ctrl-C ends the process now, in one line."""
    token = next(iter(ctrl_c_study.tokens.values()))
    with panel_serve_cli(panel_home, "ctrl-c", tmp_path) as server:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            assert c.get(f"/j/{token}").status_code == 303
            cookie = c.cookies["ib_judge"]
        held = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        held.sendall(request_head("POST", "/answer", {"Cookie": f"ib_judge={cookie}", "Content-Length": "1000",
                                                      "Content-Type": "application/x-www-form-urlencoded"})
                     + b"answer=yes&")  # the rest of the body never comes: a request in flight
        try:
            time.sleep(1.0)  # the server is reading the form
            before = server.log()
            server.proc.send_signal(signal.SIGINT)
            time.sleep(1.0)
            assert server.proc.poll() is None, "the first Ctrl-C did not wait for the answer in flight"
            server.proc.send_signal(signal.SIGINT)
            status = _stopped(server.proc)
            said = server.log()[len(before):]
        finally:
            held.close()
    assert status == 128 + signal.SIGINT, said
    assert "Traceback" not in said, said
    assert said.count("SIGINT again: stopping now") == 1, said
