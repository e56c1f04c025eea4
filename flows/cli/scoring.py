"""`imagebench ingest|score|nightly|hpsv3|compare|breakdown|report|leaderboard|runs|sql|catalog|demo`:
the scoring commands (ARCHITECTURE.md section 7), registered on the app by flows/cli/__init__.py;
`backfill` and `serve` (production mode, a Prefect server) are in flows/cli/production.py.

Heavy packages (torch, transformers, Prefect, Great Expectations) are imported inside the
commands that need them, so `sql` and `leaderboard` answer in about a second.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from flows.cli.common import (
    SCORING_PRELOAD, CliError, OutputFormat, catalog_or_exit, cli_settings, err, precheck, prepare_prefect, print_quarantine, print_rows,
    progress, render, scoring_preload, user_errors, warn_uncalibrated,
)
from schemas.settings import Settings


def ingest(
    model: Annotated[str, typer.Option("--model", "-m", help="model id: folder models/<id>/ in the store")],
    source: Annotated[Optional[str], typer.Option(help="object store URI (s3://bucket/prefix or a directory)")] = None,
) -> None:
    """Validate and record one model's images (quarantining bad ones); no scoring."""
    with user_errors():
        settings = cli_settings()
        if source:
            settings = settings.model_copy(update={"store": source})
        from tasks.runs import pinned, units_aggregate, units_ingest

        suite = pinned.load_pinned_suite(settings)
        with progress():
            summary = units_ingest.ingest_and_publish(settings, suite, model)
        units_aggregate.refresh(settings, suite)
        print_rows([summary.__dict__], OutputFormat.table, f"ingest {model}")
        print_quarantine(settings, [model], err)


def score(
    model: Annotated[str, typer.Option("--model", "-m", help="model id to score now (also the backfill path)")],
    scorer: Annotated[
        Optional[str], typer.Option(help="aggregate scores imported under this scorer name instead of running HPSv3")
    ] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    rejudge: Annotated[bool, typer.Option("--rejudge", help="ask the judges again even where a verdict exists")] = False,
) -> None:
    """Score one model now: ingest, HPSv3 and the routed judges side by side, EPS/Capability/Overall."""
    with user_errors():
        settings = cli_settings()
        precheck(settings, model, objects=scorer is None)
        prepare_prefect(settings, preload=scoring_preload(scorer is not None))
        from flows.pipeline import score_model_flow

        with progress():
            row = score_model_flow(model, scorer_name=scorer, rejudge=rejudge)
        print_rows([row], fmt, f"score {model}")
        print_quarantine(settings, [model], err)
        warn_uncalibrated(row["uncalibrated"], fmt)


def nightly(
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    rejudge: Annotated[bool, typer.Option("--rejudge", help="ask the judges again even where a verdict exists")] = False,
) -> None:
    """Score every model in the store not yet scored against the current suite, reference and
    scorer; for unchanged models, request only verdicts still missing."""
    with user_errors():
        settings = cli_settings()
        precheck(settings)
        prepare_prefect(settings, preload=SCORING_PRELOAD)
        from flows.pipeline import nightly_flow

        with progress():
            summary = nightly_flow(rejudge=rejudge)
        from flows.cli.common import nightly_line

        err.print(nightly_line(summary), highlight=False)
        for model_id, detail in summary["invalid"].items():
            err.print(f"[red]invalid model folder {model_id!r}: {detail}[/]")
        print_rows(summary["rows"], fmt, "nightly")
        print_quarantine(settings, summary["scored"] + summary["unchanged"], err)
        warn_uncalibrated(any(r["uncalibrated"] for r in summary["rows"]), fmt)


class Rotary(str, Enum):
    """HPSv3 rotary arithmetic (docs/HPSV3.md)."""

    official = "official"
    float32 = "float32"


