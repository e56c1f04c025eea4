"""Prefect flows: score one model (also the backfill path), nightly, and reference build.

Flows only compose the units in ``tasks.runs``; each Prefect task is a thin wrapper. HPSv3
batches are tagged ``gpu`` so a tag concurrency limit (``IMAGEBENCH_GPU_CONCURRENCY``, default
1 per API) governs them while ingest of the next model overlaps inference of the previous one.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.context import get_run_context

from schemas import lake as lake_schemas
from schemas.reference import ReferenceFile
from schemas.settings import Settings, load_settings
from flows import runners
from tasks.runs import progress, state as runstate
from tasks.runs import pinned, run_ids, units_aggregate, units_discover, units_hps, units_ingest, units_judge
from tasks.scores.golden import CanaryDrift, GoldenSetError
from tasks.lake.tables import LakeCorrupt
from tasks.runs.locks import ModelBusy, model_lock
from tasks.store.redact import redact
from tasks.runs.record import RunRecord
from tasks.scores.suite import Suite

GPU_TAG = "gpu"
# Errors that stop the whole run rather than one model: the golden-set canary's.
REFUSE_RUN = (CanaryDrift, GoldenSetError)
MODELS_PER_WAVE = 64  # models whose ingest/HPSv3/judging overlap in one nightly wave
AGGREGATE_WAVE = 256  # models re-aggregated in one pass by reference build (one open lock file each)
INGEST_AHEAD = 2  # ingests in flight ahead of the model being planned


# ---- thin task wrappers ---------------------------------------------------------------------
# Each returns its result with the seconds it spent, measured where it ran (a Dask worker may be
# another process), for the run record's per-stage timings.


def _timed(fn, *args):
    t0 = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - t0


@task(name="ingest", cache_policy=NO_CACHE)
def ingest_task(settings: Settings, suite: Suite, model_id: str) -> tuple[units_ingest.IngestSummary, float]:
    return _timed(units_ingest.ingest_and_stage, settings, suite, model_id)


@task(name="hpsv3-batch", tags=[GPU_TAG], cache_policy=NO_CACHE)
def hps_batch_task(settings: Settings, suite: Suite, batch: units_hps.HpsBatch, spec: pinned.ScorerSpec) -> tuple[Path, float]:
    return units_hps.score_hps_batch_timed(settings, suite, batch, spec)  # inference seconds, not device waits


@task(name="golden-canary", tags=[GPU_TAG], cache_policy=NO_CACHE)
def canary_task(settings: Settings, reference: ReferenceFile, spec: pinned.ScorerSpec):
    return pinned.check_runtime(settings, reference, spec)


@task(name="golden-set", tags=[GPU_TAG], cache_policy=NO_CACHE)
def golden_task(settings: Settings, spec: pinned.ScorerSpec):
    return pinned.golden_for_reference(settings, spec)


@task(name="judge-batch", cache_policy=NO_CACHE)
def judge_batch_task(
    settings: Settings, setup: units_judge.JudgeSetup, items: list, known: frozenset, rejudge: bool
) -> tuple[Path | None, float]:
    return _timed(units_judge.judge_batch, settings, setup, items, known, rejudge)


@task(name="commit-model", cache_policy=NO_CACHE)
def commit_task(
    settings: Settings, suite: Suite, reference: ReferenceFile | None, model_id: str, scorer_id: str,
    hps_shards: list[Path], judge_shards: list, run_id: str,
) -> tuple[units_discover.CommitResult, float]:
    return _timed(units_discover.commit_model, settings, suite, reference, model_id, scorer_id, hps_shards, judge_shards, run_id)


@task(name="aggregate", cache_policy=NO_CACHE)
def aggregate_task(
    settings: Settings, suite: Suite, reference: ReferenceFile, model_id: str, run_id: str, fingerprint: str | None
) -> dict:
    return units_aggregate.aggregate_model(settings, suite, reference, model_id, run_id, fingerprint)


@task(name="refresh-catalog", cache_policy=NO_CACHE)
def refresh_task(settings: Settings, suite: Suite) -> tuple[Path, float]:
    return _timed(units_aggregate.refresh, settings, suite)


# ---- one run --------------------------------------------------------------------------------


class RunFailed(RuntimeError):
    """Raised at the end of a run that committed what it could but had errors (the run record
    and the artifact list them): the Prefect flow run ends Failed, so alerts fire."""


def _settings_for_run(suite_version: str | None = None, reference_version: str | None = None) -> Settings:
    overrides = {k: v for k, v in (("suite_version", suite_version), ("reference_version", reference_version)) if v}
    return load_settings(**overrides)


def _run_id() -> str:
    ctx = get_run_context()
    return str(getattr(getattr(ctx, "flow_run", None), "id", None) or run_ids.new_run_id())


def ensure_gpu_limit(limit: int) -> None:
    """The cluster-wide `gpu` tag concurrency limit, on a real Prefect server only.

    On a server, a slot held by a task run whose process was killed is reclaimed when its lease
    (60 s) expires. The embedded (ephemeral) API runs no such service, and a killed command
    would leave its slot taken forever, blocking every later run; it serves one process anyway,
    so there the limit is removed and the per-process GPU semaphore (units_hps.score_hps_batch,
    IMAGEBENCH_GPU_CONCURRENCY) is what bounds concurrent inference.
    """
    from prefect.settings import get_current_settings

    from flows.warm import embedded_api_url

    with get_client(sync_client=True) as client:
        url = get_current_settings().api.url
        if url and url != embedded_api_url():  # the warm server's API is an embedded one too
            client.create_concurrency_limit(tag=GPU_TAG, concurrency_limit=limit)
            return
        try:
            client.delete_concurrency_limit_by_tag(tag=GPU_TAG)
        except ObjectNotFound:
            pass


def judge_setup(settings: Settings) -> units_judge.JudgeSetup:
    """The routing and endpoints in force, with who shares each endpoint's limits in this run
    (flows.runners.judge_limit_scope: this machine's lock files, or the Prefect server's)."""
    return replace(units_judge.load_judge_setup(settings), limits=runners.judge_limit_scope(settings))


@dataclass
class Run:
    """What every step of one flow run needs, and its run record."""

    settings: Settings
    suite: Suite
    reference: ReferenceFile | None
    record: RunRecord
    spec: pinned.ScorerSpec | None = None
    setup: units_judge.JudgeSetup | None = None
    rejudge: bool = False
    canary: object | None = None  # tasks.scores.golden.CanaryResult, once the run has checked its runtime

    def check_runtime(self) -> None:
        """Before the run's first HPSv3 batch, the golden-set canary where the batches run (a
        GPU worker): CanaryDrift propagates and the run refuses before anything is scored."""
        if self.canary is not None:
            return
        with runners.gpu_request():
            future = canary_task.submit(self.settings, self.reference, self.spec)
        self.record.add(prefect_tasks=1)
        self.canary = future.result()
        self.record.runtime = self.canary.runtime.to_json()
        self.record.canary_max_drift = self.canary.max_drift
        get_run_logger().info("%s", self.canary.describe())

    @property
    def run_id(self) -> str:
        return self.record.run_id

    def model_failed(self, model_id: str, exc: BaseException) -> None:
        """Record one model's failure; the other models go on. A corrupt lake file is moved
        aside (kept, never deleted) so the next run recomputes that model from its images."""
        logger = get_run_logger()
        message = redact(f"{type(exc).__name__}: {exc}")
        logger.error("%s failed: %s", model_id, message)
        self.record.error(model_id, message)
        if isinstance(exc, LakeCorrupt):
            set_aside_corrupt(self, [model_id], full=True)


def _start_run(flow_name: str, settings: Settings, parameters: dict) -> RunRecord:
    """The run's record, written to the lake as `running` now and at each stage (tasks.runs.state),
    so a killed run shows as `crashed` with how far it got; earlier runs whose process died are
    settled as such first."""
    ctx = get_run_context()
    flow_run = getattr(ctx, "flow_run", None)
    record = RunRecord(
        run_id=_run_id(),
        flow=flow_name,
        suite_version=settings.suite_version,
        reference_version=settings.reference_version,
        parameters=parameters,
        flow_run_id=str(flow_run.id) if flow_run else None,
        deployment=str(flow_run.deployment_id) if flow_run and flow_run.deployment_id else None,
    )
    logger = get_run_logger()
    try:
        for row in runstate.settle_crashed(settings.home, settings.lake_dir):
            logger.warning("%s", runstate.describe(row))
        runstate.RunJournal(settings.home, settings.lake_dir, record).start()
    except Exception as exc:  # noqa: BLE001 - as in _finish_run: the record must not stop the run
        logger.error("could not write the start of the run record to the lake: %s", redact(str(exc)))
    return record


def _finish_run(settings: Settings, record: RunRecord, error: BaseException | None = None) -> dict:
    """Write the run record to the lake and as a markdown artifact, whatever happened. If the
    lake cannot take it (disk full), the record still goes to the log and the artifact."""
    logger = get_run_logger()
    failed = error is not None or record.failed
    message = redact(f"{type(error).__name__}: {error}") if error is not None else None
    if message is None and record.failed:
        message = f"{len(record.errors)} error(s), {len(record.corrupt_files)} corrupt lake file(s): see errors"
    row = record.row("failed" if failed else "completed", message)
    try:
        from tasks.lake.tables import Lake
        from tasks.lake.validation import require_valid

        require_valid("runs", pa.Table.from_pylist([row], schema=lake_schemas.RUNS))
        Lake(settings.lake_dir).write_run(row)
    except Exception as exc:  # noqa: BLE001 - the record must not hide the run's own outcome
        logger.error("could not write the run record to the lake: %s", redact(str(exc)))
    finally:
        if record.journal is not None:
            record.journal.release()  # after the final record: a reader never takes it for crashed
    markdown = record.markdown(row)
    try:
        create_markdown_artifact(markdown=markdown, key=f"imagebench-{record.flow}", description=f"{record.flow} run {record.run_id}")
    except Exception as exc:  # noqa: BLE001
        logger.error("could not create the run artifact: %s", redact(str(exc)))
    logger.info("run %s %s: %s", record.run_id, row["status"], json.dumps(
        {k: row[k] for k in ("models_new", "models_incremental", "models_replaced", "models_errored", "errors")}, default=str))
    return row


def set_aside_corrupt(run: Run, model_ids: list[str] | None = None, full: bool = False, every_footer: bool = False) -> set[str]:
    """Detect unreadable partition files, move each to <lake>/_corrupt/ (kept for inspection)
    and record it. Returns the affected models: their rows in that table are gone, so the run
    must ingest them again (whatever is missing is then recomputed from their images). Never a
    silent drop: each file shows in the run record. The whole lake (no ``model_ids``): only the
    files changed since a catalog refresh read them whole (tasks/lake/check.py), unless
    ``every_footer``."""
    from tasks.lake.tables import Lake

    lake = Lake(run.settings.lake_dir)
    logger = get_run_logger()
    affected = set()
    if model_ids is None and not full and not every_footer:
        from tasks.lake.check import check_changed

        checked = check_changed(lake)
        found = checked.corrupt
        logger.info("lake check: %d of %d files changed since the last catalog refresh read them whole, footers read",
                    checked.opened, checked.files)
    else:
        found = lake.find_corrupt(model_ids, full=full)
    for table, model_id, path, detail in found:
        dest = lake.set_aside(table, model_id, f"{detail} (run {run.run_id})")
        note = f"{path} ({table}, model {model_id}): {detail} -> moved to {dest}"
        logger.error("corrupt lake file: %s", note)
        run.record.corrupt(note)
        affected.add(model_id)
    return affected


def _submit_judging(run: Run, model_id: str) -> list:
    if run.setup is None:
        return []
    items, known = units_judge.plan_judge_items(run.settings, run.suite, model_id, run.rejudge)
    if items:
        progress.advance(f"judge {model_id}", len(items), 0)
    size = run.settings.judge_task_size
    futures = [
        judge_batch_task.submit(run.settings, run.setup, items[i : i + size], known, run.rejudge)
        for i in range(0, len(items), size)
    ]
    run.record.add(judge_items=len(items), prefect_tasks=len(futures))
    return futures


def _lock_models(run: Run, stack: ExitStack, model_ids: list[str], refuse_busy: bool) -> list[str]:
    """Take each model's lock; a busy model is skipped (nightly) or refused (backfill)."""
    locked = []
    for model_id in model_ids:
        try:
            stack.enter_context(
                model_lock(run.settings.home, model_id, run.run_id, wait_s=run.settings.model_lock_wait_s)
            )
        except ModelBusy as exc:
            if refuse_busy:
                raise
            get_run_logger().warning("skipping %s: %s", model_id, exc)
            run.record.mark(model_id, "busy")
            continue
        locked.append(model_id)
    return locked


