"""What `vab run --prompt vab-official-v1` sends to an OpenAI-compatible endpoint: exactly what the
authors' eval.py sends through litellm and the openai client (docs/VAB.md, "What is sent"), whatever
the endpoint's own settings say (they are for imagebench's judges).

- **Images**: each decoded and re-encoded as RGB JPEG quality 85 (``data:image/jpeg;base64,...``),
  never resized and never refused for its size: alpha is dropped (not composited), a palette or
  grey image becomes RGB. The stored file must still be the one hashed at import (sha256).
- **Parameters** (litellm 1.81.14, eval.py's lock): ``max_tokens`` 8192 and the temperature, no seed.
  For the models litellm treats as reasoning models (OpenAI's o1/o3/o4 models it lists, and any
  name containing ``gpt-5`` but not ``gpt-5-chat``) ``max_completion_tokens`` 8192 instead, and the
  temperature only when it is 1 (gpt-5.1 and gpt-5.2 but not gpt-5.2-pro: any temperature), as
  litellm drops it (``drop_params``).
- **Retries**: one trial = up to 3 attempts, shared by answers that cannot be read and errors, 2 s
  and then 5 s apart (eval.py's ``call_api_with_parse``); each attempt is one request as the openai
  client sends it (litellm gives it 2 retries): HTTP 408, 409, 429 and 5xx, a timeout or a lost
  connection are sent again up to twice, after ``Retry-After`` when the server says 0-60 s, else
  0.5 s then 1 s (less up to a quarter, at random). The last attempt decides: an unreadable answer
  is state ``unparsable`` (its text kept), an error state ``error``.
- **The answer**: the model's full text is kept (``response``), as eval.py keeps ``model_response``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import random
from pathlib import Path
from typing import Any

OFFICIAL_MAX_TOKENS = 8192
ATTEMPT_SLEEPS_S = (2.0, 5.0)  # eval.py's RETRY_DELAYS before attempts 2 and 3
OFFICIAL_ATTEMPTS = len(ATTEMPT_SLEEPS_S) + 1
HTTP_TRIES = 3  # the openai client's first try and its 2 retries (litellm's default)
HTTP_BACKOFF_S, HTTP_BACKOFF_MAX_S, RETRY_AFTER_MAX_S = 0.5, 8.0, 60.0
JPEG_QUALITY = 85

# The o-series chat models of litellm's bundled model list (1.81.14): litellm maps their max_tokens
# to max_completion_tokens and drops a temperature other than 1. Another name starting with o1/o3/o4
# is an ordinary chat model to litellm.
LITELLM_O_SERIES = frozenset({
    "o1", "o1-2024-12-17", "o1-mini", "o1-mini-2024-09-12", "o1-preview", "o1-preview-2024-09-12", "o1-pro",
    "o1-pro-2025-03-19", "o3", "o3-2025-04-16", "o3-deep-research", "o3-deep-research-2025-06-26", "o3-mini",
    "o3-mini-2025-01-31", "o3-pro", "o3-pro-2025-06-10", "o4-mini", "o4-mini-2025-04-16", "o4-mini-deep-research",
    "o4-mini-deep-research-2025-06-26",
})


def request_params(model: str, temperature: float) -> dict[str, Any]:
    """The body's parameters besides ``model`` and ``messages``, as litellm builds them for
    ``acompletion(model="openai/<model>", max_tokens=8192, temperature=t)`` with drop_params."""
    name = model.split("/")[-1]
    o_series = name in LITELLM_O_SERIES
    gpt5 = not o_series and "gpt-5" in model and "gpt-5-chat" not in model
    if not (o_series or gpt5):
        return {"max_tokens": OFFICIAL_MAX_TOKENS, "temperature": temperature}
    any_temperature = gpt5 and (name.startswith("gpt-5.1") or (name.startswith("gpt-5.2") and "pro" not in name))
    params: dict[str, Any] = {"max_completion_tokens": OFFICIAL_MAX_TOKENS}
    if any_temperature or temperature == 1:
        params["temperature"] = temperature
    return params


def _refused(message: str) -> Exception:
    """An image of the trial is not the one imported, or unreadable: nothing is sent, nor asked again."""
    from tasks.judges.base import JudgeInputError

    exc = JudgeInputError(message)
    exc.image_refused = True  # type: ignore[attr-defined]
    return exc


def jpeg_data_url(path: str | Path, sha256: str | None) -> str:
    """eval.py's image: the decoded picture as RGB JPEG quality 85, as a data URL. Raises a
    JudgeInputError with ``image_refused`` set (nothing sent) when the file is not the one imported
    or cannot be decoded."""
    from PIL import Image, UnidentifiedImageError

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise _refused(f"image {path} cannot be read: {exc.strerror or exc}") from exc
    if sha256 and hashlib.sha256(data).hexdigest() != sha256:
        raise _refused(f"image {path} does not have the recorded sha256 {sha256[:12]}...: it changed since import")
    try:
        with Image.open(io.BytesIO(data)) as img:
            buf = io.BytesIO()
            img.convert("RGB").save(buf, format="JPEG", quality=JPEG_QUALITY)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise _refused(f"image {path} cannot be decoded: {exc}") from exc
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def http_retryable(status: int, headers: Any) -> bool:
    """Whether the openai client sends a request again after this answer."""
    hint = (headers.get("x-should-retry") or "").lower()
    if hint in ("true", "false"):
        return hint == "true"
    return status in (408, 409, 429) or status >= 500


def http_wait_s(retry: int, headers: Any = None, rng: random.Random | None = None) -> float:
    """The openai client's wait before its ``retry``-th retry (0-based): the server's Retry-After
    (ms or s, or a date) when it is in (0, 60] s, else 0.5 s * 2**retry, at most 8 s, less up to 25%."""
    from tasks.judges.openai_compat import parse_retry_after

    told = None
    if headers is not None:
        ms = headers.get("retry-after-ms")
        try:
            told = float(ms) / 1000 if ms is not None else None
        except ValueError:
            told = None
        if told is None:
            told = parse_retry_after(headers.get("retry-after"))
    if told is not None and 0 < told <= RETRY_AFTER_MAX_S:
        return told
    return min(HTTP_BACKOFF_S * 2.0 ** retry, HTTP_BACKOFF_MAX_S) * (1 - 0.25 * (rng or random).random())


def build_content(parts: list, item: Any) -> list[dict[str, Any]]:
    """The user message: text parts as they are, image slots as eval.py's JPEG data URLs."""
    content: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, str):
            content.append({"type": "text", "text": part})
        else:
            url = jpeg_data_url(item.image_paths[part], item.image_sha256[part])
            content.append({"type": "image_url", "image_url": {"url": url}})
    return content


