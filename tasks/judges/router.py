"""Route each image to its category's judges and record every attempt and every decision.

``judge_items(items, routing, judges_config)`` -> ``JudgeRun`` (unpacks as ``calls, verdicts``:
pyarrow tables with the lake schemas ``JUDGE_CALLS`` and ``VERDICTS``).

Per item:
1. The chain is ``[route.preferred, route.fallback]`` minus judges that are not configured (the
   built-in ``ocr`` counts as configured when Tesseract is installed). Empty chain: the item is
   *not judged* (no request, no verdict row; listed in ``JudgeRun.not_judged``).
2. Skip: the verdict identity (image sha256, prompt id, question, judge model, template sha256,
   sampling) of every judge in the chain is computed first; if any is in ``known_identities``
   the item is skipped, unless ``rejudge=True``.
3. Each judge: one attempt per request; HTTP 429/5xx/timeouts/connection errors are retried up to
   ``endpoint.max_retries`` times with exponential backoff + jitter, waiting at least what
   ``Retry-After`` asks; malformed responses are retried ``RetryPolicy.bad_response_retries``
   times; an answer without a final verdict line is re-asked ``routing.unparsable_retries``
   times. PASS/FAIL decides. Otherwise the next judge in the chain is asked.
4. Nothing decided: ``UNPARSABLE`` when some judge answered without a verdict line, else
   ``ERROR``; ``reason`` lists what each judge did.
5. ``route.ocr_evidence``: the OCR judge runs beside the chain; a final PASS needs the VLM's PASS
   *and* OCR's PASS (OCR FAIL -> FAIL, OCR unable -> ERROR). The deciding judge is recorded as
   ``<vlm>+ocr``.

A judge found absent or misconfigured (connection refused, HTTP 401/403/404, missing API key,
answering for another model) is taken out of the run: later items go straight to the fallback.

All requests run concurrently on one event loop (one httpx client per endpoint); each endpoint's
limits (``concurrency``, requests and tokens per minute) are its process-wide limiter's
(``tasks/judges/limits.py``), shared with every other task of the run as ``limits`` (a
``LimitScope``) says. The function is synchronous for its caller (a Prefect task).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Sequence

import pyarrow as pa

from schemas.judges import JudgesConfig, Routing
from schemas.lake import JUDGE_CALLS, VERDICTS
from schemas.suite import CATEGORIES

from .base import (
    Judge,
    JudgeBadResponse,
    JudgeError,
    JudgeIdentity,
    JudgeInputError,
    JudgeModelMismatch,
    JudgeRequest,
    JudgeUnavailable,
    redact,
)
from .config import check_routing_against, routing_judges
from .limits import LimitScope
from .protocol import (
    ERROR,
    FAIL,
    PASS,
    UNPARSABLE,
    canonical_json,
    parse_verdict,
    question_sha256,
    sha256_text,
    verdict_identity,
)
from .registry import BUILTIN_JUDGES, builtin_endpoint, create_judge

log = logging.getLogger("imagebench.judges")

OCR = "ocr"
# Verdict states that settle an identity: a re-run does not ask again (ERROR is retried).
SETTLED_VERDICTS = (PASS, FAIL, UNPARSABLE)


# --- inputs -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JudgeItem:
    """One image to judge: a (model, prompt) of the suite with its ingested image."""

    model_id: str
    prompt_id: str
    suite_version: str
    category: str
    image_path: Path
    image_sha256: str
    prompt: str
    question: str

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> "JudgeItem":
        missing = [f for f in cls.__dataclass_fields__ if row.get(f) in (None, "")]
        if missing:
            raise ValueError(f"judge item {row.get('model_id')}/{row.get('prompt_id')}: missing {missing}")
        return cls(**{f: (Path(row[f]) if f == "image_path" else str(row[f])) for f in cls.__dataclass_fields__})


def make_items(
    suite: Any,
    model_id: str,
    images: Iterable[Mapping[str, Any]],
    image_root: str | Path | None = None,
) -> list[JudgeItem]:
    """Items for one model from a suite (``tasks.scores.suite.Suite``) and its ``images`` rows (only
    ``state == "ok"`` rows are used; relative ``image_path`` resolved against ``image_root``)."""
    root = Path(image_root) if image_root is not None else None
    out = []
    for row in images:
        if row.get("state", "ok") != "ok":
            continue
        p = suite.by_id[row["prompt_id"]]
        path = Path(row["image_path"])
        if root is not None and not path.is_absolute():
            path = root / path
        out.append(
            JudgeItem(
                model_id=model_id,
                prompt_id=p.prompt_id,
                suite_version=suite.version,
                category=p.category,
                image_path=path,
                image_sha256=row["image_sha256"],
                prompt=p.prompt,
                question=p.question,
            )
        )
    return out


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for retryable failures: attempt n waits ``min(max, base * 2**(n-1))`` scaled by a
    random factor in [1 - jitter, 1], and never less than the server's ``Retry-After`` (the
    larger of the two, plus up to 0.1 s of jitter). A ``Retry-After`` above ``max_retry_after_s`` is not
    waited for: the judge counts as unavailable."""

    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    jitter: float = 0.5
    max_retry_after_s: float = 120.0
    bad_response_retries: int = 2  # malformed / empty responses, bounded also by endpoint.max_retries
    seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rng", random.Random(self.seed))

    def delay(self, retry: int, retry_after_s: float | None = None) -> float | None:
        """Seconds to wait before retry number ``retry`` (1-based); None = do not retry."""
        rng: random.Random = self._rng  # type: ignore[attr-defined]
        backoff = min(self.backoff_max_s, self.backoff_base_s * 2 ** (retry - 1))
        backoff *= 1 - self.jitter * rng.random()
        if retry_after_s is None:
            return backoff
        if retry_after_s > self.max_retry_after_s:
            return None
        return max(retry_after_s, backoff) + 0.1 * min(retry_after_s, 1.0) * rng.random()


