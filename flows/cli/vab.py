"""`imagebench vab import-sets|import-answers|leaderboard|compare`: the Visual Aesthetic Benchmark.

A typer sub-app added by flows/cli/__init__.py, with `vab run|audit|demo-sets` and the official
toolkit's `vab import-results|summarize|judges remove` below (`vab panel ...`: flows/cli/vab_people.py).
`leaderboard` and `compare` read the pinned set collection and the lake's ``vab_trials``
partition directly (pyarrow, numpy): no torch, Prefect or Great Expectations
(tests/vab/test_cli_vab.py checks it).
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from flows.cli.common import CliError, OutputFormat, cli_settings, err, prepare_prefect, render, user_errors

vab_app = typer.Typer(help="Visual Aesthetic Benchmark: sets, judges' answers, strict metrics.", no_args_is_help=True)

SETS_OPT = typer.Option("--sets", help="the set collection's name (imagebench vab import-sets ... --name S)")
NAME_OPT = typer.Option("--name", help="name of the set collection (pinned: create-once)")
# strict_both_lo/hi: 95% Wilson interval (honest at 0% and 100%); *_boot_*: the task bootstrap beside it.
# A one-trial judge (trials_per_task 1, a person) has null strict_* figures: see single_* (docs/VAB.md).
LEADERBOARD_JSON_COLUMNS = ("judge", "judge_kind", "trials_per_task", "strict_best", "strict_worst", "strict_both",
                            "strict_both_lo", "strict_both_hi", "strict_both_boot_lo", "strict_both_boot_hi", "single_best",
                            "single_worst", "single_both", "single_both_lo", "single_both_hi", "tasks", "invalid_trials",
                            "missing_trials", "uncalibrated", "audit")


class PromptType(str, Enum):
    """eval.py's --prompt-type choices."""

    all = "all"
    pick_best = "pick_best"
    pick_worst = "pick_worst"
    pick_best_and_worst = "pick_best_and_worst"


class Breakdown(str, Enum):
    judge = "judge"
    domain = "domain"
    size = "size"
    position = "position"


def _say_pinned(name: str, res) -> None:
    """What import-sets and build-sets tell: the collection pinned (or already), each rejected task."""
    state = "already pinned with the same content" if res.already_pinned else "pinned"
    err.print(f"[green]set collection {name}: {res.tasks} tasks {state}[/] ({res.pin_path})", highlight=False, soft_wrap=True)
    for task, why in res.rejected.items():
        err.print(f"[bold yellow]rejected task {task}:[/] {why}", highlight=False, soft_wrap=True, markup=True)


@vab_app.command("import-sets")
def vab_import_sets(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="our FILE.jsonl (one task per line: task_id, domain, images, best, worst), or the official release's .parquet file or folder")],
    name: Annotated[str, NAME_OPT],
    skip_bad: Annotated[bool, typer.Option("--skip-bad", help="import the valid tasks and record the rejected ones (default: reject the whole file)")] = False,
) -> None:
    """Validate a manifest or the official Parquet release (every image through the ingest checks), copy the images into the
    workspace's image cache and pin the collection (lake table vab_tasks)."""
    with user_errors():
        from tasks.vab.sets import import_any

        res = import_any(cli_settings(), file, name, skip_bad=skip_bad)
        _say_pinned(name, res)


@vab_app.command("build-sets")
def vab_build_sets(
    file: Annotated[Path, typer.Argument(metavar="LABELS.csv", help="columns prompt_id,domain,models,best,worst (models space-separated; best/worst model ids)")],
    name: Annotated[str, NAME_OPT],
    skip_bad: Annotated[bool, typer.Option("--skip-bad", help="build the valid sets and record the rejected ones (default: reject the whole file)")] = False,
) -> None:
    """Sets built from the lake: for each prompt of the suite, the images of several scored
    models, with the experts' best/worst labels (how imagebench's own judges get audited)."""
    with user_errors():
        from tasks.vab.sets import build_from_lake

        res = build_from_lake(cli_settings(), file, name, skip_bad=skip_bad)
        _say_pinned(name, res)


