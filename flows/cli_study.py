"""`imagebench study ...`: a Beauty Index study's life (docs/BEAUTY.md): init, open, status, close.

A typer sub-app registered by flows/cli.py (ARCHITECTURE.md section 6: one file per area). The
logic lives in tasks/beauty/study.py; nothing heavy is imported here (no torch, Prefect or GX).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from flows.output import OutputFormat, render

study_app = typer.Typer(help="Beauty Index studies: init, open (blind + pre-register + links), status, close.",
                        no_args_is_help=True)

DEFAULT_URL = "http://127.0.0.1:8765"


def _cli():
    import flows.cli as cli  # the shared error/settings helpers (imported late: cli imports this module)

    return cli


@study_app.command("init")
def study_init(
    study_id: Annotated[str, typer.Argument(metavar="STUDY")],
    tools: Annotated[Optional[str], typer.Option(help="comma-separated model ids (default: every model of the store)")] = None,
    host_tool: Annotated[Optional[str], typer.Option(help="the host lab's own tool (hypothesis H5)")] = None,
) -> None:
    """Write $IMAGEBENCH_HOME/studies/STUDY/study.yaml (the published panel shape) to edit before `open`."""
    cli = _cli()
    with cli._user_errors():
        from tasks.beauty.study import init_study

        path = init_study(cli._settings(), study_id, [t.strip() for t in tools.split(",") if t.strip()] if tools else None,
                          host_tool)
        cli.err.print(f"[green]wrote {path}[/]: edit the judges (anonymous labels), groups and tools, then "
                      f"`imagebench study open {study_id}`", highlight=False, soft_wrap=True)


@study_app.command("open")
def study_open(
    study_id: Annotated[str, typer.Argument(metavar="STUDY")],
    url: Annotated[Optional[str], typer.Option(help=f"the panel's public base URL, for the printed links (default: the panel_url setting, else {DEFAULT_URL})")] = None,
) -> None:
    """Ingest and blind every tool's images, write the pre-registration once, draw each judge's
    order and print the judges' and the admin's links (shown once: only their hashes are kept)."""
    cli = _cli()
    with cli._user_errors():
        from tasks.beauty.study import open_study

        from tasks.beauty.study import remember_panel_url

        settings = cli._settings()
        opened = open_study(settings, study_id)
        base = (url or settings.panel_url or DEFAULT_URL).rstrip("/")
        remember_panel_url(settings, study_id, base)  # `panel serve` and `relink` use it (https: Secure cookies)
        for line in opened.blinding_report:
            cli.err.print(line, highlight=False, soft_wrap=True, markup=False)
        cli.err.print(f"[green]study {study_id} open[/]: {opened.n_images} blinded images, pre-registration "
                      f"{opened.study_dir / 'preregistration.json'} (judge orders drawn from a private secret, "
                      f"sha256 {opened.preregistration.order_commitment}). "
                      "Links below are shown ONCE (only their sha256 is stored): send each judge theirs.",
                      highlight=False, soft_wrap=True)
        for label, token in opened.judge_tokens.items():
            typer.echo(f"judge {label}: {base}/j/{token}")
        typer.echo(f"admin: {base}/admin/{opened.admin_token}")


@study_app.command("status")
def study_status_cmd(
    study_id: Annotated[str, typer.Argument(metavar="STUDY")],
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """The study's state and each judge's progress."""
    cli = _cli()
    with cli._user_errors():
        from tasks.beauty.study import study_status

        st = study_status(cli._settings(), study_id)
        cli.err.print(f"study {study_id}: {st['state']}; {st['answers']} of {st.get('expected', 0)} answers; "
                      f"{st['images']} images; pre-registration sha256 {st['preregistration_sha256']}",
                      highlight=False, soft_wrap=True)
        cols = ("judge", "group", "answered", "total", "last_answer_at")
        render(cols, [[j["label"], j["group"], j["answered"], j["total"], j["last_answer_at"]] for j in st["judges"]], fmt,
               title=f"study {study_id}")


@study_app.command("close")
def study_close(study_id: Annotated[str, typer.Argument(metavar="STUDY")]) -> None:
    """Close the study: the panel accepts no answer or memo after this."""
    cli = _cli()
    with cli._user_errors():
        from tasks.beauty.study import close_study

        closed = close_study(cli._settings(), study_id)
        cli.err.print(f"study {study_id} {'closed' if closed else 'was already closed'}", highlight=False)


@study_app.command("relink")
def study_relink(
    study_id: Annotated[str, typer.Argument(metavar="STUDY")],
    judge: Annotated[str, typer.Option("--judge", help="the judge's label (study.yaml) whose link was lost")],
    url: Annotated[Optional[str], typer.Option(help="the panel's public base URL (default: the panel_url setting, else the URL given at open)")] = None,
) -> None:
    """Issue a new link for one judge (shown once); the old link and the judge's sessions stop working."""
    cli = _cli()
    with cli._user_errors():
        from tasks.beauty.study import panel_url_of, relink_judge

        settings = cli._settings()
        token = relink_judge(settings, study_id, judge)
        base = (url or panel_url_of(settings, study_id) or DEFAULT_URL).rstrip("/")
        cli.err.print(f"[green]new link for judge {judge}[/] (shown ONCE; the old link no longer works):", highlight=False)
        typer.echo(f"judge {judge}: {base}/j/{token}")


# analyze / leaderboard / import-answers / export: publishing, in flows/cli_beauty.py
from flows.cli_beauty import register as _register_publishing  # noqa: E402

_register_publishing(study_app)

