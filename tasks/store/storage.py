"""Object store access: a local directory (embedded default) or any S3 API through boto3.

Layout inside a store (see docs/STORAGE.md): one place per protocol (issue 26 item 2)::

    models/<model_id>/<prompt_id>.<png|jpg|jpeg|webp>          ImageBench: what the nightly scores
    beauty/<suite_version>/<tool>/<prompt_id>.<ext>            the Beauty Index: what `study open` reads
    studies/<study_id>/memos/<memo_id>.<ext>                   the Beauty Index panel's voice memos

Listing and key functions take the folder that holds one sub-folder per model or tool (``root``:
``models/`` by default, :func:`beauty_root` for a Beauty suite).

A store is opened from one URI: ``s3://bucket/prefix``, ``file:///dir`` or a plain directory
(:func:`open_store`). Keys passed to and returned by a store are relative to its root/prefix and
always use ``/``. Every failure surfaces as :class:`StoreError` naming the endpoint, bucket or key
and the cause, never the credentials.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from schemas.suite import PROMPT_ID_RE
from tasks.store.durable import atomic_write

log = logging.getLogger(__name__)

MODELS_PREFIX = "models/"  # ImageBench models: models/<model_id>/<prompt_id>.<ext>
BEAUTY_PREFIX = "beauty/"  # Beauty Index tools: beauty/<suite_version>/<tool>/<prompt_id>.<ext>
IMAGE_EXTENSIONS = ("png", "jpg", "jpeg", "webp")
MODEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_KEY_LENGTH = 1024

# boto3 client settings: an unreachable endpoint must fail in seconds, not minutes.
S3_CONNECT_TIMEOUT_S = 3.0
S3_READ_TIMEOUT_S = 30.0
# Passed as retries={"mode": "standard", "max_attempts": 5}; botocore reads a config's
# `max_attempts` as the number of retries, so a failing call is tried 6 times in all, with jittered
# exponential backoff (a refused connection gives up in about 1 s, a black-holed endpoint in about
# 6 x connect timeout).
S3_MAX_ATTEMPTS = 5
S3_MAX_POOL_CONNECTIONS = 32  # >= the ingest thread pool
# botocore retries a GetObject whose *response head* fails (503 SlowDown, reset, timeout), but not
# one whose body breaks off while it is read (connection reset or timeout mid-body): read() then
# repeats the whole GET, at most this many times in all.
S3_READ_BODY_ATTEMPTS = 3


class StoreError(RuntimeError):
    """The object store could not be reached or refused an operation (message names where/why)."""


class InvalidModelId(ValueError):
    """A model id that is not a single safe path segment."""


class InvalidKey(ValueError):
    """An object key that does not follow ``models/<model_id>/<prompt_id>.<ext>``."""


# --------------------------------------------------------------------------------------------
# Names and keys


def validate_model_id(model_id: object) -> str:
    """Return ``model_id`` unchanged if it is a safe model id, else raise :class:`InvalidModelId`.

    Allowed: ``^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`` (ASCII only) and no ``..`` anywhere, so an id is
    always one harmless path segment and one S3 "folder" name.
    """
    if not isinstance(model_id, str):
        raise InvalidModelId(f"invalid model id {model_id!r}: must be a string")
    if not MODEL_ID_RE.fullmatch(model_id) or ".." in model_id:
        raise InvalidModelId(
            f"invalid model id {model_id!r}: must be 1-128 ASCII letters, digits, '.', '_' or '-', "
            "start with a letter or digit, and contain no '..', slashes or other path tricks"
        )
    return model_id


def beauty_root(suite_version: str) -> str:
    """The folder of a Beauty Index suite's tools: ``beauty/<suite_version>/`` (one folder per tool,
    one image per prompt of that suite in it). Its own place, never under ``models/``: the nightly
    scores every folder there as an ImageBench model."""
    return check_root(f"{BEAUTY_PREFIX}{suite_version}/")


def check_root(root: object) -> str:
    """A folder of the store that holds one folder per model or tool (``models/``,
    ``beauty/beauty-index-v1/``): a safe relative key ending in ``/``. Raises :class:`InvalidKey`."""
    if not isinstance(root, str) or not root.endswith("/"):
        raise InvalidKey(f"invalid store folder {root!r}: must be a relative key ending in '/'")
    check_key(root[:-1])
    return root


def is_model_id(name: object) -> bool:
    """True when ``name`` passes :func:`validate_model_id` (for filtering; no error message)."""
    return isinstance(name, str) and bool(MODEL_ID_RE.fullmatch(name)) and ".." not in name


def parse_image_key(key: str, root: str = MODELS_PREFIX) -> tuple[str, str, str]:
    """``<root><model_id>/<prompt_id>.<ext>`` -> ``(model_id, prompt_id, ext)``; ``ext`` lower-cased
    (``root``: ``models/``, or a Beauty suite's :func:`beauty_root`).

    Raises :class:`InvalidKey` (naming the key and the rule it breaks) for anything else: another
    top-level folder, a sub-folder, a bad model or prompt id, an extension other than
    png/jpg/jpeg/webp (case-insensitive).
    """
    if not isinstance(key, str) or not key.startswith(root):
        raise InvalidKey(f"object key {key!r} is not under {root}")
    parts = key[len(root) :].split("/")
    if len(parts) != 2:
        raise InvalidKey(
            f"object key {key!r} must be {root}<model_id>/<prompt_id>.<ext>: "
            "sub-folders are not allowed"
        )
    model_part, name = parts
    try:
        validate_model_id(model_part)
    except InvalidModelId as exc:
        raise InvalidKey(f"object key {key!r}: {exc}") from exc
    stem, dot, ext = name.rpartition(".")
    if not dot or ext.lower() not in IMAGE_EXTENSIONS:
        raise InvalidKey(
            f"object key {key!r}: file extension must be one of "
            f"{', '.join('.' + e for e in IMAGE_EXTENSIONS)}"
        )
    if not PROMPT_ID_RE.fullmatch(stem):
        raise InvalidKey(f"object key {key!r}: prompt id {stem!r} must match {PROMPT_ID_RE.pattern}")
    return model_part, stem, ext.lower()


def prompt_id_of_key(key: str, root: str = MODELS_PREFIX) -> str | None:
    """The prompt id a key names (``<root><valid id>/<valid prompt>.<any ext>``), else None.

    Lets a badly named object (e.g. ``p.bmp``) still be attributed to its prompt in reports.
    """
    if not key.startswith(root):
        return None
    parts = key[len(root) :].split("/")
    if len(parts) != 2 or not MODEL_ID_RE.fullmatch(parts[0]) or ".." in parts[0]:
        return None
    stem = parts[1].rpartition(".")[0] or parts[1]
    return stem if PROMPT_ID_RE.fullmatch(stem) else None


def check_key(key: object) -> str:
    """A safe relative object key: '/'-separated, no empty, '.' or '..' segments, no backslash or
    NUL, not absolute, at most 1024 characters. Raises :class:`InvalidKey`."""
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"invalid object key {key!r}: must be a non-empty string")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"invalid object key {key[:60]!r}...: longer than {MAX_KEY_LENGTH} characters")
    if "\\" in key or "\x00" in key or key.startswith("/"):
        raise InvalidKey(f"invalid object key {key!r}: no backslashes, NUL bytes or leading '/'")
    if any(seg in ("", ".", "..") for seg in key.split("/")):
        raise InvalidKey(f"invalid object key {key!r}: empty, '.' or '..' path segment")
    return key


def model_prefix(model_id: str, root: str = MODELS_PREFIX) -> str:
    return f"{check_root(root)}{validate_model_id(model_id)}/"


# --------------------------------------------------------------------------------------------
# The interface


@dataclass(frozen=True)
class StoredObject:
    uri: str  # full location: s3://bucket/prefix/models/m1/p.png or file:///dir/models/m1/p.png
    key: str  # relative to the store root/prefix: models/m1/p.png
    size: int
    etag: str  # changes when the object changes (S3 ETag; local: f"{size}-{mtime_ns}")


def listing_fingerprint(objects: Iterable[StoredObject]) -> str:
    """sha256 over the sorted ``key\\tsize\\tetag`` lines: tells cheaply whether a listing changed."""
    lines = sorted(f"{o.key}\t{o.size}\t{o.etag}" for o in objects)
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


class ObjectStore(ABC):
    """What ingest and the flows need from an object store. Keys are relative to the store root."""

    @property
    @abstractmethod
    def uri(self) -> str:
        """Where the store is: ``s3://bucket/prefix`` or ``file:///dir``."""

    @abstractmethod
    def list_models(self, root: str = MODELS_PREFIX) -> list[str]:
        """Names of the folders directly under ``root`` (``models/``, or a Beauty suite's
        ``beauty/<suite>/``), sorted, invalid ones included so callers reject them loudly."""

    @abstractmethod
    def list_model_objects(self, model_id: str, root: str = MODELS_PREFIX) -> list[StoredObject]:
        """Every object under ``<root><model_id>/`` (sorted by key), sub-folders and odd names
        included. A model with no objects gives ``[]``. Raises InvalidModelId first."""

    @abstractmethod
    def read(self, obj: StoredObject) -> bytes:
        """The object's bytes. Raises StoreError naming the object when it cannot be read."""

    @abstractmethod
    def write(self, key: str, data: bytes) -> StoredObject:
        """Write ``data`` at ``key`` (relative), replacing any object there."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


# --------------------------------------------------------------------------------------------
# Local directory


class LocalStore(ObjectStore):
    """A plain directory. Never follows a symlink that leads out of the root.

    A root that does not exist yet is an empty store (listing gives ``[]``; ``write`` creates it).
    """

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).expanduser().absolute()

    @property
    def uri(self) -> str:
        return self.root.as_uri()

    # -- helpers
    def _real_root(self) -> Path:
        return self.root.resolve()

    def _inside(self, path: Path) -> bool:
        try:
            return path.resolve().is_relative_to(self._real_root())
        except (OSError, RuntimeError):  # symlink loop
            return False

    def _path(self, key: str) -> Path:
        try:
            check_key(key)
        except InvalidKey as exc:
            raise StoreError(f"{self.uri}: {exc}") from exc
        return self.root.joinpath(*key.split("/"))

    def _object(self, key: str, path: Path) -> StoredObject:
        st = path.stat()
        return StoredObject(uri=path.as_uri(), key=key, size=st.st_size, etag=f"{st.st_size}-{st.st_mtime_ns}")

    def _check_root(self) -> bool:
        if not self.root.exists():
            log.warning("local object store %s does not exist: treating it as empty", self.root)
            return False
        if not self.root.is_dir():
            raise StoreError(f"local object store {self.root} is not a directory")
        return True

    # -- interface
    def list_models(self, root: str = MODELS_PREFIX) -> list[str]:
        folder = check_root(root)
        if not self._check_root():
            return []
        models_dir = self.root.joinpath(*folder.rstrip("/").split("/"))
        if not models_dir.is_dir() or not self._inside(models_dir):
            return []
        try:
            with os.scandir(models_dir) as it:
                return sorted(
                    e.name for e in it if e.is_dir(follow_symlinks=True) and self._inside(Path(e.path))
                )
        except OSError as exc:
            raise StoreError(f"cannot list {models_dir}: {exc}") from exc

    def list_model_objects(self, model_id: str, root: str = MODELS_PREFIX) -> list[StoredObject]:
        prefix = model_prefix(model_id, root)
        if not self._check_root():
            return []
        top = self.root.joinpath(*prefix.rstrip("/").split("/"))
        if not top.is_dir():
            return []
        if not self._inside(top):
            log.warning("skipping %s: symlink leads out of the store root %s", top, self.root)
            return []
        out: list[StoredObject] = []
        try:
            for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
                d = Path(dirpath)
                # Descend into symlinked directories only when they stay inside the root.
                for name in list(dirnames):
                    p = d / name
                    if p.is_symlink():
                        dirnames.remove(name)
                        if self._inside(p):
                            out.extend(self._walk_linked(p))
                        else:
                            log.warning("skipping %s: symlink leads out of the store root", p)
                for name in filenames:
                    p = d / name
                    if p.is_symlink() and not self._inside(p):
                        log.warning("skipping %s: symlink leads out of the store root", p)
                        continue
                    if not p.is_file():
                        continue
                    out.append(self._object(p.relative_to(self.root).as_posix(), p))
        except OSError as exc:
            raise StoreError(f"cannot list {top}: {exc}") from exc
        return sorted(out, key=lambda o: o.key)

    def _walk_linked(self, linked_dir: Path) -> Iterator[StoredObject]:
        # Keys keep the symlink's own path (the name under <root><id>/), not its target's.
        for dirpath, _dirnames, filenames in os.walk(linked_dir, followlinks=False):
            for name in filenames:
                p = Path(dirpath) / name
                if p.is_file() and self._inside(p):
                    yield self._object(p.relative_to(self.root).as_posix(), p)

    def read(self, obj: StoredObject) -> bytes:
        path = self._path(obj.key)
        if not self._inside(path):
            raise StoreError(f"refusing to read {obj.key!r}: it resolves outside the store root {self.root}")
        try:
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise StoreError(f"object {obj.key!r} not found in local store {self.root}") from exc
        except OSError as exc:
            raise StoreError(f"cannot read {obj.key!r} from local store {self.root}: {exc}") from exc

    def write(self, key: str, data: bytes) -> StoredObject:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not self._inside(path.parent):
                raise StoreError(f"refusing to write {key!r}: it resolves outside the store root {self.root}")
            atomic_write(path, data)
            return self._object(key, path)
        except StoreError:
            raise
        except OSError as exc:
            raise StoreError(f"cannot write {key!r} to local store {self.root}: {exc}") from exc


# --------------------------------------------------------------------------------------------
# S3 (AWS, SeaweedFS, MinIO, R2, ...)

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_DENIED = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "AllAccessDisabled",
    "403",
}


class S3Store(ObjectStore):
    """Objects in ``s3://bucket/prefix`` through boto3.

    Credentials come from the standard AWS chain (env vars, shared files, SSO, instance roles);
    they are never logged. ``endpoint_url`` points at a non-AWS server (``IMAGEBENCH_S3_ENDPOINT``),
    which is then addressed path-style. Listings are paginated (``page_size`` keys per request).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        *,
        page_size: int = 1000,
        connect_timeout: float = S3_CONNECT_TIMEOUT_S,
        read_timeout: float = S3_READ_TIMEOUT_S,
        max_attempts: int = S3_MAX_ATTEMPTS,
    ):
        import boto3
        from botocore.config import Config

        if not _BUCKET_RE.fullmatch(bucket or "") or ".." in bucket:
            raise StoreError(f"invalid S3 bucket name {bucket!r}")
        prefix = (prefix or "").strip("/")
        if prefix:
            try:
                check_key(prefix)
            except InvalidKey as exc:
                raise StoreError(f"invalid S3 prefix for bucket {bucket!r}: {exc}") from exc
        if not 1 <= page_size <= 1000:
            raise ValueError(f"page_size must be within 1..1000, got {page_size}")
        self.bucket = bucket
        self.prefix = f"{prefix}/" if prefix else ""
        self.endpoint_url = endpoint_url or None
        self.region = region or None
        self.page_size = page_size
        self.max_attempts_per_call = max_attempts + 1  # botocore: max_attempts retries
        self.config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"mode": "standard", "max_attempts": max_attempts},
            max_pool_connections=S3_MAX_POOL_CONNECTIONS,
            s3={"addressing_style": "path"} if self.endpoint_url else {},
        )
        try:
            # A session per store: boto3's default session is not thread-safe to create clients
            # from; the client itself is thread-safe and shared by the ingest thread pool.
            session = boto3.session.Session()
            self._client = session.client(
                "s3", endpoint_url=self.endpoint_url, region_name=self.region, config=self.config
            )
        except Exception as exc:  # bad endpoint URL, unknown region format, ...
            raise StoreError(f"cannot set up S3 client for {self._where()}: {_describe(exc)}") from exc
        # Survived faults, for logs and tests: retried_calls, failed_attempts, body_retries.
        self.retry_counts: Counter[str] = Counter()
        self._stats_lock = threading.Lock()
        self._calls = threading.local()  # per thread: attempts and failure causes of the last call
        self._install_attempt_hooks()
        # The resolved keys are masked in every message and log record from now on (botocore's
        # DEBUG request dumps carry the access key id): tasks/store/redact.py.
        from tasks.store.redact import install_log_redaction, register_aws_credentials

        register_aws_credentials(session)
        install_log_redaction()

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/") if self.prefix else f"s3://{self.bucket}"

    def _where(self) -> str:
        return f"s3://{self.bucket}/{self.prefix} at endpoint {_redact(self.endpoint_url) if self.endpoint_url else 'AWS default'}"

    def _obj_uri(self, full_key: str) -> str:
        return f"s3://{self.bucket}/{full_key}"

    def _install_attempt_hooks(self) -> None:
        """Count the HTTP attempts of each API call (per thread) and why the failed ones failed,
        so a survived fault is logged and a given-up one says how often it was tried."""
        tl = self._calls
        counts = self.retry_counts
        lock = self._stats_lock
        endpoint = _redact(self.endpoint_url) if self.endpoint_url else "AWS default"  # no user:pass@ in errors

        def before_call(model=None, params=None, **_):
            tl.attempts, tl.causes = 0, []
            tl.op = getattr(model, "name", "?")
            tl.path = (params or {}).get("url_path", "") if isinstance(params, dict) else ""

        def before_send(**_):
            tl.attempts = getattr(tl, "attempts", 0) + 1

        def needs_retry(response=None, caught_exception=None, **_):
            if caught_exception is not None:
                cause = type(caught_exception).__name__
            elif response is not None and response[0] is not None and response[0].status_code >= 300:
                code = ((response[1] or {}).get("Error") or {}).get("Code") or ""
                cause = f"{response[0].status_code} {code}".strip()
            else:
                return None
            if not hasattr(tl, "causes"):
                tl.causes = []
            tl.causes.append(cause)
            return None  # never decides anything: botocore's retry handler does

        def after_call(http_response=None, **_):
            n = getattr(tl, "attempts", 0)
            if n > 1 and http_response is not None and http_response.status_code < 300:
                with lock:
                    counts["retried_calls"] += 1
                    counts["failed_attempts"] += n - 1
                log.warning(
                    "S3 %s %s at endpoint %s succeeded after %d attempts (%s)",
                    tl.op, tl.path, endpoint, n, _summarise(tl.causes),
                )

        events = self._client.meta.events
        events.register("before-call.s3", before_call)
        events.register("before-send.s3", before_send)
        events.register_first("needs-retry.s3", needs_retry)
        events.register("after-call.s3", after_call)

    def _attempts(self) -> tuple[int, list[str]]:
        """HTTP attempts and failure causes of this thread's latest API call."""
        return getattr(self._calls, "attempts", 0), list(getattr(self._calls, "causes", []))

    @contextmanager
    def _errors(self, action: str, key: str | None = None, history: _History | None = None) -> Iterator[None]:
        """Translate boto3/botocore failures into StoreError naming endpoint, bucket and key, and
        for transient failures (or any failure after retries) how many attempts were made.

        ``history``: attempts of earlier tries of the same operation (read() repeats a GET).
        """
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionClosedError,
            ConnectTimeoutError,
            EndpointConnectionError,
            IncompleteReadError,
            NoCredentialsError,
            PartialCredentialsError,
            ReadTimeoutError,
            ResponseStreamingError,
        )

        endpoint = _redact(self.endpoint_url) if self.endpoint_url else "AWS default"  # no user:pass@ in errors
        target = self._obj_uri(key) if key is not None else f"s3://{self.bucket}/{self.prefix}"

        def tries(transient: bool) -> str:
            last, causes = self._attempts()
            total = last
            if history is not None:
                total, causes = last + history.attempts, history.causes + causes
            if total < 1 or (total == 1 and not transient):
                return ""
            text = f" (gave up after {total} attempt{'s' if total != 1 else ''}: {_summarise(causes)}"
            if transient and last < self.max_attempts_per_call and not (history and history.body_failed):
                # botocore's standard mode stops retrying once the client's retry quota is spent
                # (sustained failures across threads), before the per-call limit.
                text += f"; retry quota spent before the limit of {self.max_attempts_per_call} attempts per call"
            return text + ")"

        try:
            yield
        except (EndpointConnectionError, ConnectTimeoutError, ConnectionClosedError) as exc:
            raise StoreError(
                f"cannot reach S3 endpoint {endpoint}: {action} {target}: {_describe(exc)}{tries(True)}"
            ) from exc
        except ReadTimeoutError as exc:
            raise StoreError(
                f"S3 endpoint {endpoint} timed out: {action} {target}: {_describe(exc)}{tries(True)}"
            ) from exc
        except (ResponseStreamingError, IncompleteReadError) as exc:
            raise StoreError(
                f"S3 endpoint {endpoint} broke off the response: {action} {target}: {_describe(exc)}{tries(True)}"
            ) from exc
        except (NoCredentialsError, PartialCredentialsError) as exc:
            raise StoreError(
                f"no usable AWS credentials for {action} {target} at endpoint {endpoint}: {_describe(exc)} "
                "(set them in the standard AWS chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                "AWS_PROFILE, ~/.aws/credentials or an instance role)"
            ) from exc
        except ClientError as exc:
            err = exc.response.get("Error", {}) if isinstance(exc.response, dict) else {}
            code = str(err.get("Code", "Unknown"))
            message = str(err.get("Message", "")).strip()
            detail = f"{code}: {message}" if message else code
            meta = exc.response.get("ResponseMetadata", {}) if isinstance(exc.response, dict) else {}
            status = int(meta.get("HTTPStatusCode") or 0)
            transient = status >= 500 or status == 429 or code in _THROTTLED
            if code in ("NoSuchBucket",):
                raise StoreError(
                    f"S3 bucket {self.bucket!r} does not exist at endpoint {endpoint} ({action} {target})"
                ) from exc
            if code in ("NoSuchKey", "404", "NotFound"):
                raise StoreError(f"S3 object {target} not found at endpoint {endpoint} ({action}): {detail}") from exc
            if code in _DENIED:
                raise StoreError(
                    f"access denied to {target} at endpoint {endpoint} ({action}): {detail}; "
                    "check the credentials of the AWS chain and the bucket policy"
                ) from exc
            raise StoreError(
                f"S3 error on {action} {target} at endpoint {endpoint}: {detail}{tries(transient)}"
            ) from exc
        except BotoCoreError as exc:
            raise StoreError(
                f"S3 failure on {action} {target} at endpoint {endpoint}: {_describe(exc)}{tries(False)}"
            ) from exc

    def _paginate(self, action: str, prefix: str, delimiter: str | None = None) -> Iterator[dict]:
        kwargs = {"Bucket": self.bucket, "Prefix": prefix, "PaginationConfig": {"PageSize": self.page_size}}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        with self._errors(action):
            for page in self._client.get_paginator("list_objects_v2").paginate(**kwargs):
                yield page

    def list_models(self, root: str = MODELS_PREFIX) -> list[str]:
        base = self.prefix + check_root(root)
        names = set()
        for page in self._paginate("list models in", base, delimiter="/"):
            for cp in page.get("CommonPrefixes", []) or []:
                name = cp["Prefix"][len(base) :].rstrip("/")
                if name:
                    names.add(name)
        return sorted(names)

    def list_model_objects(self, model_id: str, root: str = MODELS_PREFIX) -> list[StoredObject]:
        base = self.prefix + model_prefix(model_id, root)
        out: list[StoredObject] = []
        for page in self._paginate(f"list objects of model {model_id!r} in", base):
            for item in page.get("Contents", []) or []:
                full_key = item["Key"]
                if full_key.endswith("/"):  # folder marker objects some tools create
                    continue
                out.append(
                    StoredObject(
                        uri=self._obj_uri(full_key),
                        key=full_key[len(self.prefix) :],
                        size=int(item.get("Size", 0)),
                        etag=str(item.get("ETag", "")).strip('"'),
                    )
                )
        return sorted(out, key=lambda o: o.key)

    def read(self, obj: StoredObject) -> bytes:
        from botocore.exceptions import HTTPClientError, IncompleteReadError

        try:
            check_key(obj.key)
        except InvalidKey as exc:
            raise StoreError(f"{self.uri}: {exc}") from exc
        full_key = self.prefix + obj.key
        history = _History()
        with self._errors("read", full_key, history):
            for attempt in range(1, S3_READ_BODY_ATTEMPTS + 1):
                resp = self._client.get_object(Bucket=self.bucket, Key=full_key)
                try:
                    return resp["Body"].read()
                except (HTTPClientError, IncompleteReadError) as exc:
                    # Broke off mid-body: botocore does not retry that; repeat the whole GET.
                    if attempt == S3_READ_BODY_ATTEMPTS:
                        self._calls.causes = [*getattr(self._calls, "causes", []), type(exc).__name__]
                        history.body_failed = True
                        raise
                    n, causes = self._attempts()
                    history.attempts += n
                    history.causes += [*causes, type(exc).__name__]
                    with self._stats_lock:
                        self.retry_counts["body_retries"] += 1
                    log.warning(
                        "S3 read of %s at endpoint %s broke off mid-body (%s): repeating the GET (%d/%d)",
                        self._obj_uri(full_key), self.endpoint_url or "AWS default", type(exc).__name__,
                        attempt + 1, S3_READ_BODY_ATTEMPTS,
                    )
                    resp["Body"].close()
                    time.sleep(random.uniform(0, 0.1 * 2**attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def write(self, key: str, data: bytes) -> StoredObject:
        try:
            check_key(key)
        except InvalidKey as exc:
            raise StoreError(f"{self.uri}: {exc}") from exc
        full_key = self.prefix + key
        with self._errors("write", full_key):
            resp = self._client.put_object(Bucket=self.bucket, Key=full_key, Body=data)
        return StoredObject(
            uri=self._obj_uri(full_key), key=key, size=len(data), etag=str(resp.get("ETag", "")).strip('"')
        )


def _redact(text: str) -> str:
    from tasks.store.redact import redact

    return redact(text) or ""


_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException"}


@dataclass
class _History:
    """Attempts already made by earlier tries of one store operation."""

    attempts: int = 0
    causes: list[str] = field(default_factory=list)
    body_failed: bool = False  # the last try broke off mid-body (after botocore's call succeeded)


def _summarise(causes: list[str]) -> str:
    """``['503 SlowDown', '503 SlowDown', 'ConnectionClosedError']`` -> ``503 SlowDown x2, ConnectionClosedError``."""
    if not causes:
        return "no error recorded"
    return ", ".join(f"{c} x{n}" if n > 1 else c for c, n in Counter(causes).items())


def _describe(exc: BaseException) -> str:
    # botocore messages carry the URL and the cause, never credentials; a server's message is
    # its own text, masked all the same (tasks/store/redact.py).
    return _redact(str(exc)) or type(exc).__name__


# --------------------------------------------------------------------------------------------


def open_store(uri: str | os.PathLike[str], endpoint: str | None = None, region: str | None = None) -> ObjectStore:
    """``s3://bucket[/prefix]`` -> S3Store; ``file:///dir`` or a plain path -> LocalStore.

    ``endpoint``/``region`` (settings ``IMAGEBENCH_S3_ENDPOINT``/``IMAGEBENCH_S3_REGION``) apply to
    S3 only; ``None`` means AWS itself (and boto3's own ``AWS_ENDPOINT_URL*`` env, if set).
    """
    text = os.fspath(uri)
    if not text:
        raise StoreError("empty object store URI")
    parsed = urlparse(text)
    scheme = parsed.scheme.lower()
    if scheme == "s3":
        if not parsed.netloc:
            raise StoreError(f"object store URI {text!r} has no bucket (expected s3://bucket/prefix)")
        return S3Store(parsed.netloc, unquote(parsed.path), endpoint_url=endpoint, region=region)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise StoreError(f"object store URI {text!r}: file URIs must be local (file:///dir)")
        return LocalStore(unquote(parsed.path))
    if scheme and len(scheme) > 1:  # not a Windows drive letter
        raise StoreError(f"unsupported object store URI {text!r}: use s3://bucket/prefix, file:///dir or a path")
    return LocalStore(text)


def open_store_from_settings(settings: object) -> ObjectStore:
    """The store a :class:`schemas.settings.Settings` points at (``IMAGEBENCH_STORE`` & co)."""
    return open_store(
        settings.store_uri,  # type: ignore[attr-defined]
        endpoint=getattr(settings, "s3_endpoint", None),
        region=getattr(settings, "s3_region", None),
    )
