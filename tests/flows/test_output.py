"""Terminal output that a person reads (issue 8, item 12): sums that add up, wide tables that
stay readable."""

from __future__ import annotations

import io
import re

from flows.cli.common import OutputFormat, nightly_line, render


def test_nightly_line_names_every_disposition_and_adds_up():
    summary = {"discovered": 6, "scored": ["a"], "unchanged": ["b"], "up_to_date": ["c", "d"], "rejudged": ["c"],
               "invalid": {"bad name": "x"}, "busy": [], "retired": [], "errored": ["d", "e"]}
    line = nightly_line(summary)
    assert line == ("nightly: 6 models discovered: 1 scored, 1 unchanged (same images), "
                    "1 up to date (1 with new verdicts), 1 invalid, 2 errored")
    counts = [int(n) for n in re.findall(r"(?:: |, )(\d+) ", line.split("discovered")[1])]
    assert sum(counts) == 6
    # Whatever no disposition names is still counted, never silently dropped.
    assert nightly_line({"discovered": 2, "scored": [], "up_to_date": ["x"]}).endswith(
        "0 scored, 1 up to date (0 with new verdicts), 1 without a result (see `imagebench runs`)")


def test_a_table_too_wide_for_the_terminal_is_shown_one_record_per_block():
    columns = [f"column_{i:02d}" for i in range(34)]
    rows = [[f"value-{r}-{i}" for i in range(34)] for r in range(2)]
    out = io.StringIO()
    render(columns, rows, OutputFormat.table, title="select *", out=out)
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0] == "select *" and lines[1].startswith("-[ RECORD 1 ]--") and lines[2] == "column_00 | value-0-0"
    assert "\n-[ RECORD 2 ]-" in text and "column_33 | value-1-33" in text
    assert max(len(line) for line in text.splitlines()) < 80
    narrow = io.StringIO()
    render(["a", "b"], [[1, "x"]], OutputFormat.table, out=narrow)
    assert "RECORD" not in narrow.getvalue() and "x" in narrow.getvalue()


def test_a_closed_pipe_stops_quietly(workspace):
    """`imagebench sql ... | head`: no BrokenPipeError, no error line, once the reader is gone."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (head) has already gone
    try:
        done = subprocess.run([sys.executable, "-m", "flows.cli", "sql", "select * from range(5000)", "--format", "csv"],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert done.stderr.strip() == "", done.stderr
    assert done.returncode != 0  # the output was not delivered


def test_flags_show_no_bool_metavar_in_help():
    from typer.testing import CliRunner

    from flows.cli import app

    for command in (["nightly", "--help"], ["score", "--help"]):
        r = CliRunner().invoke(app, command, env={"COLUMNS": "160"})
        assert r.exit_code == 0 and "--rejudge" in r.output, r.output
        assert "<bool>" not in r.output and "<table|csv|json>" in r.output, r.output


def _every_command():
    """(argv path, click command) of the app, every group and sub-command included."""
    from typer.main import get_command

    from flows.cli import app

    def walk(cmd, path):
        yield path, cmd
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(sub, [*path, name])

    return list(walk(get_command(app), []))


def test_every_help_text_reads_whole_and_without_placeholders():
    """Issue 15, item 10: a group's command list broke summaries mid-sentence (the docstring's
    line breaks), and usage lines showed required arguments as ``{file}`` / ``{MODEL}``. Every
    command's --help, rendered wide: each sub-command's summary (its docstring's first paragraph)
    on one line of its group's list, and no brace placeholder anywhere."""
    import inspect

    from typer.testing import CliRunner

    from flows.cli import app

    commands = _every_command()
    assert len(commands) > 40  # the whole tree, not just the top level
    for path, cmd in commands:
        r = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "1000"})
        assert r.exit_code == 0, (path, r.output)
        where = " ".join(["imagebench", *path])
        assert not re.search(r"\{[A-Za-z_.-]+\}", r.output), (where, r.output)
        usage = next(line for line in r.output.splitlines() if "Usage:" in line)
        for param in cmd.params:
            if param.param_type_name == "argument":
                assert (param.metavar or param.name.upper()) in usage.split(), (where, usage)
        lines = r.output.splitlines()
        for name, sub in getattr(cmd, "commands", {}).items():
            summary = " ".join(inspect.cleandoc(sub.help or "").split("\n\n")[0].split())
            row = [line for line in lines if re.match(rf"^\W*{re.escape(name)}\s", line.lstrip("│ "))
                   or line.lstrip("│ ").startswith(name + " ")]
            assert row and summary in " ".join(row[0].split()), (f"{where} {name}", summary, row)