def hpsv3(
    pairs: Annotated[Path, typer.Option(help="CSV with columns image,prompt (image paths relative to the CSV's folder)")],
    base_model: Annotated[Optional[str], typer.Option(help="HF id or local dir with config/tokenizer/processor")] = None,
    checkpoint: Annotated[Optional[str], typer.Option(help="HPSv3.safetensors path or HF repo id")] = None,
    device: Annotated[str, typer.Option(help="auto|cpu|cuda")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto|float32|bfloat16")] = "auto",
    rotary: Annotated[
        Optional[Rotary],
        typer.Option(help="official (bf16-rounded, as trained) or float32; default: IMAGEBENCH_HPSV3_ROTARY, else official"),
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1)] = 8,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.csv,
) -> None:
    """Ad-hoc HPSv3 scoring: one output row (mu, sigma) per input pair, in input order."""
    with user_errors():
        settings = cli_settings()
        from tasks.store.adhoc import read_pairs

        images, prompts = read_pairs(pairs)
        from tasks.hpsv3.scorer import HPSv3Scorer

        scorer = HPSv3Scorer.load(
            base_model or settings.hpsv3_base_model,
            checkpoint or settings.hpsv3_checkpoint,
            device=device,
            dtype=dtype,
            rotary=rotary.value if rotary is not None else settings.hpsv3_rotary,
            preprocess_workers=settings.hpsv3_preprocess_workers,
        )
        with progress():
            from tasks.runs import progress as hooks

            hooks.advance("hpsv3", len(images), 0)
            result = scorer.score(images, prompts, batch_size=batch_size, progress=lambda n: hooks.advance("hpsv3", len(images), n))
        rows = [
            [str(img), prompt, float(mu), float(sigma)]
            for img, prompt, (mu, sigma) in zip(images, prompts, result.tolist())
        ]
        render(["image", "prompt", "mu", "sigma"], rows, fmt, title="HPSv3")
        warn_uncalibrated(scorer.identity.uncalibrated, fmt)


AXES = ("overall", "capability", "eps")


