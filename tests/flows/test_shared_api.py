"""The Prefect API secret on a shared machine (issue 24 items 1 and 5): no secret ever reaches a
listener that this workspace's own process did not bind.

Each attack runs as a second, unprivileged local account (fixture ``other_user``), over loopback
only, as a colleague on a lab's GPU server could: it binds the port an API of ours is about to use
(read from ``ps``: a uvicorn command line shows ``--port N``), or the port of ``make serve``, or the
port a killed ``make serve`` left in its ``api-url`` file, answers ``/api/health`` with 200 and
records every ``Authorization`` header it receives. With the workspace's secret every Prefect API
of that workspace would answer it (flow runs, logs, settings; ``POST /api/flows/``).

Our commands run with umask 022, in a workspace the other account can reach (``reachable_tmp``),
so that nothing passes thanks to a strict umask or a closed folder.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.flows.conftest import REPO
from tests.otheruser import umask

pytestmark = pytest.mark.slow

IMAGEBENCH = [str(Path(sys.executable).parent / "imagebench")]

# The attacker: stdlib only (Debian's python3, as the other account). It prints one JSON line per
# event: bound / bind-failed (the port it tried) / request (method, path, Authorization header).
#   watch PID SECONDS: for each uvicorn process below PID, take the port its command line shows
#   port N SECONDS [hold-first]: bind N now; with hold-first, leave the first connection unanswered
#   (what defeats a one-second "does something answer here?" check)
SQUATTER = r'''
import json, os, socket, sys, threading, time

mode, arg, deadline = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3])
hold_first = sys.argv[4:] == ["hold-first"]
held = []


def say(**event):
    print(json.dumps(event), flush=True)


def parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def below(pid, ancestor):
    for _ in range(30):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        pid = parent(pid)
    return False


def announced_ports(ancestor):
    """(pid, port) of every uvicorn process below ``ancestor``, from their command lines."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
            if "uvicorn" in argv and "--port" in argv and below(int(name), ancestor):
                found.append((int(name), int(argv[argv.index("--port") + 1])))
        except (OSError, ValueError, IndexError):
            continue
    return found


def answer(conn):
    conn.settimeout(10)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        method, path = head[0].split(" ")[:2]
        headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in head[1:] if ":" in h)}
        say(event="request", method=method, path=path, authorization=headers.get("authorization"))
        body = b"true" if path.endswith("/health") else b'"3.9.1"' if path.endswith("/version") else b"{}"
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    except OSError:
        pass
    finally:
        conn.close()


def serve(port):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(64)
    except OSError as exc:
        say(event="bind-failed", port=port, error=exc.strerror or str(exc))
        return
    say(event="bound", port=port)
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            conn, _ = sock.accept()
        except socket.timeout:
            continue
        if hold_first and not held:
            held.append(conn)
            continue
        threading.Thread(target=answer, args=(conn,), daemon=True).start()


if mode == "port":
    serve(int(arg))
else:
    tried = set()
    while time.monotonic() < deadline:
        for pid, port in announced_ports(int(arg)):
            if pid not in tried:
                tried.add(pid)
                threading.Thread(target=serve, args=(port,), daemon=True).start()
        time.sleep(0.02)
