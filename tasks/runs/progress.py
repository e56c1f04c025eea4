"""A tiny progress hook so long work shows progress without tasks knowing who watches.

The CLI installs a rich progress bar; Prefect workers keep the default, which logs every ~10%.
Tasks call ``advance(stage, total, n)``; nothing here imports rich or Prefect. Whoever plans a
stage declares its total first (``advance(stage, total, 0)``), so no bar shows ``n/?``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

Reporter = Callable[[str, int, int], None]  # (stage label, total, advance by)

_log = logging.getLogger("imagebench.progress")
_lock = threading.Lock()
_done: dict[str, int] = {}
_totals: dict[str, int] = {}


def _log_reporter(stage: str, total: int, n: int) -> None:
    """Log each stage at every 10% (a total of 0 means "keep the total you were given")."""
    with _lock:
        if total > 0:
            if starts_new_round(_done.get(stage, 0), _totals.get(stage, 0), total):
                _done[stage] = 0
            _totals[stage] = total
        before = _done.get(stage, 0)
        after = before + n
        _done[stage] = after
        total = _totals.get(stage, 0)
    if n and total and ((after * 10 // total) != (before * 10 // total) or after == total):
        _log.info("%s: %d/%d", stage, after, total)


def starts_new_round(done: int, known_total: int, total: int) -> bool:
    """A stage that already reached its total and is given a total again is a new round of
    the same work (the demo ingests the baselines for the reference, then again in the
    nightly): its count starts over instead of reading ``384/192``."""
    return total > 0 and known_total > 0 and done >= known_total


_reporter: Reporter = _log_reporter


def set_reporter(reporter: Reporter | None) -> None:
    global _reporter
    _reporter = reporter or _log_reporter


def advance(stage: str, total: int, n: int = 1) -> None:
    _reporter(stage, total, n)
