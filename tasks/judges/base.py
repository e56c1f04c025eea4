"""What every judge backend shares: the request/answer types, the typed errors, the base class,
image checks, and the redaction of secrets.

A backend makes ONE attempt per :meth:`Judge.ask`; the retry/backoff/fallback policy lives in the
router (``tasks/judges/router.py``), so that every attempt becomes one ``judge_calls`` row and a
backoff sleep never holds an endpoint's concurrency slot.
"""

from __future__ import annotations

import abc
import hashlib
import io
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from schemas.judges import Endpoint

from .protocol import SAMPLING_SEED, Template, canonical_json, load_template


# --- errors ------------------------------------------------------------------------------------
class JudgeError(Exception):
    """One attempt failed. ``retryable``: the same request may succeed if sent again later."""

    retryable: bool = False
    latency_s: float | None = None  # time the failed attempt took, when the backend measured it

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable


class JudgeUnavailable(JudgeError):
    """The judge could not be reached or refused to serve: connection refused, timeout, HTTP
    429/5xx (retryable, ``retry_after_s`` from the server when it sent one), HTTP 401/403/404, a
    missing API key (not retryable). ``judge_down``: the judge itself is absent or misconfigured
    (not a per-request hiccup), so the router stops sending it work for the rest of the run."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = True,
        retry_after_s: float | None = None,
        judge_down: bool = False,
    ) -> None:
        super().__init__(message, retryable=retryable)
        self.retry_after_s = retry_after_s
        self.judge_down = judge_down


class JudgeBadResponse(JudgeError):
    """The judge answered, but not with a usable chat completion (malformed JSON, no choices,
    no message text). Retried a bounded number of times."""

    retryable = True


class JudgeModelMismatch(JudgeError):
    """The endpoint answered for another model than the one configured (never retried; the judge
    is taken out of the run: every answer it gives would be attributed to the wrong model)."""


class JudgeInputError(JudgeError):
    """This item cannot be judged by this judge (image too large, image missing or changed, no
    exact text for OCR, HTTP 400 from the server). Not retried; the fallback judge may still
    judge it."""


class JudgesConfigError(ValueError):
    """A routing or endpoints file is invalid; the message names the file and the bad entry."""


# --- request / answer ----------------------------------------------------------------------------
@dataclass(frozen=True)
class JudgeRequest:
    """One question to one judge about one image."""

    model_id: str
    prompt_id: str
    image_path: Path
    image_sha256: str
    prompt: str  # the generation prompt the image answers
    question: str  # the prompt's binary question
    template: Template  # the judge prompt template (text, name, sha256)


@dataclass(frozen=True)
class JudgeAnswer:
    """What one successful attempt returned. ``raw_text`` is parsed by the router."""

    raw_text: str
    reported_model: str | None  # what the endpoint said answered (None if it did not say)
    latency_s: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(frozen=True)
class JudgeIdentity:
    """What a judge's verdict depends on, besides the image, prompt and question."""

    judge: str  # judge name (endpoints config key, "ocr", or "<vlm>+ocr" for OCR evidence)
    judge_model: str
    endpoint: str | None  # host/URL or "local": never a key
    template: str
    template_sha256: str
    sampling: str  # canonical JSON


# --- secrets -------------------------------------------------------------------------------------
_SECRETS: set[str] = set()
_SECRETS_LOCK = threading.Lock()


def register_secret(value: str | None) -> None:
    """Remember a secret so :func:`redact` removes it from any text that reaches a table or a log."""
    if value and len(value) >= 4:
        with _SECRETS_LOCK:
            _SECRETS.add(value)


def redact(text: str | None) -> str | None:
    if text is None or not _SECRETS:
        return text
    with _SECRETS_LOCK:
        secrets = sorted(_SECRETS, key=len, reverse=True)
    for s in secrets:
        if s in text:
            text = text.replace(s, "***")
    return text


# --- images --------------------------------------------------------------------------------------
_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


