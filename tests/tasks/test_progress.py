import logging

from tasks.runs import progress


def test_log_reporter_logs_every_tenth_with_remembered_total(caplog):
    caplog.set_level(logging.INFO, logger="imagebench.progress")
    progress.set_reporter(None)
    progress.advance("stage-x", 20, 0)  # declare the total
    for _ in range(20):
        progress.advance("stage-x", 0, 1)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stage-x")]
    assert lines[0] == "stage-x: 2/20" and lines[-1] == "stage-x: 20/20" and len(lines) == 10


def test_custom_reporter_receives_calls():
    seen = []
    progress.set_reporter(lambda stage, total, n: seen.append((stage, total, n)))
    try:
        progress.advance("s", 3, 1)
    finally:
        progress.set_reporter(None)
    assert seen == [("s", 3, 1)]


def test_a_stage_reported_again_starts_a_new_round(caplog):
    """Issue 8 item 12: `ingest m 384/192` when the same model is ingested twice in one process."""
    caplog.set_level(logging.INFO, logger="imagebench.progress")
    progress.set_reporter(None)
    for _ in range(2):
        progress.advance("stage-r", 4, 4)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stage-r")]
    assert lines == ["stage-r: 4/4", "stage-r: 4/4"]


def test_cli_bars_count_each_round_against_its_total():
    import io

    from rich.console import Console

    import flows.cli.common as cli

    out = io.StringIO()
    saved, cli.err = cli.err, Console(file=out, width=100, force_terminal=False)
    try:
        with cli.progress():
            for _ in range(2):
                progress.advance("ingest m", 192, 0)
                progress.advance("ingest m", 192, 192)
    finally:
        cli.err = saved
    text = out.getvalue()
    assert "384/192" not in text and text.count("192/192") == 2, text
