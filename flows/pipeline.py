"""Prefect flows: score one model (also the backfill path), nightly, and reference build.

Flows only compose the units in ``tasks.work``; each Prefect task is a thin wrapper. HPSv3
batches are tagged ``gpu`` so a tag concurrency limit (``IMAGEBENCH_GPU_CONCURRENCY``, default
1 per API) governs them while ingest of the next model overlaps inference of the previous one.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.context import get_run_context

from schemas.reference import ReferenceFile
from schemas.settings import Settings, load_settings
from flows import runners
from tasks import progress, work
from tasks.suite import Suite

GPU_TAG = "gpu"


# ---- thin task wrappers ---------------------------------------------------------------------


@task(name="ingest", cache_policy=NO_CACHE)
def ingest_task(settings: Settings, suite: Suite, model_id: str) -> work.IngestSummary:
    return work.ingest_and_publish(settings, suite, model_id)


@task(name="hpsv3-batch", tags=[GPU_TAG], cache_policy=NO_CACHE)
def hps_batch_task(settings: Settings, suite: Suite, batch: work.HpsBatch, spec: work.ScorerSpec) -> Path:
    return work.score_hps_batch(settings, suite, batch, spec)


@task(name="publish-hps-scores", cache_policy=NO_CACHE)
def publish_hps_task(settings: Settings, suite: Suite, model_id: str, scorer_id: str, shards: list[Path]) -> int:
    return work.publish_hps_scores(settings, suite, model_id, scorer_id, shards)


@task(name="judge-batch", cache_policy=NO_CACHE)
def judge_batch_task(
    settings: Settings, setup: work.JudgeSetup, items: list, known: frozenset, rejudge: bool
) -> Path | None:
    return work.judge_batch(settings, setup, items, known, rejudge)


@task(name="publish-judgements", cache_policy=NO_CACHE)
def publish_judgements_task(settings: Settings, model_id: str, shards: list) -> int:
    return work.publish_judgements(settings, model_id, shards)


@task(name="aggregate", cache_policy=NO_CACHE)
def aggregate_task(
    settings: Settings, suite: Suite, reference: ReferenceFile, model_id: str, run_id: str, fingerprint: str | None
) -> dict:
    return work.aggregate_model(settings, suite, reference, model_id, run_id, fingerprint)


@task(name="refresh-catalog", cache_policy=NO_CACHE)
def refresh_task(settings: Settings, suite: Suite) -> Path:
    return work.refresh(settings, suite)


# ---- helpers --------------------------------------------------------------------------------


def _settings_for_run(suite_version: str | None = None, reference_version: str | None = None) -> Settings:
    overrides = {k: v for k, v in (("suite_version", suite_version), ("reference_version", reference_version)) if v}
    return load_settings(**overrides)


def _run_id() -> str:
    ctx = get_run_context()
    return str(getattr(getattr(ctx, "flow_run", None), "id", None) or work.new_run_id())


def ensure_gpu_limit(limit: int) -> None:
    """Create (or update) the `gpu` tag concurrency limit on whichever Prefect API is in use."""
    with get_client(sync_client=True) as client:
        client.create_concurrency_limit(tag=GPU_TAG, concurrency_limit=limit)


def _submit_judging(settings: Settings, suite: Suite, setup: work.JudgeSetup, model_id: str, rejudge: bool) -> list:
    items, known = work.plan_judge_items(settings, suite, model_id, rejudge)
    if items:
        progress.advance(f"judge {model_id}", len(items), 0)
    size = settings.judge_task_size
    return [
        judge_batch_task.submit(settings, setup, items[i : i + size], known, rejudge)
        for i in range(0, len(items), size)
    ]


def _score_models(
    settings: Settings,
    suite: Suite,
    reference: ReferenceFile,
    spec: work.ScorerSpec,
    model_ids: list[str],
    setup: work.JudgeSetup | None = None,
    rejudge: bool = False,
) -> list[dict]:
    """Ingest all models concurrently; as soon as a model is ingested its HPSv3 batches (tagged
    `gpu`) and its judge requests (HTTP / OCR) are submitted side by side, so neither waits on
    the other."""
    logger = get_run_logger()
    run_id = _run_id()
    ingests = {m: ingest_task.submit(settings, suite, m) for m in model_ids}
    batches: dict[str, list] = {}
    judging: dict[str, list] = {}
    summaries: dict[str, work.IngestSummary] = {}
    for model_id, fut in ingests.items():
        summaries[model_id] = summary = fut.result()
        plan = work.plan_hps_batches(settings, suite, model_id, reference.scorer_id, settings.task_batch_size)
        logger.info(
            "%s: %d ok, %d quarantined, %d missing; %d images to score in %d batches",
            model_id, summary.images_ok, summary.images_quarantined, summary.images_missing,
            sum(len(b) for b in plan), len(plan),
        )
        if plan:
            progress.advance(f"hpsv3 {model_id}", sum(len(b) for b in plan), 0)
        with runners.gpu_request():
            batches[model_id] = [hps_batch_task.submit(settings, suite, b, spec) for b in plan]
        judging[model_id] = _submit_judging(settings, suite, setup, model_id, rejudge) if setup else []
    rows = []
    for model_id in model_ids:
        shards = [f.result() for f in batches[model_id]]
        publish_hps_task(settings, suite, model_id, reference.scorer_id, shards)
        publish_judgements_task(settings, model_id, [f.result() for f in judging[model_id]])
        rows.append(aggregate_task(settings, suite, reference, model_id, run_id, summaries[model_id].fingerprint))
    return rows


def _judge_only(
    settings: Settings, suite: Suite, reference: ReferenceFile, setup: work.JudgeSetup, model_ids: list[str], rejudge: bool
) -> list[dict]:
    """Models whose images are unchanged: only verdicts still missing are requested (a judge
    configured since the last run, or an ERROR to retry); re-aggregated if anything changed."""
    run_id = _run_id()
    judging = {m: _submit_judging(settings, suite, setup, m, rejudge) for m in model_ids}
    rows = []
    for model_id, futures in judging.items():
        if publish_judgements_task(settings, model_id, [f.result() for f in futures]):
            rows.append(aggregate_task(settings, suite, reference, model_id, run_id, None))
    return rows


def _report(title: str, rows: list[dict], notes: list[str]) -> None:
    lines = [f"# {title}", ""]
    lines += [f"- {n}" for n in notes]
    if rows:
        lines += ["", "| model | EPS | scored / eligible | lost | complete | uncalibrated |", "|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(
                f"| {r['model_id']} | {r['eps']:.2f} | {r['eps_prompts_scored']}/{r['eps_prompts_eligible']} "
                f"| {r['eps_prompts_lost']} | {r['complete']} | {r['uncalibrated']} |"
            )
    create_markdown_artifact(markdown="\n".join(lines), key="imagebench-run", description=title)


# ---- flows ----------------------------------------------------------------------------------


@flow(name="score-model", task_runner=runners.task_runner(), log_prints=True)
def score_model_flow(
    model_id: str,
    scorer_name: str | None = None,
    rejudge: bool = False,
    suite_version: str | None = None,
    reference_version: str | None = None,
) -> dict:
    """Score one model now: ingest, HPSv3, judges, aggregate. Also the backfill deployment.

    ``suite_version`` / ``reference_version`` override the configured ones for this run. With
    ``scorer_name`` (scores imported under that name) nothing is ingested or inferred: the
    model's imported scores are aggregated against the reference built for that scorer.
    """
    settings = _settings_for_run(suite_version, reference_version)
    suite = work.load_pinned_suite(settings)
    if scorer_name:
        identity = work.imported_identity(scorer_name)
        reference = work.load_verified_reference(settings, suite, identity.scorer_id)
        row = aggregate_task(settings, suite, reference, model_id, _run_id(), None)
    else:
        spec = work.ScorerSpec.from_settings(settings)
        identity = work.scorer_identity(spec)
        # Verify the frozen reference (and that it was built by this scorer) before any work.
        reference = work.load_verified_reference(settings, suite, identity.scorer_id)
        setup = work.load_judge_setup(settings)
        ensure_gpu_limit(settings.gpu_concurrency)
        row = _score_models(settings, suite, reference, spec, [model_id], setup, rejudge)[0]
    refresh_task(settings, suite)
    _report(f"score-model {model_id}", [row], [f"reference {reference.version}", f"scorer {reference.scorer_id}"])
    return row


@flow(name="nightly", task_runner=runners.task_runner(), log_prints=True)
def nightly_flow(rejudge: bool = False) -> dict:
    """Score every model in the object store not yet scored against the current suite,
    reference and scorer (or whose objects changed since). Nothing else is recomputed."""
    logger = get_run_logger()
    settings = load_settings()
    suite = work.load_pinned_suite(settings)
    spec = work.ScorerSpec.from_settings(settings)
    identity = work.scorer_identity(spec)
    reference = work.load_verified_reference(settings, suite, identity.scorer_id)
    setup = work.load_judge_setup(settings)
    plans = work.discover_models(settings, suite, reference)
    todo = [p.model_id for p in plans if p.status in ("new", "changed")]
    for p in plans:
        if p.status == "invalid":
            logger.error("skipping object-store folder %r: %s", p.model_id, p.detail)
    logger.info("nightly: %d models in store, %d to score", len(plans), len(todo))
    rows: list[dict] = []
    if todo:
        ensure_gpu_limit(settings.gpu_concurrency)
        rows = _score_models(settings, suite, reference, spec, todo, setup, rejudge)
    up_to_date = [p.model_id for p in plans if p.status == "up_to_date"]
    rejudged = _judge_only(settings, suite, reference, setup, up_to_date, rejudge) if up_to_date else []
    refresh_task(settings, suite)
    summary = {
        "discovered": len(plans),
        "scored": [r["model_id"] for r in rows],
        "rejudged": [r["model_id"] for r in rejudged],
        "up_to_date": [p.model_id for p in plans if p.status == "up_to_date"],
        "invalid": {p.model_id: p.detail for p in plans if p.status == "invalid"},
        "rows": rows + rejudged,
    }
    _report("nightly", rows, [f"{len(plans)} models discovered", f"{len(rows)} scored",
                              f"{len(summary['up_to_date'])} up to date", f"{len(summary['invalid'])} invalid"])
    return summary


@flow(name="reference-build", task_runner=runners.task_runner(), log_prints=True)
def reference_build_flow(version: str, baseline_models: list[str], scorer_name: str | None = None) -> str:
    """Build the frozen reference ``version`` from a baseline field, once.

    With the built-in scorer, baseline models not yet scored by it are ingested and scored first.
    With ``scorer_name``, the reference is built from scores imported under that name.
    """
    from tasks.reference import build_reference
    from tasks.storage import validate_model_id

    settings = load_settings()
    suite = work.load_pinned_suite(settings)
    for m in baseline_models:
        validate_model_id(m)
    target = settings.reference_dir / f"eps-reference-{version}.json"
    if target.exists():
        from tasks.reference import ReferenceExists

        raise ReferenceExists(f"{target} already exists: references are immutable, choose a new version")
    if scorer_name:
        identity = work.imported_identity(scorer_name)
    else:
        spec = work.ScorerSpec.from_settings(settings)
        identity = work.scorer_identity(spec)
        ensure_gpu_limit(settings.gpu_concurrency)
        ingests = {m: ingest_task.submit(settings, suite, m) for m in baseline_models}
        futures = {}
        for m, fut in ingests.items():
            fut.result()
            plan = work.plan_hps_batches(settings, suite, m, identity.scorer_id, settings.task_batch_size)
            with runners.gpu_request():
                futures[m] = [hps_batch_task.submit(settings, suite, b, spec) for b in plan]
        for m in baseline_models:
            publish_hps_task(settings, suite, m, identity.scorer_id, [f.result() for f in futures[m]])
    path = build_reference(
        version=version,
        baseline_models=baseline_models,
        scores=work.current_scores(settings, baseline_models, identity),
        suite=suite,
        scorer=identity,
        reference_dir=settings.reference_dir,
        created_at=work.utcnow().isoformat(),
    )
    refresh_task(settings, suite)
    create_markdown_artifact(
        markdown=f"# reference {version}\n\n- file `{path}`\n- scorer `{identity.scorer_id}`\n"
        f"- baseline: {', '.join(baseline_models)}",
        key="imagebench-reference",
    )
    return str(path)