def _score_models(run: Run, model_ids: list[str], refuse_busy: bool = False) -> list[dict]:
    """Ingest all models concurrently; as soon as a model is ingested its HPSv3 batches (tagged
    `gpu`) and its judge requests are submitted side by side, so neither waits on the other.
    Each model is committed on its own: one model's failure is recorded and the others go on."""
    logger = get_run_logger()
    settings, suite, record = run.settings, run.suite, run.record
    scorer_id = run.reference.scorer_id
    rows: list[dict] = []
    with ExitStack() as locks:
        model_ids = _lock_models(run, locks, model_ids, refuse_busy)
        few = len(model_ids) <= 8  # record every step; with more models, at most once a second
        record.enter("ingest", force=True)
        # Ingest stays INGEST_AHEAD models ahead of planning: a model's HPSv3 batches queue right
        # behind its ingest, so the device starts after the first model, not after all of them.
        ingests: dict[str, object] = {}
        waiting = list(model_ids)

        def ingest_next() -> None:
            if waiting:
                m = waiting.pop(0)
                ingests[m] = ingest_task.submit(settings, suite, m)
                record.add(prefect_tasks=1)

        for _ in range(INGEST_AHEAD):
            ingest_next()
        batches: dict[str, list] = {}
        judging: dict[str, list] = {}
        for model_id in model_ids:
            fut = ingests[model_id]
            ingest_next()
            try:
                summary, seconds = fut.result()
                record.timed("ingest", seconds)
                record.add(images_ok=summary.images_ok, images_quarantined=summary.images_quarantined,
                           images_missing=summary.images_missing)
                disposition = units_discover.classify(settings, suite, run.reference, model_id)
                record.mark(model_id, disposition)
                plan = units_hps.plan_hps_batches(
                    settings, suite, model_id, scorer_id, settings.task_batch_size, whole=disposition == "replaced"
                )
                resumed = sum(len(b) for b in plan if units_hps.shard_exists(settings, b))
                logger.info(
                    "%s (%s): %d ok, %d quarantined, %d missing; %d images to score in %d batches (%d from an interrupted run)",
                    model_id, disposition, summary.images_ok, summary.images_quarantined, summary.images_missing,
                    sum(len(b) for b in plan), len(plan), resumed,
                )
                record.add(hps_images_scored=sum(len(b) for b in plan) - resumed, hps_images_resumed=resumed,
                           prefect_tasks=len(plan))
                if plan:
                    run.check_runtime()  # once per run, before its first batch
                    progress.advance(f"hpsv3 {model_id}", sum(len(b) for b in plan), 0)
                with runners.gpu_request():
                    batches[model_id] = [hps_batch_task.submit(settings, suite, b, run.spec) for b in plan]
                judging[model_id] = _submit_judging(run, model_id)
                record.enter(f"hpsv3/judge {model_id}", force=few)
            except REFUSE_RUN:
                raise  # the runtime does not reproduce the reference: no model is scored
            except Exception as exc:  # noqa: BLE001 - recorded; the other models go on
                run.model_failed(model_id, exc)
        for model_id in batches:
            try:
                hps = [f.result() for f in batches[model_id]]
                judged = [f.result() for f in judging[model_id]]
                record.timed("hpsv3", sum(s for _, s in hps))
                record.timed("judge", sum(s for _, s in judged))
                record.enter(f"commit {model_id}", force=few)
                result, seconds = commit_task(
                    settings, suite, run.reference, model_id, scorer_id,
                    [p for p, _ in hps], [p for p, _ in judged], run.run_id,
                )
                record.timed("commit", seconds)
                record.add(verdicts_decided=result.verdicts, prefect_tasks=1)
                rows.append(result.row)
            except Exception as exc:  # noqa: BLE001
                run.model_failed(model_id, exc)
    return rows


