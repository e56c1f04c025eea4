"""Prefect flow `study-analyze`: a Beauty Index study's answers -> lake tables -> DuckDB views.

    answers (panel store, or imported/simulated in the lake)
      -> pixel metrics of the tools (FID, KID, CLIP, IS, HPSv3 mu: for H1 and H4)
      -> yes-rates per (tool, prompt), Beauty Index per tool and per panel group, H1-H5
      -> Great Expectations suites (expectations/study_*.json), then the study's partitions of
         study_answers / study_rates / study_index / study_hypotheses / study_pixel_metrics
      -> catalog refresh (views `study_*` and `study_leaderboard` beside the ImageBench ones)

Each task is a thin wrapper over tasks/beauty/publish.py; the math is tasks/beauty/analysis.py.
Nothing is written unless every table passed its suite.
"""

from __future__ import annotations

import pyarrow as pa
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from schemas.settings import Settings, load_settings
from tasks.beauty import publish
from tasks.beauty.sources import StudyContext


@task(name="study-answers", cache_policy=NO_CACHE)
def answers_task(settings: Settings, ctx: StudyContext) -> pa.Table:
    from tasks.beauty.sources import collect_answers, verify_plan

    verify_plan(settings, ctx)
    return collect_answers(settings, ctx)


@task(name="study-pixel-metrics", cache_policy=NO_CACHE)
def pixel_task(settings: Settings, ctx: StudyContext) -> tuple[pa.Table, list[str]]:
    return publish.study_pixel_metrics(settings, ctx)


@task(name="study-analysis", cache_policy=NO_CACHE)
def analysis_task(settings: Settings, ctx: StudyContext, answers: pa.Table, pixel: pa.Table,
                  mixed_resamples: int | None) -> publish.StudyTables:
    return publish.analyze(settings, ctx, answers, pixel, mixed_resamples)


@task(name="study-validate", cache_policy=NO_CACHE)
def validate_task(tables: publish.StudyTables) -> None:
    publish.validate(tables)


@task(name="study-write", cache_policy=NO_CACHE)
def write_task(settings: Settings, tables: publish.StudyTables) -> list[str]:
    return publish.write(settings, tables)


@task(name="refresh-catalog", cache_policy=NO_CACHE)
def refresh_task(settings: Settings) -> str:
    from tasks.runs import pinned, units_aggregate

    return str(units_aggregate.refresh(settings, pinned.load_pinned_suite(settings)))


def summary_markdown(tables: publish.StudyTables) -> str:
    lines = [f"# Study {tables.study_id}", ""]
    lines += [f"**{n}**" for n in tables.notes]
    lines += ["", "| rank | tool | Beauty Index [95% CI] | answers |", "|---|---|---|---|"]
    for r in publish.leaderboard_rows(tables.tables["study_index"]):
        bi = publish.index_text(r)
        lines.append(f"| {r['rank']} | {r['tool']} | {bi} | {r['answers']} |")
    lines += ["", "| hypothesis | verdict | p (Holm) |", "|---|---|---|"]
    for h in tables.tables["study_hypotheses"].to_pylist():
        p = "–" if h["p_holm"] is None else f"{h['p_holm']:.3g}"
        lines.append(f"| {h['hypothesis']} | {h['verdict']} | {p} |")
    return "\n".join(lines) + "\n"


@flow(name="study-analyze", log_prints=True)
def study_analyze_flow(study_id: str, mixed_resamples: int | None = None) -> dict:
    """Analyse one study into the lake. Returns a summary: answers, judges, tools, the table files
    written, the notes every output of this study carries (SIMULATED, TINY RANDOM, ...)."""
    from tasks.beauty.sources import load_study_context

    logger = get_run_logger()
    settings = load_settings()
    ctx = load_study_context(settings, study_id)
    answers = answers_task(settings, ctx)
    pixel, pixel_notes = pixel_task(settings, ctx)
    tables = analysis_task(settings, ctx, answers, pixel, mixed_resamples)
    tables.notes.extend(pixel_notes)
    validate_task(tables)
    written = write_task(settings, tables)
    catalog = refresh_task(settings)
    for note in tables.notes:
        logger.warning("%s", note)
    try:
        create_markdown_artifact(markdown=summary_markdown(tables), key=f"study-{study_id}", description=f"study {study_id}")
    except Exception as exc:  # noqa: BLE001 - the lake is the record; the artifact is a convenience
        logger.error("could not create the study artifact: %s", exc)
    judges = len(set(answers.column("judge_id").to_pylist()))
    return {
        "study_id": study_id, "answers": answers.num_rows, "judges": judges, "tools": len(ctx.definition.tools),
        "source": answers.column("source")[0].as_py(), "simulated": ctx.definition.simulated,
        "notes": tables.notes, "files": written, "catalog": catalog,
    }
