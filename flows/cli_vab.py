"""`imagebench vab import-sets|import-answers|leaderboard|compare`: the Visual Aesthetic Benchmark.

A typer sub-app registered in flows/cli.py; other VAB command modules register onto ``vab_app``.
`leaderboard` and `compare` read the pinned set collection and the lake's ``vab_trials``
partition directly (pyarrow, numpy): no torch, Prefect or Great Expectations
(tests/vab/test_cli_vab.py checks it).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from flows.output import OutputFormat, render

vab_app = typer.Typer(help="Visual Aesthetic Benchmark: sets, judges' answers, strict metrics.", no_args_is_help=True)

SETS_OPT = typer.Option("--sets", help="the set collection's name (imagebench vab import-sets ... --name S)")
LEADERBOARD_JSON_COLUMNS = ("judge", "judge_kind", "strict_best", "strict_worst", "strict_both", "strict_both_lo",
                            "strict_both_hi", "single_best", "single_worst", "single_both", "tasks", "invalid_trials",
                            "missing_trials", "audit")


class Breakdown(str, Enum):
    judge = "judge"
    domain = "domain"
    size = "size"
    position = "position"


def _cli():
    import flows.cli as cli  # shared error/settings helpers (imported late: cli imports this app)

    return cli


@vab_app.command("import-sets")
def vab_import_sets(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="our FILE.jsonl (one task per line: task_id, domain, images, best, worst), or the official release's .parquet file or folder")],
    name: Annotated[str, typer.Option("--name", help="name of the set collection (pinned: create-once)")],
    skip_bad: Annotated[bool, typer.Option("--skip-bad", help="import the valid tasks and record the rejected ones (default: reject the whole file)")] = False,
) -> None:
    """Validate a manifest or the official Parquet release (every image through the ingest checks), copy the images into the
    workspace's image cache and pin the collection (lake table vab_tasks)."""
    cli = _cli()
    with cli._user_errors():
        from tasks.vab.sets import import_any

        res = import_any(cli._settings(), file, name, skip_bad=skip_bad)
        state = "already pinned with the same content" if res.already_pinned else "pinned"
        cli.err.print(f"[green]set collection {name}: {res.tasks} tasks {state}[/] ({res.pin_path})", highlight=False, soft_wrap=True)
        for task, why in res.rejected.items():
            cli.err.print(f"[bold yellow]rejected task {task}:[/] {why}", highlight=False, soft_wrap=True, markup=True)


@vab_app.command("build-sets")
def vab_build_sets(
    file: Annotated[Path, typer.Argument(metavar="LABELS.csv", help="columns prompt_id,domain,models,best,worst (models space-separated; best/worst model ids)")],
    name: Annotated[str, typer.Option("--name", help="name of the set collection (pinned: create-once)")],
    skip_bad: Annotated[bool, typer.Option("--skip-bad", help="build the valid sets and record the rejected ones (default: reject the whole file)")] = False,
) -> None:
    """Sets built from the lake: for each prompt of the suite, the images of several scored
    models, with the experts' best/worst labels (how imagebench's own judges get audited)."""
    cli = _cli()
    with cli._user_errors():
        from tasks.vab.sets import build_from_lake

        res = build_from_lake(cli._settings(), file, name, skip_bad=skip_bad)
        state = "already pinned with the same content" if res.already_pinned else "pinned"
        cli.err.print(f"[green]set collection {name}: {res.tasks} tasks {state}[/] ({res.pin_path})", highlight=False, soft_wrap=True)
        for task, why in res.rejected.items():
            cli.err.print(f"[bold yellow]rejected task {task}:[/] {why}", highlight=False, soft_wrap=True, markup=True)


@vab_app.command("import-answers")
def vab_import_answers(
    file: Annotated[Path, typer.Argument(metavar="FILE.csv", help="columns task_id,trial,order,best,worst (positions 1-based, in the shown order)")],
    sets: Annotated[str, SETS_OPT],
    judge: Annotated[str, typer.Option("--judge", help="name the answers are stored and ranked under")],
) -> None:
    """Answers produced elsewhere: validated whole (bad rows named, nothing recorded), mapped back
    to the stored order and stored as the judge's trials (replacing its earlier ones)."""
    cli = _cli()
    with cli._user_errors():
        from tasks.vab.imports import import_answers

        res = import_answers(cli._settings(), file, sets, judge)
        cli.err.print(f"[green]imported {res['rows']} answers of judge {judge}[/] on {res['tasks']} of {res['tasks_in_sets']} "
                      f"tasks of {sets}", highlight=False, soft_wrap=True)
        if res["short_tasks"]:
            cli.err.print(f"[bold yellow]{res['short_tasks']} task(s) have fewer than 3 trials: they count as wrong[/]",
                          highlight=False, soft_wrap=True)
        if res["unparsable"]:
            cli.err.print(f"[bold yellow]{res['unparsable']} answer(s) without a valid answer: counted wrong[/]",
                          highlight=False, soft_wrap=True)


