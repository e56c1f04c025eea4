"""A fault-injecting HTTP/1.1 proxy on loopback, for S3 fault tests (stdlib only).

It sits between a client (boto3 with ``endpoint_url = proxy.endpoint_url``) and a real S3 server
(tests/s3server.py) and forwards every request and response byte for byte (keep-alive,
``Content-Length`` and ``chunked`` bodies, ``aws-chunked`` uploads, ``Expect: 100-continue``),
except where a programmable :class:`Rule` says otherwise:

==================  ===========================================================================
kind                what the client sees
==================  ===========================================================================
``slowdown``        ``503 SlowDown`` with the S3 XML error body (the request never reaches S3)
``error``           any status / S3 error code (e.g. ``500 InternalError``)
``reset``           the request is read, then the connection is reset (RST), no response
``reset_mid_body``  the real response's headers and half of its body, then a reset
``delay``           nothing for ``seconds`` (beyond the client's read timeout: a read timeout),
                    then the request is forwarded if the client is still there
``call``            ``action(method, target)`` runs, then the request is forwarded normally
==================  ===========================================================================

plus :meth:`FaultProxy.refuse_all` (the port stops listening and every open connection is reset:
"server down", new connections are *refused*) and :meth:`FaultProxy.heal`. Every injected fault is
counted (``proxy.counts``) and logged (``proxy.events``), so tests can assert faults happened.

Usage::

    with FaultProxy(server.endpoint_url) as proxy:
        proxy.slowdown(every=4, method="GET")         # every 4th GET gets 503 SlowDown
        proxy.reset(times=2, path="/models/")         # the next 2 requests naming /models/ reset
        store = S3Store(bucket, endpoint_url=proxy.endpoint_url)
        ...
        assert proxy.counts["slowdown"] > 0
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlparse

KINDS = ("slowdown", "error", "reset", "reset_mid_body", "delay", "call")
_MAX_LINE = 65536
_MAX_HEADERS = 200
_NO_BODY_STATUS = {204, 304}


@dataclass
class Rule:
    """Which requests get which fault.

    A request matches when ``method`` (if set) equals its method and ``path`` (if set) is a
    substring of its target (path + query). Among matching requests, the first ``after`` are
    left alone, then every ``every``-th one is hit, at most ``times`` times (None: no limit).
    With ``fresh_targets_only`` a target that any rule already faulted no longer matches, so a
    retried object sees at most one fault from such rules, whatever the interleaving.
    """

    kind: str
    times: int | None = None
    every: int = 1
    after: int = 0
    method: str | None = None
    path: str | None = None
    seconds: float = 0.0  # delay
    status: int = 503  # error / slowdown
    code: str = "SlowDown"
    message: str = "Please reduce your request rate."
    action: Callable[[str, str], None] | None = None  # call
    # Only requests whose target no rule has faulted yet: under concurrent clients the global
    # "every n-th" count can otherwise land on every retry of one object and exhaust its attempts.
    fresh_targets_only: bool = False
    seen: int = 0  # matching requests so far
    injected: int = 0  # faults injected so far

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}: one of {', '.join(KINDS)}")
        if self.every < 1:
            raise ValueError("every must be >= 1")
        if self.kind == "call" and self.action is None:
            raise ValueError("a 'call' rule needs an action")

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.injected >= self.times

    def matches(self, method: str, target: str) -> bool:
        return (self.method is None or self.method == method) and (self.path is None or self.path in target)

    def take(self) -> bool:
        """Called (under the proxy's lock) for a matching request: fire this time?"""
        self.seen += 1
        if self.exhausted or self.seen <= self.after or (self.seen - self.after) % self.every:
            return False
        self.injected += 1
        return True


@dataclass
class _Head:
    start: bytes  # request or status line, with its CRLF
    lines: list[bytes]  # raw header lines, with their CRLFs
    headers: dict[str, str]  # lower-cased name -> value (last wins; enough for framing)

    def raw(self) -> bytes:
        return self.start + b"".join(self.lines) + b"\r\n"

    def get(self, name: str) -> str:
        return self.headers.get(name, "")

    @property
    def chunked(self) -> bool:
        return "chunked" in self.get("transfer-encoding").lower()

    @property
    def wants_close(self) -> bool:
        return "close" in self.get("connection").lower()


class _Closed(Exception):
    """The peer closed the connection (or it was killed)."""


def _read_head(rf) -> _Head | None:
    start = rf.readline(_MAX_LINE + 1)
    if not start:
        return None
    if not start.endswith(b"\n"):
        raise _Closed("truncated start line")
    lines, headers = [], {}
    while True:
        line = rf.readline(_MAX_LINE + 1)
        if not line or not line.endswith(b"\n"):
            raise _Closed("truncated headers")
        if line in (b"\r\n", b"\n"):
            break
        lines.append(line)
        if len(lines) > _MAX_HEADERS:
            raise _Closed("too many headers")
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return _Head(start, lines, headers)


def _read_exact(rf, n: int) -> bytes:
    data = rf.read(n)
    if data is None or len(data) != n:
        raise _Closed(f"wanted {n} bytes, got {len(data or b'')}")
    return data


def _read_chunked_raw(rf) -> bytes:
    """A chunked body exactly as sent (sizes, extensions, data, trailers)."""
    out = bytearray()
    while True:
        line = rf.readline(_MAX_LINE + 1)
        if not line or not line.endswith(b"\n"):
            raise _Closed("truncated chunk size")
        out += line
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while True:
                trailer = rf.readline(_MAX_LINE + 1)
                if not trailer or not trailer.endswith(b"\n"):
                    raise _Closed("truncated trailers")
                out += trailer
                if trailer in (b"\r\n", b"\n"):
                    return bytes(out)
        out += _read_exact(rf, size + 2)


def _read_body(rf, head: _Head, *, request: bool, method: str = "", status: int = 0) -> bytes | None:
    """The raw body bytes; ``None`` for a response delimited by the connection closing."""
    if not request and (method == "HEAD" or status in _NO_BODY_STATUS or 100 <= status < 200):
        return b""
    if head.chunked:
        return _read_chunked_raw(rf)
    length = head.get("content-length")
    if length:
        return _read_exact(rf, int(length))
    if request:
        return b""
    return None  # read until close


def _rst(sock: socket.socket | None) -> None:
    """Close with a TCP reset (SO_LINGER 0), not a polite FIN."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def s3_error_body(code: str, message: str, resource: str, request_id: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{resource}</Resource><RequestId>{request_id}</RequestId></Error>"
    ).encode()


class _Conn:
    """One client connection and its upstream connection (both killable from other threads)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.upstream: socket.socket | None = None
        self.up_rf = None
        self.killed = threading.Event()  # also wakes a delay

    def kill(self) -> None:
        self.killed.set()
        for s in (self.sock, self.upstream):
            if s is None:
                continue
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RD)  # wakes a thread blocked reading it