# --- outputs ------------------------------------------------------------------------------------
@dataclass
class JudgeRun:
    """What :func:`judge_items` did. Unpacks as ``calls, verdicts``."""

    calls: pa.Table
    verdicts: pa.Table
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (model_id, prompt_id): identity already in the lake
    not_judged: list[tuple[str, str, str]] = field(default_factory=list)  # (model_id, prompt_id, reason)

    def __iter__(self) -> Iterator[pa.Table]:
        yield self.calls
        yield self.verdicts

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for v in self.verdicts.column("verdict").to_pylist():
            counts[v] = counts.get(v, 0) + 1
        states = ", ".join(f"{k} {counts[k]}" for k in (PASS, FAIL, ERROR, UNPARSABLE) if k in counts) or "none"
        return (
            f"{self.verdicts.num_rows} verdict(s) ({states}) from {self.calls.num_rows} call(s); "
            f"{len(self.skipped)} skipped (already judged), {len(self.not_judged)} not judged"
        )


def settled_identities(verdicts: Any) -> set[str]:
    """Identities a re-run must not request again: those of PASS / FAIL / UNPARSABLE verdicts
    (``verdicts``: a pyarrow Table, a polars/pandas DataFrame, or rows as mappings). ERROR
    verdicts are not settled: the next run tries again."""
    if hasattr(verdicts, "to_pylist"):  # pyarrow
        rows = verdicts.select(["identity", "verdict"]).to_pylist()
    elif hasattr(verdicts, "to_dicts"):  # polars
        rows = verdicts.select(["identity", "verdict"]).to_dicts()
    elif hasattr(verdicts, "to_dict") and hasattr(verdicts, "columns"):  # pandas
        rows = verdicts[["identity", "verdict"]].to_dict("records")
    else:
        rows = list(verdicts)
    return {r["identity"] for r in rows if r.get("verdict") in SETTLED_VERDICTS and r.get("identity")}


