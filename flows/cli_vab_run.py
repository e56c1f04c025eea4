"""`imagebench vab run|audit|demo-sets`: judges under test on a set collection (docs/VAB.md,
"Judges, runs and audit"). Registered onto flows.cli_vab's ``vab_app`` (imported by flows/cli.py);
Prefect and the judges are imported inside the commands only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from flows.cli_vab import SETS_OPT, vab_app
from flows.output import OutputFormat, render


def _cli():
    import flows.cli as cli

    return cli


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
    temperature: Annotated[Optional[float], typer.Option("--temperature", min=0.0, max=2.0, help="VLM sampling temperature (default: 0 for ours, 1.0 for vab-official-v1 as eval.py)")] = None,
) -> None:
    """Run judges on every task of a set collection, 3 trials each (flow `vab-run`), store their
    answers in vab_trials and print the leaderboard."""
    cli = _cli()
    with cli._user_errors():
        from tasks.vab.run import resolve_judges
        from tasks.vab.sets import load_sets

        settings = cli._settings()
        # bad names, missing weights and missing collections are named before Prefect starts
        resolve_judges(settings, judge, prompt, temperature)
        load_sets(settings, sets)
        cli._prefect(settings)
        from flows.vab import vab_run_flow

        summary = vab_run_flow(sets, list(judge), batch_size=batch_size, use_cache=not no_cache, prompt_version=prompt,
                               temperature=temperature)
        from tasks.vab.present import UNCALIBRATED_NOTE

        for name, m in summary["judges"].items():
            bad = {k: v for k, v in m["invalid_trials"].items() if v}
            cli.err.print(f"[green]{name}[/]: {m['trials']} trials ({m['cache_hits']} from the cache)"
                          + (f", [bold yellow]invalid {bad}: counted wrong[/]" if bad else "")
                          + (f", [bold yellow]{UNCALIBRATED_NOTE}[/]" if m.get("uncalibrated") else ""),
                          highlight=False, soft_wrap=True)
    from flows.cli_vab import vab_leaderboard

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
    cli = _cli()
    with cli._user_errors():
        from tasks.lake.tables import Lake
        from tasks.vab.audit import audit, own_judges, write_audit
        from tasks.vab.run import resolve_judges
        from tasks.vab.sets import load_sets
        from tasks.vab.tables import read_partition

        settings = cli._settings()
        names, notes = (list(judge), []) if judge else own_judges(settings)
        resolve_judges(settings, names)
        tasks = load_sets(settings, sets)
        if rerun:
            cli._prefect(settings)
            from flows.vab import vab_run_flow

            vab_run_flow(sets, names)
        trials = read_partition(Lake(settings.lake_dir), "vab_trials", sets)
        missing = [n for n in names if n not in set(trials.column("judge").to_pylist())]
        if missing:
            raise cli.CliError(f"no answers of {missing} on {sets}: run the audit with --rerun")
        rows = audit(tasks, trials, names)
        path = write_audit(settings, sets, rows, notes)
        from tasks.vab.present import UNCALIBRATED_NOTE

        notes = notes + [f"judge {j}: {UNCALIBRATED_NOTE}" for j in dict.fromkeys(r["judge"] for r in rows if r["uncalibrated"])]
        for note in notes:
            cli.err.print(f"[bold yellow]{note}[/]", highlight=False, soft_wrap=True)
        if fmt is OutputFormat.table:
            render(["judge", "category", "tasks", "strict both [95% Wilson]", "strict best [95% Wilson]", "single best"],
                   [[r["judge"] + (" UNCALIBRATED" if r["uncalibrated"] else ""), r["category"], r["tasks"],
                     _pct(r["strict_both"], r["strict_both_lo"], r["strict_both_hi"]),
                     _pct(r["strict_best"], r["strict_best_lo"], r["strict_best_hi"]), _pct(r["single_best"])] for r in rows],
                   fmt, title=f"VAB audit: imagebench's judges vs the experts on {sets}")
            cli.err.print(f"audit written to {path}", highlight=False, soft_wrap=True)
        else:
            cols = list(rows[0]) if rows else ["judge", "category", "tasks"]
            render(cols, [[r[c] for c in cols] for r in rows], fmt, title="VAB audit")


@vab_app.command("demo-sets")
def vab_demo_sets(
    out: Annotated[Path, typer.Option("--out", help="folder for the images and manifest.jsonl")],
) -> None:
    """Write the demo sets (bundled photos at graded degradations: known best and worst) and their
    manifest, ready for `imagebench vab import-sets OUT/manifest.jsonl --name S`."""
    cli = _cli()
    with cli._user_errors():
        from tasks.vab.demo_sets import write_demo_sets

        cli.err.print(f"[green]wrote {write_demo_sets(out)}[/]", highlight=False, soft_wrap=True)


import flows.cli_vab_official  # noqa: E402,F401  (registers vab import-results|summarize|judges remove)