def compare(
    model_a: Annotated[str, typer.Argument(metavar="A")],
    model_b: Annotated[str, typer.Argument(metavar="B")],
    axis: Annotated[str, typer.Option(help="overall, capability or eps")] = "overall",
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Paired difference A - B with its 95% bootstrap interval and P(A beats B)."""
    with user_errors():
        if axis not in AXES:
            raise CliError(f"--axis {axis!r}: choose one of {', '.join(AXES)}")
        from tasks.store.storage import validate_model_id

        for m in (model_a, model_b):  # before anything reads a path or a table named after them
            validate_model_id(m)
        settings = cli_settings()
        from tasks.runs.models import require_known

        for m in (model_a, model_b):
            require_known(settings, m)  # an unknown id: exit 1, nearest ids named
        from tasks.scores import stats
        from tasks.runs import pinned
        from tasks.lake.views import model_prompts, paired_vectors

        suite = pinned.load_pinned_suite(settings)
        reference = pinned.load_verified_reference(settings, suite, None)
        values = {}
        for m in (model_a, model_b):
            views = model_prompts(settings, suite, reference, m)
            if all(v.state == "missing" and v.mu is None for v in views):
                raise CliError(f"model {m!r} has no results under reference {reference.version}")
            values[m] = paired_vectors(views, suite, reference)
        eligible = [p.eps_eligible for p in suite.prompts]
        pick = {"capability": lambda v: v[0], "eps": lambda v: v[1], "overall": lambda v: v}[axis]
        result = stats.compare(
            pick(values[model_a]), pick(values[model_b]), axis=axis, eligible=eligible,
            n_resamples=settings.bootstrap_resamples,
        )
        render(
            ["a", "b", "axis", "difference", "ci_lo", "ci_hi", "p_a_beats_b", "n_resamples"],
            [[model_a, model_b, axis, result.diff, result.ci[0], result.ci[1], result.p_a_beats_b, result.n_resamples]],
            fmt,
            title=f"{model_a} vs {model_b} ({axis}, paired over prompts)",
        )
        warn_uncalibrated(axis != "capability" and reference.scorer.uncalibrated, fmt)  # EPS from demo weights


def breakdown(
    model: Annotated[str, typer.Option("--model", "-m", help="model id")],
    by: Annotated[str, typer.Option(help="category, subcategory, tag or difficulty")] = "category",
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Capability (PASS / decided; a missing or quarantined image is a FAIL) and EPS of one model
    per category, subcategory, tag or difficulty; the table's last row is the model's total."""
    with user_errors():
        if by not in BREAKDOWN_GROUPS:
            raise CliError(f"--by {by!r}: choose {', '.join(BREAKDOWN_GROUPS[:-1])} or {BREAKDOWN_GROUPS[-1]}")
        from tasks.store.storage import validate_model_id

        validate_model_id(model)  # before anything reads a path or a table named after it
        settings = cli_settings()
        from tasks.runs.models import require_known

        require_known(settings, model)  # an unknown id: exit 1, nearest ids named
        columns, rows, total, uncalibrated = breakdown_rows(settings, model, by)
        # The total (= the leaderboard's Capability) as a row of the table; csv/json carry the groups.
        render(columns, rows + ([total] if fmt is OutputFormat.table else []), fmt, title=f"{model} by {by}")
        warn_uncalibrated(uncalibrated, fmt)


def report(
    out: Annotated[Path, typer.Option("--out", help="output folder for the static site")] = Path("report"),
) -> None:
    """Write the static site: the leaderboard (sortable table, Capability-vs-EPS scatter, heatmaps,
    model pages) when models were scored, every Beauty Index study, the pooled view and VAB pages."""
    with user_errors():
        settings = cli_settings()
        catalog_or_exit(settings)
        from tasks.report.site import build_site  # a workspace of studies only needs no EPS reference

        site = build_site(settings, out)
        err.print(f"[green]report written:[/] {site.index}  ({site.models} models, {site.studies} studies, {site.vab} VAB "
                  f"collections; open it, or `python -m http.server -d {out}`)", highlight=False, soft_wrap=True)
        if site.leaderboard_note:
            err.print(f"[yellow]{site.leaderboard_note}[/]", highlight=False, soft_wrap=True)


LEADERBOARD_SORTS = ("overall", "capability", "eps", "rank", "model_id", "judge_coverage", "eps_prompts_lost", "scored_at")
LEADERBOARD_TABLE_COLUMNS = (
    "CASE WHEN rank = rank_worst THEN rank::VARCHAR ELSE rank || '-' || rank_worst END AS rank, model_id, "
    "printf('%.1f [%.1f, %.1f]', overall, overall_lo, overall_hi) AS overall, "
    "printf('%.1f [%.1f, %.1f]', capability, capability_lo, capability_hi) AS capability, "
    "printf('%.1f [%.1f, %.1f]', eps, eps_lo, eps_hi) AS eps, "
    "printf('%.0f%%', 100 * judge_coverage) AS judged, eps_prompts_scored || '/' || eps_prompts_eligible AS eps_scored, "
    "images_quarantined AS quarantined, images_missing AS missing, "
    "concat_ws(' ', CASE WHEN provisional THEN 'provisional' END, CASE WHEN NOT complete THEN 'incomplete' END, "
    "CASE WHEN uncalibrated THEN 'UNCALIBRATED' END) AS flags, "
    "reference_version AS reference, strftime(scored_at, '%Y-%m-%d %H:%M') AS scored_at"
)


def leaderboard(
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    sort: Annotated[str, typer.Option(help=f"one of {', '.join(LEADERBOARD_SORTS)}")] = "rank",
) -> None:
    """The leaderboard of the reference in force: Overall, Capability, EPS with 95% intervals,
    rank bands, judge coverage and flags (one row per model)."""
    with user_errors(log=False):
        if sort not in LEADERBOARD_SORTS:
            raise CliError(f"--sort {sort!r}: choose one of {', '.join(LEADERBOARD_SORTS)}")
        settings = cli_settings()
        from tasks.lake.tables import query

        order = "ASC" if sort in ("model_id", "rank") else "DESC"
        # Qualified names: the table view formats columns under the same names as strings.
        sort = f"lb.{sort} {order} NULLS LAST" + (", lb.overall DESC NULLS LAST, lb.eps DESC" if sort == "rank" else "")
        # The terminal table shows what a reader compares; csv/json carry every column.
        select = LEADERBOARD_TABLE_COLUMNS if fmt is OutputFormat.table else "*"
        columns, rows = query(
            catalog_or_exit(settings), f"SELECT {select} FROM leaderboard lb ORDER BY {sort}, lb.model_id"
        )
        render(columns, rows, fmt, title="imagebench leaderboard")
        flagged = "uncalibrated" in columns and any(r[columns.index("uncalibrated")] for r in rows)
        warn_uncalibrated(flagged or ("flags" in columns and any("UNCALIBRATED" in (r[columns.index("flags")] or "")
                                                                  for r in rows)), fmt)
        if "flags" in columns and any("incomplete" in (r[columns.index("flags")] or "") for r in rows):
            err.print("[yellow]incomplete (complete = false): missing or quarantined images counted as losses[/]")


def runs(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="how many runs, newest first")] = 10,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """The latest run records: what each run discovered, scored, found up to date, skipped and
    errored, and how long each stage took (every column with --format json|csv)."""
    with user_errors():
        settings = cli_settings()
        from flows.cli.common import runs_table
        from tasks.lake.tables import Lake
        from tasks.runs.state import settle_crashed

        settle_crashed(settings.home, settings.lake_dir)  # a running record whose process is gone: crashed
        table = Lake(settings.lake_dir).read_runs().sort_by([("started_at", "descending")]).slice(0, limit)
        if fmt is OutputFormat.table:
            records = table.to_pylist()
            names, rows = runs_table(records)
        else:
            names = table.column_names
            rows = [tuple(r[c] for c in names) for r in table.to_pylist()]
        render(names, rows, fmt, title="imagebench runs")
        if fmt is OutputFormat.table and any(r["status"] in ("failed", "crashed") for r in records):
            err.print("[red]failed or crashed runs: see their error (imagebench runs --format json)[/]")