def _judge_only(run: Run, model_ids: list[str]) -> list[dict]:
    """Models whose images are unchanged: only verdicts still missing are requested (a judge
    configured since the last run, or an ERROR to retry); re-committed if anything changed."""
    rows = []
    with ExitStack() as locks:
        model_ids = _lock_models(run, locks, model_ids, refuse_busy=False)
        judging = {}
        for m in model_ids:
            try:
                judging[m] = _submit_judging(run, m)
            except Exception as exc:  # noqa: BLE001
                run.model_failed(m, exc)
        for model_id, futures in judging.items():
            try:
                judged = [f.result() for f in futures]
                run.record.timed("judge", sum(s for _, s in judged))
                shards = [p for p, _ in judged if p is not None]
                if shards:
                    result, seconds = commit_task(
                        run.settings, run.suite, run.reference, model_id, run.reference.scorer_id, [], shards, run.run_id
                    )
                    run.record.timed("commit", seconds)
                    run.record.add(verdicts_decided=result.verdicts, prefect_tasks=1)
                    if result.verdicts:
                        rows.append(result.row)
            except Exception as exc:  # noqa: BLE001
                run.model_failed(model_id, exc)
    return rows


def _refresh(run: Run) -> None:
    run.record.enter("catalog", force=True)
    _, seconds = refresh_task(run.settings, run.suite)
    run.record.timed("catalog", seconds)
    run.record.add(prefect_tasks=1)


