"""An endpoint's limits, held across the whole run (issue 25 item 1).

An endpoint's ``concurrency`` (requests in flight), ``requests_per_minute`` and
``tokens_per_minute`` are the endpoint's, not its caller's: every judge built for an endpoint in
a process, on any thread and any event loop, shares one :class:`EndpointLimiter`
(:func:`limiter_for`), and the limiter shares its counts beyond the process as its
:class:`LimitScope` says:

- ``process``: this process (a plain ``judge_items`` call, tests, ``judges check``);
- ``files``: every process of this user on this machine (a local Dask cluster's workers, the
  warm server's commands, two commands at once): an in-flight slot is an ``flock`` on one of
  ``concurrency`` slot files, the rates are one state file read and written under its ``flock``,
  all in a private folder (the flows use the runtime dir). A killed process holds nothing: the
  kernel drops its locks;
- ``prefect``: every process and worker reporting to one Prefect server: Prefect's global
  concurrency limit ``<base>-concurrency`` and its rate limits ``<base>-rpm`` / ``<base>-tpm``
  (slot decay), created or updated from the endpoint's config before the process's first
  request (``tasks/judges/prefect_limits.py``).

The rates are token buckets (:func:`take`, pure): requests per minute is a bucket of one request
refilled at N/60 per second (requests leave at least 60/N s apart, never in a burst); tokens per
minute a bucket of that many tokens refilled at T/60 per second. A request takes from the buckets
at the moment it is sent, or learns how long until they hold it, sleeps, and tries again: a caller
that wakes late has taken nothing it did not use, so the server sees the spacing the buckets
keep. Tokens are charged before a request (its ``max_tokens`` plus the largest prompt the endpoint
has reported in its ``usage``) and settled with the answer's ``usage`` (prompt + completion): a
larger use is owed (the bucket goes below zero), a smaller one is not refunded (providers count
``max_tokens`` against the limit when the request arrives).

A 429 or 503 with ``Retry-After`` pauses the endpoint (:meth:`EndpointLimiter.pause`): nothing
is sent to it until then, from any caller of the scope (``prefect``: of the process). A pause
longer than :data:`MAX_PAUSE_S` is not waited for: requests fail at once, unsent, until it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from .base import JudgeUnavailable

MAX_PAUSE_S = 120.0  # the router's RetryPolicy.max_retry_after_s: a longer Retry-After is not waited for
SLOT_POLL_S = 0.01  # files scope: how often a process looks for a slot another process freed

ScopeKind = Literal["process", "files", "prefect"]
T = TypeVar("T")


# --- what is limited, and where the counts live ------------------------------------------------
@dataclass(frozen=True)
class EndpointLimits:
    concurrency: int
    requests_per_minute: float | None = None
    tokens_per_minute: int | None = None

    @classmethod
    def of(cls, endpoint: Any) -> "EndpointLimits":
        return cls(endpoint.concurrency, getattr(endpoint, "requests_per_minute", None),
                   getattr(endpoint, "tokens_per_minute", None))


@dataclass(frozen=True)
class LimitScope:
    """Which processes share an endpoint's counts (plain data: crosses Prefect task boundaries)."""

    kind: ScopeKind = "process"
    directory: str | None = None  # files: the private folder holding the slot and state files

    def __post_init__(self) -> None:
        if self.kind == "files" and not self.directory:
            raise ValueError("a files limit scope needs a directory")

    def describe(self) -> str:
        return {"process": "this process", "files": f"this machine (lock files in {self.directory})",
                "prefect": "the Prefect server's global concurrency and rate limits"}[self.kind]


PROCESS = LimitScope()


# --- the rates (pure) --------------------------------------------------------------------------
@dataclass(frozen=True)
class Bucket:
    """A token bucket's level at clock time ``at`` (below zero: tokens owed)."""

    level: float
    at: float


def _level(bucket: Bucket | None, now: float, capacity: float, per_second: float) -> float:
    if bucket is None:
        return capacity
    return min(capacity, bucket.level + max(0.0, now - bucket.at) * per_second)


