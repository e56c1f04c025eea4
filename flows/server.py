"""A real local Prefect server as a child process: production mode.

``imagebench serve --local-server`` (what ``make serve`` runs) starts one on loopback with its own
``PREFECT_HOME`` inside the workspace (``$IMAGEBENCH_HOME/prefect-server``, apart from the embedded
mode's ``$IMAGEBENCH_HOME/prefect``), waits until ``/api/health`` answers, serves the deployments
against it and stops it on exit. While it runs, ``$IMAGEBENCH_HOME/prefect-server/api-url`` holds
its API URL (and the pid of the ``serve`` that holds its port), so ``imagebench backfill`` finds it
without ``PREFECT_API_URL``. The server requires Prefect's auth string, the secret in
``<home>/api-auth`` (flows/apiauth.py): ``serve`` and ``backfill`` read it from there; the UI asks
for it.

The server is Prefect's own server application (``prefect.server.api.server:create_app``, final,
with its services and UI) under uvicorn, as ``prefect server start`` runs it, but on a socket this
process bound first (flows/apisocket.py): ``prefect server start`` binds its port itself, seconds
after announcing it, and another local user who took the port in between would have received the
secret. A port someone else holds is refused at once, naming who holds it. ``backfill`` checks
that the port in ``api-url`` is still held by the ``serve`` that wrote it before its first request
(and before each poll of ``--wait``): a file left by a ``serve`` killed with -9 is removed, saying
so, and nothing is sent. The UI's API URL (``/ui-settings``) is this server's own address (item 5
of issue 24: it said port 4200 whatever the port).

The server is stopped with SIGTERM (uvicorn's graceful shutdown), then SIGKILL after a grace
period; it runs in its own process group (a Ctrl-C in the terminal reaches ``imagebench serve``
only, which stops the deployments first, then the server) and, on Linux, receives SIGTERM if its
parent dies without cleaning up (``PR_SET_PDEATHSIG``), so no server is left orphaned.

This module does not import Prefect (the server runs in its own interpreter), so a caller can
set ``PREFECT_API_URL`` before its own first ``import prefect``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
PORT_ENV = "IMAGEBENCH_PREFECT_PORT"
SERVER_HOME_NAME = "prefect-server"  # under IMAGEBENCH_HOME
API_URL_FILE = "api-url"  # in the server home, while a local server runs
LOG_FILE = "server.log"
# A fresh home runs the database migrations first: ~20 s on a 2-core machine, ~10 s after that.
STARTUP_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0


class LocalServerError(RuntimeError):
    """The local Prefect server could not be started (port taken, crashed, too slow)."""


def server_home(imagebench_home: Path) -> Path:
    return Path(imagebench_home) / SERVER_HOME_NAME


def configured_port() -> int:
    """The prefect_port setting (``IMAGEBENCH_PREFECT_PORT``, default 4200), validated by schemas.settings."""
    from pydantic import ValidationError

    from schemas.settings import describe_invalid, load_settings

    try:
        return load_settings().prefect_port
    except ValidationError as exc:
        raise LocalServerError(describe_invalid(exc)) from None


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def api_healthy(api_url: str, timeout: float = 2.0) -> bool:
    """True when ``<api_url>/health`` answers 200 (any Prefect server, not only ours)."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def write_api_url(home: Path, api_url: str) -> None:
    """``<home>/api-url``: the URL, then ``pid N``, the process holding the server's port (this
    one, which bound it). Written whole (a temporary file renamed) so that no reader sees half."""
    tmp = home / f".{API_URL_FILE}.{os.getpid()}"
    tmp.write_text(f"{api_url}\npid {os.getpid()}\n")
    os.replace(tmp, home / API_URL_FILE)


def _read_api_url(path: Path) -> tuple[str, int | None] | None:
    """(URL, pid of the serve that wrote it: None in a file of an older imagebench); None: no file."""
    try:
        lines = path.read_text().split("\n")
    except OSError:
        return None
    pid = None
    for line in lines[1:]:
        key, _, value = line.partition(" ")
        if key == "pid" and value.strip().isdigit():
            pid = int(value)
    return lines[0].strip(), pid