def _end(run: Run) -> None:
    """Write the record; a run with errors then fails (after committing everything else)."""
    row = _finish_run(run.settings, run.record)
    if row["status"] == "failed":
        raise RunFailed(f"{run.record.flow} run {run.run_id} finished with errors: " + "; ".join(
            (row["errors"] + row["corrupt_files"])[:5]))


def _results_under_new_reference(run: Run, version: str, scorer_id: str, baseline_models: list[str]) -> list[str]:
    """Give every model already scored by the reference's scorer its result (EPS) under the new
    reference, the baseline field first: without this the leaderboard stays empty until each
    model is scored again. Nothing is re-scored. A model whose scores do not cover its current
    images (a run killed midway) or that another run holds is left to the next run, logged."""
    logger = get_run_logger()
    settings = run.settings.model_copy(update={"reference_version": version})
    reference = pinned.load_verified_reference(settings, run.suite, scorer_id)
    scored = units_aggregate.models_scored_by(settings, scorer_id)
    order = [m for m in baseline_models if m in scored] + [m for m in scored if m not in baseline_models]
    done = []
    # In waves (a lock file per model held open, AGGREGATE_WAVE of them), each aggregated in one pass
    # (units_aggregate.aggregate_models: one read per table, one bootstrap, one check). A wave that fails
    # wrote nothing (it raises before any write) and is redone model by model to find the culprit.
    for i in range(0, len(order), AGGREGATE_WAVE):
        with ExitStack() as locks:
            wave = _lock_models(run, locks, order[i : i + AGGREGATE_WAVE], refuse_busy=False)
            try:
                units_aggregate.aggregate_models(settings, run.suite, reference, wave, run.run_id)
                done += wave
                continue
            except Exception:  # noqa: BLE001 - one of these models: found below, one at a time
                pass
            for model_id in wave:
                try:
                    units_aggregate.aggregate_model(settings, run.suite, reference, model_id, run.run_id, None)
                except Exception as exc:  # noqa: BLE001 - this model only; the next run scores it
                    logger.warning("%s: no result under reference %s yet: %s", model_id, version, redact(str(exc)))
                    continue
                done.append(model_id)
    logger.info("reference %s: results for %d models already scored by its scorer", version, len(done))
    return done


