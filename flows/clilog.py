"""Where a command's tracebacks go: the workspace's log file, not the terminal.

An expected error (bad input, unreachable store, tampered reference) is one line on stderr and
exit code 1; its traceback, and every ERROR record Prefect logs while the command runs (flow and
task failures, with their tracebacks), go to ``$IMAGEBENCH_HOME/logs/imagebench.log``.
``imagebench --debug ...`` (or ``IMAGEBENCH_DEBUG=1``) shows them in the terminal instead.
Warnings still reach the terminal. Standard library only: `sql` and `leaderboard` use it too.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from pathlib import Path

LOG_DIR = "logs"  # under IMAGEBENCH_HOME
LOG_FILE = "imagebench.log"
LOG_MAX_BYTES = 5_000_000  # then imagebench.log.1 .. .3
LOG_BACKUPS = 3
DEBUG_ENV = "IMAGEBENCH_DEBUG"
LOGGER = "imagebench.cli"

_handler: logging.Handler | None = None


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def log_path(home: Path) -> Path:
    return Path(home) / LOG_DIR / LOG_FILE


def attach_file_log(home: Path, create: bool = True) -> Path | None:
    """Send ERROR/WARNING records of every logger (Prefect's included) and this module's
    records to the workspace log file. Idempotent per path; None when the workspace does not
    exist (and ``create`` is false) or the file cannot be opened."""
    global _handler
    path = log_path(home)
    if _handler is not None and getattr(_handler, "baseFilename", None) == os.path.abspath(path):
        return path
    if not create and not Path(home).is_dir():
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS,
                                                       encoding="utf-8", delay=True)
    except OSError:
        return None
    from tasks.store.redact import install_log_redaction

    install_log_redaction()  # records are scrubbed of credentials when created, for this file too
    handler.setLevel(logging.INFO)  # not the DEBUG request dumps of PREFECT_LOGGING_ROOT_LEVEL=DEBUG
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
    root, own = logging.getLogger(), logging.getLogger(LOGGER)
    if _handler is not None:  # another workspace in the same process (tests): one file at a time
        for logger in (root, own):
            logger.removeHandler(_handler)
        _handler.close()
    _handler = handler
    root.addHandler(handler)
    own.addHandler(handler)
    own.setLevel(logging.INFO)
    own.propagate = False  # the traceback goes to the file, not through Prefect's console handler
    return path


class _NoErrorsOnConsole(logging.Filter):
    """Prefect's console handler: ERROR records (a failed flow or task run, with its traceback)
    are in the log file; the command prints the error once, itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or debug_enabled()


def quiet_console() -> None:
    """Install the filter on Prefect's console handlers (after ``import prefect`` set them up)."""
    for handler in logging.getLogger().handlers:
        if type(handler).__name__ == "PrefectConsoleHandler" and not any(
            isinstance(f, _NoErrorsOnConsole) for f in handler.filters
        ):
            handler.addFilter(_NoErrorsOnConsole())


def command_started(home: Path, quiet: bool = True) -> Path | None:
    """For commands that run flows: file log on, console quiet, the command line recorded."""
    path = attach_file_log(home)
    if quiet:
        quiet_console()
    logging.getLogger(LOGGER).info("imagebench %s", " ".join(sys.argv[1:]))
    return path


def log_exception(home: Path | None, exc: BaseException) -> Path | None:
    """Write ``exc`` with its traceback to the workspace log; the log's path, or None."""
    path = attach_file_log(home, create=False) if home is not None else None
    if path is None:
        return None
    logging.getLogger(LOGGER).error("imagebench %s: %s: %s", " ".join(sys.argv[1:]), type(exc).__name__, exc,
                                    exc_info=(type(exc), exc, exc.__traceback__))
    for h in logging.getLogger(LOGGER).handlers:
        h.flush()
    return path
