"""`imagebench import-scores|import-verdicts`: results computed elsewhere, recorded in the lake
(tasks/lake/imports.py); registered on the app by flows/cli/__init__.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cli.common import OutputFormat, cli_settings, err, print_rows, user_errors


IMPORT_TABLE_MAX = 50  # models listed one per line; a bigger import gets one line (`imagebench leaderboard` has them)


def _print_import_rows(rows: list[dict], title: str) -> None:
    if len(rows) <= IMPORT_TABLE_MAX:
        print_rows(rows, OutputFormat.table, title)
        return
    counts = {k: sum(r[k] for r in rows) for k in ("rows_imported", "verdicts_imported") if k in rows[0]}
    what = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in counts.items()) or "results written"
    err.print(f"{title}: {len(rows)} models, {what} (tables are shown up to {IMPORT_TABLE_MAX} models; "
              "see `imagebench leaderboard`)")


def import_scores(
    file: Annotated[Path, typer.Argument(help="CSV or Parquet: model_id,prompt_id,mu[,sigma,image_sha256]")],
    scorer: Annotated[str, typer.Option(help="name the scores are recorded under (not 'hpsv3')")] = "hpsv3-import",
) -> None:
    """Record HPSv3 scores computed elsewhere; EPS follows if the reference in force is this scorer's."""
    with user_errors():
        settings = cli_settings()
        from tasks.runs import pinned, units_aggregate
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


def import_verdicts(
    file: Annotated[Path, typer.Argument(help="CSV or Parquet: model_id,prompt_id,verdict,judge[,rationale]")],
) -> None:
    """Record PASS/FAIL verdicts produced elsewhere; Capability of scored models is recomputed."""
    with user_errors():
        settings = cli_settings()
        from tasks.runs import pinned, units_aggregate
        from tasks.lake.imports import import_verdicts_file

        suite = pinned.load_pinned_suite(settings)
        summary = import_verdicts_file(settings, suite, file)
        rows = [{"model_id": m, "verdicts_imported": n} for m, n in summary.rows_per_model.items()]
        _print_import_rows(rows, "imported verdicts")
        if summary.note:
            err.print(f"[yellow]{summary.note}[/]")
        units_aggregate.refresh(settings, suite)