def take(bucket: Bucket | None, now: float, cost: float, capacity: float, per_second: float) -> tuple[Bucket | None, float]:
    """Take ``cost`` from a bucket of ``capacity`` refilled at ``per_second`` (``None``: full).
    Returns ``(the bucket after, 0.0)`` when it holds the cost now, else ``(the bucket untouched,
    seconds until it will)``. A cost above the capacity counts as the capacity (such a request
    goes alone, on a full bucket)."""
    level = _level(bucket, now, capacity, per_second)
    cost = min(cost, capacity)
    if level >= cost - 1e-9:
        return Bucket(level - cost, now), 0.0
    return bucket, (cost - level) / per_second


def owe(bucket: Bucket | None, now: float, cost: float, capacity: float, per_second: float) -> Bucket:
    """Charge ``cost`` already spent: the level may go below zero, later requests wait for it."""
    return Bucket(_level(bucket, now, capacity, per_second) - cost, now)


@dataclass(frozen=True)
class RateState:
    requests: Bucket | None = None
    tokens: Bucket | None = None
    paused_until: float = 0.0


def plan_send(state: RateState, now: float, limits: EndpointLimits, tokens: int) -> tuple[RateState, float]:
    """One request of ``tokens`` tokens: ``(state after taking it, 0.0)`` when it may be sent now,
    else ``(state unchanged, seconds to wait before asking again)``. Both buckets or neither."""
    if state.paused_until > now:
        return state, state.paused_until - now
    requests, tokens_bucket, wait = state.requests, state.tokens, 0.0
    if limits.requests_per_minute:
        requests, w = take(state.requests, now, 1, 1, limits.requests_per_minute / 60.0)
        wait = max(wait, w)
    if limits.tokens_per_minute:
        tokens_bucket, w = take(state.tokens, now, tokens, limits.tokens_per_minute, limits.tokens_per_minute / 60.0)
        wait = max(wait, w)
    if wait > 0:
        return state, wait
    return replace(state, requests=requests, tokens=tokens_bucket), 0.0


def plan_pause(state: RateState, until: float) -> RateState:
    """The endpoint said "not before ``until``"."""
    return state if until <= state.paused_until else replace(state, paused_until=until)


def plan_debt(state: RateState, now: float, limits: EndpointLimits, tokens: int) -> RateState:
    """Tokens used beyond what was charged: owed, paid by the next requests' waits."""
    if not limits.tokens_per_minute or tokens <= 0:
        return state
    tpm = limits.tokens_per_minute
    return replace(state, tokens=owe(state.tokens, now, tokens, tpm, tpm / 60.0))


# --- where the rate state lives ----------------------------------------------------------------
class _MemoryState:
    """The rate state of one process (a lock: every thread and event loop of the process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = RateState()

    def transact(self, fn: Callable[[RateState, float], tuple[RateState, T]]) -> T:
        with self._lock:
            self._state, out = fn(self._state, time.monotonic())
            return out


def _open_private(path: Path) -> int:
    """A file of ours in a private folder: never through a symlink, 0600 whatever the umask."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def _private_folder(folder: Path) -> Path:
    """``folder`` and its parent made 0700 (whatever the umask; another account cannot reach the
    slot files, where a read-only descriptor would let it hold a lock)."""
    for d in (folder.parent, folder):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        if d.stat().st_mode & 0o077 and d.stat().st_uid == os.getuid():
            os.chmod(d, 0o700)
    return folder


def _boot_id() -> str:
    # CLOCK_MONOTONIC (time.monotonic) is one clock for every process of a boot; a state written
    # before a reboot holds times of another clock and is dropped.
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _bucket_of(data: Any) -> Bucket | None:
    return Bucket(float(data[0]), float(data[1])) if isinstance(data, list) and len(data) == 2 else None


