"""From a study's answers to its lake tables: the units the `study-analyze` flow composes.

``analyze`` computes every table in memory (the math is tasks/beauty/analysis.py and
tasks/beauty/metrics.py); ``validate`` runs their Great Expectations suites; ``write`` replaces
the study's partitions only after every table passed, so a failed analysis leaves the previous
one in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from schemas.study import (
    HYPOTHESES,
    STUDY_HYPOTHESES,
    STUDY_INDEX,
    STUDY_PIXEL_METRICS,
    STUDY_RATES,
)
from tasks.beauty.prereg import status_of
from tasks.beauty.sources import StudyContext, StudyNotReady

from tasks.beauty.prereg import NEVER_OPENED as NOT_PREREGISTERED
SIMULATED_BANNER = (
    "SIMULATED: these answers were made up by `make demo`, not given by judges. "
    "The numbers show the pipeline, not how any tool moves people."
)


@dataclass
class StudyTables:
    study_id: str
    simulated: bool
    tables: dict[str, pa.Table] = field(default_factory=dict)  # lake table -> rows
    notes: list[str] = field(default_factory=list)  # what the outputs must say (SIMULATED, TINY RANDOM, ...)


def check_answers(ctx: StudyContext, answers: pa.Table) -> pa.Table:
    """Answers fit the study: its tools, its suite's prompts, its groups, one source, SIMULATED
    only in a simulated study. Returns them cast to ``STUDY_ANSWERS``."""
    from tasks.lake.tables import conform

    answers = conform("study_answers", answers)
    d = ctx.definition
    for column, allowed, what in (
        ("tool", set(d.tools), "tools"),
        ("prompt_id", set(ctx.prompt_ids), f"suite {d.suite} prompts"),
        ("panel_group", {g.name for g in d.groups}, "panel groups"),
        ("study_id", {d.study_id}, "study id"),
    ):
        bad = sorted(set(answers.column(column).to_pylist()) - allowed)
        if bad:
            raise StudyNotReady(f"study {d.study_id}: answers name {column} {bad[:5]} outside the study's {what}")
    sources = set(answers.column("source").to_pylist())
    if len(sources) > 1:
        raise StudyNotReady(f"study {d.study_id}: answers come from several sources {sorted(sources)}")
    if d.simulated != (sources == {"simulated"}):
        raise StudyNotReady(
            f"study {d.study_id}: study.yaml says simulated={d.simulated} but its answers' source is {sorted(sources)}"
        )
    return answers


def _with_study(table: pa.Table, schema: pa.Schema, study_id: str, **constants: Any) -> pa.Table:
    """``table`` with ``study_id`` (and constant columns) added, the schema's columns in order:
    a nullable column the producer does not give is null; extra columns are dropped."""
    n = table.num_rows
    cols = []
    for f in schema:
        if f.name == "study_id":
            cols.append(pa.array([study_id] * n, f.type))
        elif f.name in constants:
            cols.append(pa.array([constants[f.name]] * n, f.type))
        elif f.name in table.column_names:
            cols.append(table.column(f.name).cast(f.type))
        elif f.nullable:
            cols.append(pa.nulls(n, f.type))
        else:
            raise ValueError(f"{schema_name(schema)}: the analysis gave no column {f.name!r}")
    return pa.Table.from_arrays(cols, schema=schema)


def schema_name(schema: pa.Schema) -> str:
    from schemas.study import STUDY_TABLES

    return next((k for k, v in STUDY_TABLES.items() if v is schema), "study table")


def _num(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) or math.isinf(x) else x


def hypotheses_table(results: list[Any], study_id: str, simulated: bool) -> pa.Table:
    """``HypothesisResult`` objects (tasks.beauty.analysis) as ``study_hypotheses`` rows."""
    rows = [{
        "study_id": study_id, "hypothesis": h.hypothesis, "statement": h.statement or HYPOTHESES[h.hypothesis],
        "test": h.test, "effect_name": h.effect_name, "effect": _num(h.effect), "effect_lo": _num(h.effect_lo),
        "effect_hi": _num(h.effect_hi), "p_value": _num(h.p_value), "p_holm": _num(h.p_holm), "verdict": h.verdict,
        "detail": h.detail, "headline": h.headline, "simulated": simulated,
    } for h in results]
    return pa.Table.from_pylist(rows, schema=STUDY_HYPOTHESES)


def plan_of(ctx: StudyContext):
    """The pre-registration, or for a study never opened (imported answers) the same plan built in
    memory from its study.yaml: H4 and H5 are still tested on the declared tools, and every
    output says the plan was not pre-registered."""
    if ctx.prereg is not None:
        return ctx.prereg
    import hashlib
    import json

    from schemas.study import PreRegistration

    d = ctx.definition
    canonical = json.dumps(d.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()
    return PreRegistration(
        study_id=d.study_id, created_at="not pre-registered", definition_sha256=hashlib.sha256(canonical).hexdigest(),
        suite=d.suite, suite_sha256=ctx.suite_sha256, hypotheses=dict(HYPOTHESES), analysis=d.analysis, order_seed=0,
        host_tool=d.host_tool, praised_for_aesthetics=list(d.praised_for_aesthetics),
    )


def study_pixel_metrics(settings, ctx: StudyContext) -> tuple[pa.Table, list[str]]:
    """The pixel metrics of the study's tools on the blinded images its judges saw
    (tasks.beauty.metrics), and the notes every output of them carries. A study never opened
    (imported answers) has no images here: an empty table, and H1/H4 say "not tested"."""
    from tasks.beauty.sources import has_panel_store

    if not has_panel_store(ctx):
        return STUDY_PIXEL_METRICS.empty_table(), [
            "pixel metrics not computed: the study was never opened here, so imagebench holds no images of its tools"]
    from tasks.beauty import metrics

    table = metrics.study_pixel_metrics(settings, ctx.definition, ctx.study_dir)
    if not table.num_rows:
        return STUDY_PIXEL_METRICS.empty_table(), [
            "pixel metrics not computed: no Inception/CLIP weights given (IMAGEBENCH_BEAUTY_INCEPTION_WEIGHTS, "
            "IMAGEBENCH_BEAUTY_CLIP_MODEL): H1 and H4 not tested"]
    return _with_study(table, STUDY_PIXEL_METRICS, ctx.study_id), metrics.pixel_metrics_notes(table)


def analyze(settings, ctx: StudyContext, answers: pa.Table, pixel: pa.Table | None = None,
            mixed_resamples: int | None = None) -> StudyTables:
    """Every table of the study from its answers (and its pixel metrics, for H1/H4).
    ``mixed_resamples``: bootstrap refits of H3's mixed model (None: the analysis default; the
    demo and tests use fewer: each refit takes about a tenth of a second)."""
    from tasks.beauty import analysis

    from tasks.beauty import quality

    d, plan = ctx.definition, plan_of(ctx)
    answers = quality.flag_answers(check_answers(ctx, answers), d.quality.min_seconds_on_screen)
    out = StudyTables(study_id=d.study_id, simulated=d.simulated)
    if d.simulated:
        out.notes.append(SIMULATED_BANNER)
    status = status_of(ctx.prereg, answers)
    if status.note:
        out.notes.append(status.note)
    pixel = STUDY_PIXEL_METRICS.empty_table() if pixel is None else pixel
    rates = analysis.yes_rates(answers)
    index = analysis.beauty_index(answers, plan.analysis.bootstrap_resamples, plan.analysis.seed, d.simulated)
    # With and without the answers quality control flagged (same resamples and seed).
    index = quality.with_unflagged_index(index, answers, lambda kept: analysis.beauty_index(
        kept, plan.analysis.bootstrap_resamples, plan.analysis.seed, d.simulated))
    if quality.flag_note(answers):
        out.notes.append(quality.flag_note(answers))
    extra = {} if mixed_resamples is None else {"mixed_resamples": mixed_resamples}
    hyps = analysis.test_hypotheses(answers, plan, pixel if pixel.num_rows else None, **extra)
    out.tables = {
        "study_answers": answers,
        "study_rates": _with_study(rates, STUDY_RATES, d.study_id),
        "study_index": _with_study(index, STUDY_INDEX, d.study_id, simulated=d.simulated),
        "study_hypotheses": hypotheses_table(hyps, d.study_id, d.simulated),
        "study_pixel_metrics": pixel,
    }
    return out


def validate(tables: StudyTables) -> None:
    """Great Expectations suite of every table (expectations/study_*.json); raises on the first
    failing one, naming the suite and the expectations that failed."""
    from tasks.lake.validation import require_valid

    for name, table in tables.tables.items():
        require_valid(name, table)


def write(settings, tables: StudyTables) -> list[str]:
    """Replace the study's partition of every table (answers first: the record the rest derive from)."""
    from tasks.beauty.tables import write_study_partition
    from tasks.lake.tables import Lake

    lake = Lake(settings.lake_dir)
    return [str(write_study_partition(lake, name, tables.study_id, t)) for name, t in tables.tables.items()]


def leaderboard_rows(index: pa.Table) -> list[dict]:
    """The whole panel's rows of a ``study_index`` table, best first (what `study leaderboard` shows)."""
    rows = index.filter(pc.equal(index.column("panel_group"), "all")).to_pylist()
    return sorted(rows, key=lambda r: (-(r["beauty_index"] if r["beauty_index"] is not None else -1), r["tool"]))



def index_text(row: dict) -> str:
    """"46.7 [31.2, 60.0]" for a study_index row ("–" where a value is missing: a tool without
    answers, or an interval no resample defined)."""
    def f(x):
        return "–" if x is None else f"{x:.1f}"
    return "–" if row["beauty_index"] is None else f"{f(row['beauty_index'])} [{f(row['beauty_index_lo'])}, {f(row['beauty_index_hi'])}]"