'''


class Squatter:
    """The other account's listener; ``events`` parsed from its output once it is stopped."""

    def __init__(self, other_user, *args: str):
        self.proc = other_user.popen(SQUATTER, *args)
        self.events: list[dict] = []

    def read_ready(self, timeout: float = 60) -> dict:
        """The first event (bound / bind-failed): for ``port`` mode, before the victim starts."""
        line = self.proc.stdout.readline()
        assert line, f"the squatter said nothing: {self.proc.stderr.read()[-2000:]}"
        self.events.append(json.loads(line))
        return self.events[-1]

    def stop(self) -> list[dict]:
        if self.proc.poll() is None:
            self.proc.kill()  # our own child (running as the other user: root may signal it)
        out, err = self.proc.communicate(timeout=30)
        self.events += [json.loads(line) for line in out.splitlines() if line.strip()]
        assert not err.strip() or "Traceback" not in err, err[-2000:]
        return self.events

    def secrets_received(self) -> list[dict]:
        return [e for e in self.events if e.get("event") == "request" and e.get("authorization")]


def _env(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment for a cold command on ``home``: nothing of Prefect's or ours inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "IMAGEBENCH_"))}
    env.update(IMAGEBENCH_HOME=str(home), IMAGEBENCH_WARM="off", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               # a machine shared with other jobs can take minutes to start a Prefect API
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600", PYTHONUNBUFFERED="1", COLUMNS="10000",
               **extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"still waiting after {timeout:.0f} s: {what}")


def _stop(proc: subprocess.Popen, grace_s: float = 60) -> None:
    """SIGTERM to our own command, SIGKILL after ``grace_s`` (its APIs follow it: flows/ephemeral.py)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def _secret_header(prefect_home: Path) -> dict[str, str]:
    secret = (prefect_home / "api-auth").read_text().strip()
    return {"Authorization": "Basic " + base64.b64encode(secret.encode()).decode()}


def _uvicorn_ports(ancestor: int) -> list[int]:
    """The ports the uvicorn processes below ``ancestor`` (our own) name on their command line."""
    ports = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, argv = int(stat.parent.name), (stat.parent / "cmdline").read_bytes().decode().split("\0")
            chain = pid
            for _ in range(30):
                if chain in (ancestor, 0, 1):
                    break
                chain = int(Path(f"/proc/{chain}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if chain == ancestor and "uvicorn" in argv and "--port" in argv:
                ports.append(int(argv[argv.index("--port") + 1]))
        except (OSError, ValueError, IndexError):
            continue
    return ports


# ---- a cold command: the embedded API's port is bound before the command line shows it ------------


def test_a_cold_commands_api_port_is_ours_before_ps_shows_it(other_user, reachable_tmp):
    """`imagebench serve` on the embedded API (the cheapest command that starts the API and then
    talks to it: it registers its deployments), then a run of its `nightly` deployment, which it
    starts as a process of its own (Prefect's runner). The squatter reads the port of every uvicorn
    below `serve` from its command line and binds it: each attempt fails, the flow run uses
    `serve`'s API (it started no API of its own: it did, unguarded, its port free to take)."""
    import httpx

    home = reachable_tmp / "ws"
    log = reachable_tmp / "serve.log"
    with umask(0o022), open(log, "wb") as out:
        proc = subprocess.Popen([*IMAGEBENCH, "serve"], cwd=REPO, env=_env(home, PREFECT_RUNNER_POLL_FREQUENCY="1"),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    squatter = Squatter(other_user, "watch", str(proc.pid), "900")
    state = None
    try:
        _until(lambda: proc.poll() is not None or "Your deployments are being served" in log.read_text(errors="replace"),
               600, "the command serves or ends")
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        (port,) = _uvicorn_ports(proc.pid)
        api, auth = f"http://127.0.0.1:{port}/api", _secret_header(home / "prefect")
        answers: list[str] = []

        def ok(method: str, path: str, **kw):
            """The API's JSON once it answers 2xx: a loaded machine's SQLite-backed API may say 5xx
            (database busy) first; what it said is kept for the failure message."""
            r = httpx.request(method, f"{api}{path}", headers=auth, timeout=60, **kw)
            if r.is_success:
                return r.json()
            answers.append(f"{method} {path}: {r.status_code} {r.text[:300]}")
            assert r.status_code >= 500, answers[-1]  # a refusal (401, 404, 422) is a finding, not load
            return None

        try:
            nightly = _until(lambda: ok("GET", "/deployments/name/nightly/nightly"), 300, "the nightly deployment")
            run = _until(lambda: ok("POST", f"/deployments/{nightly['id']}/create_flow_run", json={}), 300,
                         "a flow run of the nightly")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the API said: {answers[-3:]}") from None

        def final():
            got = (ok("GET", f"/flow_runs/{run['id']}") or {}).get("state")
            return got if got and got["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None

        state = _until(final, 600, "the served flow run ends")  # a nightly without a reference fails
    finally:
        _stop(proc, grace_s=10)  # not what is tested here (after a run, Prefect's runner takes minutes)
        events = squatter.stop()
    assert not squatter.secrets_received(), f"the secret reached the other user's listener: {events}"
    tried = [e for e in events if e["event"] in ("bound", "bind-failed")]
    assert [e["event"] for e in tried] == ["bind-failed"], events  # it saw the port, and could not take it
    assert state["type"] == "FAILED", state


def test_a_port_taken_between_prefects_choice_and_our_bind_is_left_with_one_line(other_user, reachable_tmp):
    """The instant between Prefect's choice of a free port (a bind test) and our bind: played by a
    port the other account holds before Prefect's server is asked to start on it. The command says
    so in one line and Prefect starts its server on another port (uvicorn's start-up failure, exit
    3, is Prefect's cue); the client's requests with the secret go there, none to the squatter."""
    port = _free_port()
    home = reachable_tmp / "ws"
    script = (
        "import os, sys\nfrom pathlib import Path\n"
        "from flows.env import prepare_prefect_env\n"
        "prepare_prefect_env(Path(sys.argv[1]))  # the guard on Prefect's server start, the secret\n"
        "from prefect.server.api.server import SubprocessASGIServer\n"
        "server = SubprocessASGIServer(port=int(sys.argv[2]))\n"
        "server.start()\n"
        "os.environ['PREFECT_API_URL'] = server.api_url\n"
        "from prefect.context import refresh_global_settings_context\n"
        "refresh_global_settings_context()\n"
        "from prefect.client.orchestration import get_client\n"
        "with get_client(sync_client=True) as client:\n"
        "    print(server.port, len(client.read_flows()), flush=True)\n"
    )
    squatter = Squatter(other_user, "port", str(port), "600")
    try:
        assert squatter.read_ready() == {"event": "bound", "port": port}
        with umask(0o022):
            done = subprocess.run([sys.executable, "-c", script, str(home), str(port)], cwd=REPO,
                                  env=_env(home, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=600)
    finally:
        events = squatter.stop()
    assert not squatter.secrets_received(), f"the secret reached the other user's listener: {events}\n{done.stderr}"
    assert done.returncode == 0, done.stderr[-3000:]
    used, flows = map(int, done.stdout.split())
    assert used != port and flows == 0
    said = [line for line in done.stderr.splitlines() if f"127.0.0.1:{port}" in line]
    assert len(said) == 1 and other_user.name in said[0] and "another is used" in said[0], done.stderr


def test_the_warm_servers_api_port_is_ours_before_ps_shows_it(other_user, reachable_tmp):
    """The API a warm server keeps per workspace (flows/warm_server.py ``_prefect_api``), then what a
    warm command does with its URL (flows/warm.py): wait for /health, then Prefect's client with
    the workspace's secret. The squatter watches for the API's uvicorn and binds its port."""
    home = reachable_tmp / "ws" / "prefect"
    home.mkdir(parents=True)
    script = (
        "import os, sys\nfrom pathlib import Path\n"
        "from flows import apiauth, warm, warm_server\n"
        "home = sys.argv[1]\nsys.stdin.readline()  # the squatter is watching\n"
        "url = warm_server._prefect_api({}, home)\n"
        "warm._wait_healthy(url, 600)\n"
        "os.environ.update(PREFECT_API_URL=url, PREFECT_API_AUTH_STRING=apiauth.auth_string(Path(home)))\n"
        "from prefect.context import refresh_global_settings_context\n"
        "refresh_global_settings_context()  # as flows/warm.py does once it has the URL\n"
        "from prefect.client.orchestration import get_client\n"
        "with get_client(sync_client=True) as client:\n"
        "    print('flows', len(client.read_flows()), flush=True)\n"
    )
    env = _env(home.parent, PYTHONPATH=str(REPO))
    with umask(0o022):
        proc = subprocess.Popen([sys.executable, "-c", script, str(home)], cwd=REPO, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    squatter = Squatter(other_user, "watch", str(proc.pid), "600")
    try:
        time.sleep(0.5)  # the squatter's interpreter is up and looking
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the script and its API (our own processes)
            proc.wait(30)
        events = squatter.stop()
    assert not squatter.secrets_received(), f"the secret reached the other user's listener: {events}"
    # One try per uvicorn process the squatter saw: on a loaded machine the warm server may start
    # its API again (a start that missed its health deadline), on the same held socket.
    tried = [e for e in events if e["event"] in ("bound", "bind-failed")]
    assert tried and all(e["event"] == "bind-failed" for e in tried), events
    assert proc.returncode == 0 and out.startswith("flows "), err[-3000:]


# ---- make serve: its port taken before it starts ----------------------------------------------------


def test_make_serve_refuses_a_port_another_user_holds(other_user, reachable_tmp):
    """The other account holds the configured port and leaves the first connection unanswered (a
    1 s "does a server answer here?" check sees nothing), then answers 200. `serve --local-server`
    refuses at once, naming the port and that another user holds it; no secret is sent."""
    port = _free_port()
    squatter = Squatter(other_user, "port", str(port), "600", "hold-first")
    home = reachable_tmp / "ws"
    log = reachable_tmp / "serve.log"
    try:
        assert squatter.read_ready() == {"event": "bound", "port": port}
        with umask(0o022), open(log, "wb") as out:
            proc = subprocess.Popen([*IMAGEBENCH, "serve", "--local-server"], cwd=REPO,
                                    env=_env(home, IMAGEBENCH_PREFECT_PORT=str(port)), stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _until(lambda: proc.poll() is not None or "Your deployments are being served" in log.read_text(errors="replace"),
                   600, "serve ends or serves")
            time.sleep(2)  # requests of a serve that went on would land now
        finally:
            _stop(proc)
    finally:
        events = squatter.stop()
    said = log.read_text(errors="replace")
    assert not squatter.secrets_received(), f"the secret reached the other user's listener: {events}"
    assert proc.returncode == 1, said[-3000:]
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0] and other_user.name in errors[0], said[-3000:]
    assert not (home / "prefect-server" / "api-url").exists()


# ---- backfill: a killed `make serve` left its api-url ---------------------------------------------


def test_backfill_sends_nothing_to_the_port_a_killed_serve_left(other_user, reachable_tmp):
    """`make serve` killed with -9 leaves ``prefect-server/api-url``; its server follows it (the
    port is free), the other account binds that port and answers /api/health. `backfill` finds the
    file, sees the listener is not this workspace's server, removes the file saying so in one line,
    and sends no secret (it then goes on as without a server: in this process, which refuses an unknown
    model)."""
    port = _free_port()
    home = reachable_tmp / "ws"
    recorded = home / "prefect-server" / "api-url"
    log = reachable_tmp / "serve.log"
    with umask(0o022), open(log, "wb") as out:
        serve = subprocess.Popen([*IMAGEBENCH, "serve", "--local-server"], cwd=REPO,
                                 env=_env(home, IMAGEBENCH_PREFECT_PORT=str(port)), stdout=out,
                                 stderr=subprocess.STDOUT)
    try:
        _until(lambda: serve.poll() is not None or recorded.exists(), 600, "serve's server is up")
        assert serve.poll() is None, log.read_text(errors="replace")[-3000:]
        os.kill(serve.pid, signal.SIGKILL)  # no clean-up: the api-url file stays
        serve.wait(30)
        _until(lambda: not _listening(port), 120, "the server follows its parent")
    finally:
        _stop(serve)
    assert recorded.exists()
    squatter = Squatter(other_user, "port", str(port), "600")
    try:
        assert squatter.read_ready() == {"event": "bound", "port": port}
        with umask(0o022):
            done = subprocess.run([*IMAGEBENCH, "backfill", "--model", "no-such-model"], cwd=REPO, env=_env(home),
                                  capture_output=True, text=True, timeout=600)
    finally:
        events = squatter.stop()
    assert not squatter.secrets_received(), f"the secret reached the other user's listener: {events}\n{done.stderr}"
    lines = [line for line in done.stderr.splitlines() if str(recorded) in line]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "removed" in lines[0], done.stderr
    assert not recorded.exists()
    assert done.returncode == 1 and "production mode" not in done.stderr, done.stderr


def test_a_stale_api_url_is_removed_with_one_line(tmp_path):
    """The checks behind ``backfill``'s use of ``api-url`` (flows/server.py), without a server:
    nothing listening, a listener of ours not held by the recorded ``serve``, and the recorded
    process holding the port (kept). Each removal is said in one line."""
    from flows.server import API_URL_FILE, recorded_api_url, recorded_server_problem, server_home, write_api_url

    home = tmp_path / "ws"
    server_home(home).mkdir(parents=True)
    recorded = server_home(home) / API_URL_FILE
    said: list[str] = []
    port = _free_port()
    write_api_url(server_home(home), f"http://127.0.0.1:{port}/api")  # this process: its `serve`
    assert recorded_api_url(home, said.append) is None and not recorded.exists()
    assert len(said) == 1 and f"nothing listens on 127.0.0.1:{port}" in said[0] and str(recorded) in said[0]

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        write_api_url(server_home(home), f"http://127.0.0.1:{port}/api")
        assert recorded_server_problem(home) is None  # held by the process that wrote the file
        recorded.write_text(f"http://127.0.0.1:{port}/api\npid 1\n")  # another process wrote it
        assert recorded_api_url(home, said.append) is None and not recorded.exists()
    assert len(said) == 2 and f"127.0.0.1:{port} is not held by process 1" in said[1]