# --- internals ----------------------------------------------------------------------------------
@dataclass
class _Result:
    status: str  # "decided" | "unparsable" | "error" | "skipped" (judge down, not asked)
    identity: JudgeIdentity
    verdict: str | None = None
    rationale: str | None = None
    reason: str | None = None


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _composite_identity(vlm: JudgeIdentity, ocr: JudgeIdentity) -> JudgeIdentity:
    import json

    return JudgeIdentity(
        judge=f"{vlm.judge}+{ocr.judge}",
        judge_model=f"{vlm.judge_model}+{ocr.judge_model}",
        endpoint=vlm.endpoint,
        template=f"{vlm.template}+{ocr.template}",
        template_sha256=sha256_text(f"{vlm.template_sha256}+{ocr.template_sha256}"),
        sampling=canonical_json({"ocr": json.loads(ocr.sampling), "vlm": json.loads(vlm.sampling)}),
    )


def _item_identity(item: JudgeItem, ident: JudgeIdentity) -> str:
    return verdict_identity(
        item.image_sha256, item.prompt_id, item.question, ident.judge_model, ident.template_sha256, ident.sampling
    )


class _Runner:
    def __init__(
        self,
        routing: Routing,
        judges: Mapping[str, Judge],
        down: dict[str, str],
        policy: RetryPolicy,
        known: Collection[str],
        rejudge: bool,
        not_configured: Mapping[str, str],
    ) -> None:
        self.routing = routing
        self.judges = judges
        self.down = down
        self.policy = policy
        self.known = known
        self.rejudge = rejudge
        self.not_configured = not_configured
        self.calls: list[dict[str, Any]] = []
        self.verdicts: list[dict[str, Any]] = []
        self.skipped: list[tuple[str, str]] = []
        self.not_judged: list[tuple[str, str, str]] = []

    # one call row per attempt ------------------------------------------------------------------
    def _record(
        self,
        item: JudgeItem,
        ident: JudgeIdentity,
        attempt: int,
        outcome: str,
        requested_at: datetime,
        *,
        error: str | None = None,
        raw_text: str | None = None,
        reported_model: str | None = None,
        latency_s: float | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
    ) -> None:
        self.calls.append(
            {
                "model_id": item.model_id,
                "prompt_id": item.prompt_id,
                "image_sha256": item.image_sha256,
                "judge": ident.judge,
                "judge_model": ident.judge_model,
                "reported_model": reported_model,
                "endpoint": ident.endpoint,
                "template": ident.template,
                "template_sha256": ident.template_sha256,
                "sampling": ident.sampling,
                "attempt": attempt,
                "outcome": outcome,
                "error": redact(error),
                "raw_text": redact(raw_text),
                "latency_s": latency_s,
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "requested_at": requested_at,
            }
        )

    async def ask_judge(self, judge: Judge, item: JudgeItem, route_template: str) -> _Result:
        """One judge on one item, with its retries; every attempt recorded."""
        ident = judge.identity_for(route_template)
        if judge.name in self.down:
            return _Result(
                "skipped", ident, reason=f"{judge.name}: not asked, unavailable in this run ({self.down[judge.name]})"
            )
        request = JudgeRequest(
            model_id=item.model_id,
            prompt_id=item.prompt_id,
            image_path=Path(item.image_path),
            image_sha256=item.image_sha256,
            prompt=item.prompt,
            question=item.question,
            template=judge.template_for(route_template),
        )
        ep = judge.endpoint
        max_bad = min(self.policy.bad_response_retries, ep.max_retries)
        attempt = transient = bad = unparsable = 0
        while True:
            attempt += 1
            requested_at = _now()
            t0 = time.perf_counter()
            try:
                answer = await judge.ask(request)
            except JudgeError as exc:
                msg = redact(str(exc)) or type(exc).__name__
                latency = exc.latency_s if exc.latency_s is not None else time.perf_counter() - t0
                self._record(item, ident, attempt, ERROR, requested_at, error=msg, latency_s=latency)
                if isinstance(exc, JudgeModelMismatch) or (isinstance(exc, JudgeUnavailable) and exc.judge_down):
                    if judge.name not in self.down:
                        log.warning("judge %s taken out of this run: %s", judge.name, msg)
                    self.down.setdefault(judge.name, msg)
                    return _Result("error", ident, reason=f"{judge.name}: {msg}")
                if isinstance(exc, JudgeUnavailable) and exc.retryable and transient < ep.max_retries:
                    delay = self.policy.delay(transient + 1, exc.retry_after_s)
                    if delay is not None:
                        transient += 1
                        await asyncio.sleep(delay)
                        continue
                    return _Result(
                        "error",
                        ident,
                        reason=f"{judge.name}: {msg} (Retry-After above {self.policy.max_retry_after_s:g} s)",
                    )
                if isinstance(exc, JudgeBadResponse) and bad < max_bad:
                    bad += 1
                    await asyncio.sleep(self.policy.delay(bad) or 0.0)
                    continue
                if isinstance(exc, JudgeUnavailable):
                    return _Result(
                        "error", ident, reason=f"{judge.name}: unavailable after {attempt} attempt(s): {msg}"
                    )
                if isinstance(exc, JudgeInputError):
                    return _Result("error", ident, reason=f"{judge.name}: {msg}")
                return _Result("error", ident, reason=f"{judge.name}: {msg} (after {attempt} attempt(s))")
            except Exception as exc:  # a backend bug: record it, keep the run going
                log.exception("judge %s failed on %s/%s", judge.name, item.model_id, item.prompt_id)
                msg = redact(f"{type(exc).__name__}: {exc}")
                self._record(item, ident, attempt, ERROR, requested_at, error=msg, latency_s=time.perf_counter() - t0)
                return _Result("error", ident, reason=f"{judge.name}: {msg}")
            outcome, rationale = parse_verdict(answer.raw_text)
            self._record(
                item,
                ident,
                attempt,
                outcome,
                requested_at,
                raw_text=answer.raw_text,
                reported_model=answer.reported_model,
                latency_s=answer.latency_s,
                prompt_tokens=answer.prompt_tokens,
                completion_tokens=answer.completion_tokens,
            )
            if outcome == UNPARSABLE:
                if unparsable < self.routing.unparsable_retries:
                    unparsable += 1
                    continue
                return _Result(
                    "unparsable", ident, reason=f"{judge.name}: no final verdict line in {unparsable + 1} answer(s)"
                )
            return _Result("decided", ident, verdict=outcome, rationale=rationale)

    async def run_chain(self, chain: Sequence[str], item: JudgeItem, route_template: str) -> _Result:
        notes: list[str] = []
        answered_unparsable = False
        last: _Result | None = None
        for name in chain:
            res = await self.ask_judge(self.judges[name], item, route_template)
            if res.status == "decided":
                return res
            notes.append(res.reason or f"{name}: failed")
            if res.status == "unparsable":
                answered_unparsable = True
            if res.status != "skipped" or last is None:
                last = res
        assert last is not None
        state = UNPARSABLE if answered_unparsable else ERROR
        return _Result(state.lower(), last.identity, reason="; ".join(notes))

    def _verdict_row(
        self, item: JudgeItem, ident: JudgeIdentity, verdict: str, reason: str | None, rationale: str | None
    ) -> dict[str, Any]:
        return {
            "model_id": item.model_id,
            "prompt_id": item.prompt_id,
            "suite_version": item.suite_version,
            "image_sha256": item.image_sha256,
            "question_sha256": question_sha256(item.question),
            "verdict": verdict,
            "reason": redact(reason),
            "judge": ident.judge,
            "judge_model": ident.judge_model,
            "template_sha256": ident.template_sha256,
            "sampling": ident.sampling,
            "identity": _item_identity(item, ident),
            "rationale": redact(rationale) if rationale else None,
            "source": "judged",
            "decided_at": _now(),
        }

    async def judge_one(self, item: JudgeItem) -> None:
        route = self.routing.routes[item.category]
        wanted = [n for n in (route.preferred, route.fallback) if n]
        chain = [n for n in wanted if n in self.judges]
        if not chain:
            why = "; ".join(f"{n}: {self.not_configured.get(n, 'not configured')}" for n in wanted)
            self.not_judged.append((item.model_id, item.prompt_id, f"no judge available for {item.category!r} ({why})"))
            return
        evidence = route.ocr_evidence and route.preferred != OCR
        if evidence and OCR not in self.judges:
            self.not_judged.append(
                (
                    item.model_id,
                    item.prompt_id,
                    f"{item.category!r} needs OCR evidence: {self.not_configured.get(OCR, 'not configured')}",
                )
            )
            return
        idents = {n: self.judges[n].identity_for(route.template) for n in chain}
        if evidence:
            ocr_ident = self.judges[OCR].identity_for(route.template)
            idents = {n: _composite_identity(i, ocr_ident) for n, i in idents.items()}
        if not self.rejudge and any(_item_identity(item, i) in self.known for i in idents.values()):
            self.skipped.append((item.model_id, item.prompt_id))
            return

        if not evidence:
            res = await self.run_chain(chain, item, route.template)
            if res.status == "decided":
                self.verdicts.append(self._verdict_row(item, res.identity, res.verdict, None, res.rationale))  # type: ignore[arg-type]
            else:
                self.verdicts.append(self._verdict_row(item, res.identity, res.status.upper(), res.reason, None))
            return

        vlm_res, ocr_res = await asyncio.gather(
            self.run_chain(chain, item, route.template), self.ask_judge(self.judges[OCR], item, route.template)
        )
        ident = _composite_identity(vlm_res.identity, ocr_res.identity)
        if vlm_res.status != "decided":
            self.verdicts.append(self._verdict_row(item, ident, vlm_res.status.upper(), vlm_res.reason, None))
        elif vlm_res.verdict == FAIL:
            self.verdicts.append(self._verdict_row(item, ident, FAIL, None, vlm_res.rationale))
        elif ocr_res.status != "decided":
            reason = f"OCR evidence required for a PASS: {ocr_res.reason}"
            self.verdicts.append(self._verdict_row(item, ident, ERROR, reason, None))
        else:
            rationale = f"{vlm_res.rationale}\n\nOCR evidence: {ocr_res.rationale}"
            self.verdicts.append(self._verdict_row(item, ident, ocr_res.verdict, None, rationale))  # type: ignore[arg-type]


