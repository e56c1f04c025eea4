"""An endpoint's limits on a Prefect server: Prefect's global concurrency and rate limits, shared
by every worker and flow run that reaches the server (the ``prefect`` scope of
``tasks/judges/limits.py``).

- ``<base>-concurrency`` (limit = the endpoint's ``concurrency``): a request in flight holds one
  of its slots. A slot is taken with ``prefect.concurrency.sync.concurrency`` (a lease of
  :data:`LEASE_S`, renewed while held: a killed worker's slot returns when it expires) by a
  holder thread of this process, and **handed from one request of the process to the next**
  while requests wait for one; a slot no request claims for :data:`LINGER_S` is given back.
  Taking a slot costs a few calls to the API (measured: ~0.16 s on a SQLite server, and one at a
  time per process): taken per request, it would cap a process at a few requests per second.
- ``<base>-rpm`` and ``<base>-tpm`` (limit T, decay T/60 per second): a request's turn in each
  (``tpm``: the tokens charged) is taken with the client's ``increment_concurrency_slots(mode=
  "rate_limit")`` (:class:`RateTaker`), asked at the endpoint's rate by the process. Prefect decays
  a limit in whole slots since its last update (an acquisition or a refusal), so a request is
  :data:`RATE_UNITS` slots of ``<base>-rpm`` (limit ``RPM_SLOTS * RATE_UNITS``, decay ``N/60 *
  RATE_UNITS``): at one slot per request, requests 60/N s apart would often find nothing decayed.
  A refused turn is asked again after half the time one request decays, not after the server's
  ``Retry-After``: that one grows with every refusal the limit has counted, and
  ``prefect.concurrency.asyncio.rate_limit`` waits it out one acquisition at a time per process
  (measured: waits of 2-3.5 s at 4 requests per second on a busy machine, 0.63 of the allowed rate
  for Capability judging beside HPSv3).

The limits are created, or set to this endpoint's config, before the process's first request
(:func:`ensure_limits`); with several configs for one endpoint name and URL, the last one wins.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import os
import threading
import time

LEASE_S = 60.0  # the shortest lease Prefect grants
LINGER_S = 0.25  # an idle held slot waits this long for another request of the process, then goes back
RPM_SLOTS = 3  # requests the rate limit lets through at once: slack for the jitter of the calls to the API
RATE_UNITS = 100  # slots of the requests-per-minute limit per request (see the module doc)


def ensure_limits(wanted: list[tuple[str, int, float | None]]) -> None:
    """Create each (name, limit, slot decay per second) global limit, or update it to these values."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for name, limit, decay in wanted:
            try:
                client.upsert_global_concurrency_limit_by_name(name, limit, slot_decay_per_second=decay)
            except Exception:  # noqa: BLE001 - another process created it between the read and the create
                client.upsert_global_concurrency_limit_by_name(name, limit, slot_decay_per_second=decay)


class RateTaker:
    """Turns in the server's rate limits for one process: one call to the API per try (a sync
    client, in a worker thread: every event loop of the process shares it)."""

    def __init__(self) -> None:
        from prefect.client.orchestration import get_client

        self._client = get_client(sync_client=True)
        self._client.__enter__()
        _TAKERS.add(self)

    def try_take(self, name: str, slots: int) -> float | None:
        """None: taken; else the server's Retry-After (seconds)."""
        import httpx

        try:
            resp = self._client.increment_concurrency_slots(names=[name], slots=slots, mode="rate_limit")
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 423:
                raise
            try:
                return float(exc.response.headers.get("Retry-After", "0.1"))
            except ValueError:
                return 0.1
        if not resp.json():
            raise RuntimeError(f"Prefect's rate limit {name!r} does not exist")
        return None

    async def take(self, name: str, slots: int, slots_per_second: float) -> None:
        while True:
            retry_after = await asyncio.to_thread(self.try_take, name, slots)
            if retry_after is None:
                return
            await asyncio.sleep(max(0.02, min(retry_after, slots / slots_per_second) / 2))

    def close(self) -> None:
        self._client.__exit__(None, None, None)


