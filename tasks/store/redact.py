"""Keep credentials out of everything imagebench writes: error texts, lake rows, run records, logs.

Two layers:

1. At the source. Code that holds a secret registers it (:func:`register_secret`; the S3 store
   registers the AWS credentials its boto3 session resolved, an HTTP judge its API key), and
   passes any text that came from elsewhere (an HTTP error body, a judge's answer, a library's
   exception message) through :func:`redact` before it becomes a message, a table cell or a log
   line.
2. Second line of defence: :func:`install_log_redaction` wraps logging's LogRecord factory, so
   every record of every library is rendered and scrubbed when it is created, before any handler
   (console, file, Prefect's API log handler, pytest's caplog) sees it. This is what keeps
   botocore's DEBUG request dumps (``Authorization: AWS4-HMAC-SHA256 Credential=<key id>/...``)
   out of captured logs.

:func:`redact` replaces with ``***``:

- every registered secret, its percent-encoded and JSON-escaped forms, and its base64 forms
  (standard and URL-safe, at every byte alignment, so also inside a longer base64 blob such as a
  Basic auth header or an echoed request);
- whatever follows ``Bearer`` (a token-looking word), the value of ``Authorization``-like headers
  (``Authorization``, ``Proxy-Authorization``, ``X-Api-Key``, ``Api-Key``,
  ``X-Amz-Security-Token``), AWS SigV4 ``Credential=<key id>/``, key/token/signature query
  parameters, ``aws_secret_access_key = ...`` style assignments and ``user:password@`` in URLs,
  whether or not the value was registered.

Cheap to import (stdlib only).
"""

from __future__ import annotations

import base64
import logging
import os
import re
import threading
from urllib.parse import quote

__all__ = [
    "MASK",
    "install_log_redaction",
    "redact",
    "register_aws_credentials",
    "register_env_secrets",
    "register_secret",
    "secret_forms",
]

MASK = "***"
MIN_SECRET_LEN = 4  # shorter values would mask ordinary text
MIN_ENCODED_LEN = 8  # base64 cores shorter than this are not distinctive

# Environment variables whose values are credentials wherever they show up.
_SECRET_ENV_RE = re.compile(
    r"^(AWS_ACCESS_KEY_ID|AWS_SECRET_ACCESS_KEY|AWS_SESSION_TOKEN|AWS_SECURITY_TOKEN|HF_TOKEN|"
    r"HUGGING_FACE_HUB_TOKEN|[A-Z0-9_]*_API_KEY|[A-Z0-9_]*_ACCESS_TOKEN|[A-Z0-9_]*_SECRET(_KEY)?|"
    r"[A-Z0-9_]*_PASSWORD)$"
)
_SECRET_ENV_MIN_LEN = 8

_TOKEN_CHARS = r"A-Za-z0-9._~+/=-"
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Header values, in any dump style: "Authorization: Bearer x", 'Authorization': b'AWS4-...',
    # {"authorization": "Basic x"}, x-api-key=x. The value runs to the end of the quoted string
    # or line (commas included: SigV4 values contain them).
    (
        re.compile(
            r"(?i)\b((?:proxy-)?authorization|x-api-key|api-key|x-goog-api-key|x-amz-security-token)"
            r"(\\?[\"']?\s*[:=]\s*(?:b(?=[\"']))?\\?[\"']?)([^\"'\r\n]+)"
        ),
        r"\1\2" + MASK,
    ),
    (re.compile(rf"(?i)\b(bearer)\s+(?=[{_TOKEN_CHARS}]*[0-9._~+/=-])[{_TOKEN_CHARS}]{{8,}}"), r"\1 " + MASK),
    (re.compile(r"(?i)\b(Credential=)[^/\s,\"'&]+"), r"\1" + MASK),
    (
        re.compile(
            r"(?i)([?&](?:api[_-]?key|key|access[_-]?token|token|x-amz-credential|x-amz-signature|"
            r"x-amz-security-token|signature)=)[^&\s\"'#]+"
        ),
        r"\1" + MASK,
    ),
    (
        re.compile(
            r"(?i)\b(aws_secret_access_key|aws_access_key_id|aws_session_token|secret_access_key|api_key)"
            r"([\"']?\s*[:=]\s*[\"']?)([^\s\"',}&]+)"
        ),
        r"\1\2" + MASK,
    ),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s:\"']+:[^/@\s\"']+@"), r"\1" + MASK + ":" + MASK + "@"),
)

