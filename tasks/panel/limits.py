"""What one panel server gives one request or connection, and no more (issue 24 item 6).

Bodies (:class:`BodyLimitMiddleware`, an ASGI middleware inside every panel app): a request whose
``Content-Length`` is over its path's limit is refused with 413 before a byte of its body is read
(and before the session lookup); a chunked body is counted as it arrives and refused the moment it
passes the limit; a body that has not arrived whole within ``timeout_s`` of the request's start is
refused with 408. Nothing of a refused body reaches the app or stays in memory: uvicorn reads at
most 64 kB ahead of the app (its flow control) and drops what comes after the response. The
connection then lingers, as nginx's does, so that a client still sending its body reads the
refusal instead of a reset: it is closed when the header deadline below runs out (the rest of the
body and the next request's headers must come within it), so a flood is cut after
``header_timeout_s``. Starlette's own ``max_body_size`` is not used: it looks at ``Content-Length``
only when the app first reads (after the session lookup), and has no deadline.

Connections (:class:`PanelH11Protocol`, uvicorn's h11 protocol with one deadline more): a
connection must deliver a request's complete headers within ``header_timeout_s`` of opening, or of
the previous response; otherwise it is closed. uvicorn alone has no such limit: a connection that
sends nothing, or a header byte every few seconds (slowloris), stays open for good. Headers are
at most ``max_header_bytes`` (h11 answers 400 and closes beyond), an idle keep-alive connection
closes after ``keep_alive_s``.

The values are :class:`ServerLimits` (``make_server`` in tasks/panel/app.py) and the protocol's
:class:`BodyRules`; docs/BEAUTY.md ("Limits and the reverse proxy") lists them with the nginx set-up
that puts the same limits in front.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("imagebench.panel")

HEADER_TIMEOUT_S = 10.0  # from a connection's start (or its last response) to a request's complete headers
BODY_TIMEOUT_S = 60.0  # from a request's headers to its whole body (a 1 MB memo on a slow uplink fits)
KEEP_ALIVE_S = 5.0  # uvicorn's default, said out loud
MAX_HEADER_BYTES = 16 * 1024  # h11's default: a request line and headers over this are a 400
GRACEFUL_SHUTDOWN_S = 10.0  # Ctrl-C: requests in flight get this long, then their connections close
OPEN_FILES_WANTED = 65536  # each connection is a file descriptor: Debian's soft limit of 1024 is few


@dataclass(frozen=True)
class BodyLimit:
    """The most a request body to one path may hold; ``json``: its refusal is ``{"error": ...}``
    (the path is called by the page's ``fetch``), else a page."""

    max_bytes: int
    json: bool = False


@dataclass
class BodyRules:
    """The body limit of each path (``default`` for the others) and the deadline for a whole body."""

    default: BodyLimit
    paths: dict[str, BodyLimit] = field(default_factory=dict)
    timeout_s: float = BODY_TIMEOUT_S

    def limit_for(self, path: str) -> BodyLimit:
        return self.paths.get(path, self.default)


class _BodyRefused(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status, self.text = status, text


# (status, one-line reason, limit of the path) -> an ASGI response (Starlette's Response is one).
Refusal = Callable[[int, str, BodyLimit], Callable[..., Awaitable[None]]]


class BodyLimitMiddleware:
    """Refuses bodies by size before reading them, and slow bodies by time (module docstring).
    ``refuse`` renders a refusal as the app's page or JSON."""

    def __init__(self, app, rules: BodyRules, refuse: Refusal):
        self.app, self.rules, self.refuse = app, rules, refuse

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.rules.limit_for(scope["path"])
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and (len(declared) > 18 or int(declared) > limit.max_bytes):  # h11 lets only digits through
            return await self._refuse(scope, receive, send, limit, 413, f"request body over {limit.max_bytes} bytes")
        deadline = anyio.current_time() + self.rules.timeout_s
        got, body_done, started = 0, False, False

        async def limited_receive():
            nonlocal got, body_done
            if body_done:  # after the body: e.g. waiting for a disconnect while a response streams
                return await receive()
            try:
                with anyio.fail_after(max(deadline - anyio.current_time(), 0.0)):
                    message = await receive()
            except TimeoutError:
                raise _BodyRefused(408, f"the request body did not arrive within {self.rules.timeout_s:g} s") from None
            if message["type"] == "http.request":
                got += len(message.get("body", b""))
                if got > limit.max_bytes:
                    raise _BodyRefused(413, f"request body over {limit.max_bytes} bytes")
                body_done = not message.get("more_body", False)
            return message

        async def tracking_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyRefused as exc:
            if started:  # nothing left to answer with: uvicorn closes the connection
                raise
            await self._refuse(scope, receive, send, limit, exc.status, exc.text)

    async def _refuse(self, scope, receive, send, limit: BodyLimit, status: int, text: str) -> None:
        log.warning("request body refused: %s", text)  # the request log names the path, redacted (tasks/panel/app.py)
        await self.refuse(status, text, limit)(scope, receive, send)


class PanelH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's headers (module docstring).
    ``make_server`` makes a subclass carrying the server's ``header_timeout_s``."""

    header_timeout_s: float = HEADER_TIMEOUT_S

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self._header_deadline = None
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_flight():  # headers complete: the app (and the body deadline) take over
            self._disarm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing() or self._in_flight():  # closing, or a pipelined request is being served
            self._disarm_header_deadline()
        else:  # the next request's headers must come in time (uvicorn's keep-alive timer stops at its first byte)
            self._arm_header_deadline()

    def connection_lost(self, exc) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _in_flight(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self._in_flight() or self.transport.is_closing():
            return
        try:
            self.conn.send(h11.ConnectionClosed())
        except h11.LocalProtocolError:  # part of a request read: h11 minds, the socket closes all the same
            pass
        self.transport.close()


@dataclass(frozen=True)
class ServerLimits:
    """The connection limits of a panel server (``make_server``)."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    keep_alive_s: float = KEEP_ALIVE_S
    max_header_bytes: int = MAX_HEADER_BYTES
    graceful_shutdown_s: float = GRACEFUL_SHUTDOWN_S

    def protocol(self) -> type[PanelH11Protocol]:
        return type("PanelH11Protocol", (PanelH11Protocol,), {"header_timeout_s": self.header_timeout_s})


def raise_open_files_limit(wanted: int = OPEN_FILES_WANTED) -> int:
    """Raise this process's soft limit of open files towards ``wanted`` (never above the hard
    limit, never lower than it was): at Debian's default 1024, a thousand idle connections would
    stop the server accepting a judge's. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # a container that forbids it: keep what we have
            pass
    return soft
