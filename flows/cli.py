"""The `imagebench` command line.

Heavy packages (torch, transformers, Prefect, Great Expectations) are imported inside the
commands that need them, so `sql` and `leaderboard` answer in about a second.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

import flows.clihelp  # noqa: F401  (boolean flags show no `<bool>` in --help)
from flows.output import OutputFormat, render
from schemas.settings import Settings, load_settings

app = typer.Typer(
    name="imagebench",
    help="Reproducible scoring of text-to-image models: HPSv3 EPS against a frozen reference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
reference_app = typer.Typer(help="Build or verify the frozen EPS reference.", no_args_is_help=True)
app.add_typer(reference_app, name="reference")
judges_app = typer.Typer(help="Judges: check the configured endpoints.", no_args_is_help=True)
app.add_typer(judges_app, name="judges")
from flows.cli_models import models_app, print_quarantine  # noqa: E402 - a sub-app per area (ARCHITECTURE.md section 6)

app.add_typer(models_app, name="models")
from flows.cli_study import study_app  # noqa: E402

app.add_typer(study_app, name="study")
from flows.cli_panel import panel_app  # noqa: E402

app.add_typer(panel_app, name="panel")
from flows.cli_vab import vab_app  # noqa: E402
import flows.cli_vab_run  # noqa: E402,F401  (registers vab run|audit|demo-sets onto vab_app)
import flows.cli_vab_people  # noqa: E402,F401  (registers vab panel open|serve|status|close|analyze|export)

app.add_typer(vab_app, name="vab")
from flows.cli_warm import warm_app  # noqa: E402

app.add_typer(warm_app, name="warm")

err = Console(stderr=True)
UNCALIBRATED_BANNER = (
    "UNCALIBRATED DEMO WEIGHTS: these mu/EPS values come from a tiny randomly initialised "
    "HPSv3-architecture model, not from HPSv3. They show the pipeline, not model quality."
)


@app.callback()
def _global_options(
    debug: Annotated[
        bool, typer.Option("--debug", help="show tracebacks and Prefect's error logs in the terminal (else in $IMAGEBENCH_HOME/logs/imagebench.log)")
    ] = False,
) -> None:
    if debug:
        os.environ["IMAGEBENCH_DEBUG"] = "1"  # read by flows.clilog, also in processes this one starts


class CliError(Exception):
    """An error the user can fix; printed without a traceback, exit code 1."""


def _expected_errors() -> tuple[type[BaseException], ...]:
    # Every error class our modules raise for bad input derives from ValueError, RuntimeError,
    # OSError or LookupError; a traceback is shown only with IMAGEBENCH_DEBUG=1.
    return (CliError, ValueError, RuntimeError, OSError, LookupError)


@contextmanager
def _user_errors(log: bool = True):
    """Expected errors: one line, exit 1; with ``log``, the traceback goes to the workspace log
    (read-only commands, `sql` and `leaderboard`, leave the workspace as it was)."""
    try:
        yield
    except (typer.Exit, BrokenPipeError):  # a closed pipe (`| head`): click stops quietly (EPIPE)
        raise
    except _expected_errors() as exc:
        from flows.clilog import debug_enabled, log_exception

        if debug_enabled():
            raise
        from rich.markup import escape

        # One line; the traceback (and Prefect's record of a failed run) is in the workspace log.
        logged = log_exception(_home_or_none(), exc) if log else None
        where = f" (traceback in {logged}; --debug shows it)" if logged else ""
        err.print(f"[bold red]error:[/] {escape(f'{type(exc).__name__}: {exc}')}{escape(where)}", highlight=False,
                  markup=True, soft_wrap=True)
        raise typer.Exit(1) from None


def _home_or_none() -> Path | None:
    try:
        return load_settings().home
    except Exception:  # noqa: BLE001 - an invalid setting is reported on its own
        return None


def _settings() -> Settings:
    try:
        return load_settings()
    except Exception as exc:  # pydantic ValidationError on a bad IMAGEBENCH_* value
        from pydantic import ValidationError
        from rich.markup import escape

        from schemas.settings import describe_invalid

        text = describe_invalid(exc) if isinstance(exc, ValidationError) else str(exc)
        err.print(f"[bold red]error:[/] invalid setting: {escape(text)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _precheck(settings: Settings, model: str | None = None, objects: bool = False) -> None:
    """What a flow would refuse first, checked before Prefect starts (no server, no log noise):
    the model id's form, the pinned suite, the reference file's SHA256SUMS line and, with
    ``objects``, that the store holds objects of the model (one listing: a typo or a wrong
    prefix is named here once, not from inside the flow)."""
    from tasks.scores.reference import verify_reference_file
    from tasks.store.storage import validate_model_id
    from tasks.runs.pinned import load_pinned_suite

    if model is not None:
        validate_model_id(model)
    load_pinned_suite(settings)
    verify_reference_file(settings.reference_dir, settings.reference_version)
    if model is not None and objects:
        from tasks.lake.tables import Lake
        from tasks.runs.models import require_objects
        from tasks.runs.units_ingest import open_configured_store

        store = open_configured_store(settings)
        require_objects(store, Lake(settings.lake_dir), model, len(store.list_model_objects(model)))


def _prefect(settings: Settings, quiet: bool = True) -> None:
    """Before a command runs flows: the workspace and Prefect's home exist (flows.env), its
    ephemeral API server dies with the command (flows.ephemeral), failures go to the log file
    (and, unless ``quiet`` is false as for `serve`, not to the terminal: flows.clilog)."""
    from flows.clilog import command_started
    from flows.env import prepare_prefect_env

    prepare_prefect_env(settings.home)
    # Prefect's logging first: set up later, it sees our file handler on the root logger, takes
    # it for the user's and drops its own console handler (no flow log in the terminal at all).
    from prefect.logging.configuration import PROCESS_LOGGING_CONFIG, setup_logging

    if not PROCESS_LOGGING_CONFIG:
        setup_logging()
    command_started(settings.home, quiet=quiet)
    _report_crashed(settings)


def _report_crashed(settings: Settings) -> None:
    """Runs of this workspace whose process died (killed, machine stopped): recorded as crashed."""
    from rich.markup import escape

    from tasks.runs.state import describe, settle_crashed

    try:
        crashed = settle_crashed(settings.home, settings.lake_dir)
    except Exception as exc:  # noqa: BLE001 - e.g. a corrupt run record: the run itself reports the lake
        import logging

        logging.getLogger("imagebench.cli").warning("could not look for crashed runs: %s", exc)
        return
    for row in crashed:
        err.print(f"[yellow]{escape(describe(row))}[/]", highlight=False, soft_wrap=True)


@contextmanager
def _progress():
    """Rich progress bars for whatever long work runs inside (ingest, HPSv3 batches)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tasks.runs import progress as hooks

    bars = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=False,
    )
    ids: dict[str, int] = {}

    def report(stage: str, total: int, n: int) -> None:
        if stage in ids:
            task = next(t for t in bars.tasks if t.id == ids[stage])
            if hooks.starts_new_round(int(task.completed), int(task.total or 0), total):
                ids.pop(stage)  # the same stage again (e.g. ingest for the reference, then the nightly)
        if stage not in ids:
            ids[stage] = bars.add_task(stage, total=total if total > 0 else None)
        elif total > 0:
            bars.update(ids[stage], total=total)
        if n:
            bars.advance(ids[stage], n)

    hooks.set_reporter(report)
    try:
        with bars:
            yield
    finally:
        hooks.set_reporter(None)