def _load(cli, sets: str):
    from tasks.lake import Lake
    from tasks.vab.sets import load_sets
    from tasks.vab.tables import read_partition

    settings = cli._settings()
    tasks = load_sets(settings, sets)
    trials = read_partition(Lake(settings.lake_dir), "vab_trials", sets)
    if not trials.num_rows:
        raise cli.CliError(f"set collection {sets} has no judge answers yet: imagebench vab run, or vab import-answers FILE.csv --sets {sets} --judge NAME")
    return tasks, trials


def _r1(v):
    return None if v is None else round(v, 1)


@vab_app.command("leaderboard")
def vab_leaderboard(
    sets: Annotated[str, SETS_OPT],
    by: Annotated[Breakdown, typer.Option("--by", help="one row per judge, or per judge and domain / set size / shown slot (position bias)")] = Breakdown.judge,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Strict best, worst and best-and-worst accuracy (percent of tasks: right in all 3 trials),
    95% bootstrap interval of strict both, single-trial accuracy; best first."""
    cli = _cli()
    with cli._user_errors(log=False):
        from tasks.vab.metrics import random_baselines, strict_metrics

        from tasks.vab.audit import audit_path, read_audit

        tasks, trials = _load(cli, sets)
        metrics = sorted(strict_metrics(tasks, trials).values(), key=lambda m: (-(m["strict_both"] or 0), m["judge"]))
        table = fmt is OutputFormat.table
        # Each of our own judges links to its audit (`imagebench vab audit`): per category, with intervals.
        settings = cli._settings()
        audited = {r["judge"] for r in (read_audit(settings, sets) or {}).get("rows", [])}
        audit_of = {j: str(audit_path(settings, sets)) for j in audited}
        if by is Breakdown.judge:
            columns = list(LEADERBOARD_JSON_COLUMNS)
            rows = []
            for m in metrics:
                lo, hi = m["strict_both_ci"] or (None, None)
                rows.append([m["judge"], m["judge_kind"], m["strict_best"], m["strict_worst"], m["strict_both"], lo, hi,
                             m["single_best"], m["single_worst"], m["single_both"], m["tasks"],
                             sum(m["invalid_trials"].values()), m["missing_trials"], audit_of.get(m["judge"])])
            if table:
                columns = ["judge", "kind", "strict both [95% CI]", "strict best", "strict worst", "single both", "tasks", "invalid",
                           "missing", "audit"]
                rows = [[r[0], r[1], f"{r[4]:.1f} [{r[5]:.1f}, {r[6]:.1f}]", f"{r[2]:.1f}",
                         "" if r[3] is None else f"{r[3]:.1f}", f"{r[9]:.1f}", r[10], r[11], r[12],
                         "yes" if r[13] else ""] for r in rows]
        elif by is Breakdown.position:
            columns = ["judge", "set_size", "slot", "picked_best", "rate", "uniform", "p_value"]
            rows = [[m["judge"], n, k + 1, c, _r1(d["rates"][k]), _r1(d["uniform"]), d["p_value"]]
                    for m in metrics for n, d in m["position_bias"]["by_size"].items() for k, c in enumerate(d["counts"])]
        else:
            key = "by_domain" if by is Breakdown.domain else "by_size"
            columns = ["judge", by.value, "strict_best", "strict_worst", "strict_both", "single_both", "tasks"]
            rows = [[m["judge"], g, _r1(s["strict_best"]), _r1(s["strict_worst"]), _r1(s["strict_both"]), _r1(s["single_both"]), s["tasks"]]
                    for m in metrics for g, s in m[key].items()]
        render(columns, rows, fmt, title=f"VAB: set collection {sets} ({len(tasks)} tasks)")
        if table:
            base = random_baselines(tasks)["overall"]
            cli.err.print(f"random judge on this collection: strict both {base['strict_both']:.2f}%, strict best "
                          f"{base['strict_best']:.2f}%, single both {base['single_both']:.1f}%. Published: best model "
                          f"26.5%, experts 68.9% strict both.", highlight=False, soft_wrap=True)


@vab_app.command("compare")
def vab_compare(
    judge_a: Annotated[str, typer.Argument(metavar="JUDGE_A")],
    judge_b: Annotated[str, typer.Argument(metavar="JUDGE_B")],
    sets: Annotated[str, SETS_OPT],
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Paired comparison of two judges on the same tasks (McNemar's exact test) for strict best,
    strict worst and strict best-and-worst."""
    cli = _cli()
    with cli._user_errors(log=False):
        from tasks.vab.metrics import compare_judges

        tasks, trials = _load(cli, sets)
        columns = ["metric", "judge_a", "judge_b", "a_pct", "b_pct", "only_a", "only_b", "both", "neither", "tasks", "p_value"]
        rows = []
        for metric in ("strict_both", "strict_best", "strict_worst"):
            c = compare_judges(tasks, trials, judge_a, judge_b, metric)
            if c["tasks"]:
                rows.append([metric, judge_a, judge_b, _r1(c["a_pct"]), _r1(c["b_pct"]), c["only_a"], c["only_b"],
                             c["both"], c["neither"], c["tasks"], round(c["p_value"], 6)])
        render(columns, rows, fmt, title=f"VAB: {judge_a} vs {judge_b} on {sets} (McNemar exact)")
