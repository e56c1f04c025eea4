"""Prefect flow `vab-run`: judges under test on a VAB set collection -> lake table vab_trials.

    pinned set collection (tasks.vab.sets) -> 3 trials per task (tasks.vab.trials)
      -> per judge: batches of trials judged in parallel (task `vab-judge-batch`; answers cached
         by judge identity, so a rerun sends nothing already settled)
      -> Great Expectations suite expectations/vab_trials.json
      -> the judge's rows of partition sets=<S> replaced (other judges' rows kept)
      -> metrics (tasks.vab.metrics) in the returned summary and a markdown artifact

Every task is a thin wrapper over tasks/vab/run.py; nothing is written for a judge whose rows
fail the suite.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from schemas.settings import load_settings
from tasks.vab.run import JudgeSpec

DEFAULT_BATCH = 8  # trials per parallel VLM batch


@task(name="vab-judge-batch", cache_policy=NO_CACHE, retries=0)
def judge_batch_task(sets: str, spec: JudgeSpec, items: list, cache_dir: str | None) -> tuple[list[dict], int]:
    from tasks.vab.run import judge_batch

    return judge_batch(sets, spec, items, Path(cache_dir) if cache_dir else None)


@task(name="vab-validate-write", cache_policy=NO_CACHE)
def validate_write_task(settings, sets: str, judge: str, rows: list[dict]) -> str:
    from tasks.lake.tables import Lake
    from tasks.lake.validation import require_valid
    from tasks.vab.run import trials_table
    from tasks.vab.tables import replace_judge_trials

    table = trials_table(rows)
    require_valid("vab_trials", table)
    return str(replace_judge_trials(Lake(settings.lake_dir), sets, judge, table))


def summary_markdown(sets: str, results: dict[str, dict]) -> str:
    lines = [f"# VAB run on {sets}", "", "| judge | strict both | strict best | strict worst | tasks | invalid trials |",
             "|---|---|---|---|---|---|"]
    f = lambda v: "–" if v is None else f"{v:.1f}%"  # noqa: E731
    for j, m in results.items():
        inv = ", ".join(f"{k} {v}" for k, v in m["invalid_trials"].items() if v) or "0"
        name = j + (" **UNCALIBRATED** demo weights" if m.get("uncalibrated") else "")
        lines.append(f"| {name} | {f(m['strict_both'])} | {f(m['strict_best'])} | {f(m['strict_worst'])} | {m['tasks']} | {inv} |")
    return "\n".join(lines) + "\n"


def with_run_limits(settings, specs: list[JudgeSpec]) -> list[JudgeSpec]:
    """The specs with who shares each VLM endpoint's limits in this run (every batch, thread and
    process: flows.runners.judge_limit_scope), so a batch's own client is not its own limit."""
    from dataclasses import replace

    from flows.runners import judge_limit_scope

    if not any(s.kind == "vlm" for s in specs):
        return specs
    scope = judge_limit_scope(settings)
    return [replace(s, limits=scope) if s.kind == "vlm" else s for s in specs]


@flow(name="vab-run", log_prints=True)
def vab_run_flow(sets: str, judges: list[str], batch_size: int = DEFAULT_BATCH, use_cache: bool = True,
                 n_resamples: int = 2000, prompt_version: str | None = None, temperature: float | None = None,
                 prompt_types: list[str] | None = None) -> dict:
    """Run ``judges`` on every task of set collection ``sets`` (3 trials each, in the collection's
    trial scheme; VLMs with ``prompt_version``: ours, or the official prompt types, all three or
    ``prompt_types`` as eval.py's --prompt-type). Returns per judge (under the name its answers are
    stored under: JudgeSpec.stored_name) the metrics (tasks.vab.metrics.judge_metrics), cache hits
    and the file written."""
    from tasks.vab.metrics import judge_metrics
    from tasks.vab.prompts import VAB_PROMPT_VERSION
    from schemas.vab import PICK_BEST_AND_WORST
    from tasks.vab.run import batches, check_prompt_types, derived_rows, resolve_judges, trial_items
    from tasks.vab.sets import image_paths, load_sets, trial_scheme

    logger = get_run_logger()
    settings = load_settings()
    specs = resolve_judges(settings, judges, prompt_version or VAB_PROMPT_VERSION, temperature)
    specs = with_run_limits(settings, specs)
    tasks = load_sets(settings, sets)
    scheme = trial_scheme(settings, sets)
    paths = [image_paths(settings, t) for t in tasks]
    items = {official: trial_items(tasks, paths, scheme, official, prompt_types if official else None)
             for official in {s.official for s in specs}}
    cache_dir = str(Path(settings.home) / "cache" / "vab") if use_cache else None
    futures = {s.name: [judge_batch_task.submit(sets, s, b, cache_dir) for b in batches(items[s.official], s, batch_size)]
               for s in specs}
    results: dict[str, dict] = {}
    for spec in specs:
        rows, hits = [], 0
        for fut in futures[spec.name]:
            r, h = fut.result()
            rows += r
            hits += h
        if spec.official and PICK_BEST_AND_WORST in check_prompt_types(prompt_types, True):
            rows += derived_rows(rows, tasks)  # eval.py's pick_best_and_worst of 2-image tasks (when it asks that type)
        name = spec.stored_name
        path = validate_write_task(settings, sets, name, rows)
        m = judge_metrics(tasks, rows, name, n_resamples=n_resamples)
        m.update(cache_hits=hits, trials=len(rows), file=path)
        bad = [r for r in rows if r["state"] != "ok"]
        for r in bad[:10]:  # shown, never silently dropped (all of them are in vab_trials)
            logger.warning("judge %s, task %s, trial %d: %s (%s)", name, r["task_id"], r["trial"], r["state"], r["detail"])
        results[name] = m
    try:
        create_markdown_artifact(markdown=summary_markdown(sets, results), key=f"vab-{sets}".lower().replace(".", "-").replace("_", "-"),
                                 description=f"VAB run on {sets}")
    except Exception as exc:  # noqa: BLE001 - the lake is the record; the artifact is a convenience
        logger.error("could not create the VAB artifact: %s", exc)
    return {"sets": sets, "tasks": len(tasks), "judges": results}