@dataclass(frozen=True)
class ImagePayload:
    data: bytes  # bytes to send (the original file, or a PNG re-encode for other formats)
    mime: str
    width: int
    height: int


def read_image(path: Path, sha256: str | None, judge: str, max_side: int) -> ImagePayload:
    """Read the image, check it is the one recorded at ingest and fits the judge's limit.
    Raises JudgeInputError (nothing is sent) when it does not."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise JudgeInputError(f"image {path} cannot be read: {exc.strerror or exc}") from exc
    if sha256 and hashlib.sha256(data).hexdigest() != sha256:
        raise JudgeInputError(
            f"image {path} does not have the recorded sha256 {sha256[:12]}...: it changed since ingest"
        )
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height, fmt = img.width, img.height, img.format
            if fmt not in _MIME or fmt == "GIF":
                buf = io.BytesIO()
                img.convert("RGB").save(buf, format="PNG")
                data, fmt = buf.getvalue(), "PNG"
    except (UnidentifiedImageError, OSError) as exc:
        raise JudgeInputError(f"image {path} cannot be decoded: {exc}") from exc
    check_image_side(path, width, height, judge, max_side)
    return ImagePayload(data=data, mime=_MIME[fmt], width=width, height=height)


def check_image_side(path: Path | str, width: int, height: int, judge: str, max_side: int) -> None:
    if max(width, height) > max_side:
        raise JudgeInputError(
            f"image {path} is {width}x{height}: its longer side {max(width, height)} px exceeds judge "
            f"'{judge}' max_image_side {max_side} px (no request sent)"
        )


# --- base class ----------------------------------------------------------------------------------
class Judge(abc.ABC):
    """One configured judge. Subclasses implement :meth:`ask` (one attempt) and may override
    :meth:`identity_for`, :meth:`unavailable_reason`, :meth:`aclose`."""

    backend: ClassVar[str]

    def __init__(self, name: str, endpoint: Endpoint) -> None:
        self.name = name
        self.endpoint = endpoint

    # identity ------------------------------------------------------------------------------
    @property
    def judge_model(self) -> str:
        return self.endpoint.model

    @property
    def endpoint_label(self) -> str | None:
        return "local"

    def sampling(self) -> dict[str, Any]:
        """Greedy decoding: temperature 0, a fixed seed, the endpoint's max_tokens."""
        return {"max_tokens": self.endpoint.max_tokens, "seed": SAMPLING_SEED, "temperature": 0.0}

    def template_for(self, route_template: str) -> Template:
        return load_template(route_template)

    def identity_for(self, route_template: str) -> JudgeIdentity:
        t = self.template_for(route_template)
        return JudgeIdentity(
            judge=self.name,
            judge_model=self.judge_model,
            endpoint=self.endpoint_label,
            template=t.name,
            template_sha256=t.sha256,
            sampling=canonical_json(self.sampling()),
        )

    # availability --------------------------------------------------------------------------
    def unavailable_reason(self) -> str | None:
        """Why this judge cannot run at all in this process (None: it can)."""
        return None

    def bind_limits(self, scope: Any) -> None:
        """Share the endpoint's limits as ``scope`` (a tasks.judges.limits.LimitScope) says; a
        backend without a remote endpoint has nothing to share."""
        return None

    # work ------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def ask(self, request: JudgeRequest) -> JudgeAnswer:
        """One attempt. Raises JudgeUnavailable / JudgeBadResponse / JudgeModelMismatch /
        JudgeInputError."""

    async def aclose(self) -> None:
        return None

    def __repr__(self) -> str:  # never shows a key: endpoints hold only the variable's name
        return (
            f"{type(self).__name__}(name={self.name!r}, model={self.judge_model!r}, endpoint={self.endpoint_label!r})"
        )


def json_excerpt(obj: Any, limit: int = 200) -> str:
    try:
        s = json.dumps(obj, ensure_ascii=False)
    except (TypeError, ValueError):
        s = repr(obj)
    return s if len(s) <= limit else s[: limit - 3] + "..."
