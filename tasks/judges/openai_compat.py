"""Judge backend for any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, Ollama,
OpenRouter, OpenAI) over HTTP with httpx.

One :meth:`OpenAIJudge.ask` = one HTTP request: the image inline as a base64 data URL, temperature
0, a fixed seed, ``max_tokens`` from the endpoint. The endpoint's limits (``concurrency``,
``requests_per_minute``, ``tokens_per_minute``) hold across the whole run: every request takes a
slot of the endpoint's process-wide limiter (``tasks/judges/limits.py``, shared further as the
run's :class:`~tasks.judges.limits.LimitScope` says) and waits for its rates just before it is
sent; a 429 or 503 with ``Retry-After`` pauses the endpoint for every caller. The whole request
(connect + send + read) must finish within ``endpoint.timeout_s`` (the wait for a rate is not
part of it). Retries and backoff are the router's (``router.RetryPolicy``): this module classifies
failures into typed errors and reads ``Retry-After``.

The API key is read from the environment variable named by ``api_key_env`` when the judge is
built, sent only in the ``Authorization`` header, registered for redaction, and never put in a
message, a log line or a table.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import os
import re
import time
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from schemas.judges import Endpoint

from .base import (
    Judge,
    JudgeAnswer,
    JudgeBadResponse,
    JudgeError,
    JudgeInputError,
    JudgeModelMismatch,
    JudgeRequest,
    JudgeUnavailable,
    json_excerpt,
    read_image,
)
from .base import register_secret as _register_router_secret
from .limits import EndpointLimiter, LimitScope, limiter_for
from tasks.store.redact import install_log_redaction, redact, register_secret

RETRYABLE_STATUS = frozenset({408, 409, 425, 429}) | frozenset(range(500, 600))


def public_url(url: str) -> str:
    """scheme://host[:port]/path: no user info, query or fragment (where keys sometimes hide)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """``Retry-After`` as seconds to wait: delta-seconds or an HTTP date (RFC 9110). None if absent
    or unreadable; a date in the past gives 0."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - (now or datetime.now(timezone.utc))).total_seconds())


_DATED_SNAPSHOT = re.compile(r"-\d{4}-\d{2}-\d{2}$")


def same_model(configured: str, reported: str) -> bool:
    """Whether an answer's ``model`` is the configured one: equal, or the configured name with
    Ollama's default tag (``gemma3`` -> ``gemma3:latest``), or an OpenAI dated snapshot of it
    (``gpt-4o`` -> ``gpt-4o-2024-08-06``; configure the dated name to pin it)."""
    if reported == configured or reported == f"{configured}:latest":
        return True
    return reported.startswith(f"{configured}-") and bool(_DATED_SNAPSHOT.fullmatch(reported[len(configured) :]))


