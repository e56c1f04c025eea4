"""How a figure is written for a person: one style for the terminal tables and the static pages.

The style (issue 26 item 7; docs/REPORT.md, "How numbers are written"):

- a score on the 0..100 scale (Capability, EPS, Overall, a difference of two, a group's
  Capability or EPS) and its interval bounds: one decimal, ``44.4`` and ``44.4 [25.5, 65.0]``;
- an HPSv3 mu or sigma (a logit): three decimals, ``0.123``;
- a share (coverage, P(A beats B)): a percentage with one decimal, ``14.1%``;
- a count out of a total (judged, decided): ``12/192``;
- absent (nothing behind the figure): ``–``, never 0 and never a blank.

CSV and JSON are data, not display: they keep every figure at full precision, shares as the
fractions the lake stores (``coverage`` 0.140625), absent as an empty cell / ``null``.

Pure functions of the standard library only: `imagebench leaderboard` and `sql` import this.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["ABSENT", "COLUMN_STYLES", "FLAGS", "band", "count_of", "finite", "interval", "leaderboard_cells", "leaderboard_flags",
           "leaderboard_layouts", "mu", "score", "share", "styled"]

ABSENT = "–"  # U+2013: a figure with nothing behind it


def finite(x: Any) -> float | None:
    """``x`` as a float, or None for None, NaN, infinities and anything that is not a number."""
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def score(x: Any) -> str:
    """A 0..100 score: ``44.4``."""
    x = finite(x)
    return ABSENT if x is None else f"{x:.1f}"


def interval(x: Any, lo: Any, hi: Any) -> str:
    """A score with its 95% interval, ``44.4 [25.5, 65.0]``; the bare score without bounds."""
    x, lo, hi = finite(x), finite(lo), finite(hi)
    if x is None:
        return ABSENT
    if lo is None or hi is None:
        return f"{x:.1f}"
    return f"{x:.1f} [{lo:.1f}, {hi:.1f}]"


def mu(x: Any) -> str:
    """An HPSv3 mu (or sigma), a logit: ``0.123``."""
    x = finite(x)
    return ABSENT if x is None else f"{x:.3f}"


def share(x: Any) -> str:
    """A fraction 0..1 as a percentage: ``14.1%``."""
    x = finite(x)
    return ABSENT if x is None else f"{100.0 * x:.1f}%"


def count_of(n: Any, total: Any) -> str:
    """``12/192``; absent without both counts."""
    if n is None or total is None:
        return ABSENT
    return f"{int(n)}/{int(total)}"


def band(rank: Any, worst: Any) -> str:
    """An arena-style rank band: ``3-5``, just ``3`` when it is one place."""
    if rank is None:
        return ABSENT
    return str(rank) if worst is None or worst == rank else f"{rank}-{worst}"


# Terminal columns written in the style above by their name (every command's table, `sql`'s
# included: `SELECT capability FROM leaderboard` reads 44.4). Columns not named here keep their
# plain value (at most 6 significant digits for a float).
COLUMN_STYLES: dict[str, Callable[[Any], str]] = {
    **dict.fromkeys(
        ("capability", "capability_lo", "capability_hi", "eps", "eps_lo", "eps_hi", "overall", "overall_lo",
         "overall_hi", "difference", "ci_lo", "ci_hi"),
        score,
    ),
    **dict.fromkeys(("coverage", "judge_coverage", "p_a_beats_b"), share),
    **dict.fromkeys(("mu", "sigma", "mean_mu"), mu),
}


def styled(column: str, value: Any) -> str | None:
    """``value`` written in its column's style, or None when the column has none (or the value
    is not a number: a string an `sql` query put under such a name is shown as it is)."""
    style = COLUMN_STYLES.get(column)
    if style is None or isinstance(value, (str, bool, bytes)):
        return None
    if value is not None and finite(value) is None and not (isinstance(value, float) and math.isnan(value)):
        return None
    return style(value)


# ---- the leaderboard as a terminal table (`imagebench leaderboard`) ------------------------------
# (flag, its letter where the table must be narrow, what it means)
FLAGS = (
    ("provisional", "P", "not every prompt decided yet: Capability and Overall may move"),
    ("incomplete", "I", "missing or quarantined images counted as losses"),
    ("UNCALIBRATED", "U", "demo weights: not a real HPSv3 score"),
)
LEADERBOARD_NARROW = ("band", "model_id", "overall", "capability", "eps", "judged", "flags")
LEADERBOARD_WIDE = ("band", "model_id", "overall", "capability", "eps", "judged", "decided", "coverage", "eps_scored",
                    "quarantined", "missing", "flags", "reference", "scored_at")


def leaderboard_flags(row: dict) -> list[str]:
    """The flags of one `leaderboard` view row, in the order of :data:`FLAGS`."""
    on = (bool(row.get("provisional")), row.get("complete") is False, bool(row.get("uncalibrated")))
    return [name for (name, _, _), set_ in zip(FLAGS, on) if set_]


def leaderboard_cells(row: dict, letters: bool = False) -> dict[str, str]:
    """Every terminal column of one `leaderboard` view row, written in the one style."""
    flags = leaderboard_flags(row)
    if letters:
        flags = [letter for name, letter, _ in FLAGS if name in flags]
    scored_at = row.get("scored_at")
    return {
        "band": band(row.get("rank"), row.get("rank_worst")),
        "model_id": str(row["model_id"]),
        **{axis: interval(row.get(axis), row.get(f"{axis}_lo"), row.get(f"{axis}_hi")) for axis in ("overall", "capability", "eps")},
        "judged": count_of(row.get("judged"), row.get("prompts")),
        "decided": count_of(row.get("decided"), row.get("prompts")),
        "coverage": share(row.get("coverage")),
        "eps_scored": count_of(row.get("eps_prompts_scored"), row.get("eps_prompts_eligible")),
        "quarantined": str(row.get("images_quarantined", ABSENT)),
        "missing": str(row.get("images_missing", ABSENT)),
        "flags": " ".join(flags),
        "reference": str(row.get("reference_version") or ABSENT),
        "scored_at": scored_at.strftime("%Y-%m-%d %H:%M") if hasattr(scored_at, "strftime") else ABSENT,
    }


def leaderboard_layouts(rows: list[dict], wide: bool) -> list[tuple[list[str], list[list[str]], str | None]]:
    """The terminal tables to try, richest first: (columns, cells, legend line or None). Narrow:
    the headline columns with the flags spelled out, then with the flags as letters and a legend
    (the demo's eight models fit 100 columns so); ``wide``: every column."""
    if wide:
        return [(list(LEADERBOARD_WIDE), [[leaderboard_cells(r)[c] for c in LEADERBOARD_WIDE] for r in rows], None)]
    cols = list(LEADERBOARD_NARROW)
    spelled = [[leaderboard_cells(r)[c] for c in cols] for r in rows]
    used = {f for r in rows for f in leaderboard_flags(r)}
    legend = "flags: " + ", ".join(f"{letter} {name} ({why})" for name, letter, why in FLAGS if name in used) if used else None
    lettered = [[leaderboard_cells(r, letters=True)[c] for c in cols] for r in rows]
    return [(cols, spelled, None), (cols, lettered, legend)]
