"""The `imagebench` command line: the Typer app assembled from one sub-app module per area
(ARCHITECTURE.md section 7). Imported by nobody inside this package: the areas import
flows/cli/common.py (errors, settings, output, logging), never each other.

- scoring.py: ingest, score, backfill, nightly, hpsv3, compare, breakdown, report, leaderboard,
  runs, sql, catalog, serve (a Prefect server), demo; imports.py: import-scores, import-verdicts;
  deploy.py: deploy (prefect.yaml's deployments for workers)
- reference.py, judges.py, models.py, study.py (with publishing), panel.py, vab.py (with run and
  the official toolkit), vab_people.py (`vab panel`), warm.py

Heavy packages (torch, transformers, Prefect, Great Expectations) are imported inside the
commands that need them, so `sql` and `leaderboard` answer in about a second.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from flows.cli import deploy, imports, scoring
from flows.cli.judges import judges_app
from flows.cli.models import models_app
from flows.cli.panel import panel_app
from flows.cli.reference import reference_app
from flows.cli.study import study_app
from flows.cli.vab import vab_app
from flows.cli.vab_people import vab_panel_app
from flows.cli.warm import warm_app
from tasks.store import private

app = typer.Typer(
    name="imagebench",
    help="Reproducible scoring of text-to-image models: HPSv3 EPS against a frozen reference.",
    no_args_is_help=True,
    # Typer's --install-completion / --show-completion: the shell asks `imagebench` itself on <TAB>
    # (flows/launch.py runs that in this process: the app's import is the light one of `sql`).
    add_completion=True,
    pretty_exceptions_enable=False,
)


def version_text() -> str:
    """`imagebench --version`: the installed package's version and, when the code runs from a git
    checkout (`make` installs it in place), its commit, said when files differ from it."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    try:
        text = f"imagebench {version('imagebench')}"
    except PackageNotFoundError:
        text = "imagebench (package not installed)"
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():  # an installed copy: no commit to name (never a parent folder's repository)
        return text
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()

        commit = git("rev-parse", "--short=12", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):  # no git, or not readable by this user
        return text
    return f"{text} (commit {commit}{', with uncommitted changes' if changed else ''})"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit(0)


@app.callback()
def _global_options(
    debug: Annotated[
        bool, typer.Option("--debug", help="show tracebacks and Prefect's error logs in the terminal (else in $IMAGEBENCH_HOME/logs/imagebench.log)")
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=_print_version, help="print the version (and the git commit) and exit")
    ] = False,
) -> None:
    if debug:
        os.environ["IMAGEBENCH_DEBUG"] = "1"  # read by flows.cli.common, also in processes this one starts


# The top-level commands, in the order `imagebench --help` lists them; then the sub-apps.
for command in (
    scoring.ingest, scoring.score, scoring.backfill, scoring.nightly, scoring.hpsv3, imports.import_scores,
    imports.import_verdicts, scoring.compare, scoring.breakdown, scoring.report, scoring.leaderboard, scoring.runs,
    scoring.sql, scoring.catalog, scoring.serve, deploy.deploy, scoring.demo,
):
    app.command()(command)
app.add_typer(reference_app, name="reference")
app.add_typer(judges_app, name="judges")
app.add_typer(models_app, name="models")
app.add_typer(study_app, name="study")
app.add_typer(panel_app, name="panel")
vab_app.add_typer(vab_panel_app, name="panel")
app.add_typer(vab_app, name="vab")
app.add_typer(warm_app, name="warm")


def main() -> None:
    private.enter_private()  # `python -m flows.cli` too: new files 0600, folders 0700 (tasks/store/private.py)
    app()
