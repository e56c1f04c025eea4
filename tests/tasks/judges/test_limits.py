"""An endpoint's limits hold across the whole run (issue 25 item 1): every judge built for an
endpoint, on any thread, event loop or process of the scope, shares its concurrency and its
requests and tokens per minute; a 429/503 Retry-After pauses the endpoint for all of them.

Against a fake paid API over loopback (tests/fake_openai.py, ``ServerLimits``) that answers 429
beyond 4 requests in flight or N per minute. Several batches at once, each with its own judge,
client and event loop (as Prefect tasks and VAB batches run), or each in its own process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tasks.judges import judge_items
from tasks.judges.limits import (EndpointLimits, LimitScope, RateState, _Permits, limiter_for, plan_debt, plan_pause, plan_send,
                                 take)
from tests.fake_openai import FakeOpenAI, Reply, ServerLimits
from tests.tasks.judges.helpers import FAST, config, endpoint, make_routing

REPO = Path(__file__).resolve().parents[3]
PASS_TEXT = "Looks right.\nVERDICT: PASS"


def _batches(make_item, batches: int, per_batch: int) -> list[list]:
    return [[make_item(prompt=f"a fox number {b}-{i}") for i in range(per_batch)] for b in range(batches)]


def _judge_batches_in_threads(batches, cfg, limits=None) -> list:
    """Each batch in its own thread, event loop, judge and HTTP client (a Prefect task each)."""
    runs: list = [None] * len(batches)

    def one(i: int) -> None:
        scope = {"limits": limits} if limits is not None else {}  # default: the process's limiter
        runs[i] = judge_items(batches[i], make_routing("alpha", None), cfg, retry=FAST, **scope)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return runs


def _verdicts(runs) -> list[str]:
    return [v for r in runs for v in r.verdicts["verdict"].to_pylist()]


def test_concurrency_is_the_endpoints_across_batches_threads_and_event_loops(make_item) -> None:
    # Before: each batch built its own semaphore, 4 batches of concurrency 4 sent 16 at once.
    with FakeOpenAI(responder=lambda r: Reply(text=PASS_TEXT, delay_s=0.2), limits=ServerLimits(max_in_flight=4)) as srv:
        cfg = config(alpha=endpoint(srv, concurrency=4))
        runs = _judge_batches_in_threads(_batches(make_item, 4, 6), cfg)
    assert srv.max_in_flight <= 4 and srv.refused == 0
    assert _verdicts(runs) == ["PASS"] * 24  # every verdict kept
    assert len(srv.completions) == 24  # one request each: nothing was refused and asked again


def test_requests_per_minute_hold_across_batches(make_item) -> None:
    # 240 per minute: requests 0.25 s apart. The server's bucket holds 3 (a request may arrive up to
    # 0.5 s late after taking its turn, on a loaded machine, without two arriving together).
    limits = ServerLimits(max_in_flight=4, requests_per_minute=240, burst=3)
    with FakeOpenAI(responder=lambda r: Reply(text=PASS_TEXT, delay_s=0.05), limits=limits) as srv:
        cfg = config(alpha=endpoint(srv, concurrency=4, requests_per_minute=240))
        runs = _judge_batches_in_threads(_batches(make_item, 3, 6), cfg)
    assert srv.refused == 0 and srv.max_in_flight <= 4
    assert _verdicts(runs) == ["PASS"] * 18 and len(srv.completions) == 18


_PROCESS_CLIENT = """
import json, sys, hashlib, io
from pathlib import Path
from PIL import Image
from schemas.judges import Endpoint, JudgesConfig
from tasks.judges import JudgeItem, judge_items
from tasks.judges.limits import LimitScope
from tests.tasks.judges.helpers import FAST, make_routing

base_url, folder, worker, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
items = []
for i in range(n):
    path = Path(folder) / f"w{worker}-{i}.png"
    Image.new("RGB", (32, 32), (worker * 40, i * 9, 7)).save(path)
    items.append(JudgeItem("m", f"p-{worker}-{i}", "v", "Spatial Reasoning", path,
                           hashlib.sha256(path.read_bytes()).hexdigest(), f"a fox {worker}-{i}", "Is it right?"))