# What a person compares in a terminal; --format csv/json carries every column.
SCORE_TABLE_COLUMNS = (
    "model_id", "overall", "capability", "eps", "judge_coverage", "eps_prompts_scored", "eps_prompts_eligible",
    "images_quarantined", "images_missing", "complete", "provisional", "uncalibrated", "reference_version",
)


def _print_rows(rows: list[dict], fmt: OutputFormat, title: str) -> None:
    if not rows:
        return
    columns = list(rows[0])
    if fmt is OutputFormat.table and set(SCORE_TABLE_COLUMNS) <= set(columns):
        columns = list(SCORE_TABLE_COLUMNS)
    render(columns, [[r[c] for c in columns] for r in rows], fmt, title=title)


def _warn_uncalibrated(flagged: bool, fmt: OutputFormat) -> None:
    if flagged:
        err.print(f"[bold yellow]{UNCALIBRATED_BANNER}[/]")


# ---------------------------------------------------------------------------------------------


@app.command()
def ingest(
    model: Annotated[str, typer.Option("--model", "-m", help="model id: folder models/<id>/ in the store")],
    source: Annotated[Optional[str], typer.Option(help="object store URI (s3://bucket/prefix or a directory)")] = None,
) -> None:
    """Validate and record one model's images (quarantining bad ones); no scoring."""
    with _user_errors():
        settings = _settings()
        if source:
            settings = settings.model_copy(update={"store": source})
        from tasks.runs import pinned, units_aggregate, units_ingest, units_judge

        suite = pinned.load_pinned_suite(settings)
        with _progress():
            summary = units_ingest.ingest_and_publish(settings, suite, model)
        units_aggregate.refresh(settings, suite)
        _print_rows([summary.__dict__], OutputFormat.table, f"ingest {model}")
        print_quarantine(settings, [model], err)