@vab_app.command("import-answers")
def vab_import_answers(
    file: Annotated[Path, typer.Argument(metavar="FILE.csv", help="columns task_id,trial,order,best,worst (positions 1-based, in the shown order)")],
    sets: Annotated[str, SETS_OPT],
    judge: Annotated[str, typer.Option("--judge", help="name the answers are stored and ranked under")],
) -> None:
    """Answers produced elsewhere: validated whole (bad rows named, nothing recorded), mapped back
    to the stored order and stored as the judge's trials (replacing its earlier ones)."""
    with user_errors():
        from tasks.vab.imports import import_answers

        res = import_answers(cli_settings(), file, sets, judge)
        err.print(f"[green]imported {res['rows']} answers of judge {judge}[/] on {res['tasks']} of {res['tasks_in_sets']} "
                  f"tasks of {sets}", highlight=False, soft_wrap=True)
        if res["short_tasks"]:
            err.print(f"[bold yellow]{res['short_tasks']} task(s) have fewer than 3 trials: they count as wrong[/]",
                      highlight=False, soft_wrap=True)
        if res["unparsable"]:
            err.print(f"[bold yellow]{res['unparsable']} answer(s) without a valid answer: counted wrong[/]",
                      highlight=False, soft_wrap=True)


def _load(sets: str):
    from tasks.lake.tables import Lake
    from tasks.vab.sets import load_sets
    from tasks.vab.tables import read_partition

    settings = cli_settings()
    tasks = load_sets(settings, sets)
    trials = read_partition(Lake(settings.lake_dir), "vab_trials", sets)
    if not trials.num_rows:
        raise CliError(f"set collection {sets} has no judge answers yet: imagebench vab run, or vab import-answers FILE.csv --sets {sets} --judge NAME")
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
    with user_errors(log=False):
        from tasks.vab.metrics import random_baselines, strict_metrics
        from tasks.vab.present import ranked, uncalibrated_notes

        from tasks.vab.audit import audit_path, read_audit

        tasks, trials = _load(sets)
        metrics = ranked(strict_metrics(tasks, trials).values())
        table = fmt is OutputFormat.table
        # Each of our own judges links to its audit (`imagebench vab audit`): per category, with intervals.
        settings = cli_settings()
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
            err.print(f"[bold yellow]{note}[/]", highlight=False, soft_wrap=True)
        if table:
            base = random_baselines(tasks)["overall"]
            err.print(f"random judge on this collection: strict both (3 trials) {base['strict_both']:.2f}%, strict best "
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
    with user_errors(log=False):
        from tasks.vab.metrics import compare_judges
        from tasks.vab.present import format_p

        tasks, trials = _load(sets)
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
            err.print(f"[bold yellow]{judge_a if judge_a in once else judge_b} answered each task once: its 'strict' is one "
                      f"trial, the other's three; compare people with machines on one-trial accuracy (vab leaderboard)[/]",
                      highlight=False, soft_wrap=True)


# ---- judges, runs and audit -----------------------------------------------------------------------
# `imagebench vab run|audit|demo-sets`: judges under test on a set collection (docs/VAB.md,
# "Judges, runs and audit"). Prefect and the judges are imported inside the commands only.


def _pct(v, lo=None, hi=None) -> str:
    if v is None:
        return "–"
    return f"{v:.1f}" + (f" [{lo:.1f}, {hi:.1f}]" if lo is not None and hi is not None else "")


@vab_app.command("run")
def vab_run(
    sets: Annotated[str, SETS_OPT],
    judge: Annotated[list[str], typer.Option("--judge", help="sharpness, hpsv3, or a VLM of the endpoints config (repeat for several)")],
    batch_size: Annotated[int, typer.Option(min=1, max=256, help="trials per parallel VLM batch")] = 8,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="ask again even what is cached for this judge identity")] = False,
    prompt: Annotated[str, typer.Option("--prompt", help="VLM prompt version: vab-best-worst-v2 (ours, one combined question) or vab-official-v1 (eval.py's three prompt types)")] = "vab-best-worst-v2",
    temperature: Annotated[Optional[float], typer.Option("--temperature", min=0.0, max=2.0, help="VLM sampling temperature (default: 0 for ours, 1.0 for vab-official-v1 as eval.py); another one stores the answers as <judge>@t<T>, beside the default run")] = None,
    prompt_type: Annotated[PromptType, typer.Option("--prompt-type", help="with vab-official-v1: the prompt type(s) asked, as eval.py's --prompt-type")] = PromptType.all,
) -> None:
    """Run judges on every task of a set collection, 3 trials each (flow `vab-run`), store their
    answers in vab_trials and print the leaderboard."""
    with user_errors():
        from tasks.vab.prompts import OFFICIAL_PROMPT_VERSION
        from tasks.vab.run import check_prompt_types, resolve_judges
        from tasks.vab.sets import load_sets

        settings = cli_settings()
        types = None if prompt_type is PromptType.all else [prompt_type.value]
        # bad names, missing weights and missing collections are named before Prefect starts
        check_prompt_types(types, prompt == OFFICIAL_PROMPT_VERSION)
        resolve_judges(settings, judge, prompt, temperature)
        load_sets(settings, sets)
        prepare_prefect(settings)
        from flows.vab import vab_run_flow

        summary = vab_run_flow(sets, list(judge), batch_size=batch_size, use_cache=not no_cache, prompt_version=prompt,
                               temperature=temperature, prompt_types=types)
        from tasks.vab.present import UNCALIBRATED_NOTE

        for name, m in summary["judges"].items():
            bad = {k: v for k, v in m["invalid_trials"].items() if v}
            err.print(f"[green]{name}[/]: {m['trials']} trials ({m['cache_hits']} from the cache)"
                      + (f", [bold yellow]invalid {bad}: counted wrong[/]" if bad else "")
                      + (f", [bold yellow]{UNCALIBRATED_NOTE}[/]" if m.get("uncalibrated") else ""),
                      highlight=False, soft_wrap=True)
    vab_leaderboard(sets)