def _build_judges(
    routing: Routing, judges_config: JudgesConfig | None, injected: Mapping[str, Judge] | None,
    limits: LimitScope | None = None,
) -> tuple[dict[str, Judge], dict[str, str], dict[str, str]]:
    """(judges usable in this run, judges down from the start, not-configured reasons). Judges
    built here share their endpoint's limits as ``limits`` says."""
    configured = dict(judges_config.judges) if judges_config else {}
    judges: dict[str, Judge] = {}
    down: dict[str, str] = {}
    absent: dict[str, str] = {}
    for name in routing_judges(routing):
        if injected and name in injected:
            judge = injected[name]
        elif name in configured:
            judge = create_judge(name, configured[name])
            judge.bind_limits(limits)
        elif name in BUILTIN_JUDGES:
            judge = create_judge(name, builtin_endpoint(name))
            reason = judge.unavailable_reason()
            if reason:  # the implicit built-in judge is simply absent without its engine
                absent[name] = reason
                continue
        else:
            absent[name] = "not configured"
            continue
        reason = judge.unavailable_reason()
        if reason:
            down[name] = reason
        judges[name] = judge
    return judges, down, absent


def _table(rows: list[dict[str, Any]], schema: pa.Schema, sort: Sequence[str]) -> pa.Table:
    rows = sorted(rows, key=lambda r: tuple(r[k] for k in sort))
    return pa.Table.from_pylist(rows, schema=schema)