_TAKERS: "set[RateTaker]" = set()


class _Held:
    """One slot of the global limit, held by a thread of its own (sync ``concurrency``) until
    :meth:`give_up`; its lease is renewed by Prefect meanwhile."""

    def __init__(self, name: str, on_exit=None) -> None:
        self.granted: concurrent.futures.Future = concurrent.futures.Future()
        self._on_exit = on_exit  # called once the slot is given back (or was never granted)
        self.idle_since: float | None = None
        self.wake = threading.Event()
        self.leave = False
        self._name = name
        thread = threading.Thread(target=contextvars.copy_context().run, args=(self._hold,), daemon=True,
                                  name=f"prefect-slot-{name}")
        thread.start()
        self.thread = thread

    def _hold(self) -> None:
        from prefect.concurrency.sync import concurrency

        try:
            with concurrency(self._name, occupy=1, strict=True, lease_duration=LEASE_S,
                             raise_on_lease_renewal_failure=False):
                try:
                    self.granted.set_result(self)
                except concurrent.futures.InvalidStateError:
                    return  # the request that asked was cancelled: give the slot straight back
                while not self.leave:
                    self.wake.wait()
                    self.wake.clear()
        except BaseException as exc:  # noqa: BLE001 - the asking request gets the error
            if not self.granted.done():
                self.granted.set_exception(exc)
        finally:
            if self._on_exit is not None:
                self._on_exit(self)

    def give_up(self) -> None:
        self.leave = True
        self.wake.set()


class PrefectSlots:
    """The global concurrency slots this process holds for one endpoint."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._idle: list[_Held] = []
        self._all: set[_Held] = set()
        _KEEPERS.add(self)

    async def claim(self) -> _Held:
        with self._lock:
            while self._idle:
                held = self._idle.pop()
                if not held.leave:
                    held.idle_since = None
                    return held
        with self._lock:
            held = _Held(self.name, self._gone)
            self._all.add(held)
        try:
            return await asyncio.wrap_future(held.granted)
        except asyncio.CancelledError:
            if held.granted.done() and not held.granted.cancelled() and held.granted.exception() is None:
                self.give_back(held)  # granted as the request was cancelled: idle, then back to the server
            raise

    def _gone(self, held: _Held) -> None:
        """A holder thread ended: its slot is back (or was never granted)."""
        with self._lock:
            self._all.discard(held)

    def give_back(self, held: _Held) -> None:
        """The request is done: the slot waits LINGER_S for the next request of the process."""
        with self._lock:
            held.idle_since = time.monotonic()
            self._idle.append(held)
        timer = threading.Timer(LINGER_S, self._expire, args=(held, held.idle_since))
        timer.daemon = True
        timer.start()

    def _expire(self, held: _Held, since: float) -> None:
        with self._lock:
            if held.idle_since != since or held not in self._idle:
                return  # claimed again meanwhile
            self._idle.remove(held)
        held.give_up()  # stays in _all until its thread has given the slot back (close() waits for it)

    def close(self, wait_s: float = 5.0) -> None:
        """Give every held slot back and wait for it (at exit: a slot left to its lease would
        block others for a minute)."""
        with self._lock:
            held, self._idle = list(self._all), []
        for h in held:
            h.give_up()
        deadline = time.monotonic() + wait_s
        for h in held:
            h.thread.join(max(0.0, deadline - time.monotonic()))


_KEEPERS: "set[PrefectSlots]" = set()


@atexit.register
def _give_everything_back() -> None:
    for keeper in list(_KEEPERS):
        keeper.close()
    for taker in list(_TAKERS):
        taker.close()


def _forget_after_fork() -> None:  # a forked child holds none of its parent's slots or clients
    _KEEPERS.clear()
    _TAKERS.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
