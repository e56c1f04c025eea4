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