cfg = JudgesConfig(judges={"alpha": Endpoint(backend="openai", base_url=base_url, model="fake-vlm", concurrency=4,
                                             requests_per_minute=240, max_retries=3)})
run = judge_items(items, make_routing("alpha", None), cfg, retry=FAST, limits=LimitScope(sys.argv[5], sys.argv[6] or None))
print(json.dumps(run.verdicts["verdict"].to_pylist()))
"""


def _judge_in_processes(srv: FakeOpenAI, tmp_path: Path, scope: LimitScope, processes: int = 3, per: int = 5,
                        env: dict | None = None) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    procs = [subprocess.Popen([sys.executable, "-c", _PROCESS_CLIENT, srv.base_url, str(tmp_path), str(w), str(per),
                               scope.kind, scope.directory or ""], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(processes)]
    verdicts = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        verdicts += json.loads(out.strip().splitlines()[-1])
    return verdicts


def test_files_scope_holds_the_limits_across_processes(tmp_path) -> None:
    """A local Dask cluster's workers, or two commands at once: one endpoint, one limit."""
    limits = ServerLimits(max_in_flight=4, requests_per_minute=240, burst=3)
    private = tmp_path / "runtime"
    private.mkdir(mode=0o700)
    with FakeOpenAI(responder=lambda r: Reply(text=PASS_TEXT, delay_s=0.3), limits=limits) as srv:
        verdicts = _judge_in_processes(srv, tmp_path, LimitScope("files", str(private)))
    assert verdicts == ["PASS"] * 15
    assert srv.refused == 0 and srv.max_in_flight <= 4
    folder = next((private / "judge-limits").iterdir())
    assert sorted(p.name for p in folder.iterdir()) == ["rate.json", "slot-0", "slot-1", "slot-2", "slot-3"]
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in folder.iterdir())