def _message_text(content: Any) -> str | None:
    """``message.content``: a string, or a list of parts ({"type": "text", "text": ...})."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "".join(texts) if texts else None
    return None


def _is_loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


def _timed(exc: JudgeError, t0: float) -> JudgeError:
    exc.latency_s = time.perf_counter() - t0
    return exc


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class OpenAIJudge(Judge):
    backend = "openai"

    def __init__(self, name: str, endpoint: Endpoint, *, seed: int | None = None) -> None:
        super().__init__(name, endpoint)
        if not endpoint.base_url:
            raise ValueError(f"judge '{name}': backend 'openai' needs base_url")
        self.base_url = endpoint.base_url.rstrip("/")
        self._api_key: str | None = None
        self._key_problem: str | None = None
        if endpoint.api_key_env:
            key = os.environ.get(endpoint.api_key_env)
            if key:
                self._api_key = key
                register_secret(key)  # tasks.store.redact: errors, answers and every log record
                _register_router_secret(key)  # judges.base.redact: the router's rows
                install_log_redaction()
            else:
                self._key_problem = (
                    f"environment variable {endpoint.api_key_env} (api_key_env of judge '{name}') is not set"
                )
        self._seed = seed
        self._client: httpx.AsyncClient | None = None
        self._limit_scope: LimitScope | None = None
        self._limiter: EndpointLimiter | None = None

    @property
    def endpoint_label(self) -> str:
        return public_url(self.base_url)

    def unavailable_reason(self) -> str | None:
        return self._key_problem

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _ensure_client(self) -> httpx.AsyncClient:
        if self._client is None:
            n = self.endpoint.concurrency
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.endpoint.timeout_s),
                limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
                follow_redirects=False,
                # Proxy settings (HTTPS_PROXY, NO_PROXY, SSL_CERT_FILE) apply to remote endpoints,
                # never to a server on this machine.
                trust_env=not _is_loopback(self.base_url),
            )
        return self._client

    # --- the endpoint's limits (transport) -------------------------------------------------------
    def bind_limits(self, scope: LimitScope | None) -> None:
        """Share the endpoint's limits as ``scope`` says (default: this process)."""
        self._limit_scope = scope
        self._limiter = None

    @property
    def limiter(self) -> EndpointLimiter:
        if self._limiter is None:
            self._limiter = limiter_for(self.name, self.endpoint, self._limit_scope, self.endpoint_label)
        return self._limiter

    def slot(self):
        """``async with judge.slot():`` one of the endpoint's in-flight slots, for every caller of
        the endpoint in the run (read the image and send inside it)."""
        return self.limiter.slot()

    def _token_charge(self, payload: dict[str, Any]) -> int:
        asked = payload.get("max_completion_tokens") or payload.get("max_tokens") or self.endpoint.max_tokens
        return self.limiter.estimate_tokens(int(asked))

    def _after_response(self, resp: httpx.Response, charged: int) -> None:
        """What the answer tells the limiter: a 429/503 Retry-After pauses the endpoint; the
        usage settles the tokens charged."""
        if resp.status_code in (429, 503):
            retry_after = parse_retry_after(resp.headers.get("retry-after"))
            if retry_after:
                self.limiter.pause(retry_after)
            return
        if resp.status_code != 200 or not self.endpoint.tokens_per_minute:
            return
        try:
            usage = resp.json().get("usage")
        except (ValueError, AttributeError):
            return
        if isinstance(usage, dict):
            self.limiter.settle(charged, _int_or_none(usage.get("prompt_tokens")), _int_or_none(usage.get("completion_tokens")))

    def build_payload(self, request: JudgeRequest, data_url: str) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": data_url}},
                        {"type": "text", "text": request.template.render(request.prompt, request.question)},
                    ],
                }
            ],
            "temperature": 0,
            "max_tokens": self.endpoint.max_tokens,
        }
        seed = self.sampling().get("seed") if self._seed is None else self._seed
        if seed is not None:
            payload["seed"] = seed
        return payload

    async def _send(self, path: str, payload: dict[str, Any]) -> tuple[httpx.Response, float]:
        """POST within the endpoint's total deadline (the caller holds a slot: :meth:`slot`), once
        the endpoint's rates allow; transport failures become typed errors carrying the time spent."""
        client = self._ensure_client()
        timeout = self.endpoint.timeout_s
        charged = await self.limiter.before_send(self._token_charge(payload))
        t0 = time.perf_counter()
        try:
            resp = await asyncio.wait_for(
                client.post(f"{self.base_url}{path}", json=payload, headers=self._headers()), timeout
            )
        except (asyncio.TimeoutError, httpx.TimeoutException):
            raise _timed(JudgeUnavailable(f"judge '{self.name}' timed out after {timeout:g} s"), t0) from None
        except httpx.ConnectError as exc:
            raise _timed(
                JudgeUnavailable(
                    f"judge '{self.name}' at {self.endpoint_label}: cannot connect ({redact(str(exc)) or type(exc).__name__})",
                    judge_down=True,
                ),
                t0,
            ) from None
        except httpx.TransportError as exc:
            raise _timed(
                JudgeUnavailable(
                    f"judge '{self.name}' at {self.endpoint_label}: {type(exc).__name__} ({redact(str(exc))})"
                ),
                t0,
            ) from None
        latency = time.perf_counter() - t0
        self._after_response(resp, charged)
        return resp, latency

    def _check_status(self, resp: httpx.Response) -> None:
        status = resp.status_code
        if status == 200:
            return
        body = redact(resp.text[:200].strip()) or ""
        where = f"judge '{self.name}' at {self.endpoint_label}"
        if status in RETRYABLE_STATUS:
            retry_after = parse_retry_after(resp.headers.get("retry-after"))
            hint = f", Retry-After {retry_after:g} s" if retry_after is not None else ""
            raise JudgeUnavailable(f"{where}: HTTP {status}{hint}: {body}", retry_after_s=retry_after)
        if status in (401, 403):
            var = self.endpoint.api_key_env or "(no api_key_env configured)"
            raise JudgeUnavailable(
                f"{where}: HTTP {status}, authentication refused: check the key in {var}",
                retryable=False,
                judge_down=True,
            )
        if status == 404:
            raise JudgeUnavailable(
                f"{where}: HTTP 404 (wrong base_url, or model '{self.endpoint.model}' not served): {body}",
                retryable=False,
                judge_down=True,
            )
        raise JudgeInputError(f"{where}: HTTP {status}: {body}")

    def _read_completion(self, resp: httpx.Response) -> tuple[dict[str, Any], str]:
        try:
            data = resp.json()
        except ValueError:
            raise JudgeBadResponse(
                f"judge '{self.name}': malformed JSON in the response: {redact(resp.text[:120])!r}"
            ) from None
        if not isinstance(data, dict):
            raise JudgeBadResponse(f"judge '{self.name}': response is not a JSON object: {json_excerpt(data)}")
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise JudgeBadResponse(f"judge '{self.name}': response has no choices: {redact(json_excerpt(data))}")
        message = choices[0].get("message")
        text = _message_text(message.get("content")) if isinstance(message, dict) else None
        if text is None:
            raise JudgeBadResponse(
                f"judge '{self.name}': response has no message text: {redact(json_excerpt(choices[0]))}"
            )
        return data, text

    def _check_model(self, reported: Any) -> str | None:
        if reported is None:
            return None
        reported = str(reported)
        if not same_model(self.endpoint.model, reported):
            raise JudgeModelMismatch(
                f"judge '{self.name}' answers for another model: configured model '{self.endpoint.model}', "
                f"endpoint {self.endpoint_label} answered as '{redact(reported)}'"
            )
        return reported

    async def ask(self, request: JudgeRequest) -> JudgeAnswer:
        if self._key_problem:
            raise JudgeUnavailable(self._key_problem, retryable=False, judge_down=True)
        self._ensure_client()
        async with self.slot():  # the image is read inside the slot: at most `concurrency` payloads in memory
            image = await asyncio.to_thread(
                read_image, request.image_path, request.image_sha256, self.name, self.endpoint.max_image_side
            )
            data_url = f"data:{image.mime};base64,{base64.b64encode(image.data).decode('ascii')}"
            payload = self.build_payload(request, data_url)
            del image, data_url
            resp, latency = await self._send("/chat/completions", payload)
        try:
            self._check_status(resp)
            data, text = self._read_completion(resp)
            reported = self._check_model(data.get("model"))
        except JudgeError as exc:
            exc.latency_s = latency
            raise
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        return JudgeAnswer(
            raw_text=redact(text),  # a server (or a prompt-injected model) may echo the request
            reported_model=reported,
            latency_s=latency,
            prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
            completion_tokens=_int_or_none(usage.get("completion_tokens")),
        )

    # --- judges check ---------------------------------------------------------------------------
    async def probe(self) -> dict[str, Any]:
        """Which model answers: GET /models, else a 1-token text request. Never raises."""
        out: dict[str, Any] = {"reported_model": None, "ok": False, "detail": "", "latency_s": None}
        if self._key_problem:
            out["detail"] = self._key_problem
            return out
        client = self._ensure_client()
        t0 = time.perf_counter()
        try:
            resp = await asyncio.wait_for(
                client.get(f"{self.base_url}/models", headers=self._headers()), self.endpoint.timeout_s
            )
            out["latency_s"] = time.perf_counter() - t0
            if resp.status_code == 200:
                ids = [m.get("id") for m in (resp.json().get("data") or []) if isinstance(m, dict)]
                if self.endpoint.model in ids:
                    out.update(
                        reported_model=self.endpoint.model, ok=True, detail=f"served ({len(ids)} model(s) listed)"
                    )
                else:
                    shown = redact(", ".join(map(str, ids[:8])) + (" ..." if len(ids) > 8 else ""))
                    out["detail"] = (
                        f"answers for another model: '{self.endpoint.model}' is not served here; serves [{shown}]"
                    )
                    out["reported_model"] = redact(str(ids[0])) if len(ids) == 1 else None
                return out
            if resp.status_code in (401, 403):
                out["detail"] = (
                    f"HTTP {resp.status_code}: authentication refused (key from {self.endpoint.api_key_env})"
                )
                return out
        except (asyncio.TimeoutError, httpx.TimeoutException):
            out["detail"] = f"timed out after {self.endpoint.timeout_s:g} s"
            return out
        except httpx.TransportError as exc:
            out["detail"] = f"cannot connect: {redact(str(exc)) or type(exc).__name__}"
            return out
        except ValueError:
            pass  # /models answered something that is not a model list: try a completion
        payload = {
            "model": self.endpoint.model,
            "messages": [{"role": "user", "content": "Say OK."}],
            "max_tokens": 1,
            "temperature": 0,
        }
        try:
            async with self.slot():
                resp, latency = await self._send("/chat/completions", payload)
            out["latency_s"] = latency
            self._check_status(resp)
            data, _ = self._read_completion(resp)
            reported = data.get("model")
            out["reported_model"] = redact(str(reported)) if reported is not None else None
            self._check_model(reported)
            out.update(ok=True, detail="answered a 1-token request")
        except Exception as exc:  # JudgeError subclasses: report, never raise
            out["detail"] = redact(str(exc))
        return out

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
