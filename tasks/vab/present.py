"""How VAB numbers are shown, the same on the command line and the report page (no I/O, no heavy
imports): p-values that never round to 0, the UNCALIBRATED flag, and the split of judges into the
3-trial strict column and the one-trial column (docs/VAB.md, "One trial and three")."""

from __future__ import annotations

from collections.abc import Iterable

UNCALIBRATED_NOTE = ("UNCALIBRATED demo weights (a tiny random HPSv3-architecture model): its numbers show the "
                     "pipeline, not HPSv3")
STRICT_KEYS = ("strict_best", "strict_worst", "strict_both")


def format_p(p: float | None) -> str:
    """Two significant digits, scientific below 1e-4, so 3.7e-9 prints ``3.7e-09``, never ``0``."""
    if p is None:
        return ""
    return f"{p:.2g}"


def uncalibrated_notes(metrics: Iterable[dict]) -> list[str]:
    """One line per judge whose answers came from uncalibrated (demo) weights."""
    return [f"judge {m['judge']}: {UNCALIBRATED_NOTE}" for m in metrics if m.get("uncalibrated")]


def judge_label(m: dict) -> str:
    return m["judge"] + (" UNCALIBRATED" if m.get("uncalibrated") else "")


def is_one_trial(m: dict) -> bool:
    return m.get("trials_per_task") == 1


def strict_or_none(m: dict, key: str):
    """A 3-trial strict figure, or None for a one-trial judge (it has none: it answered once)."""
    return None if is_one_trial(m) else m.get(key)


def ranked(metrics: Iterable[dict]) -> list[dict]:
    """3-trial judges by strict both (best first), then one-trial judges by their one-trial both; a
    judge whose figure is absent (never asked for both) after those that have one."""

    def key(m: dict) -> tuple:
        figure = m["single_both"] if is_one_trial(m) else m["strict_both"]
        return (is_one_trial(m), figure is None, -(figure or 0), m["judge"])

    return sorted(metrics, key=key)