# ---- flows ----------------------------------------------------------------------------------


@flow(name="score-model", task_runner=runners.task_runner(), log_prints=True)
def score_model_flow(
    model_id: str,
    scorer_name: str | None = None,
    rejudge: bool = False,
    suite_version: str | None = None,
    reference_version: str | None = None,
) -> dict:
    """Score one model now: ingest, HPSv3, judges, commit. Also the backfill deployment.

    ``suite_version`` / ``reference_version`` override the configured ones for this run. With
    ``scorer_name`` (scores imported under that name) nothing is ingested or inferred: the
    model's imported scores are aggregated against the reference built for that scorer.
    A second run of the same model waits IMAGEBENCH_MODEL_LOCK_WAIT_S, then refuses.

    Args:
        model_id: the model's folder under models/ in the object store.
        scorer_name: aggregate scores imported under this scorer name instead of running HPSv3.
        rejudge: ask the judges again even where a verdict exists.
        suite_version: prompt suite to score against (default: IMAGEBENCH_SUITE_VERSION).
        reference_version: frozen EPS reference to use (default: IMAGEBENCH_REFERENCE_VERSION).
    """
    from tasks.store.storage import validate_model_id

    validate_model_id(model_id)
    settings = _settings_for_run(suite_version, reference_version)
    record = _start_run("score-model", settings, {
        "model_id": model_id, "scorer_name": scorer_name, "rejudge": rejudge,
        "suite_version": suite_version, "reference_version": reference_version,
    })
    try:
        suite = pinned.load_pinned_suite(settings)
        if scorer_name:
            identity = pinned.imported_identity(scorer_name)
            reference = pinned.load_verified_reference(settings, suite, identity.scorer_id)
            record.scorer_id = identity.scorer_id
            run = Run(settings, suite, reference, record)
            with model_lock(settings.home, model_id, run.run_id, wait_s=settings.model_lock_wait_s):
                row = aggregate_task(settings, suite, reference, model_id, run.run_id, None)
            record.mark(model_id, "new")
        else:
            spec = pinned.ScorerSpec.from_settings(settings)
            identity = pinned.scorer_identity(spec)
            # Verify the frozen reference (and that it was built by this scorer) before any work.
            reference = pinned.load_verified_reference(settings, suite, identity.scorer_id)
            record.scorer_id = identity.scorer_id
            run = Run(settings, suite, reference, record, spec, judge_setup(settings), rejudge)
            ensure_gpu_limit(settings.gpu_concurrency)
            set_aside_corrupt(run, [model_id])
            rows = _score_models(run, [model_id], refuse_busy=True)
            row = rows[0] if rows else None
        _refresh(run)
    except BaseException as exc:
        _finish_run(settings, record, exc)
        raise
    _end(run)
    return row