def test_prefect_scope_holds_the_limits_across_processes(prefect_harness, tmp_path) -> None:
    """Workers of a Prefect server: the server's global concurrency and rate limits, one endpoint."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    limits = ServerLimits(max_in_flight=4, requests_per_minute=240, burst=3)
    with get_client(sync_client=True) as client:  # the session's server holds earlier tests' endpoints too
        before = {g.name for g in client.read_global_concurrency_limits(limit=200)}
    with FakeOpenAI(responder=lambda r: Reply(text=PASS_TEXT, delay_s=0.3), limits=limits) as srv:
        verdicts = _judge_in_processes(srv, tmp_path, LimitScope("prefect"), env={"PREFECT_API_URL": PREFECT_API_URL.value()})
    assert verdicts == ["PASS"] * 15
    assert srv.refused == 0 and srv.max_in_flight <= 4
    with get_client(sync_client=True) as client:
        made = {g.name: g for g in client.read_global_concurrency_limits(limit=200)
                if g.name.startswith("imagebench-judge-alpha-") and g.name not in before}
    by_kind = {name.rsplit("-", 1)[1]: g for name, g in made.items()}
    assert by_kind["concurrency"].limit == 4 and by_kind["concurrency"].slot_decay_per_second == 0
    from tasks.judges.prefect_limits import RATE_UNITS, RPM_SLOTS

    # 240 per minute: 4 requests a second, each RATE_UNITS slots (Prefect decays whole slots)
    assert by_kind["rpm"].slot_decay_per_second == pytest.approx(4.0 * RATE_UNITS)
    assert by_kind["rpm"].limit == RPM_SLOTS * RATE_UNITS
    assert by_kind["concurrency"].active_slots == 0  # every slot given back when the processes ended


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_pauses_the_whole_endpoint(make_item, status) -> None:
    # The refusal comes at 0.5 s while other requests are in flight (0.3 s each, more waiting):
    # before, the other batches went on sending during the 2 s the server asked for.
    first = threading.Event()

    def answer(req) -> Reply:
        if not first.is_set():
            first.set()
            return Reply(status=status, text=None, headers={"Retry-After": "2"}, delay_s=0.5)
        return Reply(text=PASS_TEXT, delay_s=0.3)

    with FakeOpenAI(responder=answer) as srv:
        cfg = config(alpha=endpoint(srv, concurrency=4))
        runs = _judge_batches_in_threads(_batches(make_item, 2, 10), cfg)
    refused = srv.completions[0]
    during = [round(r.t - refused.t_end, 2) for r in srv.completions if refused.t_end + 0.05 < r.t < refused.t_end + 1.95]
    assert during == []  # (a request already on its way when the answer left may arrive just after it)
    assert any(r.t >= refused.t_end + 1.95 for r in srv.completions)  # ... and the rest went after the pause
    assert _verdicts(runs) == ["PASS"] * 20


def test_a_retry_after_beyond_the_bound_sends_nothing_until_it_ends(make_item) -> None:
    with FakeOpenAI(responder=lambda r: Reply(status=429, text=None, headers={"Retry-After": "3600"})) as srv:
        cfg = config(alpha=endpoint(srv, concurrency=1))
        t0 = time.monotonic()
        run = judge_items([make_item(prompt=f"a fox {i}") for i in range(5)], make_routing("alpha", None), cfg, retry=FAST)
    assert time.monotonic() - t0 < 60  # not waited for
    assert len(srv.completions) == 1  # the 429; the other four were never sent
    assert run.verdicts["verdict"].to_pylist() == ["ERROR"] * 5
    reasons = run.verdicts["reason"].to_pylist()
    assert sum("asked to wait" in r and "not sent" in r for r in reasons) == 4, reasons


def test_the_limiter_is_one_per_endpoint_and_scope() -> None:
    from schemas.judges import Endpoint

    ep = Endpoint(backend="openai", base_url="http://127.0.0.1:9/v1", model="m", concurrency=3, requests_per_minute=60)
    a = limiter_for("alpha", ep, None, "http://127.0.0.1:9/v1")
    assert limiter_for("alpha", ep, LimitScope(), "http://127.0.0.1:9/v1") is a
    assert limiter_for("alpha", ep, None, "http://127.0.0.1:10/v1") is not a  # another endpoint
    assert limiter_for("beta", ep, None, "http://127.0.0.1:9/v1") is not a
    assert a.limits == EndpointLimits(3, 60, None)
    with pytest.raises(ValueError, match="directory"):
        LimitScope("files")


# --- the math ------------------------------------------------------------------------------------
def test_a_bucket_of_one_request_lets_one_through_per_interval() -> None:
    bucket, wait = take(None, 100.0, 1, 1, 2.0)  # 120 per minute
    assert wait == 0.0
    same, wait = take(bucket, 100.1, 1, 1, 2.0)  # the next caller is told when to ask again, and takes nothing
    assert same is bucket and wait == pytest.approx(0.4)
    bucket, wait = take(bucket, 100.5, 1, 1, 2.0)
    assert wait == 0.0
    _, wait = take(bucket, 110.0, 1, 1, 2.0)  # idle meanwhile: refilled, but never beyond one request
    assert wait == 0.0
    assert take(take(bucket, 110.0, 1, 1, 2.0)[0], 110.0, 1, 1, 2.0)[1] == pytest.approx(0.5)


def test_tokens_charge_what_was_asked_and_settle_what_was_used() -> None:
    limits = EndpointLimits(4, None, 600)  # 600 tokens per minute: 10 per second, a minute's worth at most
    state, wait = plan_send(RateState(), 0.0, limits, 500)
    assert wait == 0.0  # a full bucket holds it
    later, wait = plan_send(state, 0.0, limits, 500)
    assert later is state and wait == pytest.approx(40.0)  # 100 left: 400 more at 10/s
    state = plan_debt(state, 0.0, limits, 300)  # the answers used 300 more than charged: -200 now
    assert plan_send(state, 0.0, limits, 100)[1] == pytest.approx(30.0)
    assert plan_send(RateState(), 0.0, limits, 5000)[1] == 0.0  # over a minute's worth: alone, on a full bucket
    both = EndpointLimits(4, 60, 600)
    state, _ = plan_send(RateState(), 0.0, both, 100)
    held, wait = plan_send(state, 0.5, both, 100)  # tokens suffice, the request bucket does not: neither taken
    assert held is state and wait == pytest.approx(0.5)


def test_a_pause_holds_every_request() -> None:
    limits = EndpointLimits(4, 120, None)
    state = plan_pause(RateState(), 10.0)
    assert plan_send(state, 1.0, limits, 0) == (state, 9.0)
    state, wait = plan_send(state, 10.0, limits, 0)
    assert wait == 0.0
    assert plan_send(state, 10.1, limits, 0)[1] == pytest.approx(0.4)  # then the rate again, no burst
    assert plan_pause(state, 5.0) is state  # an earlier end changes nothing


def test_permits_are_shared_by_event_loops_and_survive_cancelled_waiters() -> None:
    permits = _Permits(2)
    held, peak, lock = [0], [0], threading.Lock()

    async def use(hold: float) -> None:
        await permits.acquire()
        try:
            with lock:
                held[0] += 1
                peak[0] = max(peak[0], held[0])
            await asyncio.sleep(hold)
        finally:
            with lock:
                held[0] -= 1
            permits.release()

    async def loop_body() -> None:
        tasks = [asyncio.ensure_future(use(0.05)) for _ in range(6)]
        await asyncio.sleep(0.01)
        tasks[-1].cancel()  # a waiter cancelled: its turn passes on
        await asyncio.gather(*tasks, return_exceptions=True)

    threads = [threading.Thread(target=asyncio.run, args=(loop_body(),)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert peak[0] <= 2 and held[0] == 0
    asyncio.run(asyncio.wait_for(permits.acquire(), 5))  # nothing leaked: both permits are free
    asyncio.run(asyncio.wait_for(permits.acquire(), 5))


def test_another_local_account_cannot_hold_an_endpoints_slots(other_user, reachable_tmp) -> None:
    """A lab's shared machine: the lock files live in a folder only their owner enters, even when
    the scope's folder is one everybody can reach (a flock needs only a read-only descriptor)."""
    from schemas.judges import Endpoint

    from tests.otheruser import umask

    ep = Endpoint(backend="openai", base_url="http://127.0.0.1:9/v1", model="m", concurrency=2, requests_per_minute=60)
    with umask(0o022):
        limiter = limiter_for("alpha", ep, LimitScope("files", str(reachable_tmp)), "http://127.0.0.1:9/v1")
        limiter.pause(0.01)  # writes rate.json
    folder = reachable_tmp / "judge-limits" / limiter.key
    files = sorted(folder.iterdir())
    assert [p.name for p in files] == ["rate.json", "slot-0", "slot-1"]
    assert (reachable_tmp / "judge-limits").stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in files)
    attack = other_user.run("import fcntl, sys\nheld = 0\nfor p in sys.argv[1:]:\n    try:\n"
                            "        fcntl.flock(open(p, 'rb'), fcntl.LOCK_EX | fcntl.LOCK_NB)\n        held += 1\n"
                            "    except OSError:\n        pass\nprint(held)\n", *map(str, files))
    assert attack.returncode == 0 and attack.stdout.strip() == "0", attack.stderr