@vab_app.command("audit")
def vab_audit(
    sets: Annotated[str, SETS_OPT],
    judge: Annotated[Optional[list[str]], typer.Option("--judge", help="judges to audit (default: hpsv3 and the routing's VLM judges in the endpoints config)")] = None,
    rerun: Annotated[bool, typer.Option("--rerun/--no-rerun", help="run the judges first (answers are cached); --no-rerun audits the stored answers")] = True,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """How often imagebench's own judges (HPSv3 ranking, the Capability judges) agree with the
    experts' labels of a collection, per category, with 95% bootstrap intervals."""
    with user_errors():
        from tasks.lake.tables import Lake
        from tasks.vab.audit import audit, own_judges, write_audit
        from tasks.vab.run import resolve_judges
        from tasks.vab.sets import load_sets
        from tasks.vab.tables import read_partition

        settings = cli_settings()
        names, notes = (list(judge), []) if judge else own_judges(settings)
        resolve_judges(settings, names)
        tasks = load_sets(settings, sets)
        if rerun:
            prepare_prefect(settings)
            from flows.vab import vab_run_flow

            vab_run_flow(sets, names)
        trials = read_partition(Lake(settings.lake_dir), "vab_trials", sets)
        missing = [n for n in names if n not in set(trials.column("judge").to_pylist())]
        if missing:
            raise CliError(f"no answers of {missing} on {sets}: run the audit with --rerun")
        rows = audit(tasks, trials, names)
        path = write_audit(settings, sets, rows, notes)
        from tasks.vab.present import UNCALIBRATED_NOTE

        notes = notes + [f"judge {j}: {UNCALIBRATED_NOTE}" for j in dict.fromkeys(r["judge"] for r in rows if r["uncalibrated"])]
        for note in notes:
            err.print(f"[bold yellow]{note}[/]", highlight=False, soft_wrap=True)
        if fmt is OutputFormat.table:
            render(["judge", "category", "tasks", "strict both [95% Wilson]", "strict best [95% Wilson]", "single best"],
                   [[r["judge"] + (" UNCALIBRATED" if r["uncalibrated"] else ""), r["category"], r["tasks"],
                     _pct(r["strict_both"], r["strict_both_lo"], r["strict_both_hi"]),
                     _pct(r["strict_best"], r["strict_best_lo"], r["strict_best_hi"]), _pct(r["single_best"])] for r in rows],
                   fmt, title=f"VAB audit: imagebench's judges vs the experts on {sets}")
            err.print(f"audit written to {path}", highlight=False, soft_wrap=True)
        else:
            cols = list(rows[0]) if rows else ["judge", "category", "tasks"]
            render(cols, [[r[c] for c in cols] for r in rows], fmt, title="VAB audit")


@vab_app.command("demo-sets")
def vab_demo_sets(
    out: Annotated[Path, typer.Option("--out", help="folder for the images and manifest.jsonl")],
) -> None:
    """Write the demo sets (bundled photos at graded degradations: known best and worst) and their
    manifest, ready for `imagebench vab import-sets OUT/manifest.jsonl --name S`."""
    with user_errors():
        from tasks.vab.demo_sets import write_demo_sets

        err.print(f"[green]wrote {write_demo_sets(out)}[/]", highlight=False, soft_wrap=True)


# ---- the official toolkit ------------------------------------------------------------------------
# `imagebench vab import-results|summarize|judges remove`: VAB as the authors' toolkit runs it
# (docs/VAB.md, "The official toolkit"). Light: pyarrow only, no torch, Prefect or Great Expectations.

judges_app = typer.Typer(help="The judges of a set collection.", no_args_is_help=True)
vab_app.add_typer(judges_app, name="judges")


T0_SUFFIX = "@t0"  # a judge's run at temperature 0 (tasks.vab.run.JudgeSpec.stored_name)


class SummaryFormat(str, Enum):
    table = "table"
    json = "json"


@vab_app.command("import-results")
def vab_import_results(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="an eval.py result file: results/<model>.json or <model>.partial.jsonl")],
    sets: Annotated[str, SETS_OPT],
    judge: Annotated[Optional[str], typer.Option("--judge", help="name to store them under (default: metadata.model after its last '/')")] = None,
) -> None:
    """The official toolkit's answers (all three prompt types), as they are: checked whole against
    the collection (bad rows named, nothing stored), errors kept as state error."""
    with user_errors():
        from tasks.vab.results_import import import_results

        name, res = import_results(cli_settings(), file, sets, judge)
        states = ", ".join(f"{k} {v}" for k, v in sorted(res["states"].items()))
        err.print(f"[green]imported {res['rows']} answers of judge {name}[/] ({states}; {res['derived']} derived "
                  f"2-image pick_best_and_worst) on {res['tasks']} of {res['tasks_in_sets']} tasks of {sets}",
                  highlight=False, soft_wrap=True)
        if res["skipped_lines"]:
            err.print(f"[bold yellow]{res['skipped_lines']} unreadable line(s) skipped, as eval.py skips them[/]",
                      highlight=False, soft_wrap=True)
        if res["orders_not_official"]:
            err.print(f"[bold yellow]{res['orders_not_official']} answer(s) were shown in another order than eval.py's "
                      f"generate_permutations gives: scored in the order they name[/]", highlight=False, soft_wrap=True)