_lock = threading.Lock()
_secrets: set[str] = set()
_forms: list[str] = []  # every form of every secret, longest first
_forms_re: re.Pattern[str] | None = None


def _b64_cores(data: bytes) -> set[str]:
    """Substrings that any base64 text containing ``data`` (at any byte alignment, followed by
    anything) must contain: encode after 0, 1 or 2 filler bytes, drop the first group when it
    mixes in filler and the last group (it depends on what follows)."""
    out: set[str] = set()
    for shift in (0, 1, 2):
        enc = base64.b64encode(b"\0" * shift + data).decode("ascii")
        core = enc[4 if shift else 0 : len(enc) - 4]
        if len(core) >= MIN_ENCODED_LEN:
            out.add(core)
            out.add(core.replace("+", "-").replace("/", "_"))
    return out


def secret_forms(secret: str) -> set[str]:
    """The texts under which ``secret`` can appear: itself, percent-encoded, JSON-escaped, and its
    base64 cores (found inside any base64 text that holds it: Basic auth, an echoed header)."""
    forms = {secret, quote(secret, safe=""), secret.replace("/", "\\/")}
    raw = secret.encode("utf-8")
    forms |= _b64_cores(raw)
    return {f for f in forms if len(f) >= MIN_SECRET_LEN}


def register_secret(value: str | None) -> None:
    """Remember a secret: :func:`redact` (and the log redaction) masks it from now on."""
    global _forms_re
    if not value or len(value) < MIN_SECRET_LEN:
        return
    with _lock:
        if value in _secrets:
            return
        _secrets.add(value)
        forms = set(_forms) | secret_forms(value)
        _forms[:] = sorted(forms, key=len, reverse=True)
        _forms_re = re.compile("|".join(re.escape(f) for f in _forms))


def register_env_secrets(environ: dict[str, str] | None = None) -> None:
    """Register the values of credential-named environment variables (AWS_*, HF_TOKEN,
    *_API_KEY, *_ACCESS_TOKEN, *_SECRET[_KEY], *_PASSWORD)."""
    env = os.environ if environ is None else environ
    for name, value in list(env.items()):
        if _SECRET_ENV_RE.match(name) and value and len(value) >= _SECRET_ENV_MIN_LEN:
            register_secret(value)


def register_aws_credentials(session: object | None = None) -> None:
    """Register the AWS credentials of the environment and, given a boto3/botocore session,
    those it resolved (profiles, credential files, SSO, instance roles)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        register_secret(os.environ.get(name))
    if session is None:
        return
    try:
        creds = session.get_credentials()  # type: ignore[attr-defined]
        frozen = creds.get_frozen_credentials() if creds is not None else None
    except Exception:  # no credentials, or a provider that failed: nothing to register
        return
    if frozen is not None:
        for value in (frozen.access_key, frozen.secret_key, frozen.token):
            register_secret(value)


def redact(text: str | None) -> str | None:
    """``text`` with every registered secret (and its encodings) and every credential-looking
    header, token, parameter or URL user info replaced by ``***``. ``None`` stays ``None``."""
    if not text:
        return text
    if not isinstance(text, str):
        text = str(text)
    pattern = _forms_re
    if pattern is not None:
        text = pattern.sub(MASK, text)
    for rx, repl in _PATTERNS:
        text = rx.sub(repl, text)
    return text


# --- logging -------------------------------------------------------------------------------------
_FACTORY_MARK = "_imagebench_redacting"


def _scrub_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a broken format string: leave it to logging's own error handling
        return
    clean = redact(message)
    if clean != message:
        record.msg, record.args = clean, None
    if record.exc_info and record.exc_info[0] is not None:
        try:
            rendered = logging.Formatter().formatException(record.exc_info)
        except Exception:
            rendered = None
        if rendered is not None:
            clean_exc = redact(rendered)
            record.exc_text = clean_exc
            if clean_exc != rendered:
                # Handlers that render exc_info themselves must not see the raw exception.
                record.exc_info = None
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


def install_log_redaction() -> None:
    """Scrub every log record at creation (idempotent; keeps any factory installed before).
    Also registers the credential-named environment variables (:func:`register_env_secrets`)."""
    register_env_secrets()
    with _lock:
        current = logging.getLogRecordFactory()
        if getattr(current, _FACTORY_MARK, False):
            return

        def factory(*args, **kwargs):  # type: ignore[no-untyped-def]
            record = current(*args, **kwargs)
            _scrub_record(record)
            return record

        setattr(factory, _FACTORY_MARK, True)
        logging.setLogRecordFactory(factory)