@app.command()
def score(
    model: Annotated[str, typer.Option("--model", "-m", help="model id to score now (also the backfill path)")],
    scorer: Annotated[
        Optional[str], typer.Option(help="aggregate scores imported under this scorer name instead of running HPSv3")
    ] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    rejudge: Annotated[bool, typer.Option("--rejudge", help="ask the judges again even where a verdict exists")] = False,
) -> None:
    """Score one model now: ingest, HPSv3 and the routed judges side by side, EPS/Capability/Overall."""
    with _user_errors():
        settings = _settings()
        _precheck(settings, model, objects=scorer is None)
        _prefect(settings)
        from flows.pipeline import score_model_flow

        with _progress():
            row = score_model_flow(model, scorer_name=scorer, rejudge=rejudge)
        _print_rows([row], fmt, f"score {model}")
        print_quarantine(settings, [model], err)
        _warn_uncalibrated(row["uncalibrated"], fmt)


# ---- production mode: backfills on a Prefect server (flows/cli_backfill.py) ----------------
from flows.cli_backfill import BACKFILL_DEPLOYMENT  # noqa: E402,F401  (light: no Prefect import)


@app.command()
def backfill(
    model: Annotated[str, typer.Option("--model", "-m", help="model id: folder models/<id>/ in the store")],
    suite_version: Annotated[Optional[str], typer.Option(help="prompt suite version (default: the configured one)")] = None,
    reference_version: Annotated[
        Optional[str], typer.Option(help="frozen EPS reference version (default: the configured one)")
    ] = None,
    rejudge: Annotated[bool, typer.Option("--rejudge", help="ask the judges again even where a verdict exists")] = False,
    scorer: Annotated[
        Optional[str], typer.Option(help="aggregate scores imported under this scorer name instead of running HPSv3")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="on a server: wait for the run's end, print its scores")
    ] = False,
    local: Annotated[bool, typer.Option("--local", help="run in this process even when a server is configured")] = False,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Backfill one model: a run of deployment score-model/backfill on the Prefect server
    (production mode: PREFECT_API_URL set, or `make serve` running), else in this process."""
    with _user_errors():
        from schemas.settings import VERSION_RE
        from tasks.store.storage import validate_model_id

        validate_model_id(model)
        for flag, value in (("--suite-version", suite_version), ("--reference-version", reference_version)):
            if value is not None and not VERSION_RE.fullmatch(value):
                raise CliError(f"{flag} {value!r} is not a valid version name (letters, digits, '.', '_', '-')")
        settings = _settings()
        _prefect(settings)
        from flows.cli_backfill import backfill_on_server, server_api_url

        api_url, source = (None, "") if local else server_api_url(settings)
        parameters = {"model_id": model, "rejudge": rejudge}
        parameters.update({k: v for k, v in (("suite_version", suite_version), ("reference_version", reference_version),
                                             ("scorer_name", scorer)) if v is not None})
        if api_url:
            backfill_on_server(settings, api_url, source, parameters, wait, fmt)
            return
        why = "--local" if local else "embedded mode: no Prefect server configured (PREFECT_API_URL unset, `make serve` not running)"
        _precheck(settings.model_copy(update={k: v for k, v in (
            ("suite_version", suite_version), ("reference_version", reference_version)) if v}),
            model, objects=scorer is None)
        err.print(f"{why}: running score-model in this process", highlight=False, soft_wrap=True)
        from flows.pipeline import score_model_flow

        with _progress():
            row = score_model_flow(**parameters)
        _print_rows([row], fmt, f"backfill {model}")
        print_quarantine(settings, [model], err)
        _warn_uncalibrated(row["uncalibrated"], fmt)


@app.command()
def nightly(
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    rejudge: Annotated[bool, typer.Option("--rejudge", help="ask the judges again even where a verdict exists")] = False,
) -> None:
    """Score every model in the store not yet scored against the current suite, reference and
    scorer; for unchanged models, request only verdicts still missing."""
    with _user_errors():
        settings = _settings()
        _precheck(settings)
        _prefect(settings)
        from flows.pipeline import nightly_flow

        with _progress():
            summary = nightly_flow(rejudge=rejudge)
        from flows.output import nightly_line

        err.print(nightly_line(summary), highlight=False)
        for model_id, detail in summary["invalid"].items():
            err.print(f"[red]invalid model folder {model_id!r}: {detail}[/]")
        _print_rows(summary["rows"], fmt, "nightly")
        print_quarantine(settings, summary["scored"] + summary["unchanged"], err)
        _warn_uncalibrated(any(r["uncalibrated"] for r in summary["rows"]), fmt)


class Rotary(str, Enum):
    """HPSv3 rotary arithmetic (docs/HPSV3.md)."""

    official = "official"
    float32 = "float32"


@app.command()
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
    with _user_errors():
        settings = _settings()
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
        with _progress():
            from tasks.runs import progress as hooks

            hooks.advance("hpsv3", len(images), 0)
            result = scorer.score(images, prompts, batch_size=batch_size, progress=lambda n: hooks.advance("hpsv3", len(images), n))
        rows = [
            [str(img), prompt, float(mu), float(sigma)]
            for img, prompt, (mu, sigma) in zip(images, prompts, result.tolist())
        ]
        render(["image", "prompt", "mu", "sigma"], rows, fmt, title="HPSv3")
        _warn_uncalibrated(scorer.identity.uncalibrated, fmt)


IMPORT_TABLE_MAX = 50  # models listed one per line; a bigger import gets one line (`imagebench leaderboard` has them)


def _print_import_rows(rows: list[dict], title: str) -> None:
    if len(rows) <= IMPORT_TABLE_MAX:
        _print_rows(rows, OutputFormat.table, title)
        return
    counts = {k: sum(r[k] for r in rows) for k in ("rows_imported", "verdicts_imported") if k in rows[0]}
    what = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in counts.items()) or "results written"
    err.print(f"{title}: {len(rows)} models, {what} (tables are shown up to {IMPORT_TABLE_MAX} models; "
              "see `imagebench leaderboard`)")


@app.command("import-scores")
def import_scores(
    file: Annotated[Path, typer.Argument(help="CSV or Parquet: model_id,prompt_id,mu[,sigma,image_sha256]")],
    scorer: Annotated[str, typer.Option(help="name the scores are recorded under (not 'hpsv3')")] = "hpsv3-import",
) -> None:
    """Record HPSv3 scores computed elsewhere; EPS follows if the reference in force is this scorer's."""
    with _user_errors():
        settings = _settings()
        from tasks.runs import pinned, units_aggregate, units_ingest, units_judge
        from tasks.lake.imports import import_scores_file

        suite = pinned.load_pinned_suite(settings)
        summary = import_scores_file(settings, suite, file, scorer)
        rows = [{"model_id": m, "rows_imported": n} for m, n in summary.rows_per_model.items()]
        _print_import_rows(rows, f"imported under scorer {scorer!r}")
        if summary.aggregated:
            _print_import_rows(summary.aggregated, "EPS")
        else:
            err.print(f"[yellow]{summary.note}[/]")
        units_aggregate.refresh(settings, suite)