async def one_attempt(judge: Any, item: Any, parts: list, temperature: float) -> str:
    """One of eval.py's attempts: the request, sent again by the HTTP client as the openai client
    does; the answer's text, or the JudgeError of the last try. ``judge`` is the VAB judge
    (tasks.vab.judges.VlmSetJudge); the endpoint's slot is held while the images are encoded and
    the request is out (with the client's own retries), not while it waits between attempts."""
    from tasks.judges.base import JudgeUnavailable
    from tasks.store.redact import redact

    j = judge.backend
    reason = j.unavailable_reason()
    if reason:
        raise JudgeUnavailable(reason, retryable=False, judge_down=True)
    j._ensure_client()
    async with j.slot():  # the endpoint's in-flight slot, shared by the whole run (tasks/judges/limits.py)
        if judge._down is not None:
            raise JudgeUnavailable(judge._down, retryable=False)
        content = await asyncio.to_thread(build_content, parts, item)
        payload = {"model": judge.endpoint.model, "messages": [{"role": "user", "content": content}],
                   **request_params(judge.endpoint.model, temperature)}
        for retry in range(HTTP_TRIES):
            try:
                resp, _latency = await j._send("/chat/completions", payload)
            except JudgeUnavailable as exc:  # a timeout or a lost connection: the client tries again
                if retry == HTTP_TRIES - 1 or not exc.retryable:
                    raise
                wait = http_wait_s(retry)
            else:
                if resp.status_code != 200 and http_retryable(resp.status_code, resp.headers) and retry < HTTP_TRIES - 1:
                    wait = http_wait_s(retry, resp.headers)
                else:
                    j._check_status(resp)
                    data, answer = j._read_completion(resp)
                    j._check_model(data.get("model"))
                    return redact(answer) or ""
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")  # the loop returns or raises


async def ask(judge: Any, item: Any, parts: list, temperature: float, parse) -> tuple:
    """eval.py's trial: up to 3 attempts shared by unreadable answers and errors, 2 s then 5 s
    apart. Returns ``(best, worst, state, detail, response)``; the last attempt decides the state."""
    from tasks.judges.base import JudgeError

    failure: str | None = None
    response: str | None = None
    last_why = ""
    for attempt in range(OFFICIAL_ATTEMPTS):
        try:
            text = await one_attempt(judge, item, parts, temperature)
        except JudgeError as exc:
            if getattr(exc, "image_refused", False):
                return None, None, "error", f"{type(exc).__name__}: {exc}", response
            if getattr(exc, "judge_down", False) and not exc.retryable:
                judge._down = str(exc)  # auth refused, no such model, no key: no trial will do better
                return None, None, "error", f"{type(exc).__name__}: {exc}", response
            failure, text = f"{type(exc).__name__}: {exc}", None
        if text is not None:
            response = text
            best, worst, why = parse(text)
            if why is None:
                return best, worst, "ok", None, text
            failure = None
            last_why = why
        if attempt < OFFICIAL_ATTEMPTS - 1:
            await asyncio.sleep(ATTEMPT_SLEEPS_S[attempt])
    if failure is not None:
        return None, None, "error", failure, response
    return None, None, "unparsable", f"{last_why}; answer ended: {(response or '').strip()[-200:]!r}", response
