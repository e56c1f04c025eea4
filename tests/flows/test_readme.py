"""The README's path as a new user walks it (issue 15, items 5 and 10): every command it lists
exists and every top-level command is listed; its example output folders stay out of git status."""

from __future__ import annotations

import re
import subprocess

from tests.flows.conftest import REPO

README = (REPO / "README.md").read_text()
# What the README shows as commands: its code blocks and `inline code`, not its prose.
README_CODE = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", README, re.S) + re.findall(r"`([^`\n]+)`", README))


def test_every_top_level_command_is_in_the_readme_and_every_readme_command_exists():
    from typer.main import get_command

    from flows.cli import app

    commands = set(get_command(app).commands)
    named = set(re.findall(r"(?:^|\s)imagebench (?:--\S+ )*([a-z][a-z0-9-]*)", README_CODE, re.M))
    assert sorted(commands - named) == [], f"commands not in README.md: {sorted(commands - named)}"
    assert named <= commands, f"README.md names commands that do not exist: {sorted(named - commands)}"


def test_the_readmes_example_output_folders_are_ignored_by_git():
    """`imagebench report --out site/` (and `study export --out bundle/`), run from the checkout
    as the README shows, leave `git status` clean."""
    outs = set(re.findall(r"--out ([A-Za-z0-9_.-]+)/", README))
    assert {"site", "bundle"} <= outs, outs
    for out in sorted(outs):
        r = subprocess.run(["git", "check-ignore", "-q", f"{out}/index.html"], cwd=REPO)
        assert r.returncode == 0, f"{out}/ (README's example output folder) is not ignored by git"


def _shell(script: str, cwd, path: str) -> subprocess.CompletedProcess:
    import os

    env = {"PATH": path, "HOME": str(cwd), "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO)),
           "IMAGEBENCH_HOME": str(cwd / "home"), "IMAGEBENCH_REFERENCE_DIR": str(REPO / "reference"),
           "IMAGEBENCH_WARM": "off"}
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def test_the_demos_next_steps_work_when_pasted_into_a_new_shell(tmp_path):
    """Issue 15, item 5: after `make demo`, `imagebench leaderboard` was "command not found" (the
    venv's bin is not on the user's PATH). The demo's last lines, pasted into a shell whose PATH
    lacks the venv, run imagebench; with the venv already on PATH they say nothing to activate."""
    import sys
    from pathlib import Path

    from flows.demo import DEMO_NEXT_COMMANDS, next_steps_text

    bin_dir = Path(sys.executable).parent.absolute()  # as the demo sees it: .venv/bin, not resolved
    assert (bin_dir / "imagebench").is_file()
    bare = "/usr/bin:/bin"
    text = next_steps_text(bin_dir, bare, tmp_path)
    pasted = [line.strip() for line in text.splitlines() if line.startswith("  ")]
    assert pasted[0].startswith("source ") and pasted[1:] == list(DEMO_NEXT_COMMANDS), text
    not_found = _shell("imagebench --help", tmp_path, bare)
    assert not_found.returncode == 127  # what the user saw
    # The activation line, then a documented command (a light one: no demo workspace here).
    done = _shell(f"{pasted[0]}\nimagebench --help && imagebench sql 'SELECT 41 + 1 AS n' --format csv",
                     tmp_path, bare)
    assert done.returncode == 0, done.stderr
    assert "Usage: imagebench" in done.stdout and done.stdout.rstrip().endswith("n\n42")
    # The venv already on PATH: nothing to activate, the commands as the README writes them.
    on_path = next_steps_text(bin_dir, f"{bin_dir}:{bare}", tmp_path)
    assert "source" not in on_path and "not on your PATH" not in on_path
    assert [line.strip() for line in on_path.splitlines() if line.startswith("  ")] == list(DEMO_NEXT_COMMANDS)
    # A checkout-local venv is named relative to the folder `make demo` runs in.
    assert next_steps_text(bin_dir, bare, bin_dir.parent.parent).splitlines()[1] == (
        f"  source {bin_dir.parent.name}/bin/activate")


def test_every_output_of_numbers_from_demo_weights_says_so(built_reference, tmp_path):
    """Issue 15, item 9: README: "without real weights every output says UNCALIBRATED DEMO
    WEIGHTS"; `compare`, `models list`, `reference build` (and the leaderboard's table, whose
    columns hide `uncalibrated`) said nothing. The tiny model's scores are flagged uncalibrated."""
    from typer.testing import CliRunner

    from flows.cli import app

    mark = "UNCALIBRATED DEMO WEIGHTS"

    def said(*args: str) -> str:
        r = CliRunner().invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "200"})
        assert r.exit_code == 0, r.output
        return r.output

    baseline = tmp_path / "baseline.txt"
    baseline.write_text("base-a\nbase-b\n")
    for args in (["compare", "base-a", "base-b"], ["compare", "base-a", "base-b", "--axis", "eps", "--format", "json"],
                 ["models", "list"], ["models", "list", "--format", "csv"], ["leaderboard"],
                 ["breakdown", "--model", "base-a"], ["reference", "build", "--version", "t2", "--baseline", str(baseline)]):
        assert mark in said(*args), args
    # Capability alone is the judges' (no HPSv3 number in it): no mark there.
    assert mark not in said("compare", "base-a", "base-b", "--axis", "capability")