def test_tokens_are_estimated_from_the_endpoints_usage_and_charged_what_was_used(make_item) -> None:
    # The fake reports usage 321 prompt + 12 completion tokens per answer.
    items = [make_item(prompt=f"a fox {i}") for i in range(3)]
    with FakeOpenAI(responder=lambda r: Reply(text=PASS_TEXT)) as srv:
        ep = endpoint(srv, concurrency=1, tokens_per_minute=60_000, max_tokens=16)
        t0 = time.monotonic()
        run = judge_items(items, make_routing("alpha", None), config(alpha=ep), retry=FAST)
        elapsed = time.monotonic() - t0
        limiter = limiter_for("alpha", ep, None, srv.base_url)
    assert run.verdicts["verdict"].to_pylist() == ["PASS"] * 3
    assert limiter.estimate_tokens(16) == 16 + 321  # max_tokens plus the largest prompt reported
    # One at a time: the first request was charged 16 (no prompt seen yet) and used 333, 317 owed;
    # the next two were charged 337 each (more than they used: nothing back). The bucket (60,000,
    # refilled at 1,000 a second meanwhile) is down by 1,007, less what refilled during the run.
    state = limiter._state.transact(lambda s, now: (s, s))
    spent = 60_000 - state.tokens.level
    assert 1_007 - 1_000 * elapsed - 1 <= spent <= 1_007 + 1e-6
