"""A real local Prefect server (``prefect server start``) as a child process: production mode.

``imagebench serve --local-server`` (what ``make serve`` runs) starts one on loopback with its own
``PREFECT_HOME`` inside the workspace (``$IMAGEBENCH_HOME/prefect-server``, apart from the embedded
mode's ``$IMAGEBENCH_HOME/prefect``), waits until ``/api/health`` answers, serves the deployments
against it and stops it on exit. While it runs, ``$IMAGEBENCH_HOME/prefect-server/api-url`` holds
its API URL, so ``imagebench backfill`` finds it without ``PREFECT_API_URL``. The server requires
Prefect's auth string, the secret in ``<home>/api-auth`` (flows/apiauth.py): ``serve`` and
``backfill`` read it from there; the UI asks for it.

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
from collections.abc import Iterator
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


def recorded_api_url(imagebench_home: Path) -> str | None:
    """The API URL of the local server ``imagebench serve --local-server`` runs for this
    workspace, if one is running and answers; else None (a stale file is ignored)."""
    path = server_home(imagebench_home) / API_URL_FILE
    try:
        url = path.read_text().strip()
    except OSError:
        return None
    return url if url and api_healthy(url) else None


def protect_clients(home: Path) -> None:
    """This process's Prefect clients (and the flow runs it starts) send the secret of the server on ``home``."""
    from flows import apiauth

    apiauth.protect(home, server=False)


def use_recorded_api(imagebench_home: Path) -> str | None:
    """:func:`recorded_api_url`, with this process's Prefect client given the server's secret."""
    url = recorded_api_url(imagebench_home)
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
    """A ``prefect server start`` child process on ``host:port`` with ``home`` as PREFECT_HOME."""

    host: str
    port: int
    home: Path
    auth: bool = True  # require the secret in <home>/api-auth (flows/apiauth.py)
    process: subprocess.Popen | None = None
    started_in_s: float | None = None
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
        """The server process's environment: ours, with its own PREFECT_HOME and no telemetry."""
        env = dict(os.environ)
        env["PREFECT_HOME"] = str(self.home)
        env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
        # The server does not talk to an API; a client-side URL here would only confuse it.
        env.pop("PREFECT_API_URL", None)
        env.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
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
        if api_healthy(self.api_url, timeout=1.0):
            raise LocalServerError(
                f"a Prefect server already answers at {self.url}: stop it, or pick another port "
                f"({PORT_ENV}=...); imagebench only manages a server it started"
            )
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / API_URL_FILE).unlink(missing_ok=True)
        self._log = open(self.log_path, "ab")
        cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", self.host, "--port", str(self.port)]
        self._t0 = time.monotonic()
        self.started_in_s = None
        self.process = subprocess.Popen(
            cmd,
            env=self.environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
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
            (self.home / API_URL_FILE).write_text(self.api_url + "\n")
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
