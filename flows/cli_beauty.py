"""`imagebench study analyze|leaderboard|import-answers|export`: publishing a Beauty Index study.

Registered on the `study` sub-app of flows/cli_study.py (``register(study_app)``). `leaderboard`
reads the DuckDB catalog only: no torch, Prefect or Great Expectations (tests/flows/test_cli.py
checks it); `analyze` runs the Prefect flow `study-analyze` in this process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from flows.output import OutputFormat, render

LEADERBOARD_JSON_COLUMNS = ("rank", "tool", "beauty_index", "beauty_index_lo", "beauty_index_hi", "answers", "simulated",
                            "preregistered")
DIGITS = 1  # the table prints the Beauty Index and its interval to one decimal: so do CSV and JSON


def _cli():
    import flows.cli as cli  # shared error/settings helpers (imported late: cli imports the study app)

    return cli


def _simulated_banner(cli) -> None:
    from tasks.beauty.publish import SIMULATED_BANNER  # light: pyarrow only

    cli.err.print(f"[bold yellow]{SIMULATED_BANNER}[/]", highlight=False, soft_wrap=True)


def study_analyze(
    study: Annotated[str, typer.Option("--study", help="the study id (folder under $IMAGEBENCH_HOME/studies/)")],
    mixed_resamples: Annotated[Optional[int], typer.Option(
        "--mixed-resamples", min=1, help="bootstrap refits of H3's mixed model (default 100; each takes ~0.3 s)")] = None,
) -> None:
    """Read the study's answers (panel app, or imported), compute % yes per (tool, prompt), the
    Beauty Index per tool and panel group with bootstrap intervals, the pixel metrics and H1-H5,
    validate them and write them to the lake (views study_* in `imagebench sql`). Ends with the
    leaderboard and the hypotheses' verdicts."""
    cli = _cli()
    with cli._user_errors():
        settings = cli._settings()
        from tasks.beauty.study import load_study

        load_study(settings, study)  # a missing or tampered study is named before Prefect starts
        cli._prefect(settings)
        from flows.beauty import study_analyze_flow

        summary = study_analyze_flow(study, mixed_resamples=mixed_resamples)
        cli.err.print(f"[green]study {study} analysed[/]: {summary['answers']} answers from {summary['judges']} judges "
                      f"({summary['source']}), {summary['tools']} tools", highlight=False, soft_wrap=True)
        for note in summary["notes"]:
            cli.err.print(f"[bold yellow]{note}[/]", highlight=False, soft_wrap=True)
    study_leaderboard(study, OutputFormat.table)
    study_hypotheses(study, OutputFormat.table)


def _prereg_status(settings, catalog, study: str):
    """Whether the study's plan predates every answer (tasks.beauty.prereg), from its folder and
    the catalog's answers: no torch, Prefect or GX."""
    from datetime import datetime, timezone

    from tasks.beauty.prereg import NEVER_OPENED, PreregStatus, preregistration_status
    from tasks.beauty.study import StudyError, load_study
    from tasks.lake.tables import query

    try:
        _, prereg, _ = load_study(settings, study)
    except (StudyError, OSError, ValueError) as exc:
        return PreregStatus(False, f"pre-registration not checked: {exc}")
    if prereg is None:
        return PreregStatus(False, NEVER_OPENED)
    created = datetime.fromisoformat(prereg.created_at.replace("Z", "+00:00"))
    created_us = int((created - datetime(1970, 1, 1, tzinfo=timezone.utc)).total_seconds() * 1_000_000)
    _, ((early, total),) = query(catalog, "SELECT count(*) FILTER (WHERE epoch_us(shown_at) < "
                                          f"{created_us}), count(*) FROM study_answers WHERE study_id = '{study}'")
    # Only the counts matter: preregistration_status compares times, so give it stand-ins.
    return preregistration_status(prereg, [datetime(1970, 1, 1, tzinfo=timezone.utc)] * early + [created] * (total - early))


