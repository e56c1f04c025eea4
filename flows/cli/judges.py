"""`imagebench judges check`: which configured judges answer (tasks/judges/)."""

from __future__ import annotations

from typing import Annotated

import typer

from flows.cli.common import OutputFormat, cli_settings, err, render, user_errors

judges_app = typer.Typer(help="Judges: check the configured endpoints.", no_args_is_help=True)


@judges_app.command("check")
def judges_check(
    load_weights: Annotated[bool, typer.Option(help="also load local transformers judges")] = False,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Which configured judges answer, and with which model; and whether the routing is covered."""
    with user_errors():
        settings = cli_settings()
        from tasks.runs import units_judge
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
