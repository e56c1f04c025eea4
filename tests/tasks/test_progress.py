import logging

from tasks import progress


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
