"""`imagebench panel serve` as its own process, as a lab runs it (the real CLI: its uvicorn set-up,
its limits), for tests that measure the server's memory from /proc, kill it, or put nginx in
front of it; and a raw HTTP/1.1 client on a socket, for requests no well-behaved client sends."""

from __future__ import annotations

import os
import re
import resource
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEBIAN_OPEN_FILES = 1024  # the soft limit a Debian login or systemd service starts with


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid`` (VmRSS of /proc/PID/status)."""
    m = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(m.group(1)) * 1024


@dataclass
class CliServer:
    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _debian_limits() -> None:  # in the child, before exec
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(DEBIAN_OPEN_FILES, hard), hard))


def _wait_listening(proc: subprocess.Popen, port: int, log_path: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"panel serve exited {proc.returncode}:\n{log_path.read_text(errors='replace')[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"panel serve did not listen on {port} within {timeout_s} s")


@contextmanager
def panel_serve_cli(home: Path, study_id: str, log_dir: Path, *, port: int | None = None, url: str | None = None,
                    database: str | None = None) -> Iterator[CliServer]:
    """`imagebench panel serve STUDY --port PORT` for the workspace ``home`` (its objects in
    ``home/objects``), started with Debian's default open-files limit; stopped (SIGTERM, then
    SIGKILL) at the end unless the test killed it."""
    port = port or free_port()
    env = {**os.environ, "IMAGEBENCH_HOME": str(home), "IMAGEBENCH_REFERENCE_DIR": str(REPO / "reference"),
           "IMAGEBENCH_STORE": str(home / "objects"), "IMAGEBENCH_WARM": "off"}
    env.pop("IMAGEBENCH_PANEL_DATABASE", None)
    if database:
        env["IMAGEBENCH_PANEL_DATABASE"] = database
    args = [str(Path(sys.executable).parent / "imagebench"), "panel", "serve", study_id, "--port", str(port)]
    if url:
        args += ["--url", url]
    log_path = log_dir / f"panel-serve-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,  # noqa: S603
                                preexec_fn=_debian_limits, start_new_session=True)
    try:
        _wait_listening(proc, port, log_path)
        yield CliServer(proc, port, log_path)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


# ---- a raw HTTP/1.1 client --------------------------------------------------------------------


def request_head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes


def read_response(sock: socket.socket, timeout_s: float) -> RawResponse:
    """One response (status line, headers, a Content-Length body) read from ``sock``."""
    sock.settimeout(timeout_s)
    buf = b""
    while b"\r\n\r\n" not in buf:
        got = sock.recv(65536)
        if not got:
            raise ConnectionError(f"connection closed before a response ({buf[:200]!r})")
        buf += got
    head, _, body = buf.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    want = int(headers.get("content-length", "0"))
    while len(body) < want:
        got = sock.recv(65536)
        if not got:
            break
        body += got
    return RawResponse(int(status_line.split()[1]), headers, body)


def send_until_answered(sock: socket.socket, head: bytes, chunks: Iterator[bytes], timeout_s: float) -> int:
    """Send ``head`` then ``chunks`` without blocking, stopping as soon as the server has something
    to say (a response, or a closed connection) or the chunks run out. Returns the body bytes sent."""
    sock.setblocking(False)
    pending, sent = head, 0
    deadline = time.monotonic() + timeout_s
    in_head = True
    while time.monotonic() < deadline:
        readable, writable, _ = select.select([sock], [sock] if pending else [], [], 1.0)
        if readable:
            break
        if writable and pending:
            try:
                n = sock.send(pending)
            except (BrokenPipeError, ConnectionResetError):
                break
            if not in_head:
                sent += n
            pending = pending[n:]
        if not pending:
            in_head = False
            pending = next(chunks, b"")
            if not pending:
                break
    sock.setblocking(True)
    return sent


def closed_by_server(sock: socket.socket, timeout_s: float, keep_sending: bytes = b"") -> bool:
    """Whether the server closes ``sock`` within ``timeout_s`` (EOF or reset), reading and
    discarding what it sends, and sending ``keep_sending`` over and over meanwhile (a flood)."""
    sock.setblocking(False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        readable, writable, _ = select.select([sock], [sock] if keep_sending else [], [], 0.5)
        try:
            if readable and not sock.recv(65536):
                return True
            if writable and keep_sending:
                sock.send(keep_sending)
        except (BrokenPipeError, ConnectionResetError):
            return True
        except BlockingIOError:
            pass
    return False