class FaultProxy:
    """Threaded HTTP/1.1 forwarding proxy on 127.0.0.1 with programmable faults."""

    def __init__(self, upstream_url: str, host: str = "127.0.0.1", port: int = 0, upstream_timeout: float = 120.0):
        self.host = host
        self.port = port
        self.upstream_timeout = upstream_timeout
        self.set_upstream(upstream_url)
        self.rules: list[Rule] = []
        self.counts: Counter[str] = Counter()
        self.events: list[tuple[float, str, str, str]] = []  # (time, kind, method, target)
        self.faulted_targets: Counter[str] = Counter()  # target -> faults injected on it
        self._lock = threading.Lock()
        self._conns: set[_Conn] = set()
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stopped = False

    # -- life cycle
    def set_upstream(self, upstream_url: str) -> None:
        u = urlparse(upstream_url)
        if u.scheme != "http" or not u.hostname or not u.port:
            raise ValueError(f"upstream must be http://host:port, got {upstream_url!r}")
        self.upstream = (u.hostname, u.port)

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FaultProxy:
        self._listen()
        return self

    def _listen(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, self.port))
        s.listen(128)
        self.port = s.getsockname()[1]
        self._listener = s
        t = threading.Thread(target=self._accept_loop, args=(s,), name=f"faultproxy-accept-{self.port}", daemon=True)
        self._accept_thread = t
        t.start()

    def _close_listener(self) -> None:
        s, t = self._listener, self._accept_thread
        self._listener = self._accept_thread = None
        if s is not None:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # stops listening now and wakes accept()
        if t is not None:
            t.join(timeout=5)
        if s is not None:
            with contextlib.suppress(OSError):
                s.close()

    def _kill_all(self) -> int:
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.kill()
        return len(conns)

    @property
    def refusing(self) -> bool:
        return self._listener is None

    def refuse_all(self) -> None:
        """Server down: the port stops listening (connections refused) and every open connection
        is reset."""
        self._close_listener()
        n = self._kill_all()
        self._record("refuse_all", "-", f"{n} open connections reset")

    def heal(self, clear_rules: bool = True) -> None:
        """Listen again on the same port (after :meth:`refuse_all`); drop the rules by default."""
        if clear_rules:
            self.clear()
        if self._listener is None and not self._stopped:
            self._listen()
            self._record("heal", "-", "-")

    def stop(self) -> None:
        self._stopped = True
        self._close_listener()
        self._kill_all()
        for t in list(self._threads):
            t.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- rules
    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def slowdown(self, **match) -> Rule:
        return self.add(Rule("slowdown", **match))

    def error(self, status: int, code: str, message: str = "injected", **match) -> Rule:
        return self.add(Rule("error", status=status, code=code, message=message, **match))

    def reset(self, **match) -> Rule:
        return self.add(Rule("reset", **match))

    def reset_mid_body(self, **match) -> Rule:
        return self.add(Rule("reset_mid_body", **match))

    def delay(self, seconds: float, **match) -> Rule:
        return self.add(Rule("delay", seconds=seconds, **match))

    def on_request(self, action: Callable[[str, str], None], **match) -> Rule:
        return self.add(Rule("call", action=action, **match))

    @property
    def injected(self) -> int:
        """Faults injected so far (``call`` hooks not counted)."""
        return sum(self.counts[k] for k in KINDS if k != "call")

    def _pick(self, method: str, target: str) -> Rule | None:
        with self._lock:
            self.counts["requests"] += 1
            for rule in self.rules:
                if rule.fresh_targets_only and self.faulted_targets[target]:
                    continue
                if rule.matches(method, target) and rule.take():
                    if rule.kind != "call":
                        self.faulted_targets[target] += 1
                    self.counts[rule.kind] += 1
                    self.events.append((time.monotonic(), rule.kind, method, target))
                    return rule
        return None

    def _record(self, kind: str, method: str, target: str, event: bool = True) -> None:
        with self._lock:
            self.counts[kind] += 1
            if event:
                self.events.append((time.monotonic(), kind, method, target))

    # -- serving
    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return  # listener shut down
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock)
            with self._lock:
                self._conns.add(conn)
                self.counts["connections"] += 1
                self._threads = [t for t in self._threads if t.is_alive()]
                t = threading.Thread(target=self._serve, args=(conn,), name="faultproxy-conn", daemon=True)
                self._threads.append(t)
            t.start()

    def _serve(self, conn: _Conn) -> None:
        rf = conn.sock.makefile("rb")
        up_rf = None
        reset = False
        try:
            while not conn.killed.is_set():
                head = _read_head(rf)
                if head is None:
                    break
                parts = head.start.split(b" ", 2)
                method = parts[0].decode("latin-1")
                target = parts[1].decode("latin-1") if len(parts) > 1 else "/"
                if "100-continue" in head.get("expect").lower():
                    conn.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = _read_body(rf, head, request=True)
                rule = self._pick(method, target)
                kind = rule.kind if rule else None
                if kind in ("slowdown", "error"):
                    self._send_error(conn.sock, method, target, rule)
                    if head.wants_close:
                        break
                    continue
                if kind == "reset":
                    reset = True
                    break
                if kind == "delay":
                    if conn.killed.wait(rule.seconds) or self._client_gone(conn.sock):
                        reset = True
                        break
                if kind == "call":
                    rule.action(method, target)
                    if conn.killed.is_set():
                        reset = True
                        break
                request_raw = head.raw() + body
                resp = self._exchange(conn, request_raw, method, target)
                if resp is None:
                    reset = True  # upstream unreachable or broke: the client sees a reset
                    break
                up_rf = resp[3]
                status_head, status, resp_body = resp[0], resp[1], resp[2]
                if kind == "reset_mid_body":
                    data = resp_body if resp_body is not None else up_rf.read()
                    conn.sock.sendall(status_head.raw() + data[: len(data) // 2])
                    self._drop_upstream(conn)
                    reset = True
                    break
                if resp_body is None:  # delimited by close: stream until upstream closes
                    conn.sock.sendall(status_head.raw())
                    while chunk := up_rf.read1(65536):
                        conn.sock.sendall(chunk)
                    self._drop_upstream(conn)
                    # Counted before the close that ends the client's read.
                    self._record("forwarded", method, target, event=False)
                    break
                # Counted before the client can see the last byte, so a test that reads
                # the answer and then the counter never races this thread.
                self._record("forwarded", method, target, event=False)
                conn.sock.sendall(status_head.raw() + (resp_body or b""))
                if head.wants_close or status_head.wants_close:
                    self._drop_upstream(conn)
                    break
        except (OSError, _Closed, ValueError):
            reset = True
        finally:
            if conn.killed.is_set():
                reset = True
            self._drop_upstream(conn)
            with contextlib.suppress(OSError):
                rf.close()
            if reset:
                _rst(conn.sock)
            else:
                with contextlib.suppress(OSError):
                    conn.sock.close()
            with self._lock:
                self._conns.discard(conn)

    @staticmethod
    def _client_gone(sock: socket.socket) -> bool:
        try:
            r, _, _ = select.select([sock], [], [], 0)
            if not r:
                return False
            return sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _send_error(self, sock: socket.socket, method: str, target: str, rule: Rule) -> None:
        request_id = f"faultproxy-{self.counts['requests']}"
        body = s3_error_body(rule.code, rule.message, target.split("?", 1)[0], request_id)
        reason = {503: "Slow Down", 500: "Internal Server Error"}.get(rule.status, "Injected")
        head = (
            f"HTTP/1.1 {rule.status} {reason}\r\n"
            "Content-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"x-amz-request-id: {request_id}\r\n"
            "Server: faultproxy\r\n\r\n"
        ).encode()
        sock.sendall(head if method == "HEAD" else head + body)

    def _drop_upstream(self, conn: _Conn) -> None:
        if conn.upstream is not None:
            with contextlib.suppress(OSError):
                conn.upstream.close()
            conn.upstream = None
            conn.up_rf = None

    def _connect_upstream(self, conn: _Conn) -> bool:
        try:
            s = socket.create_connection(self.upstream, timeout=self.upstream_timeout)
        except OSError:
            return False
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.upstream = s
        conn.up_rf = s.makefile("rb")
        if conn.killed.is_set():  # killed while connecting
            self._drop_upstream(conn)
            return False
        return True

    def _exchange(self, conn: _Conn, request_raw: bytes, method: str, target: str):
        """Send one request upstream, read the response head (1xx skipped) and body.

        Returns (head, status, body or None when delimited by close, upstream reader), or None when
        upstream cannot be reached. A kept-alive upstream connection that turns out to be closed
        is replaced once.
        """
        for attempt in (1, 2):
            reused = conn.upstream is not None
            if not reused and not self._connect_upstream(conn):
                self._record("upstream_unreachable", method, target)
                return None
            up_rf = conn.up_rf
            try:
                conn.upstream.sendall(request_raw)
                while True:
                    head = _read_head(up_rf)
                    if head is None:
                        raise _Closed("upstream closed before responding")
                    status = int(head.start.split(b" ", 2)[1])
                    if status >= 200 or status == 101:
                        break
                    # interim 1xx (100 Continue: the client already got ours): drop it
                body = _read_body(up_rf, head, request=False, method=method, status=status)
                return head, status, body, up_rf
            except (OSError, _Closed, ValueError, IndexError):
                self._drop_upstream(conn)
                if conn.killed.is_set() or not reused or attempt == 2:
                    self._record("upstream_broken", method, target)
                    return None
        return None


if __name__ == "__main__":  # pragma: no cover - manual use: python -m tests.faultproxy http://127.0.0.1:8333
    import sys

    with FaultProxy(sys.argv[1]) as p:
        print(f"proxy at {p.endpoint_url} -> {sys.argv[1]}")
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