@vab_app.command("summarize")
def vab_summarize(
    sets: Annotated[str, SETS_OPT],
    fmt: Annotated[SummaryFormat, typer.Option("--format", help="table: what summarize.py prints; json: what it writes with --output")] = SummaryFormat.table,
    t0: Annotated[bool, typer.Option("--t0", help="each judge's run at temperature 0 (stored as <judge>@t0) in parentheses beside its own, as summarize.py --t0-dir shows results-t0/ (not rows of their own then)")] = False,
) -> None:
    """The official metrics (p^3 and ap@1 per prompt type, by domain and image count, and the
    random guess) of every judge with answers to the official prompt types, as summarize.py computes them."""
    with user_errors(log=False):
        from tasks.lake.tables import Lake
        from tasks.vab.official import official_summary, summary_table
        from tasks.vab.sets import load_sets
        from tasks.vab.tables import read_partition

        settings = cli_settings()
        tasks = load_sets(settings, sets)
        rows = read_partition(Lake(settings.lake_dir), "vab_trials", sets).to_pylist()
        by_judge: dict[str, list[dict]] = {}
        for r in rows:
            by_judge.setdefault(r["judge"], []).append(r)
        # summarize.py reads sorted(results_dir.glob("*.json")): judges in the order of their file
        # names <model>.json (gpt-4o-mini.json before gpt-4o.json), after "Random Guess"
        t0_rows = {j.removesuffix(T0_SUFFIX): by_judge.pop(j) for j in sorted(by_judge) if j.endswith(T0_SUFFIX)} if t0 else {}
        scores = official_summary(tasks, {j: by_judge[j] for j in sorted(by_judge, key=lambda j: j + ".json")})
        t0_scores = {j: s for j, s in official_summary(tasks, t0_rows).items() if j in scores and j != "Random Guess"}
        others = sorted(set(by_judge) - set(scores)) + sorted(f"{j}{T0_SUFFIX}" for j in t0_rows if j not in t0_scores)
        if fmt is SummaryFormat.json:
            typer.echo(json.dumps(scores, indent=2, ensure_ascii=False))
        else:
            typer.echo(summary_table(scores, t0_scores), nl=False)
        if others:
            err.print(f"not here (no answers to the official prompt types, or a t=0 run without its judge's own; see vab "
                      f"leaderboard): {', '.join(others)}",
                      highlight=False, soft_wrap=True)


@judges_app.command("remove")
def vab_judges_remove(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the judge, exactly as vab leaderboard names it")],
    sets: Annotated[str, SETS_OPT],
) -> None:
    """Remove every answer of one judge from a set collection (other judges' answers kept)."""
    with user_errors():
        from tasks.lake.tables import Lake
        from tasks.vab.tables import check_set_name, remove_judge

        settings = cli_settings()
        n = remove_judge(Lake(settings.lake_dir), check_set_name(sets), name)
        err.print(f"[green]removed judge {name!r} from {sets}[/]: {n} answer(s)", highlight=False, soft_wrap=True)