@flow(name="nightly", task_runner=runners.task_runner(), log_prints=True)
def nightly_flow(rejudge: bool = False) -> dict:
    """Score every model of the object store that has no complete result under the current
    suite, reference and scorer for its current images (by content hash); new images of a known
    model are scored incrementally, a model whose images changed is re-scored whole. Models that
    are up to date only get verdicts still missing. One model's failure does not stop the others.

    Args:
        rejudge: ask the judges again even where a verdict exists.
    """
    logger = get_run_logger()
    settings = load_settings()
    record = _start_run("nightly", settings, {"rejudge": rejudge})
    try:
        suite = pinned.load_pinned_suite(settings)
        spec = pinned.ScorerSpec.from_settings(settings)
        identity = pinned.scorer_identity(spec)
        reference = pinned.load_verified_reference(settings, suite, identity.scorer_id)
        record.scorer_id = identity.scorer_id
        run = Run(settings, suite, reference, record, spec, judge_setup(settings), rejudge)
        run.record.enter("discover", force=True)
        recover = set_aside_corrupt(run)  # models that lost a partition: ingested again below
        try:
            plans = units_discover.discover_models(settings, suite, reference)
        except LakeCorrupt:  # a file damaged in place since it was verified: every footer, as before
            recover |= set_aside_corrupt(run, every_footer=True)
            plans = units_discover.discover_models(settings, suite, reference)
        for p in plans:
            if p.status == "invalid":  # no model of the suite: skipped and counted, never a failed run
                # INFO: the deployment's flow-run log (the UI) shows it; the command line and the
                # demo print the summary's line for it instead, so a terminal gets it once.
                logger.info("skipping object-store folder %r: %s", p.model_id, p.detail)
                record.skip(p.model_id, p.detail)
            elif p.status == "retired":
                logger.info("skipping %r: %s (imagebench models unretire %s)", p.model_id, p.detail, p.model_id)
            elif p.status == "up_to_date" and p.model_id not in recover:
                record.mark(p.model_id, "up_to_date")
        todo = [p.model_id for p in plans if p.status == "candidate" or (p.status == "up_to_date" and p.model_id in recover)]
        logger.info("nightly: %d models in store, %d to ingest", len(plans), len(todo))
        rows: list[dict] = []
        if todo:
            ensure_gpu_limit(settings.gpu_concurrency)
            # In waves: each model holds a lock file from its ingest to its commit, and a wave
            # bounds the open files and the futures in flight (1,000 models would exceed ulimit -n).
            for i in range(0, len(todo), MODELS_PER_WAVE):
                rows += _score_models(run, todo[i : i + MODELS_PER_WAVE])
        up_to_date = [p.model_id for p in plans if p.status == "up_to_date" and p.model_id not in recover]
        rejudged = []
        for i in range(0, len(up_to_date), MODELS_PER_WAVE):
            rejudged += _judge_only(run, up_to_date[i : i + MODELS_PER_WAVE])
        _refresh(run)
    except BaseException as exc:
        _finish_run(settings, record, exc)
        raise
    summary = {
        "run_id": record.run_id,
        "discovered": len(plans),
        "scored": sorted({r["model_id"] for r in rows} & set(
            record.models("new") + record.models("incremental") + record.models("replaced"))),
        "unchanged": record.models("unchanged"),
        "rejudged": [r["model_id"] for r in rejudged],
        "up_to_date": up_to_date,
        "invalid": {p.model_id: p.detail for p in plans if p.status == "invalid"},
        "retired": [p.model_id for p in plans if p.status == "retired"],
        "busy": record.models("busy"),
        "errored": record.models("errored"),
        "errors": list(record.errors),
        "corrupt_files": list(record.corrupt_files),
        "rows": rows + rejudged,
    }
    _end(run)
    return summary


