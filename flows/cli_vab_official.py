"""`imagebench vab import-results|summarize|judges remove`: VAB as the authors' toolkit runs it
(docs/VAB.md, "The official toolkit"). Registered onto flows.cli_vab's ``vab_app`` (imported by
flows/cli_vab_run.py). Light: pyarrow only, no torch, Prefect or Great Expectations.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from flows.cli_vab import SETS_OPT, vab_app

judges_app = typer.Typer(help="The judges of a set collection.", no_args_is_help=True)
vab_app.add_typer(judges_app, name="judges")


class SummaryFormat(str, Enum):
    table = "table"
    json = "json"


def _cli():
    import flows.cli as cli

    return cli


@vab_app.command("import-results")
def vab_import_results(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="an eval.py result file: results/<model>.json or <model>.partial.jsonl")],
    sets: Annotated[str, SETS_OPT],
    judge: Annotated[Optional[str], typer.Option("--judge", help="name to store them under (default: metadata.model after its last '/')")] = None,
) -> None:
    """The official toolkit's answers (all three prompt types), as they are: checked whole against
    the collection (bad rows named, nothing stored), errors kept as state error."""
    cli = _cli()
    with cli._user_errors():
        from tasks.vab.results_import import import_results

        name, res = import_results(cli._settings(), file, sets, judge)
        states = ", ".join(f"{k} {v}" for k, v in sorted(res["states"].items()))
        cli.err.print(f"[green]imported {res['rows']} answers of judge {name}[/] ({states}; {res['derived']} derived "
                      f"2-image pick_best_and_worst) on {res['tasks']} of {res['tasks_in_sets']} tasks of {sets}",
                      highlight=False, soft_wrap=True)
        if res["skipped_lines"]:
            cli.err.print(f"[bold yellow]{res['skipped_lines']} unreadable line(s) skipped, as eval.py skips them[/]",
                          highlight=False, soft_wrap=True)
        if res["orders_not_official"]:
            cli.err.print(f"[bold yellow]{res['orders_not_official']} answer(s) were shown in another order than eval.py's "
                          f"generate_permutations gives: scored in the order they name[/]", highlight=False, soft_wrap=True)


@vab_app.command("summarize")
def vab_summarize(
    sets: Annotated[str, SETS_OPT],
    fmt: Annotated[SummaryFormat, typer.Option("--format", help="table: what summarize.py prints; json: what it writes with --output")] = SummaryFormat.table,
) -> None:
    """The official metrics (p^3 and ap@1 per prompt type, by domain and image count, and the
    random guess) of every judge with answers to the official prompt types, as summarize.py computes them."""
    cli = _cli()
    with cli._user_errors(log=False):
        from tasks.lake.tables import Lake
        from tasks.vab.official import official_summary, summary_table
        from tasks.vab.sets import load_sets
        from tasks.vab.tables import read_partition

        settings = cli._settings()
        tasks = load_sets(settings, sets)
        rows = read_partition(Lake(settings.lake_dir), "vab_trials", sets).to_pylist()
        by_judge: dict[str, list[dict]] = {}
        for r in rows:
            by_judge.setdefault(r["judge"], []).append(r)
        scores = official_summary(tasks, {j: by_judge[j] for j in sorted(by_judge)})
        others = sorted(set(by_judge) - set(scores))
        if fmt is SummaryFormat.json:
            typer.echo(json.dumps(scores, indent=2, ensure_ascii=False))
        else:
            typer.echo(summary_table(scores), nl=False)
        if others:
            cli.err.print(f"not here (no answers to the official prompt types; see vab leaderboard): {', '.join(others)}",
                          highlight=False, soft_wrap=True)


@judges_app.command("remove")
def vab_judges_remove(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the judge, exactly as vab leaderboard names it")],
    sets: Annotated[str, SETS_OPT],
) -> None:
    """Remove every answer of one judge from a set collection (other judges' answers kept)."""
    cli = _cli()
    with cli._user_errors():
        from tasks.lake.tables import Lake
        from tasks.vab.tables import check_set_name, remove_judge

        settings = cli._settings()
        n = remove_judge(Lake(settings.lake_dir), check_set_name(sets), name)
        cli.err.print(f"[green]removed judge {name!r} from {sets}[/]: {n} answer(s)", highlight=False, soft_wrap=True)