async def ajudge_items(
    items: Iterable[JudgeItem | Mapping[str, Any]],
    routing: Routing,
    judges_config: JudgesConfig | None,
    *,
    known_identities: Collection[str] = frozenset(),
    rejudge: bool = False,
    retry: RetryPolicy | None = None,
    judges: Mapping[str, Judge] | None = None,
    max_active_items: int | None = None,
    progress: Callable[[int], None] | None = None,
    limits: LimitScope | None = None,
) -> JudgeRun:
    """The async form of :func:`judge_items` (for callers that already run an event loop)."""
    check_routing_against(routing, judges_config)
    todo = [i if isinstance(i, JudgeItem) else JudgeItem.from_mapping(i) for i in items]
    seen: set[tuple[str, str]] = set()
    for it in todo:
        if it.category not in CATEGORIES or it.category not in routing.routes:
            raise ValueError(f"judge item {it.model_id}/{it.prompt_id}: unknown category {it.category!r}")
        key = (it.model_id, it.prompt_id)
        if key in seen:
            raise ValueError(f"judge item {it.model_id}/{it.prompt_id} given twice")
        seen.add(key)
    usable, down, absent = _build_judges(routing, judges_config, judges, limits)
    for name, reason in down.items():
        log.warning("judge %s is unavailable: %s", name, reason)
    runner = _Runner(routing, usable, down, retry or RetryPolicy(), known_identities, rejudge, absent)
    # Bound the items in flight (each holds file handles / futures), generously above the
    # endpoints' own concurrency so every endpoint stays busy.
    cap = max_active_items or max(64, 4 * sum(j.endpoint.concurrency for j in usable.values()))
    gate = asyncio.Semaphore(cap)

    async def one(it: JudgeItem) -> None:
        async with gate:
            await runner.judge_one(it)
        if progress is not None:
            progress(1)

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(one(it) for it in todo))
    finally:
        for j in usable.values():
            if not (judges and j.name in judges):  # injected judges belong to the caller
                await j.aclose()
    run = JudgeRun(
        calls=_table(runner.calls, JUDGE_CALLS, ("model_id", "prompt_id", "requested_at", "judge", "attempt")),
        verdicts=_table(runner.verdicts, VERDICTS, ("model_id", "prompt_id")),
        skipped=sorted(runner.skipped),
        not_judged=sorted(runner.not_judged),
    )
    log.info("judged %d item(s) in %.1f s: %s", len(todo), time.perf_counter() - t0, run.summary())
    return run