def study_leaderboard(
    study: Annotated[str, typer.Option("--study", help="the study id (folder under $IMAGEBENCH_HOME/studies/)")],
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """The study's Beauty Index per tool (0-100, 95% interval, answers), best first."""
    cli = _cli()
    with cli._user_errors(log=False):
        from schemas.study import STUDY_ID_RE

        if not STUDY_ID_RE.fullmatch(study):
            raise cli.CliError(f"--study {study!r}: a study id matches {STUDY_ID_RE.pattern}")
        settings = cli._settings()
        from tasks.lake.tables import query

        catalog = cli._catalog_or_exit(settings)
        status = _prereg_status(settings, catalog, study)
        flags = " || ".join(["CASE WHEN simulated THEN 'SIMULATED ' ELSE '' END"] +
                            ([] if status.preregistered else ["'not pre-registered'"]))
        if fmt is OutputFormat.table:
            select = (f"\"rank\", tool, printf('%.{DIGITS}f [%.{DIGITS}f, %.{DIGITS}f]', beauty_index, beauty_index_lo, "
                      f"beauty_index_hi) AS beauty_index, answers, trim({flags}) AS flags")
        else:
            rounded = {"beauty_index", "beauty_index_lo", "beauty_index_hi"}
            select = ", ".join(f'round("{c}", {DIGITS}) AS "{c}"' if c in rounded else
                               (f"{status.preregistered} AS preregistered" if c == "preregistered" else f'"{c}"')
                               for c in LEADERBOARD_JSON_COLUMNS)
        columns, rows = query(catalog, f"SELECT {select}, simulated AS _sim FROM study_leaderboard WHERE study_id = '{study}'")
        if not rows:
            raise cli.CliError(f"study {study} has no Beauty Index yet: imagebench study analyze --study {study}")
        simulated = any(r[-1] for r in rows)
        render(columns[:-1], [r[:-1] for r in rows], fmt, title=f"Beauty Index: study {study}")
        if simulated:
            _simulated_banner(cli)
        if status.note:
            cli.err.print(f"[bold yellow]{status.note}[/]", highlight=False, soft_wrap=True)


def study_hypotheses(study: str, fmt: OutputFormat = OutputFormat.table) -> None:
    """The pre-registered hypotheses' verdicts (Holm-adjusted p), with why a hypothesis was not tested."""
    cli = _cli()
    with cli._user_errors(log=False):
        from tasks.lake.tables import query

        columns, rows = query(cli._catalog_or_exit(cli._settings()),
                              "SELECT hypothesis, verdict, round(p_holm, 4) AS p_holm, "
                              "CASE WHEN verdict = 'not tested' THEN detail ELSE coalesce(headline, '') END AS why "
                              f"FROM study_hypotheses WHERE study_id = '{study}' ORDER BY hypothesis")
        render(columns, rows, fmt, title=f"Hypotheses: study {study}")


def study_import_answers(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="CSV: judge,group,tool,prompt_id,answer,shown_at,answered_at")],
    study: Annotated[str, typer.Option("--study", help="the study id (folder under $IMAGEBENCH_HOME/studies/)")],
) -> None:
    """Answers of a panel run elsewhere: validated whole (a bad row names its line and nothing is
    recorded), stored under salted judge ids; then `study analyze` as for the panel app."""
    cli = _cli()
    with cli._user_errors():
        from tasks.beauty.imports import import_answers

        n, judges = import_answers(cli._settings(), study, file)
        cli.err.print(f"[green]imported {n} answers from {judges} judges[/] into study {study}: "
                      f"next, imagebench study analyze --study {study}", highlight=False, soft_wrap=True)


def study_export(
    study: Annotated[str, typer.Option("--study", help="the study id (folder under $IMAGEBENCH_HOME/studies/)")],
    out: Annotated[Optional[Path], typer.Option("--out", help="bundle folder (default: $IMAGEBENCH_HOME/exports/STUDY)")] = None,
) -> None:
    """The open-data bundle (CC-BY 4.0): anonymised answers (Parquet + CSV), the analysis, the
    datasheet, the pre-registration, consented memos and SHA256SUMS."""
    cli = _cli()
    with cli._user_errors():
        settings = cli._settings()
        from tasks.beauty.export import export_study

        path = export_study(settings, study, out or settings.home / "exports" / study)
        cli.err.print(f"[green]bundle written:[/] {path} (check it with: cd {path} && sha256sum -c SHA256SUMS)",
                      highlight=False, soft_wrap=True)


def study_import_bundle(
    bundle: Annotated[Path, typer.Argument(metavar="DIR", help="a bundle folder written by `imagebench study export` (any lab)")],
    as_id: Annotated[Optional[str], typer.Option("--as", help="study id here (default: the bundle's own)")] = None,
) -> None:
    """Another lab's open-data bundle as a study of this workspace: SHA256SUMS verified and the
    pre-registration shown to predate every answer (refused otherwise); then `study analyze`."""
    cli = _cli()
    with cli._user_errors():
        from tasks.beauty.bundles import import_bundle

        study, n, judges = import_bundle(cli._settings(), bundle, as_id)
        cli.err.print(f"[green]imported bundle {bundle}[/] as study {study}: {n} answers from {judges} judges, "
                      f"SHA256SUMS verified, pre-registered before every answer; next, imagebench study analyze --study {study}",
                      highlight=False, soft_wrap=True)


def register(study_app: typer.Typer) -> None:
    study_app.command("analyze")(study_analyze)
    study_app.command("leaderboard")(study_leaderboard)
    study_app.command("import-answers")(study_import_answers)
    study_app.command("export")(study_export)
    study_app.command("import-bundle")(study_import_bundle)
