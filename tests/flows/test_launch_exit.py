"""A cold command ends as Python would end it, minus the teardown (flows/launch.py
_end_without_teardown): its exit status, every byte of its output and every exit handler of the
command kept; the freeing of every object (seconds after torch, Prefect and GX) skipped."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.flows.conftest import REPO

# The command under test stands in for flows.cli.main: it registers an exit handler as Prefect
# does (its API is stopped from one), writes more output than a pipe buffers, and holds an
# object whose finalizer writes a file only if the interpreter tears the process down.
COMMAND = textwrap.dedent(
    """
    import atexit, os, sys
    from pathlib import Path
    import flows.cli
    from flows import launch

    marks = Path(os.environ["MARKS"])

    class Teardown:
        def __del__(self):
            (marks / "teardown").write_text("ran")

    KEPT = Teardown()

    def command():
        atexit.register(lambda: (marks / "handler").write_text("ran"))
        sys.stdout.write("x" * 1_000_000)
        how = os.environ["HOW"]
        if how == "return":
            return
        if how == "raise":
            raise RuntimeError("boom from the command")
        sys.exit(None if how == "none" else how if how == "text" else int(how))

    flows.cli.main = command
    sys.argv = ["imagebench", "score", "--model", "m"]
    launch.main()
    """
)


def _run(tmp_path, how: str, teardown: bool = False) -> tuple[subprocess.CompletedProcess, set[str]]:
    marks = tmp_path / how
    marks.mkdir()
    env = {**os.environ, "MARKS": str(marks), "HOW": how, "IMAGEBENCH_WARM": "off", "PYTHONPATH": str(REPO)}
    script = COMMAND if not teardown else COMMAND.replace("launch.main()", "launch._end_without_teardown = lambda: None\nlaunch.main()")
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    return proc, {p.name for p in marks.iterdir()}


@pytest.mark.parametrize(("how", "status"), [("return", 0), ("none", 0), ("0", 0), ("3", 3), ("text", 1), ("raise", 1)])
def test_a_cold_command_keeps_its_status_output_and_handlers_and_skips_the_teardown(tmp_path, how, status):
    proc, marks = _run(tmp_path, how)
    assert proc.returncode == status, proc.stderr
    assert len(proc.stdout) == 1_000_000  # flushed before the process ended
    assert "handler" in marks  # the command's own exit handlers ran (Prefect stops its API in one)
    assert "teardown" not in marks  # ... and nothing after them
    if how == "text":
        assert proc.stderr.strip().endswith("text")  # printed by Python, as sys.exit("text") does
    if how == "raise":
        assert "RuntimeError: boom from the command" in proc.stderr


def test_the_finalizer_of_the_probe_runs_when_the_teardown_is_not_skipped(tmp_path):
    """The check above can fail: with the handler disabled, Python's teardown runs the finalizer."""
    proc, marks = _run(tmp_path, "3", teardown=True)
    assert proc.returncode == 3, proc.stderr
    assert {"handler", "teardown"} <= marks
