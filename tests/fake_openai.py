"""A small OpenAI-compatible chat-completions server for the judge tests (stdlib only).

Runs a ``ThreadingHTTPServer`` on 127.0.0.1 (a free port) in a background thread. Each request
to ``POST /v1/chat/completions`` is answered by ``responder(request) -> Reply``, which scripts the
behaviour per request: a delay, an HTTP status (429 + Retry-After, 500...), a hang past the
client's timeout, a malformed body, any answer text, another model name, or an answer that echoes
the request's headers (``Reply(echo_headers=True)``: in the error body, or in the answer text
of a 200, as some real APIs and proxies do). ``GET /v1/models``
lists the server's model. The server records every request (time, headers, JSON body) and the
largest number of requests in flight at once.

``limits=ServerLimits(...)`` makes it a paid API's endpoint: a request beyond ``max_in_flight``
requests in flight, beyond ``requests_per_minute`` (a token bucket of ``burst`` requests refilled
at N/60 per second, as providers enforce a per-minute limit over shorter periods) or beyond
``tokens_per_minute`` (the reply's usage, charged on arrival) is answered 429 with a
``Retry-After`` and counted in ``refused`` (the request is marked ``refused``).

    with FakeOpenAI(model="fake-vlm", responder=lambda r: Reply(text="ok\\nVERDICT: PASS")) as srv:
        srv.base_url  # http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass
class Reply:
    text: str | None = "The image shows what the question asks for.\nVERDICT: PASS"
    status: int = 200
    delay_s: float = 0.0  # before answering
    hang_s: float | None = None  # sleep this long, then drop the connection without answering
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None  # raw body (e.g. malformed JSON); overrides text
    model: str | None = None  # the "model" field of the answer (default: the server's model)
    usage: dict[str, int] | None = field(default_factory=lambda: {"prompt_tokens": 321, "completion_tokens": 12})
    # Echo the request headers (Authorization included): in the JSON error body when status !=
    # 200, else on a line before the answer text (the verdict line stays last).
    echo_headers: bool = False


@dataclass
class RecordedRequest:
    t: float  # time.monotonic() at arrival
    t_end: float | None
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON (or None)
    refused: str | None = None  # why the server's limits answered it 429 (ServerLimits)

    @property
    def user_text(self) -> str:
        """The text parts of the last user message."""
        try:
            content = self.body["messages"][-1]["content"]
        except (KeyError, IndexError, TypeError):
            return ""
        if isinstance(content, str):
            return content
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")

    @property
    def generation_prompt(self) -> str:
        m = re.search(r"<prompt>\s*(.*?)\s*</prompt>", self.user_text, re.S)
        return m.group(1) if m else ""

    @property
    def image_url(self) -> str | None:
        try:
            for p in self.body["messages"][-1]["content"]:
                if isinstance(p, dict) and p.get("type") == "image_url":
                    return p["image_url"]["url"]
        except (KeyError, TypeError):
            pass
        return None


@dataclass(frozen=True)
class ServerLimits:
    """What the server allows before it answers 429 (``None``: no such limit)."""

    max_in_flight: int | None = None
    requests_per_minute: float | None = None
    burst: int = 2  # requests the per-minute bucket holds (the tolerance for arrival jitter)
    tokens_per_minute: int | None = None


class _Bucket:
    """capacity, refilled at per_second; take(cost) -> None, or the seconds until it holds cost."""

    def __init__(self, capacity: float, per_second: float) -> None:
        self.capacity, self.per_second, self.level, self.at = capacity, per_second, capacity, time.monotonic()

    def take(self, cost: float, now: float) -> float | None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.per_second)
        self.at = now
        if self.level + 1e-9 >= cost:
            self.level -= cost
            return None
        return (cost - self.level) / self.per_second


class FakeOpenAI:
    def __init__(
        self,
        model: str = "fake-vlm",
        responder: Callable[[RecordedRequest], Reply] | None = None,
        api_key: str | None = None,
        echo_headers_on_auth_failure: bool = False,
        limits: ServerLimits | None = None,
    ) -> None:
        self.model = model
        self.limits = limits
        self.refused = 0
        self._requests_bucket = (_Bucket(limits.burst, limits.requests_per_minute / 60.0)
                                 if limits and limits.requests_per_minute else None)
        self._tokens_bucket = (_Bucket(limits.tokens_per_minute, limits.tokens_per_minute / 60.0)
                               if limits and limits.tokens_per_minute else None)
        self.responder = responder or (lambda req: Reply())
        self.api_key = api_key
        # With api_key set: the 401 body quotes the request's headers (the key that was refused).
        self.echo_headers_on_auth_failure = echo_headers_on_auth_failure
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle -------------------------------------------------------------------------------
    def start(self) -> "FakeOpenAI":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                # Done before the client can read the answer: a test that checks in_flight or
                # t_end right after its call returns must not race this thread.
                fake._done(self._rec)
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self) -> bool:
                if fake.api_key is None:
                    return True
                return self.headers.get("Authorization") == f"Bearer {fake.api_key}"

            def _refuse(self) -> None:
                error: dict[str, Any] = {"message": "invalid api key"}
                if fake.echo_headers_on_auth_failure:
                    error["message"] = f"invalid api key: {self.headers.get('Authorization')}"
                    error["request_headers"] = dict(self.headers.items())
                self._send(401, json.dumps({"error": error}).encode())

            def do_GET(self) -> None:  # noqa: N802
                rec = self._rec = fake._record(self, None)
                try:
                    if not self._authorized():
                        self._refuse()
                    elif self.path.rstrip("/").endswith("/models"):
                        self._send(
                            200,
                            json.dumps({"object": "list", "data": [{"id": fake.model, "object": "model"}]}).encode(),
                        )
                    else:
                        self._send(404, b'{"error": "not found"}')
                finally:
                    fake._done(rec)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                rec = self._rec = fake._record(self, body)
                try:
                    if not self.path.rstrip("/").endswith("/chat/completions"):
                        self._send(404, b'{"error": "not found"}')
                        return
                    if not self._authorized():
                        self._refuse()
                        return
                    reply = fake.responder(rec)
                    over = fake._over_limits(rec, reply)
                    if over is not None:
                        why, retry_after = over
                        body = json.dumps({"error": {"message": f"rate limited: {why}", "type": "rate_limit"}}).encode()
                        self._send(429, body, {"Retry-After": str(retry_after)})
                        return
                    if reply.hang_s is not None:
                        fake._closing.wait(reply.hang_s)
                        self.close_connection = True
                        return
                    if reply.delay_s:
                        fake._closing.wait(reply.delay_s)
                    echoed = dict(self.headers.items()) if reply.echo_headers else None
                    if reply.body is not None:
                        payload = reply.body
                    elif reply.status != 200:
                        error: dict[str, Any] = {"message": f"scripted {reply.status}"}
                        if echoed is not None:
                            error["message"] += f"; request headers: {echoed}"
                            error["request_headers"] = echoed
                        payload = json.dumps({"error": error}).encode()
                    else:
                        answer: dict[str, Any] = {
                            "id": f"chatcmpl-{len(fake.requests)}",
                            "object": "chat.completion",
                            "created": int(time.time()),
                            "model": reply.model or (body or {}).get("model") or fake.model,
                            "choices": [
                                {
                                    "index": 0,
                                    "message": {
                                        "role": "assistant",
                                        "content": (
                                            f"request headers: {json.dumps(echoed)}\n{reply.text}"
                                            if echoed is not None else reply.text
                                        ),
                                    },
                                    "finish_reason": "stop",
                                }
                            ],
                        }
                        if reply.usage is not None:
                            answer["usage"] = dict(reply.usage, total_tokens=sum(reply.usage.values()))
                        payload = json.dumps(answer).encode()
                    self._send(reply.status, payload, reply.headers)
                finally:
                    fake._done(rec)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "FakeOpenAI":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # bookkeeping -----------------------------------------------------------------------------
    def _record(self, handler: BaseHTTPRequestHandler, body: Any) -> RecordedRequest:
        rec = RecordedRequest(
            time.monotonic(), None, handler.command, handler.path, dict(handler.headers.items()), body
        )
        with self._lock:
            self.requests.append(rec)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return rec

    def _over_limits(self, rec: RecordedRequest, reply: Reply) -> tuple[str, int] | None:
        """(why, Retry-After seconds) when this request is beyond the server's limits."""
        if self.limits is None:
            return None
        with self._lock:
            now = time.monotonic()
            why, wait = None, None
            if self.limits.max_in_flight is not None and self.in_flight > self.limits.max_in_flight:
                why, wait = f"{self.in_flight} requests in flight, {self.limits.max_in_flight} allowed", 1.0
            elif self._requests_bucket is not None and (w := self._requests_bucket.take(1, now)) is not None:
                why, wait = f"over {self.limits.requests_per_minute:g} requests per minute", w
            elif self._tokens_bucket is not None:
                cost = sum((reply.usage or {}).values())
                if (w := self._tokens_bucket.take(cost, now)) is not None:
                    why, wait = f"over {self.limits.tokens_per_minute} tokens per minute", w
            if why is None:
                return None
            rec.refused = why
            self.refused += 1
            return why, max(1, math.ceil(wait))

    @property
    def accepted(self) -> list[RecordedRequest]:
        """Chat completions the limits let through, in arrival order."""
        return [r for r in self.completions if r.refused is None]

    def _done(self, rec: RecordedRequest) -> None:
        with self._lock:
            if rec.t_end is None:  # once per request: on answering, or when the handler ends
                self.in_flight -= 1
                rec.t_end = time.monotonic()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def completions(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.method == "POST"]


def free_port() -> int:
    """A port nothing listens on (for connection-refused tests)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