@app.command("import-verdicts")
def import_verdicts(
    file: Annotated[Path, typer.Argument(help="CSV or Parquet: model_id,prompt_id,verdict,judge[,rationale]")],
) -> None:
    """Record PASS/FAIL verdicts produced elsewhere; Capability of scored models is recomputed."""
    with _user_errors():
        settings = _settings()
        from tasks.runs import pinned, units_aggregate, units_ingest, units_judge
        from tasks.lake.imports import import_verdicts_file

        suite = pinned.load_pinned_suite(settings)
        summary = import_verdicts_file(settings, suite, file)
        rows = [{"model_id": m, "verdicts_imported": n} for m, n in summary.rows_per_model.items()]
        _print_import_rows(rows, "imported verdicts")
        if summary.note:
            err.print(f"[yellow]{summary.note}[/]")
        units_aggregate.refresh(settings, suite)


AXES = ("overall", "capability", "eps")


@app.command()
def compare(
    model_a: Annotated[str, typer.Argument(metavar="A")],
    model_b: Annotated[str, typer.Argument(metavar="B")],
    axis: Annotated[str, typer.Option(help="overall, capability or eps")] = "overall",
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Paired difference A - B with its 95% bootstrap interval and P(A beats B)."""
    with _user_errors():
        if axis not in AXES:
            raise CliError(f"--axis {axis!r}: choose one of {', '.join(AXES)}")
        from tasks.store.storage import validate_model_id

        for m in (model_a, model_b):  # before anything reads a path or a table named after them
            validate_model_id(m)
        settings = _settings()
        from tasks.runs.models import require_known

        for m in (model_a, model_b):
            require_known(settings, m)  # an unknown id: exit 1, nearest ids named
        from tasks.scores import stats
        from tasks.runs import pinned, units_aggregate, units_ingest, units_judge
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
        _warn_uncalibrated(axis != "capability" and reference.scorer.uncalibrated, fmt)  # EPS from demo weights


@app.command()
def breakdown(
    model: Annotated[str, typer.Option("--model", "-m", help="model id")],
    by: Annotated[str, typer.Option(help="category, subcategory, tag or difficulty")] = "category",
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Capability (PASS / decided; a missing or quarantined image is a FAIL) and EPS of one model
    per category, subcategory, tag or difficulty; the table's last row is the model's total."""
    with _user_errors():
        from flows.cli_breakdown import BREAKDOWN_GROUPS, breakdown_rows

        if by not in BREAKDOWN_GROUPS:
            raise CliError(f"--by {by!r}: choose {', '.join(BREAKDOWN_GROUPS[:-1])} or {BREAKDOWN_GROUPS[-1]}")
        from tasks.store.storage import validate_model_id

        validate_model_id(model)  # before anything reads a path or a table named after it
        settings = _settings()
        from tasks.runs.models import require_known

        require_known(settings, model)  # an unknown id: exit 1, nearest ids named
        columns, rows, total, uncalibrated = breakdown_rows(settings, model, by)
        # The total (= the leaderboard's Capability) as a row of the table; csv/json carry the groups.
        render(columns, rows + ([total] if fmt is OutputFormat.table else []), fmt, title=f"{model} by {by}")
        _warn_uncalibrated(uncalibrated, fmt)


@app.command()
def report(
    out: Annotated[Path, typer.Option("--out", help="output folder for the static site")] = Path("report"),
) -> None:
    """Write the static site: the leaderboard (sortable table, Capability-vs-EPS scatter, heatmaps,
    model pages) when models were scored, every Beauty Index study, the pooled view and VAB pages."""
    with _user_errors():
        settings = _settings()
        _catalog_or_exit(settings)
        from tasks.report.site import build_site  # a workspace of studies only needs no EPS reference

        site = build_site(settings, out)
        err.print(f"[green]report written:[/] {site.index}  ({site.models} models, {site.studies} studies, {site.vab} VAB "
                  f"collections; open it, or `python -m http.server -d {out}`)", highlight=False, soft_wrap=True)
        if site.leaderboard_note:
            err.print(f"[yellow]{site.leaderboard_note}[/]", highlight=False, soft_wrap=True)


@judges_app.command("check")
def judges_check(
    load_weights: Annotated[bool, typer.Option(help="also load local transformers judges")] = False,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Which configured judges answer, and with which model; and whether the routing is covered."""
    with _user_errors():
        settings = _settings()
        from tasks.runs import pinned, units_aggregate, units_ingest, units_judge
        from tasks.judges import check_judges

        setup = units_judge.load_judge_setup(settings)
        rows = check_judges(setup.judges_config, load_weights=load_weights)
        columns = ["judge", "backend", "endpoint", "model", "reported_model", "ok", "latency_s", "detail"]
        render(columns, [[r.get(c) for c in columns] for r in rows], fmt, title="judges")
        routes = setup.routing.routes
        for category, route in routes.items():
            names = [route.preferred] + ([route.fallback] if route.fallback else [])
            up = [n for n in names if any(r["judge"] == n and r["ok"] for r in rows)]
            err.print(f"{category}: {' -> '.join(names)}: " + (f"[green]{up[0]} answers[/]" if up else "[yellow]not judged (no judge answers)[/]"))
        if any(not r["ok"] for r in rows):
            raise typer.Exit(1)


@reference_app.command("build")
def reference_build(
    version: Annotated[str, typer.Option(help="new reference version; an existing one is never rewritten")],
    baseline: Annotated[Path, typer.Option(help="file with one baseline model id per line")],
    scorer: Annotated[Optional[str], typer.Option(help="build from scores imported under this name")] = None,
) -> None:
    """Build the frozen reference once: median mu of the baseline field per EPS-eligible prompt."""
    with _user_errors():
        settings = _settings()
        from tasks.store.adhoc import read_baseline

        models = read_baseline(baseline)
        _prefect(settings)
        from flows.pipeline import reference_build_flow

        with _progress():
            path = reference_build_flow(version, models, scorer_name=scorer)
        err.print(f"[green]reference {version} written to {path} and pinned in SHA256SUMS[/]")
        import json

        _warn_uncalibrated(bool(json.loads(Path(path).read_text())["scorer"].get("uncalibrated")), OutputFormat.table)


@reference_app.command("verify")
def reference_verify(
    version: Annotated[Optional[str], typer.Option(help="default: IMAGEBENCH_REFERENCE_VERSION")] = None,
) -> None:
    """Check the reference (and suite) against SHA256SUMS and its Great Expectations suite."""
    with _user_errors():
        settings = _settings()
        if version:
            settings = settings.model_copy(update={"reference_version": version})
        from tasks.runs import pinned, units_aggregate, units_ingest, units_judge

        suite = pinned.load_pinned_suite(settings)
        ref = pinned.load_verified_reference(settings, suite, None)
        err.print(
            f"[green]ok[/]: {settings.reference_path} ({len(ref.prompts)} prompts, suite {ref.suite.version}, "
            f"scorer {ref.scorer.scorer_name} {ref.scorer_id}, baseline {len(ref.baseline_models)} models)"
        )
        _warn_uncalibrated(ref.scorer.uncalibrated, OutputFormat.table)


@reference_app.command("canary")
def reference_canary(
    version: Annotated[Optional[str], typer.Option(help="default: IMAGEBENCH_REFERENCE_VERSION")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", help="table, csv or json")] = OutputFormat.table,
) -> None:
    """Score the reference's golden set in this runtime and compare with the mu stored at build
    (what every scoring run does first); exit 1 beyond the tolerance."""
    with _user_errors():
        settings = _settings()
        if version:
            settings = settings.model_copy(update={"reference_version": version})
        from tasks.runs import pinned, units_aggregate, units_ingest, units_judge
        from rich.markup import escape

        from tasks.scores.golden import compare, load_golden_set, score_golden
        from tasks.hpsv3.scorer import pin_intra_op_threads

        suite = pinned.load_pinned_suite(settings)
        spec = pinned.ScorerSpec.from_settings(settings)
        ref = pinned.load_verified_reference(settings, suite, pinned.scorer_identity(spec).scorer_id)
        golden = load_golden_set(settings.reference_dir, ref.golden.set if ref.golden else settings.golden_set)
        scorer = pinned.get_scorer(spec)
        pin_intra_op_threads(settings.hpsv3_threads)
        mus, runtime = score_golden(scorer, golden, settings.batch_size)
        result = compare(ref, golden, mus, runtime)
        expected = {g.item_id: g.mu for g in ref.golden.items}
        rows = [
            {"item": it.item_id, "prompt_id": it.prompt_id, "mu_reference": expected[it.item_id], "mu_now": mu,
             "drift": result.drifts[it.item_id], "within_tolerance": abs(result.drifts[it.item_id]) <= result.tolerance}
            for it, mu in zip(golden.items, mus)
        ]
        _print_rows(rows, fmt, f"golden-set canary: reference {ref.version}")
        err.print(("[green]ok[/]: " if result.passed else "[red]DRIFT[/]: ") + escape(result.describe()), highlight=False)
        _warn_uncalibrated(ref.scorer.uncalibrated, fmt)
        if not result.passed:
            raise typer.Exit(1)


def _catalog_or_exit(settings: Settings) -> Path:
    """The catalog, built from the lake and the pinned suite when missing or of an older format:
    `prompts` and the views are there from the first command, before anything is scored."""
    from tasks.runs.models import ensure_catalog

    return ensure_catalog(settings)[0]


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


@app.command()
def leaderboard(
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    sort: Annotated[str, typer.Option(help=f"one of {', '.join(LEADERBOARD_SORTS)}")] = "rank",
) -> None:
    """The leaderboard of the reference in force: Overall, Capability, EPS with 95% intervals,
    rank bands, judge coverage and flags (one row per model)."""
    with _user_errors(log=False):
        if sort not in LEADERBOARD_SORTS:
            raise CliError(f"--sort {sort!r}: choose one of {', '.join(LEADERBOARD_SORTS)}")
        settings = _settings()
        from tasks.lake.tables import query

        order = "ASC" if sort in ("model_id", "rank") else "DESC"
        # Qualified names: the table view formats columns under the same names as strings.
        sort = f"lb.{sort} {order} NULLS LAST" + (", lb.overall DESC NULLS LAST, lb.eps DESC" if sort == "rank" else "")
        # The terminal table shows what a reader compares; csv/json carry every column.
        select = LEADERBOARD_TABLE_COLUMNS if fmt is OutputFormat.table else "*"
        columns, rows = query(
            _catalog_or_exit(settings), f"SELECT {select} FROM leaderboard lb ORDER BY {sort}, lb.model_id"
        )
        render(columns, rows, fmt, title="imagebench leaderboard")
        flagged = "uncalibrated" in columns and any(r[columns.index("uncalibrated")] for r in rows)
        _warn_uncalibrated(flagged or ("flags" in columns and any("UNCALIBRATED" in (r[columns.index("flags")] or "")
                                                                  for r in rows)), fmt)
        if "flags" in columns and any("incomplete" in (r[columns.index("flags")] or "") for r in rows):
            err.print("[yellow]incomplete (complete = false): missing or quarantined images counted as losses[/]")


@app.command()
def runs(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="how many runs, newest first")] = 10,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """The latest run records: what each run discovered, scored, found up to date, skipped and
    errored, and how long each stage took (every column with --format json|csv)."""
    with _user_errors():
        settings = _settings()
        from flows.output import runs_table
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


@app.command()
def sql(
    query_text: Annotated[str, typer.Argument(metavar="QUERY", help="SQL over the catalog's views (read-only)")],
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Run a read-only SQL query on the DuckDB catalog."""
    with _user_errors(log=False):
        settings = _settings()
        # tasks.lake.tables.query refuses anything but queries (EXPLAIN ANALYZE of a write included),
        # parsing on the read-only connection, which has no file access.
        from tasks.lake.tables import query

        columns, rows = query(_catalog_or_exit(settings), query_text)
        render(columns, rows, fmt)


@app.command()
def catalog(
    full: Annotated[bool, typer.Option("--full", help="rebuild the compacted copy from every per-model file, not only what changed")] = False,
) -> None:
    """Rebuild the DuckDB catalog file from the lake."""
    with _user_errors():
        settings = _settings()
        from tasks.runs import pinned, units_aggregate, units_ingest, units_judge
        from tasks.lake.tables import refresh_catalog

        suite = pinned.load_pinned_suite(settings)
        if full:
            refresh_catalog(settings.lake_dir, settings.catalog_path, suite, settings.reference_version, full=True)
            path = settings.catalog_path
        else:
            path = units_aggregate.refresh(settings, suite)
        err.print(f"catalog written: {path}")


@app.command()
def serve(
    local_server: Annotated[
        bool,
        typer.Option(
            "--local-server",
            help="first start a real Prefect server on 127.0.0.1 (port IMAGEBENCH_PREFECT_PORT, default 4200; "
            "home $IMAGEBENCH_HOME/prefect-server), serve against it, stop it on exit (`make serve`)",
        ),
    ] = False,
    port: Annotated[Optional[int], typer.Option(help="--local-server port (default IMAGEBENCH_PREFECT_PORT or 4200)")] = None,
) -> None:
    """Serve the nightly deployment (cron schedule) and backfills: on the configured Prefect API, or
    with --local-server on a local Prefect server started (and stopped) by this command."""
    with _user_errors():
        settings = _settings()
        if not local_server:
            _prefect(settings, quiet=False)  # a server's console shows its runs' errors
            url = os.environ.get("PREFECT_API_URL")
            err.print(
                f"serving on the Prefect API at {url}" if url else
                "serving on the embedded Prefect API (no UI; `make serve` starts a real local server)",
                highlight=False, soft_wrap=True,
            )
            from flows.deployments import serve_deployments

            serve_deployments()
            return
        _serve_with_local_server(settings, port)


def _serve_with_local_server(settings: Settings, port: int | None) -> None:
    """`imagebench serve --local-server`: a real Prefect server child process, the deployments served
    against it from this process, both stopped on Ctrl-C / SIGTERM (the server last)."""
    import signal
    import threading

    from flows.server import LocalServer, protect_clients, server_home

    port = port or settings.prefect_port
    server = LocalServer(host="127.0.0.1", port=port, home=server_home(settings.home).resolve())
    configured = os.environ.get("PREFECT_API_URL")
    if configured and configured.rstrip("/") != server.api_url:
        # Decision (docs/OPERATIONS.md): the explicit flag wins over the environment.
        err.print(
            f"[yellow]PREFECT_API_URL={configured} is set, but --local-server serves on the local server it "
            f"starts ({server.api_url}); run plain `imagebench serve` to serve on {configured}[/]",
            highlight=False, soft_wrap=True,
        )
    # Before the first `import prefect` of this process: the client, and every flow run the runner
    # starts, talk to this server and keep their state beside it.
    os.environ["PREFECT_API_URL"] = server.api_url
    os.environ["PREFECT_HOME"] = str(server.home)
    protect_clients(server.home)  # its secret, for this process and the flow runs it starts
    _prefect(settings, quiet=False)  # a server's console shows its runs' errors

    stopping, died = threading.Event(), threading.Event()

    def _terminate(signum, _frame):  # until Prefect's runner installs its own handler
        stopping.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        err.print(f"starting a Prefect server on {server.url} (home {server.home}, log {server.log_path}) ...",
                  highlight=False, soft_wrap=True)
        server.start(wait=False)
        # Imported while the server starts (its first start migrates its database).
        from prefect.runner import Runner
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from flows.deployments import nightly_cron, nightly_timezone, serve_deployments

        server.wait_healthy()
        err.print(f"[green]Prefect server ready[/] in {server.started_in_s:.0f} s", highlight=False, soft_wrap=True)
        # Prefect pauses the served schedules on shutdown (the next `serve` resumes them).
        runner = Runner(pause_on_shutdown=True)

        def _watch() -> None:  # a server that dies takes `serve` down with it, loudly and at once
            while not stopping.wait(2.0):
                if not server.running():
                    died.set()
                    runner.pause_on_shutdown = False  # nothing left to pause
                    err.print(f"[bold red]error:[/] the Prefect server exited ({server.process.returncode}); "
                              f"{server.log_path} ends with:", highlight=False, soft_wrap=True)
                    err.print(server.log_tail(), markup=False, highlight=False)
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

        threading.Thread(target=_watch, name="imagebench-server-watch", daemon=True).start()
        err.print(
            f"\n[bold]imagebench production mode[/]\n"
            f"  UI:        {server.ui_url}\n"
            f"  API:       {server.api_url}\n"
            f"  nightly:   nightly/nightly, cron '{nightly_cron()}' in {nightly_timezone()}\n"
            f"  backfill:  imagebench backfill --model M [--rejudge] [--wait]   (another terminal, same IMAGEBENCH_HOME)\n"
            f"             or the UI: {server.ui_url}/deployments -> score-model/backfill -> Run\n"
            f"  stop:      Ctrl-C (stops the deployments, then the server)\n",
            highlight=False, soft_wrap=True,
        )
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            serve_deployments(runner=runner)
    except KeyboardInterrupt:
        pass
    except Exception:
        if not died.is_set():
            raise
        # The runner's shutdown could not reach the dead server: already reported above.
    finally:
        stopping.set()
        signal.signal(signal.SIGTERM, previous)
        if server.process is not None:
            err.print(f"stopping the Prefect server on {server.url} ...", highlight=False, soft_wrap=True)
            server.stop()
            err.print("Prefect server stopped", highlight=False, soft_wrap=True)
    if died.is_set():
        raise typer.Exit(1)


@app.command()
def demo() -> None:
    """Seed demo models, build a demo reference, run the nightly flow, print the leaderboard."""
    with _user_errors():
        from flows.demo import run_demo
        from flows.nextsteps import print_next_steps

        run_demo(err)
        leaderboard(fmt=OutputFormat.table, sort="rank")
        print_next_steps(err)  # the exact commands to paste: `make demo` cannot put .venv/bin on PATH


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
