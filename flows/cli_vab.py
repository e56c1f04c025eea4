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
# strict_both_lo/hi: 95% Wilson interval (honest at 0% and 100%); *_boot_*: the task bootstrap beside it.
# A one-trial judge (trials_per_task 1, a person) has null strict_* figures: see single_* (docs/VAB.md).
LEADERBOARD_JSON_COLUMNS = ("judge", "judge_kind", "trials_per_task", "strict_best", "strict_worst", "strict_both",
                            "strict_both_lo", "strict_both_hi", "strict_both_boot_lo", "strict_both_boot_hi", "single_best",
                            "single_worst", "single_both", "single_both_lo", "single_both_hi", "tasks", "invalid_trials",
                            "missing_trials", "uncalibrated", "audit")


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
    from tasks.lake.tables import Lake
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
    """Strict best, worst and best-and-worst accuracy (percent of tasks: right in all 3 trials)
    with its 95% Wilson interval, and one-trial accuracy in its own column (where people, who
    answer once, are ranked); 3-trial judges first, best first."""
    cli = _cli()
    with cli._user_errors(log=False):
        from tasks.vab.metrics import random_baselines, strict_metrics
        from tasks.vab.present import ranked, uncalibrated_notes

        from tasks.vab.audit import audit_path, read_audit

        tasks, trials = _load(cli, sets)
        metrics = ranked(strict_metrics(tasks, trials).values())
        table = fmt is OutputFormat.table
        # Each of our own judges links to its audit (`imagebench vab audit`): per category, with intervals.
        settings = cli._settings()
        audited = {r["judge"] for r in (read_audit(settings, sets) or {}).get("rows", [])}
        audit_of = {j: str(audit_path(settings, sets)) for j in audited}
        if by is Breakdown.judge:
            columns, rows = _by_judge(metrics, audit_of, table)
        elif by is Breakdown.position:
            r1 = _r1 if table else (lambda v: v)  # JSON and CSV keep full precision
            columns = ["judge", "set_size", "slot", "picked_best", "rate", "uniform", "p_value"]
            rows = [[m["judge"], n, k + 1, c, r1(d["rates"][k]), r1(d["uniform"]), d["p_value"]]
                    for m in metrics for n, d in m["position_bias"]["by_size"].items() for k, c in enumerate(d["counts"])]
        else:
            columns, rows = _by_group(metrics, by, table)
        render(columns, rows, fmt, title=f"VAB: set collection {sets} ({len(tasks)} tasks)")
        for note in uncalibrated_notes(metrics):
            cli.err.print(f"[bold yellow]{note}[/]", highlight=False, soft_wrap=True)
        if table:
            base = random_baselines(tasks)["overall"]
            cli.err.print(f"random judge on this collection: strict both (3 trials) {base['strict_both']:.2f}%, strict best "
                          f"{base['strict_best']:.2f}%; one-trial both {base['single_both']:.1f}% (the column where people, who "
                          f"answer once, are ranked). Published: best model 26.5%, experts 68.9% strict both.",
                          highlight=False, soft_wrap=True)


def _ci(v, ci) -> str:
    if v is None:
        return "–"
    return f"{v:.1f}" + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")


def _by_judge(metrics: list[dict], audit_of: dict, table: bool) -> tuple[list[str], list[list]]:
    """Leaderboard rows, one per judge. A one-trial judge (a person) has no 3-trial strict figures:
    its accuracy is in the one-trial column, beside the machines' single-trial accuracy."""
    from tasks.vab.present import judge_label, is_one_trial, strict_or_none

    if table:
        columns = ["judge", "kind", "trials", "strict both, 3 trials [95% Wilson]", "one-trial both [95% Wilson]", "strict best",
                   "strict worst", "tasks", "invalid", "missing", "audit"]
        rows = [[judge_label(m), m["judge_kind"], m["trials_per_task"],
                 "–" if is_one_trial(m) else _ci(m["strict_both"], m["strict_both_ci"]), _ci(m["single_both"], m["single_both_ci"]),
                 _ci(strict_or_none(m, "strict_best"), None), _ci(strict_or_none(m, "strict_worst"), None), m["tasks"],
                 sum(m["invalid_trials"].values()), m["missing_trials"], "yes" if audit_of.get(m["judge"]) else ""] for m in metrics]
        return columns, rows
    columns = list(LEADERBOARD_JSON_COLUMNS)
    rows = []
    for m in metrics:
        one = is_one_trial(m)
        lo, hi = (None, None) if one else (m["strict_both_ci"] or (None, None))
        blo, bhi = (None, None) if one else (m["strict_both_boot"] or (None, None))
        slo, shi = m["single_both_ci"] or (None, None)
        rows.append([m["judge"], m["judge_kind"], m["trials_per_task"], strict_or_none(m, "strict_best"),
                     strict_or_none(m, "strict_worst"), strict_or_none(m, "strict_both"), lo, hi, blo, bhi,
                     m["single_best"], m["single_worst"], m["single_both"], slo, shi, m["tasks"],
                     sum(m["invalid_trials"].values()), m["missing_trials"], m["uncalibrated"], audit_of.get(m["judge"])])
    return columns, rows


def _by_group(metrics: list[dict], by: "Breakdown", table: bool) -> tuple[list[str], list[list]]:
    from tasks.vab.present import judge_label, strict_or_none

    r1 = _r1 if table else (lambda v: v)  # JSON and CSV keep full precision, like the main JSON
    key = "by_domain" if by is Breakdown.domain else "by_size"
    columns = ["judge", by.value, "trials_per_task", "strict_best", "strict_worst", "strict_both", "single_both", "tasks"]
    rows = []
    for m in metrics:
        for g, s in m[key].items():
            one = {"trials_per_task": m["trials_per_task"], **s}
            rows.append([judge_label(m) if table else m["judge"], g, m["trials_per_task"], r1(strict_or_none(one, "strict_best")),
                         r1(strict_or_none(one, "strict_worst")), r1(strict_or_none(one, "strict_both")), r1(s["single_both"]),
                         s["tasks"]])
    return columns, rows


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
        from tasks.vab.present import format_p

        tasks, trials = _load(cli, sets)
        columns = ["metric", "judge_a", "judge_b", "a_pct", "b_pct", "only_a", "only_b", "both", "neither", "tasks", "p_value"]
        table = fmt is OutputFormat.table
        # The table rounds percentages and prints p with two significant digits (3.7e-09, never 0);
        # JSON and CSV keep the full-precision floats.
        r1, p_out = (_r1, format_p) if table else ((lambda v: v), (lambda p: p))
        rows = []
        for metric in ("strict_both", "strict_best", "strict_worst"):
            c = compare_judges(tasks, trials, judge_a, judge_b, metric)
            if c["tasks"]:
                rows.append([metric, judge_a, judge_b, r1(c["a_pct"]), r1(c["b_pct"]), c["only_a"], c["only_b"],
                             c["both"], c["neither"], c["tasks"], p_out(c["p_value"])])
        render(columns, rows, fmt, title=f"VAB: {judge_a} vs {judge_b} on {sets} (McNemar exact)")
        once = {r["judge"] for r in trials.select(["judge", "judge_kind"]).to_pylist() if r["judge_kind"] == "human"}
        if (judge_a in once) != (judge_b in once):  # docs/VAB.md, "One trial and three"
            cli.err.print(f"[bold yellow]{judge_a if judge_a in once else judge_b} answered each task once: its 'strict' is one "
                          f"trial, the other's three; compare people with machines on one-trial accuracy (vab leaderboard)[/]",
                          highlight=False, soft_wrap=True)