def recorded_server_problem(imagebench_home: Path) -> str | None:
    """Why the local server in this workspace's ``api-url`` is not, or no longer, the one ``make
    serve`` started: its port is held by another user, or not by the ``serve`` that wrote the file
    (killed, its port then free for anyone), or nothing listens (flows/apisocket.py). None when it
    is. Checked before any request that carries the secret."""
    from urllib.parse import urlsplit

    from flows.apisocket import listener_problem

    path = server_home(imagebench_home) / API_URL_FILE
    recorded = _read_api_url(path)
    if recorded is None:
        return f"{path} is gone (the local server stopped)"
    url, pid = recorded
    try:
        parts = urlsplit(url)
        scheme, host, port = parts.scheme, parts.hostname, parts.port
    except ValueError:
        scheme = host = port = None
    if scheme != "http" or host is None or port is None:
        return f"{url!r} is not the http://host:port/api of a local server"
    return listener_problem(host, port, pid)


def recorded_api_url(imagebench_home: Path, say: Callable[[str], None] | None = None) -> str | None:
    """The API URL of the local server ``imagebench serve --local-server`` runs for this
    workspace, if one is running, is ours (:func:`recorded_server_problem`) and answers; else None.
    A file that names a server not ours is removed, and ``say`` (default: stderr) is told in one
    line; no request is made to that address."""
    path = server_home(imagebench_home) / API_URL_FILE
    recorded = _read_api_url(path)
    if recorded is None:
        return None
    problem = recorded_server_problem(imagebench_home)
    if problem is not None:
        with contextlib.suppress(OSError):
            path.unlink()
        pid = f" (pid {recorded[1]})" if recorded[1] else ""
        line = (f"removed the stale {path}: {problem}, so it is not the local server `make serve`{pid} started; "
                "nothing was sent there")
        (say or (lambda text: print(f"imagebench: {text}", file=sys.stderr, flush=True)))(line)
        return None
    url = recorded[0]
    return url if url and api_healthy(url) else None


def protect_clients(home: Path) -> None:
    """This process's Prefect clients (and the flow runs it starts) send the secret of the server on ``home``."""
    from flows import apiauth

    apiauth.protect(home, server=False)


