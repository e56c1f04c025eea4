"""`imagebench reference build|verify|canary`: the frozen EPS reference (tasks/scores/reference.py,
tasks/scores/golden.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from flows.cli.common import (
    OutputFormat, cli_settings, err, prepare_prefect, print_rows, progress, scoring_preload, user_errors, warn_uncalibrated,
)

reference_app = typer.Typer(help="Build or verify the frozen EPS reference.", no_args_is_help=True)


@reference_app.command("build")
def reference_build(
    version: Annotated[str, typer.Option(help="new reference version; an existing one is never rewritten")],
    baseline: Annotated[Path, typer.Option(help="file with one baseline model id per line")],
    scorer: Annotated[Optional[str], typer.Option(help="build from scores imported under this name")] = None,
) -> None:
    """Build the frozen reference once: median mu of the baseline field per EPS-eligible prompt."""
    with user_errors():
        settings = cli_settings()
        from tasks.store.adhoc import read_baseline

        models = read_baseline(baseline)
        prepare_prefect(settings, preload=scoring_preload(scorer is not None))
        from flows.pipeline import reference_build_flow

        with progress():
            path = reference_build_flow(version, models, scorer_name=scorer)
        err.print(f"[green]reference {version} written to {path} and pinned in SHA256SUMS[/]")
        import json

        warn_uncalibrated(bool(json.loads(Path(path).read_text())["scorer"].get("uncalibrated")), OutputFormat.table)


@reference_app.command("verify")
def reference_verify(
    version: Annotated[Optional[str], typer.Option(help="default: IMAGEBENCH_REFERENCE_VERSION")] = None,
) -> None:
    """Check the reference (and suite) against SHA256SUMS and its Great Expectations suite."""
    with user_errors():
        settings = cli_settings()
        if version:
            settings = settings.model_copy(update={"reference_version": version})
        from tasks.runs import pinned

        suite = pinned.load_pinned_suite(settings)
        ref = pinned.load_verified_reference(settings, suite, None)
        err.print(
            f"[green]ok[/]: {settings.reference_path} ({len(ref.prompts)} prompts, suite {ref.suite.version}, "
            f"scorer {ref.scorer.scorer_name} {ref.scorer_id}, baseline {len(ref.baseline_models)} models)"
        )
        warn_uncalibrated(ref.scorer.uncalibrated, OutputFormat.table)


@reference_app.command("canary")
def reference_canary(
    version: Annotated[Optional[str], typer.Option(help="default: IMAGEBENCH_REFERENCE_VERSION")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", help="table, csv or json")] = OutputFormat.table,
) -> None:
    """Score the reference's golden set in this runtime and compare with the mu stored at build
    (what every scoring run does first); exit 1 beyond the tolerance."""
    with user_errors():
        settings = cli_settings()
        if version:
            settings = settings.model_copy(update={"reference_version": version})
        from tasks.runs import pinned
        from rich.markup import escape

        from tasks.scores.golden import compare, load_golden_set, score_golden
        from tasks.hpsv3.scorer import pin_intra_op_threads

        suite = pinned.load_pinned_suite(settings)
        spec = pinned.ScorerSpec.from_settings(settings)
        ref = pinned.load_verified_reference(settings, suite, pinned.scorer_identity(spec).scorer_id)
        golden = load_golden_set(settings.reference_dir, ref.golden.set if ref.golden else settings.golden_set)
        scorer = pinned.get_scorer(spec)
        pin_intra_op_threads(settings.hpsv3_threads)
        mus, runtime = score_golden(scorer, golden, settings.batch_size)
        result = compare(ref, golden, mus, runtime)
        expected = {g.item_id: g.mu for g in ref.golden.items}
        rows = [
            {"item": it.item_id, "prompt_id": it.prompt_id, "mu_reference": expected[it.item_id], "mu_now": mu,
             "drift": result.drifts[it.item_id], "within_tolerance": abs(result.drifts[it.item_id]) <= result.tolerance}
            for it, mu in zip(golden.items, mus)
        ]
        print_rows(rows, fmt, f"golden-set canary: reference {ref.version}")
        err.print(("[green]ok[/]: " if result.passed else "[red]DRIFT[/]: ") + escape(result.describe()), highlight=False)
        warn_uncalibrated(ref.scorer.uncalibrated, fmt)
        if not result.passed:
            raise typer.Exit(1)
