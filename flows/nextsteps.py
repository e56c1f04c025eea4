"""What `make demo` prints last: the exact commands a user pastes next (issue 15, item 5).

`make demo` runs `.venv/bin/imagebench demo`; it cannot change the user's shell, so a plain
`imagebench leaderboard` typed afterwards is "command not found" unless the virtual environment's
bin folder is on PATH. The demo says so, with the one line that fixes it. Standard library only.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

# What to try after the demo, in the order a new user reads the README.
DEMO_NEXT_COMMANDS = (
    "imagebench leaderboard",
    "imagebench breakdown --model demo-patchy",
    "imagebench runs",
    "imagebench models list",
    "imagebench report --out site/",
)


def _shown_path(path: Path, cwd: Path) -> str:
    """``path`` relative to ``cwd`` when it is inside it (``.venv/bin``), else absolute."""
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def activation_line(bin_dir: Path, path_env: str | None, cwd: Path) -> str | None:
    """The shell line that puts ``bin_dir``'s ``imagebench`` first on PATH, or None when typing
    ``imagebench`` already runs that one (or ``bin_dir`` has no ``imagebench`` to point at)."""
    exe = bin_dir / "imagebench"
    if not exe.is_file():
        return None
    found = shutil.which("imagebench", path=path_env or "")
    if found is not None:
        try:
            if os.path.samefile(found, exe):
                return None
        except OSError:
            pass
    shown = _shown_path(bin_dir, cwd)
    if (bin_dir / "activate").is_file():
        return f"source {shlex.quote(shown + '/activate')}"
    return f'export PATH={shlex.quote(shown)}:"$PATH"'


def next_steps_text(bin_dir: Path, path_env: str | None, cwd: Path) -> str:
    """The lines the demo ends with: the activation line when needed, then commands to paste."""
    line = activation_line(bin_dir, path_env, cwd)
    out = []
    if line:
        out.append(f"next: `imagebench` is in {_shown_path(bin_dir, cwd)}, which is not on your PATH; "
                   "run this once in each new shell (or prefix the commands with that folder):")
        out.append(f"  {line}")
        out.append("then, for example:")
    else:
        out.append("next, for example:")
    out += [f"  {c}" for c in DEMO_NEXT_COMMANDS]
    return "\n".join(out)


def print_next_steps(console) -> None:
    """Print :func:`next_steps_text` for the running interpreter's bin folder (not resolved:
    ``.venv/bin/python`` is a symlink to the system Python)."""
    console.print(next_steps_text(Path(sys.executable).parent.absolute(), os.environ.get("PATH"), Path.cwd()),
                  markup=False, highlight=False, soft_wrap=True)