def use_recorded_api(imagebench_home: Path, say: Callable[[str], None] | None = None) -> str | None:
    """:func:`recorded_api_url`, with this process's Prefect client given the server's secret."""
    url = recorded_api_url(imagebench_home, say)
    if url:
        protect_clients(server_home(imagebench_home))
        if "prefect.context" in sys.modules:  # Prefect read its settings already: again, with the secret
            from prefect.context import refresh_global_settings_context

            refresh_global_settings_context()
    return url


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            PR_SET_PDEATHSIG = 1
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class LocalServer:
    """A Prefect server child process (Prefect's server app under uvicorn, as ``prefect server
    start`` runs it) on ``host:port``, a socket bound here first, with ``home`` as PREFECT_HOME."""

    host: str
    port: int
    home: Path
    auth: bool = True  # require the secret in <home>/api-auth (flows/apiauth.py)
    process: subprocess.Popen | None = None
    started_in_s: float | None = None
    _socket: socket.socket | None = field(default=None, repr=False)  # its port, bound here (flows/apisocket.py)
    _log: object | None = field(default=None, repr=False)
    _t0: float = field(default=0.0, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"

    @property
    def ui_url(self) -> str:
        return self.url

    @property
    def log_path(self) -> Path:
        return self.home / LOG_FILE

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def environment(self) -> dict[str, str]:
        """The server process's environment: ours, with its own PREFECT_HOME and no telemetry, a
        final (not ephemeral) server, and its own address as the one its UI calls."""
        env = dict(os.environ)
        env["PREFECT_HOME"] = str(self.home)
        env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
        env.setdefault("DO_NOT_TRACK", "1")  # Prefect's client telemetry too (flows/env.py)
        # The server does not talk to an API; a client-side URL here would only confuse it.
        env.pop("PREFECT_API_URL", None)
        env.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
        # What `prefect server start` sets for the app it runs (its services and UI on).
        env["PREFECT__SERVER_FINAL"] = "1"
        for var in ("PREFECT__SERVER_EPHEMERAL", "PREFECT__SERVER_WEBSERVER_ONLY"):
            env.pop(var, None)
        # The UI's API URL (/ui-settings) is built from these, not from the port the server listens
        # on: left at 4200, the UI of a server on another port sent its calls, and the secret its
        # user types, to whoever holds 4200 (issue 24 item 5). A UI API URL the user set (a
        # reverse proxy's) is theirs.
        env["PREFECT_SERVER_API_HOST"], env["PREFECT_SERVER_API_PORT"] = self.host, str(self.port)
        if self.auth:
            from flows import apiauth

            env.update(apiauth.server_environment(self.home))
        else:  # a stand-in for a server of the user's own (tests): no secret of ours
            env.pop("PREFECT_SERVER_API_AUTH_STRING", None)
        return env

    def start(self, timeout: float = STARTUP_TIMEOUT_S, wait: bool = True) -> "LocalServer":
        """Start the server process; with ``wait``, return once ``/api/health`` answers (else
        call :meth:`wait_healthy` before using it)."""
        if self.running():
            return self
        from flows.apisocket import PortTaken, bind_api_socket

        if self._socket is None:
            try:  # before anything names the port: nobody else can take it from now on
                self._socket = bind_api_socket(self.host, self.port, listen=True)
            except PortTaken as exc:
                raise LocalServerError(
                    f"{exc}: stop what holds it, or pick another port ({PORT_ENV}=...); imagebench serves only "
                    "on a port it bound itself, so that no secret goes to someone else's server"
                ) from None
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / API_URL_FILE).unlink(missing_ok=True)
        self._log = open(self.log_path, "ab")
        env = self.environment()
        cmd = [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app", "--host", self.host,
               "--port", str(self.port), "--fd", str(self._socket.fileno()), "--lifespan", "on",
               "--log-level", env["PREFECT_SERVER_LOGGING_LEVEL"].lower(),
               "--timeout-keep-alive", env.get("PREFECT_SERVER_API_KEEPALIVE_TIMEOUT", "5")]
        self._t0 = time.monotonic()
        self.started_in_s = None
        self.process = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            pass_fds=(self._socket.fileno(),),
            preexec_fn=_die_with_parent,  # noqa: PLW1509 (setsid + PDEATHSIG, nothing else)
        )
        if wait:
            self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> "LocalServer":
        """Block until ``/api/health`` answers; stop the server and raise if it exits or is too slow."""
        try:
            self._wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        if self.started_in_s is None:
            self.started_in_s = time.monotonic() - self._t0
            write_api_url(self.home, self.api_url)
        return self

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None:
                raise LocalServerError(f"prefect server on {self.url} was not started")
            if self.process.poll() is not None:
                raise LocalServerError(
                    f"prefect server on {self.url} exited with code {self.process.returncode} while "
                    f"starting; its log ({self.log_path}) ends with:\n{self.log_tail()}"
                )
            if api_healthy(self.api_url, timeout=1.0):
                return
            time.sleep(0.25)
        raise LocalServerError(
            f"prefect server on {self.url} did not answer {self.api_url}/health within {timeout:.0f} s; "
            f"its log ({self.log_path}) ends with:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM the server's process group, SIGKILL it after ``timeout``; its exit code."""
        with contextlib.suppress(OSError):
            (self.home / API_URL_FILE).unlink(missing_ok=True)
        proc, code = self.process, None
        if proc is not None:
            if proc.poll() is None:
                self._signal_group(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self._signal_group(signal.SIGKILL)
                    proc.wait(10)
            else:
                # The leader is gone; make sure nothing it started lingers.
                self._signal_group(signal.SIGKILL)
            code = proc.returncode
        if self._log is not None:
            with contextlib.suppress(Exception):
                self._log.close()  # type: ignore[attr-defined]
            self._log = None
        if self._socket is not None:  # the server is gone: the port too
            self._socket.close()
            self._socket = None
        return code

    def _signal_group(self, sig: int) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, sig)  # its own group (setsid in the child)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                if self.process.poll() is None:
                    self.process.send_signal(sig)


@contextlib.contextmanager
def local_server(
    home: Path,
    port: int | None = None,
    host: str = DEFAULT_HOST,
    timeout: float = STARTUP_TIMEOUT_S,
) -> Iterator[LocalServer]:
    """Start a local Prefect server, yield it once ``/api/health`` answers, stop it on exit."""
    server = LocalServer(host=host, port=port if port is not None else configured_port(), home=Path(home).resolve())
    server.start(timeout)
    try:
        yield server
    finally:
        server.stop()