def judge_items(
    items: Iterable[JudgeItem | Mapping[str, Any]],
    routing: Routing,
    judges_config: JudgesConfig | None,
    *,
    known_identities: Collection[str] = frozenset(),
    rejudge: bool = False,
    retry: RetryPolicy | None = None,
    judges: Mapping[str, Judge] | None = None,
    max_active_items: int | None = None,
    progress: Callable[[int], None] | None = None,
    limits: LimitScope | None = None,
) -> JudgeRun:
    """Judge ``items`` (``JudgeItem`` or mappings with its fields) as ``routing`` says, with the
    endpoints of ``judges_config``. Returns ``JudgeRun`` (unpacks as ``calls, verdicts``).

    ``known_identities``: verdict identities already in the lake (see :func:`settled_identities`);
    items whose identity is among them are not requested again unless ``rejudge``.
    ``judges``: ready judge instances by name (override the config; for tests and reuse).
    ``progress(n)``: called as items finish (decided, skipped or not judged), from the loop's thread.
    ``limits``: who shares the endpoints' limits (``tasks.judges.limits.LimitScope``; default:
    this process).
    Runs its own event loop (in a helper thread when the caller's thread already runs one)."""

    def run() -> JudgeRun:
        return asyncio.run(
            ajudge_items(
                items,
                routing,
                judges_config,
                known_identities=known_identities,
                rejudge=rejudge,
                retry=retry,
                judges=judges,
                max_active_items=max_active_items,
                progress=progress,
                limits=limits,
            )
        )

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="judges") as pool:
        return pool.submit(run).result()