@flow(name="reference-build", task_runner=runners.task_runner(), log_prints=True)
def reference_build_flow(version: str, baseline_models: list[str], scorer_name: str | None = None) -> str:
    """Build the frozen reference ``version`` from a baseline field, once.

    With the built-in scorer, baseline models not yet scored by it are ingested and scored first.
    With ``scorer_name``, the reference is built from scores imported under that name.
    """
    from tasks.scores.reference import build_reference
    from tasks.store.storage import validate_model_id

    from tasks.scores.reference import reference_filename

    reference_filename(version)  # validates the version (it becomes a file name) before any work
    settings = load_settings()
    for m in baseline_models:
        validate_model_id(m)
    record = _start_run("reference-build", settings, {
        "version": version, "baseline_models": baseline_models, "scorer_name": scorer_name})
    try:
        suite = pinned.load_pinned_suite(settings)
        target = settings.reference_dir / f"eps-reference-{version}.json"
        if target.exists():
            from tasks.scores.reference import ReferenceExists

            raise ReferenceExists(f"{target} already exists: references are immutable, choose a new version")
        run = Run(settings, suite, None, record)
        golden = None  # imported scores: no scorer here to run the golden set with
        if scorer_name:
            identity = pinned.imported_identity(scorer_name)
        else:
            spec = pinned.ScorerSpec.from_settings(settings)
            identity = pinned.scorer_identity(spec)
            ensure_gpu_limit(settings.gpu_concurrency)
            with ExitStack() as locks:
                _lock_models(run, locks, baseline_models, refuse_busy=True)
                ingests = {m: ingest_task.submit(settings, suite, m) for m in baseline_models}
                futures = {}
                for m, fut in ingests.items():
                    _, seconds = fut.result()
                    record.timed("ingest", seconds)
                    record.mark(m, "new")
                    plan = units_hps.plan_hps_batches(settings, suite, m, identity.scorer_id, settings.task_batch_size)
                    record.add(hps_images_scored=sum(len(b) for b in plan), prefect_tasks=1 + len(plan))
                    if plan:  # the bar's total, before any batch reports (else "hpsv3 M 165/?")
                        progress.advance(f"hpsv3 {m}", sum(len(b) for b in plan), 0)
                    with runners.gpu_request():
                        futures[m] = [hps_batch_task.submit(settings, suite, b, spec) for b in plan]
                for m in baseline_models:
                    hps = [f.result() for f in futures[m]]
                    record.timed("hpsv3", sum(sec for _, sec in hps))
                    _, seconds = commit_task(settings, suite, None, m, identity.scorer_id, [p for p, _ in hps], [], record.run_id)
                    record.timed("commit", seconds)
            # The golden set's mu in this runtime: what every later run's canary compares against.
            with runners.gpu_request():
                golden = golden_task.submit(settings, spec).result()
            record.add(prefect_tasks=1)
            record.runtime = golden.runtime.to_json()
        record.scorer_id = identity.scorer_id
        record.enter("build reference", force=True)
        path = build_reference(
            version=version,
            baseline_models=baseline_models,
            scores=units_aggregate.current_scores(settings, baseline_models, identity),
            suite=suite,
            scorer=identity,
            reference_dir=settings.reference_dir,
            created_at=run_ids.utcnow().isoformat(),
            golden=golden,
        )
        _results_under_new_reference(run, version, identity.scorer_id, baseline_models)
        _refresh(run)
    except BaseException as exc:
        _finish_run(settings, record, exc)
        raise
    create_markdown_artifact(
        markdown=f"# reference {version}\n\n- file `{path}`\n- scorer `{identity.scorer_id}`\n"
        f"- baseline: {', '.join(baseline_models)}",
        key="imagebench-reference",
    )
    _end(run)
    return str(path)