def sql(
    query_text: Annotated[str, typer.Argument(metavar="QUERY", help="SQL over the catalog's views (read-only)")],
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Run a read-only SQL query on the DuckDB catalog."""
    with user_errors(log=False):
        settings = cli_settings()
        # tasks.lake.tables.query refuses anything but queries (EXPLAIN ANALYZE of a write included),
        # parsing on the read-only connection, which has no file access.
        from tasks.lake.tables import query

        columns, rows = query(catalog_or_exit(settings), query_text)
        render(columns, rows, fmt)


def catalog(
    full: Annotated[bool, typer.Option("--full", help="rebuild the compacted copy from every per-model file, not only what changed")] = False,
) -> None:
    """Rebuild the DuckDB catalog file from the lake."""
    with user_errors():
        settings = cli_settings()
        from tasks.runs import pinned, units_aggregate
        from tasks.lake.tables import refresh_catalog

        suite = pinned.load_pinned_suite(settings)
        if full:
            refresh_catalog(settings.lake_dir, settings.catalog_path, suite, settings.reference_version, full=True)
            path = settings.catalog_path
        else:
            path = units_aggregate.refresh(settings, suite)
        err.print(f"catalog written: {path}")


# ---- breakdown: one model's Capability and EPS per group (tasks/scores/breakdown.py) ------------

BREAKDOWN_GROUPS = ("category", "subcategory", "tag", "difficulty")
BREAKDOWN_COLUMNS = ("capability", "pass", "fail", "fail_no_image", "undecided", "decided", "judged", "prompts",
                     "coverage", "eps", "eps_prompts")


def breakdown_rows(settings: Settings, model: str, by: str) -> tuple[list[str], list[list], list, bool]:
    """(columns, one row per group, the total row, whether its EPS comes from uncalibrated demo
    weights). ``fail`` counts every FAIL the headline counts: those of a judge and the missing or
    quarantined images (``fail_no_image``, FAIL by rule)."""
    from tasks.runs import pinned
    from tasks.scores.breakdown import capability_by_group
    from tasks.lake.views import model_prompts, paired_vectors

    suite = pinned.load_pinned_suite(settings)
    reference = pinned.load_verified_reference(settings, suite, None)
    views = model_prompts(settings, suite, reference, model)
    verdicts, contributions = paired_vectors(views, suite, reference)
    groups = [getattr(p, by) for p in suite.prompts]
    per_group, total = capability_by_group([v.state for v in views], verdicts, groups)

    def row(g, members: list[int]) -> list:
        elig = [i for i in members if suite.prompts[i].eps_eligible]
        eps = 100.0 * float(sum(contributions[i] for i in elig)) / len(elig) if elig else None
        return [g.group, g.capability, g.passed, g.failed, g.failed_no_image, g.undecided, g.decided, g.judged,
                g.prompts, g.coverage, eps, len(elig)]

    rows = [row(g, [i for i, x in enumerate(groups) if x == g.group]) for g in per_group]
    return [by, *BREAKDOWN_COLUMNS], rows, row(total, list(range(len(groups)))), bool(reference.scorer.uncalibrated)


def demo() -> None:
    """Seed demo models, build a demo reference, run the nightly flow, print the leaderboard."""
    with user_errors():
        from flows.demo import run_demo

        run_demo(err)
        leaderboard(fmt=OutputFormat.table, sort="rank")
        print_next_steps(err)  # the exact commands to paste: `make demo` cannot put .venv/bin on PATH


# ---- what `make demo` prints last: the exact commands a user pastes next (issue 15, item 5) -------
#
# `make demo` runs `.venv/bin/imagebench demo`; it cannot change the user's shell, so a plain
# `imagebench leaderboard` typed afterwards is "command not found" unless the virtual environment's
# bin folder is on PATH. The demo says so, with the one line that fixes it. Standard library only.

# What to try after the demo, in the order a new user reads the README.
DEMO_NEXT_COMMANDS = (
    "imagebench leaderboard",
    "imagebench breakdown --model demo-patchy",
    "imagebench runs",
    "imagebench models list",
    "imagebench report --out site/",
)


def _shown_path(path: Path, cwd: Path) -> str:
    """``path`` relative to ``cwd`` when it is inside it (``.venv/bin``), else absolute."""
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def activation_line(bin_dir: Path, path_env: str | None, cwd: Path) -> str | None:
    """The shell line that puts ``bin_dir``'s ``imagebench`` first on PATH, or None when typing
    ``imagebench`` already runs that one (or ``bin_dir`` has no ``imagebench`` to point at)."""
    exe = bin_dir / "imagebench"
    if not exe.is_file():
        return None
    found = shutil.which("imagebench", path=path_env or "")
    if found is not None:
        try:
            if os.path.samefile(found, exe):
                return None
        except OSError:
            pass
    shown = _shown_path(bin_dir, cwd)
    if (bin_dir / "activate").is_file():
        return f"source {shlex.quote(shown + '/activate')}"
    return f'export PATH={shlex.quote(shown)}:"$PATH"'


def next_steps_text(bin_dir: Path, path_env: str | None, cwd: Path) -> str:
    """The lines the demo ends with: the activation line when needed, then commands to paste."""
    line = activation_line(bin_dir, path_env, cwd)
    out = []
    if line:
        out.append(f"next: `imagebench` is in {_shown_path(bin_dir, cwd)}, which is not on your PATH; "
                   "run this once in each new shell (or prefix the commands with that folder):")
        out.append(f"  {line}")
        out.append("then, for example:")
    else:
        out.append("next, for example:")
    out += [f"  {c}" for c in DEMO_NEXT_COMMANDS]
    return "\n".join(out)


def print_next_steps(console) -> None:
    """Print :func:`next_steps_text` for the running interpreter's bin folder (not resolved:
    ``.venv/bin/python`` is a symlink to the system Python)."""
    console.print(next_steps_text(Path(sys.executable).parent.absolute(), os.environ.get("PATH"), Path.cwd()),
                  markup=False, highlight=False, soft_wrap=True)
