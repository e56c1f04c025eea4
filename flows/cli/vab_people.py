"""`imagebench vab panel open|serve|status|close|analyze|export`: VAB expert studies (people).

The panel app's two VAB protocols (tasks/vab/panel.py): pick best and worst of a set with
the domain's rubric, then score each image 0-10. Added to the ``vab`` sub-app by flows/cli/__init__.py.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from flows.cli.common import CliError, cli_settings, err, user_errors

vab_panel_app = typer.Typer(help="VAB expert panels: best+worst and 0-10 scores in the panel web app.", no_args_is_help=True)

STUDY_ARG = typer.Argument(metavar="STUDY", help="the VAB study id (its folder: $IMAGEBENCH_HOME/vab_studies/STUDY)")


@vab_panel_app.command("open")
def vab_panel_open(
    study_id: Annotated[str, STUDY_ARG],
    sets: Annotated[str, typer.Option("--sets", help="the pinned set collection the experts judge")],
    experts: Annotated[str, typer.Option("--experts", help="comma-separated anonymous expert labels, e.g. x01,x02,x03")],
    protocols: Annotated[str, typer.Option(help="rank, score or rank,score (ranking block first)")] = "rank,score",
    url: Annotated[str, typer.Option(help="public base URL printed in the links")] = "http://127.0.0.1:8766",
) -> None:
    """Blind the collection's images, draw each expert's orders, print each link and the admin link once."""
    with user_errors():
        from tasks.vab.panel import open_vab_study
        from tasks.vab.sets import image_paths, load_sets

        settings = cli_settings()
        tasks = load_sets(settings, sets)
        opened = open_vab_study(settings, study_id, sets, tasks, [e.strip() for e in experts.split(",") if e.strip()],
                                read_image=lambda t, i: image_paths(settings, t)[i].read_bytes(),
                                protocols=[p.strip() for p in protocols.split(",") if p.strip()])
        base = url.rstrip("/")
        err.print(f"[green]VAB study {study_id} open[/]: {len(tasks)} tasks of {sets}; links are shown once "
                  "(only their sha256 is stored):", highlight=False)
        for label, token in opened.tokens.items():
            typer.echo(f"{label}\t{base}/j/{token}")
        typer.echo(f"admin\t{base}/admin/{opened.admin_token}")


@vab_panel_app.command("serve")
def vab_panel_serve(
    study_id: Annotated[str, STUDY_ARG],
    host: Annotated[str, typer.Option(help="interface to listen on (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8766,
) -> None:
    """Serve the study's expert pages until Ctrl-C (put an HTTPS reverse proxy in front)."""
    with user_errors():
        from tasks.panel.app import make_server
        from tasks.vab.panel import create_vab_app

        app = create_vab_app(cli_settings(), study_id)
        err.print(f"VAB panel {study_id} on http://{host}:{port}/ (Ctrl-C stops it)", highlight=False)
        make_server(app, host, port).run()


@vab_panel_app.command("status")
def vab_panel_status(study_id: Annotated[str, STUDY_ARG]) -> None:
    """Answers per expert."""
    with user_errors():
        from tasks.vab.panel import open_store

        store = open_store(cli_settings(), study_id)
        try:
            row = store.study_row()
            if row is None:
                raise CliError(f"VAB study {study_id} is not open")
            for p in store.progress():
                typer.echo(f"{p['label']}\t{p['answered']}/{p['total']}")
            typer.echo(f"state\t{row['state']}")
        finally:
            store.dispose()


@vab_panel_app.command("close")
def vab_panel_close(study_id: Annotated[str, STUDY_ARG]) -> None:
    """Close the study: nothing more is accepted."""
    with user_errors():
        from tasks.vab.panel import open_store

        store = open_store(cli_settings(), study_id)
        try:
            if store.study_row() is None:
                raise CliError(f"VAB study {study_id} is not open")
            err.print(f"VAB study {study_id} " + ("closed" if store.close() else "was already closed"), highlight=False)
        finally:
            store.dispose()


@vab_panel_app.command("analyze")
def vab_panel_analyze(study_id: Annotated[str, STUDY_ARG]) -> None:
    """Consensus (tie rule in docs/VAB.md), Fleiss' kappa and Krippendorff's alpha, leave-one-expert-out
    accuracy, the scores-vs-ranking study: one JSON object on stdout."""
    with user_errors():
        from tasks.vab.panel import analyze_vab_study

        typer.echo(json.dumps(analyze_vab_study(cli_settings(), study_id), indent=1))


@vab_panel_app.command("export")
def vab_panel_export(study_id: Annotated[str, STUDY_ARG]) -> None:
    """Write the experts' best/worst answers into the lake's vab_trials (judge_kind human), one judge per expert."""
    with user_errors():
        from tasks.vab.panel import export_trials

        counts = export_trials(cli_settings(), study_id)
        err.print(f"vab_trials: {sum(counts.values())} rows of {len(counts)} experts", highlight=False)