class _FileState:
    """The rate state of every process of this user: one JSON file, read and written under its
    ``flock`` (held for a read and a write). Unreadable (a write cut short): starts afresh."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._boot = _boot_id()

    def _read(self, fd: int) -> RateState:
        try:
            raw = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
            if raw.get("boot") != self._boot:
                return RateState()
            return RateState(_bucket_of(raw.get("requests")), _bucket_of(raw.get("tokens")), float(raw.get("paused_until", 0.0)))
        except (ValueError, TypeError, AttributeError):
            return RateState()

    def _write(self, fd: int, state: RateState) -> None:
        data = {"boot": self._boot, "paused_until": state.paused_until,
                "requests": [state.requests.level, state.requests.at] if state.requests else None,
                "tokens": [state.tokens.level, state.tokens.at] if state.tokens else None}
        blob = json.dumps(data).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, blob, 0)

    def transact(self, fn: Callable[[RateState, float], tuple[RateState, T]]) -> T:
        fd = _open_private(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            before = self._read(fd)
            state, out = fn(before, time.monotonic())
            if state != before:
                self._write(fd, state)
            return out
        finally:
            os.close(fd)  # drops the lock


# --- in-flight slots ---------------------------------------------------------------------------
class _Permits:
    """A counting semaphore for every thread and event loop of the process, first come first
    served. (An asyncio.Semaphore belongs to one loop; VAB batches run one loop per thread.)"""

    def __init__(self, n: int) -> None:
        self._lock = threading.Lock()
        self._free = n
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = deque()

    async def acquire(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return
            waiter = (loop, loop.create_future())
            self._waiters.append(waiter)
        try:
            await waiter[1]
        except asyncio.CancelledError:
            with self._lock:
                queued = waiter in self._waiters
                if queued:
                    self._waiters.remove(waiter)
            if not queued and waiter[1].done() and not waiter[1].cancelled():
                self.release()  # granted, then cancelled before it ran: pass the permit on
            raise

    def _grant(self, fut: asyncio.Future) -> None:  # on the waiter's loop
        if fut.cancelled():
            self.release()
        else:
            fut.set_result(None)

    def release(self) -> None:
        with self._lock:
            while self._waiters:
                loop, fut = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(self._grant, fut)
                    return
                except RuntimeError:  # that loop has closed: its waiter is gone
                    continue
            self._free += 1


class _FileSlots:
    """``n`` slot files; holding one (an exclusive ``flock``) is one request in flight. Each
    process opens each file once (its own open file description); a flag per file stops two
    callers of the process from sharing a lock."""

    def __init__(self, folder: Path, n: int) -> None:
        self._fds = [_open_private(folder / f"slot-{i}") for i in range(n)]
        self._taken = [False] * n
        self._lock = threading.Lock()

    def try_claim(self) -> int | None:
        with self._lock:
            for i, fd in enumerate(self._fds):
                if self._taken[i]:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # another process holds it
                self._taken[i] = True
                return i
        return None

    def release(self, i: int) -> None:
        with self._lock:
            fcntl.flock(self._fds[i], fcntl.LOCK_UN)
            self._taken[i] = False

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)


# --- the limiter -------------------------------------------------------------------------------
def endpoint_key(name: str, url: str | None) -> str:
    """What the shared counts of an endpoint are filed under: its judge name and public URL (two
    workspaces' 'gemma' on two servers share nothing)."""
    return hashlib.sha256(f"{name}\0{url or ''}".encode()).hexdigest()[:12]


class EndpointLimiter:
    """The limits of one endpoint in one scope. Use: ``async with limiter.slot():`` around a
    request, ``await limiter.before_send(tokens)`` just before sending it (returns the tokens
    charged), then :meth:`settle` with the answer's usage or :meth:`pause` on a Retry-After."""

    def __init__(self, name: str, url: str | None, limits: EndpointLimits, scope: LimitScope) -> None:
        self.name, self.url, self.limits, self.scope = name, url, limits, scope
        self.key = endpoint_key(name, url)
        self._permits = _Permits(limits.concurrency)
        self._prompt_tokens = 0  # the largest prompt the endpoint reported (tokens estimate)
        self._owed = 0  # prefect: tokens used beyond the charge, added to the next charge (Prefect's tpm)
        self._lock = threading.Lock()
        self._file_slots: _FileSlots | None = None
        if scope.kind == "files":
            folder = _private_folder(Path(scope.directory) / "judge-limits" / self.key)  # type: ignore[arg-type]
            self._state: _MemoryState | _FileState = _FileState(folder / "rate.json")
            self._file_slots = _FileSlots(folder, limits.concurrency)
        else:
            self._state = _MemoryState()  # prefect: this process's pause and buckets, before Prefect's limits
        self._prefect_ready = False
        self._prefect_slots: Any = None  # prefect_limits.PrefectSlots
        self._prefect_rates_taker: Any = None  # prefect_limits.RateTaker
        self._asking = _MemoryState()  # prefect: when this process may next ask the server's rate limit

    # names of Prefect's global limits ----------------------------------------------------------
    def prefect_name(self, what: str) -> str:
        return f"imagebench-judge-{self.name}-{self.key[:8]}-{what}"

    def _prefect_setup(self) -> None:
        """Create (or bring to this config) the endpoint's global limits, once per process."""
        from .prefect_limits import RATE_UNITS, RPM_SLOTS, PrefectSlots, RateTaker, ensure_limits

        with self._lock:
            if self._prefect_ready:
                return
            wanted: list[tuple[str, int, float | None]] = [(self.prefect_name("concurrency"), self.limits.concurrency, None)]
            if self.limits.requests_per_minute:
                wanted.append((self.prefect_name("rpm"), RPM_SLOTS * RATE_UNITS, self.limits.requests_per_minute / 60.0 * RATE_UNITS))
            if self.limits.tokens_per_minute:
                wanted.append((self.prefect_name("tpm"), self.limits.tokens_per_minute, self.limits.tokens_per_minute / 60.0))
            ensure_limits(wanted)
            self._prefect_slots = PrefectSlots(self.prefect_name("concurrency"))
            self._prefect_rates_taker = RateTaker() if len(wanted) > 1 else None
            self._prefect_ready = True

    async def _ensure_prefect(self) -> None:
        if not self._prefect_ready:
            try:
                await asyncio.to_thread(self._prefect_setup)
            except Exception as exc:  # noqa: BLE001 - no limit in force: send nothing
                raise JudgeUnavailable(
                    f"judge '{self.name}': cannot set its limits on the Prefect API ({type(exc).__name__}: {exc}); "
                    "nothing sent", retryable=False, judge_down=True) from None

    # one request ---------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One of the endpoint's ``concurrency`` slots, held for the block."""
        await self._permits.acquire()
        try:
            if self.scope.kind == "files":
                assert self._file_slots is not None
                while (i := self._file_slots.try_claim()) is None:
                    await asyncio.sleep(SLOT_POLL_S)
                try:
                    yield
                finally:
                    self._file_slots.release(i)
            elif self.scope.kind == "prefect":
                await self._ensure_prefect()
                try:
                    held = await self._prefect_slots.claim()
                except Exception as exc:  # noqa: BLE001 - the server refused or is gone: nothing sent
                    raise JudgeUnavailable(f"judge '{self.name}': no slot of its Prefect concurrency limit "
                                           f"({type(exc).__name__}: {exc})") from None
                try:
                    yield
                finally:
                    self._prefect_slots.give_back(held)
            else:
                yield
        finally:
            self._permits.release()

    def estimate_tokens(self, max_tokens: int) -> int:
        """What a request asking for ``max_tokens`` is charged before it is sent."""
        return max_tokens + self._prompt_tokens

    async def before_send(self, tokens: int) -> int:
        """Wait until the request may be sent (pause, requests and tokens per minute) and take it
        from the buckets; returns the tokens charged. Raises JudgeUnavailable (nothing sent)
        while the endpoint asked for a pause longer than MAX_PAUSE_S."""
        prefect = self.scope.kind == "prefect"
        with self._lock:  # Prefect's tokens limit is charged what earlier answers used beyond their charge
            owed, self._owed = self._owed, 0

        def plan(state: RateState, now: float) -> tuple[RateState, float]:
            if state.paused_until - now > MAX_PAUSE_S:
                return state, -(state.paused_until - now)  # negative: refused for that long
            return plan_send(state, now, self.limits, tokens)

        if prefect:
            # The process asks the server at the endpoint's rate (asked all at once, the server's
            # refusals would grow its Retry-After), then its buckets space what it sends.
            await self._take(self._asking, lambda s, now: plan_send(s, now, EndpointLimits(1, self.limits.requests_per_minute), 0))
            await self._prefect_rates(tokens + owed)
        await self._take(self._state, plan)
        return tokens

    async def _take(self, state: "_MemoryState | _FileState", plan: Callable[[RateState, float], tuple[RateState, float]]) -> None:
        while True:
            wait = state.transact(plan)
            if wait < 0:
                raise JudgeUnavailable(
                    f"judge '{self.name}': the endpoint asked to wait {-wait:.0f} s more (Retry-After), "
                    f"over the {MAX_PAUSE_S:.0f} s a run waits: not sent", retryable=False)
            if wait == 0:
                return
            await asyncio.sleep(wait)

    async def _prefect_rates(self, tokens: int) -> None:
        from .prefect_limits import RATE_UNITS

        await self._ensure_prefect()
        taker = self._prefect_rates_taker
        try:
            if self.limits.requests_per_minute:
                await taker.take(self.prefect_name("rpm"), RATE_UNITS, self.limits.requests_per_minute / 60.0 * RATE_UNITS)
            if self.limits.tokens_per_minute:
                tpm = self.limits.tokens_per_minute
                await taker.take(self.prefect_name("tpm"), max(1, min(tokens, tpm)), tpm / 60.0)
        except Exception as exc:  # noqa: BLE001 - the server refused or is gone: nothing sent
            raise JudgeUnavailable(f"judge '{self.name}': no turn in its Prefect rate limits "
                                   f"({type(exc).__name__}: {exc})") from None

    def settle(self, charged: int, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """The answer's usage: the prompt size feeds the next estimates; tokens used beyond the
        charge are owed (never refunded below it)."""
        if prompt_tokens:
            with self._lock:
                self._prompt_tokens = max(self._prompt_tokens, prompt_tokens)
        used = (prompt_tokens or 0) + (completion_tokens or 0)
        extra = used - charged
        if not self.limits.tokens_per_minute or extra <= 0:
            return
        if self.scope.kind == "prefect":
            with self._lock:
                self._owed += extra
        self._state.transact(lambda s, now: (plan_debt(s, now, self.limits, extra), None))

    def pause(self, seconds: float) -> None:
        """The endpoint said "retry after ``seconds``": nothing is sent to it before then."""
        if seconds > 0:
            self._state.transact(lambda s, now: (plan_pause(s, now + seconds), None))


# --- one limiter per endpoint per process ------------------------------------------------------
_LIMITERS: dict[tuple, EndpointLimiter] = {}
_LIMITERS_LOCK = threading.Lock()


def limiter_for(name: str, endpoint: Any, scope: LimitScope | None = None, url: str | None = None) -> EndpointLimiter:
    """The process's limiter of judge ``name`` at ``url`` (its public URL) in ``scope``: the same
    object for every caller with the same limits."""
    scope = scope or PROCESS
    limits = EndpointLimits.of(endpoint)
    key = (scope, name, url, limits)
    with _LIMITERS_LOCK:
        limiter = _LIMITERS.get(key)
        if limiter is None:
            limiter = _LIMITERS[key] = EndpointLimiter(name, url, limits, scope)
        return limiter


def reset_limiters() -> None:
    """Forget every limiter of the process (a new process starts with none): for tests. Nothing
    may be using them."""
    with _LIMITERS_LOCK:
        _LIMITERS.clear()


def _forget_after_fork() -> None:
    global _LIMITERS_LOCK
    # A forked child holds none of its parent's slots: it closes its copies of the slot files (the
    # parent's locks would otherwise outlive the parent while the child lives).
    for limiter in _LIMITERS.values():
        if limiter._file_slots is not None:
            limiter._file_slots.close()
    _LIMITERS.clear()
    _LIMITERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
