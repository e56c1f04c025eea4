"""What every `imagebench` sub-app shares (ARCHITECTURE.md section 7): errors, settings, output
and logging. Imported by the sub-apps of flows/cli/, never importing them; no heavy imports
(`sql` and `leaderboard` use it: no torch, Prefect or Great Expectations here).

- Errors: ``CliError`` and ``user_errors`` (an expected error is one line and exit 1).
- Settings: ``cli_settings`` (a bad IMAGEBENCH_* value is exit 2), ``precheck`` and
  ``prepare_prefect`` before a command runs flows (with ``SCORING_PRELOAD``, what the scoring
  flows import, loaded while the embedded Prefect API starts).
- Output: the stderr console ``err``, ``render`` (table, CSV or JSON), progress bars, banners.
- Logging: where a command's tracebacks go, the workspace's log file, not the terminal.
- Help rendering fixes for typer 0.29, applied when this module is imported (before any
  command is built).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
import logging.handlers
import math
import os
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, TextIO

import typer
from rich.console import Console
from typer import rich_utils
from typer.core import TyperArgument, TyperOption

from schemas.settings import Settings, load_settings


# ---- help rendering fixes for typer 0.29 (formerly flows/clihelp.py) ----------------------------
# - Every flag's help showed ``<bool>`` as its value: typer's rich help prints
#   ``display_type_rich`` for every option, and for a boolean flag (which takes no value:
#   ``--rejudge``, ``--help``) that is ``<bool>``, as if one had to write ``--rejudge true``. A flag
#   shows no metavar; options that take a value are unchanged.
# - The usage line showed a required argument in braces, ``{file}`` or ``{MODEL}``, which reads
#   like a template placeholder: it shows ``FILE`` / ``MODEL`` (``[NAME]`` when optional).
# - A group's command list kept the line breaks of a multi-line docstring's first paragraph, so a
#   summary broke mid-sentence at the docstring's margin: its lines are joined, as in the
#   command's own help.

_display_type_rich = TyperOption.display_type_rich


def _no_metavar_for_flags(self: TyperOption, ctx) -> str | None:
    if self.is_flag and not self.count:
        return None
    return _display_type_rich(self, ctx)


def _usage_name(self: TyperArgument) -> str:
    name = self.display_name_raw if self.metavar else self.display_name_raw.upper()
    name = name if self.required else f"[{name}]"
    return name + ("..." if self.nargs != 1 else "")


_make_command_help = rich_utils._make_command_help


def _summary_on_one_line(*, help_text: str, markup_mode):
    import inspect

    first, sep, rest = inspect.cleandoc(help_text).partition("\n\n")
    if not first.startswith("\b"):
        first = " ".join(first.split())
    return _make_command_help(help_text=first + sep + rest, markup_mode=markup_mode)


TyperOption.display_type_rich = _no_metavar_for_flags  # type: ignore[method-assign]
TyperArgument._usage_display_name = _usage_name  # type: ignore[method-assign]
rich_utils._make_command_help = _summary_on_one_line  # type: ignore[assignment]


# ---- logging: where tracebacks go (formerly flows/clilog.py) ------------------------------------
# Where a command's tracebacks go: the workspace's log file, not the terminal.
#
# An expected error (bad input, unreachable store, tampered reference) is one line on stderr and
# exit code 1; its traceback, and every ERROR record Prefect logs while the command runs (flow and
# task failures, with their tracebacks), go to ``$IMAGEBENCH_HOME/logs/imagebench.log``.
# ``imagebench --debug ...`` (or ``IMAGEBENCH_DEBUG=1``) shows them in the terminal instead.
# Warnings still reach the terminal. Standard library only: `sql` and `leaderboard` use it too.

LOG_DIR = "logs"  # under IMAGEBENCH_HOME
LOG_FILE = "imagebench.log"
LOG_MAX_BYTES = 5_000_000  # then imagebench.log.1 .. .3
LOG_BACKUPS = 3
DEBUG_ENV = "IMAGEBENCH_DEBUG"
LOGGER = "imagebench.cli"

_handler: logging.Handler | None = None


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def log_path(home: Path) -> Path:
    return Path(home) / LOG_DIR / LOG_FILE


def attach_file_log(home: Path, create: bool = True) -> Path | None:
    """Send ERROR/WARNING records of every logger (Prefect's included) and this module's
    records to the workspace log file. Idempotent per path; None when the workspace does not
    exist (and ``create`` is false) or the file cannot be opened."""
    global _handler
    path = log_path(home)
    if _handler is not None and getattr(_handler, "baseFilename", None) == os.path.abspath(path):
        return path
    if not create and not Path(home).is_dir():
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS,
                                                       encoding="utf-8", delay=True)
    except OSError:
        return None
    from tasks.store.redact import install_log_redaction

    install_log_redaction()  # records are scrubbed of credentials when created, for this file too
    handler.setLevel(logging.INFO)  # not the DEBUG request dumps of PREFECT_LOGGING_ROOT_LEVEL=DEBUG
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
    root, own = logging.getLogger(), logging.getLogger(LOGGER)
    if _handler is not None:  # another workspace in the same process (tests): one file at a time
        for logger in (root, own):
            logger.removeHandler(_handler)
        _handler.close()
    _handler = handler
    root.addHandler(handler)
    own.addHandler(handler)
    own.setLevel(logging.INFO)
    own.propagate = False  # the traceback goes to the file, not through Prefect's console handler
    return path


class _NoErrorsOnConsole(logging.Filter):
    """Prefect's console handler: ERROR records (a failed flow or task run, with its traceback)
    are in the log file; the command prints the error once, itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or debug_enabled()


def quiet_console() -> None:
    """Install the filter on Prefect's console handlers (after ``import prefect`` set them up)."""
    for handler in logging.getLogger().handlers:
        if type(handler).__name__ == "PrefectConsoleHandler" and not any(
            isinstance(f, _NoErrorsOnConsole) for f in handler.filters
        ):
            handler.addFilter(_NoErrorsOnConsole())


def command_started(home: Path, quiet: bool = True) -> Path | None:
    """For commands that run flows: file log on, console quiet, the command line recorded."""
    path = attach_file_log(home)
    if quiet:
        quiet_console()
    logging.getLogger(LOGGER).info("imagebench %s", " ".join(sys.argv[1:]))
    return path


def log_exception(home: Path | None, exc: BaseException) -> Path | None:
    """Write ``exc`` with its traceback to the workspace log; the log's path, or None."""
    path = attach_file_log(home, create=False) if home is not None else None
    if path is None:
        return None
    logging.getLogger(LOGGER).error("imagebench %s: %s: %s", " ".join(sys.argv[1:]), type(exc).__name__, exc,
                                    exc_info=(type(exc), exc, exc.__traceback__))
    for h in logging.getLogger(LOGGER).handlers:
        h.flush()
    return path


# ---- output: tables, CSV and JSON (formerly flows/output.py) ------------------------------------

class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def _cell(value: Any, column: str | None = None) -> str:
    """A table cell as a person reads it: a known figure (capability, coverage, mu, ...) in the one
    number style of tasks/scores/display.py, any other float with 6 significant digits."""
    if column is not None:
        from tasks.scores.display import styled

        text = styled(column, value)
        if text is not None:
            return text
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def render(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    fmt: OutputFormat,
    title: str | None = None,
    out: TextIO | None = None,
) -> None:
    out = out or sys.stdout
    if fmt is OutputFormat.json:
        objs = [{c: _jsonable(v) for c, v in zip(columns, row)} for row in rows]
        out.write(json.dumps(objs, indent=1) + "\n")
    elif fmt is OutputFormat.csv:
        from tasks.store.spreadsheet import write_csv

        write_csv(out, columns, rows)  # no cell a spreadsheet would run (issue 24 item 7)
    else:
        from rich.console import Console
        from rich.table import Table

        console = Console(file=out)
        if not console.is_terminal:
            console = Console(file=out, width=240)  # piped: never fold cells into slivers
        cells = [[_cell(v, c) for c, v in zip(columns, row)] for row in rows]
        if table_width(columns, cells) > console.width:
            # Too wide to read as columns (34 of them from `select *`): one block per record.
            out.write(vertical(columns, cells, title))
            return
        table = Table(title=title, show_lines=False)
        for c in columns:
            table.add_column(c, overflow="fold")
        for row in cells:
            table.add_row(*row)
        console.print(table)


def render_fitted(
    layouts: Sequence[tuple[Sequence[str], Sequence[Sequence[str]], str | None]],
    title: str | None = None,
    wide: bool = False,
    out: TextIO | None = None,
) -> None:
    """A table of already written cells, one line per row, never one block per record: the first
    of ``layouts`` (columns, cells, legend line) that fits the terminal (its width, or COLUMNS; a
    pipe without COLUMNS: 240), else the last one, whose cells Rich folds to fit. ``wide``: the
    first layout at its full width, however wide the terminal (for `less -S` or a wide window)."""
    import io

    from rich import box
    from rich.table import Table

    out = out or sys.stdout
    console = Console(file=out)
    width = console.width
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        width = 240  # piped: never fold cells into slivers

    def table(columns: Sequence[str], cells: Sequence[Sequence[str]]) -> Table:
        t = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
        for c in columns:
            t.add_column(c, overflow="fold")
        for row in cells:
            t.add_row(*row)
        return t

    def needed(columns: Sequence[str], cells: Sequence[Sequence[str]]) -> int:
        return Console(file=io.StringIO(), width=100_000).measure(table(columns, cells)).maximum

    chosen = layouts[0] if wide else next((lay for lay in layouts if needed(lay[0], lay[1]) <= width), layouts[-1])
    columns, cells, legend = chosen
    console = Console(file=out, width=max(width, needed(columns, cells)) if wide else width)
    console.print(table(columns, cells))
    if legend:
        console.print(legend, highlight=False, markup=False)


def table_width(columns: Sequence[str], cells: Sequence[Sequence[str]]) -> int:
    """Characters a rich table needs to show every cell unfolded (borders and padding included)."""
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    return sum(widths) + 3 * len(widths) + 1


def vertical(columns: Sequence[str], cells: Sequence[Sequence[str]], title: str | None = None) -> str:
    """psql's expanded display: ``-[ RECORD n ]`` then one ``column | value`` line per column."""
    name_w = max((len(c) for c in columns), default=0)
    value_w = min(60, max((len(v) for row in cells for v in row), default=0))
    lines = [title] if title else []
    for n, row in enumerate(cells, 1):
        head = f"-[ RECORD {n} ]"
        lines.append(head + "-" * max(1, name_w + 3 + value_w - len(head)))
        lines += [f"{c:<{name_w}} | {v}" for c, v in zip(columns, row)]
    if not cells:
        lines.append("(0 rows)")
    return "\n".join(lines) + "\n"


def nightly_line(summary: dict) -> str:
    """One line that adds up: every discovered model in exactly one disposition, each named."""
    errored = set(summary.get("errored", []))
    up_to_date = [m for m in summary.get("up_to_date", []) if m not in errored]
    rejudged = len(set(summary.get("rejudged", [])) & set(up_to_date))
    parts = [
        ("scored", len(summary.get("scored", []))),
        ("unchanged (same images)", len([m for m in summary.get("unchanged", []) if m not in errored])),
        (f"up to date ({rejudged} with new verdicts)", len(up_to_date)),
        ("busy (another run holds them)", len(summary.get("busy", []))),
        ("retired", len(summary.get("retired", []))),
        ("invalid", len(summary.get("invalid", {}))),
        ("errored", len(errored)),
    ]
    discovered = int(summary.get("discovered", 0))
    left = discovered - sum(n for _, n in parts)
    if left > 0:  # never print a sum that does not add up: whatever is left is named too
        parts.append(("without a result (see `imagebench runs`)", left))
    shown = [f"{n} {label}" for label, n in parts if n or label == "scored"]
    return f"nightly: {discovered} models discovered: " + ", ".join(shown)


# `imagebench runs` as a person reads it: what each run found and did, as counts, and where its
# time went (every column of the run record with --format csv|json).
RUNS_TABLE = ("run", "flow", "status", "started", "took_s", "discovered", "scored", "up_to_date", "skipped",
              "errored", "images_scored", "verdicts", "stage_s")
STAGE_NAMES = ("ingest", "hpsv3", "judge", "commit", "catalog")  # schemas.lake.STAGES (not imported: light)


def runs_table(records: Sequence[dict]) -> tuple[list[str], list[list[Any]]]:
    """One row per run record: ``scored`` counts new, incremental and replaced models;
    ``up_to_date`` the models with nothing to score (up to date, or unchanged content);
    ``skipped`` the busy and invalid ones; ``stage_s`` the seconds of each stage the run spent
    time in. A run that did not complete says at which stage it stopped."""

    def n(record: dict, *keys: str) -> int:
        return sum(len(record.get(f"models_{k}") or []) for k in keys)

    rows = []
    for r in records:
        status = r.get("status") or ""
        if status != "completed" and r.get("stage"):
            status = f"{status} at {r['stage']}"
        started = r.get("started_at")
        seconds = [(s, float(r.get(f"{s}_s") or 0)) for s in STAGE_NAMES]
        stages = [f"{s} {v:.0f}" if v >= 10 else f"{s} {v:.1f}" for s, v in seconds if v > 0]
        rows.append([
            str(r.get("run_id") or "")[:8], r.get("flow"), status,
            started.strftime("%Y-%m-%d %H:%M") if isinstance(started, dt.datetime) else started,
            None if r.get("total_s") is None else round(float(r["total_s"])),
            r.get("models_discovered"), n(r, "new", "incremental", "replaced"), n(r, "up_to_date", "unchanged"),
            n(r, "busy", "invalid"), n(r, "errored"), r.get("hps_images_scored"), r.get("verdicts_decided"),
            ", ".join(stages) or "-",
        ])
    return list(RUNS_TABLE), rows


# ---- errors, settings and the console (formerly the top of flows/cli.py) ------------------------

err = Console(stderr=True)
UNCALIBRATED_BANNER = (
    "UNCALIBRATED DEMO WEIGHTS: these mu/EPS values come from a tiny randomly initialised "
    "HPSv3-architecture model, not from HPSv3. They show the pipeline, not model quality."
)


class CliError(Exception):
    """An error the user can fix; printed without a traceback, exit code 1."""


def _expected_errors() -> tuple[type[BaseException], ...]:
    # Every error class our modules raise for bad input derives from ValueError, RuntimeError,
    # OSError or LookupError; a traceback is shown only with IMAGEBENCH_DEBUG=1.
    return (CliError, ValueError, RuntimeError, OSError, LookupError)


@contextmanager
def user_errors(log: bool = True):
    """Expected errors: one line, exit 1; with ``log``, the traceback goes to the workspace log
    (read-only commands, `sql` and `leaderboard`, leave the workspace as it was)."""
    try:
        yield
    except (typer.Exit, BrokenPipeError):  # a closed pipe (`| head`): click stops quietly (EPIPE)
        raise
    except _expected_errors() as exc:
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


def cli_settings() -> Settings:
    try:
        settings = load_settings()
    except Exception as exc:  # pydantic ValidationError on a bad IMAGEBENCH_* value
        from pydantic import ValidationError
        from rich.markup import escape

        from schemas.settings import describe_invalid

        text = describe_invalid(exc) if isinstance(exc, ValidationError) else str(exc)
        err.print(f"[bold red]error:[/] invalid setting: {escape(text)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    secure_workspace(settings)
    return settings


def secure_workspace(settings: Settings) -> None:
    """The workspace its owner's alone (or its lake and catalog open to IMAGEBENCH_SHARE_GROUP), a
    workspace left open said in one line, one of another user refused; the lake's lock waits
    bounded by IMAGEBENCH_LAKE_LOCK_WAIT_S (tasks/store/private.py, tasks/store/lockfile.py)."""
    from rich.markup import escape

    from tasks.store import lockfile, private

    lockfile.set_lake_lock_wait(settings.lake_lock_wait_s)
    try:
        said = private.secure_workspace(settings.home, settings.lake_dir, settings.catalog_path, settings.share_group)
    except (private.WorkspaceRefused, OSError) as exc:  # nothing is written there, not even the log
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    for line in said:
        err.print(f"[yellow]imagebench: {escape(line)}[/]", highlight=False, soft_wrap=True)


def publish_outside(settings: Settings, path: Path) -> None:
    """An output written where the person asked, outside the workspace (a report site, a bundle):
    the modes their own umask gives, not the workspace's 0600 (tasks/store/private.py)."""
    from tasks.store import private

    if not private.inside(path, settings.home):
        private.publish_tree(path)


def precheck(settings: Settings, model: str | None = None, objects: bool = False) -> None:
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
        from tasks.runs.models import check_model_folder
        from tasks.runs.units_ingest import open_configured_store

        store = open_configured_store(settings)
        check_model_folder(store, Lake(settings.lake_dir), model, settings.suite_version, settings.reference_dir)


# What the scoring flows (score, nightly, backfill, reference build) import on their way: Great
# Expectations (validation, the reference check) and the HPSv3 scorer (torch, transformers).
VALIDATION_PRELOAD = ("great_expectations",)
SCORING_PRELOAD = (*VALIDATION_PRELOAD, "tasks.hpsv3.scorer")


def scoring_preload(scorer_given: bool) -> tuple[str, ...]:
    """A command handed an already loaded scorer (tests, the warm server's child) needs no torch import."""
    return VALIDATION_PRELOAD if scorer_given else SCORING_PRELOAD


def prepare_prefect(settings: Settings, quiet: bool = True, preload: Sequence[str] = ()) -> None:
    """Before a command runs flows: the workspace and Prefect's home exist (flows.env), its
    ephemeral API server dies with the command (flows.ephemeral), failures go to the log file
    (and, unless ``quiet`` is false as for `serve`, not to the terminal: the logging section above).

    ``preload``: modules the command's flows will import (Great Expectations, the HPSv3 scorer),
    imported here while the embedded Prefect API boots in its own process (flows.env
    ``start_embedded_api``): the two waits overlap instead of adding up."""
    import importlib

    from flows.env import prepare_prefect_env, start_embedded_api

    prepare_prefect_env(settings.home)
    secure_workspace(settings)  # a workspace just created: its share group's lake from the first command
    # Prefect's logging first: set up later, it sees our file handler on the root logger, takes
    # it for the user's and drops its own console handler (no flow log in the terminal at all).
    from prefect.logging.configuration import PROCESS_LOGGING_CONFIG, setup_logging

    if not PROCESS_LOGGING_CONFIG:
        setup_logging()
    api_start = start_embedded_api() if preload else None
    command_started(settings.home, quiet=quiet)
    _report_crashed(settings)
    for name in preload:
        importlib.import_module(name)
    if api_start is not None:
        api_start.join()


def _report_crashed(settings: Settings) -> None:
    """Runs of this workspace whose process died (killed, machine stopped): recorded as crashed."""
    from rich.markup import escape

    from tasks.runs.state import describe, settle_crashed

    try:
        crashed = settle_crashed(settings.home, settings.lake_dir)
    except Exception as exc:  # noqa: BLE001 - e.g. a corrupt run record: the run itself reports the lake
        logging.getLogger("imagebench.cli").warning("could not look for crashed runs: %s", exc)
        return
    for row in crashed:
        err.print(f"[yellow]{escape(describe(row))}[/]", highlight=False, soft_wrap=True)


@contextmanager
def progress():
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


def print_rows(rows: list[dict], fmt: OutputFormat, title: str) -> None:
    if not rows:
        return
    columns = list(rows[0])
    if fmt is OutputFormat.table and set(SCORE_TABLE_COLUMNS) <= set(columns):
        columns = list(SCORE_TABLE_COLUMNS)
    render(columns, [[r[c] for c in columns] for r in rows], fmt, title=title)


def warn_uncalibrated(flagged: bool, fmt: OutputFormat) -> None:
    if flagged:
        err.print(f"[bold yellow]{UNCALIBRATED_BANNER}[/]")


def print_quarantine(settings, model_ids, console) -> None:
    """Why each of these models' objects was quarantined (every command that ingests prints it)."""
    from tasks.runs.models import quarantine_lines

    lines = quarantine_lines(settings, model_ids)
    for line in lines:
        console.print(f"[yellow]{line}[/]", highlight=False, soft_wrap=True, markup=True)
    if lines:
        console.print("[yellow]quarantined images count as losses (complete = false): "
                      "imagebench sql \"SELECT * FROM quarantine WHERE model_id = '...'\"[/]",
                      highlight=False, soft_wrap=True)


def catalog_or_exit(settings: Settings) -> Path:
    """The catalog, built from the lake and the pinned suite when missing or of an older format:
    `prompts` and the views are there from the first command, before anything is scored."""
    from tasks.runs.models import ensure_catalog

    return ensure_catalog(settings)[0]
