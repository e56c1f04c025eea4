"""Evidence that accumulates: the Beauty Index of a tool pooled across the studies that ran it.

Pure functions, no I/O. Each study gives, per tool, its Beauty Index (0-100, the whole panel) and
the 95% interval of its two-way cluster bootstrap (judges x prompts). The pooled estimate is a
random-effects meta-analysis on that proportion scale (points): DerSimonian & Laird (1986), the
between-study variance tau^2 by the method of moments, each study weighted by 1 / (its variance
+ tau^2). Studies differ in panels, prompts' reception and labs, so a fixed-effect pool would
claim more precision than the field has; tau^2 says how much the studies disagree beyond their
own sampling noise (I^2: the share of the spread that is between studies).

A study's variance is its bootstrap interval's width turned into a standard error,
(hi - lo) / (2 * 1.96), and never below the binomial standard error of its answers (with half a
yes and half a no added, Agresti-Coull style): a small study whose bootstrap saw no spread (every
judge said the same) must not take all the weight.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054


@dataclass(frozen=True)
class RandomEffects:
    estimate: float
    se: float
    lo: float
    hi: float
    tau2: float  # between-study variance, in squared points
    q: float  # Cochran's Q
    i2: float  # 0-1
    k: int  # studies pooled


def _z(confidence: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + confidence / 2)


def dersimonian_laird(estimates: Sequence[float], variances: Sequence[float], confidence: float = 0.95) -> RandomEffects:
    """Random-effects pool of ``estimates`` with within-study ``variances`` (all > 0)."""
    y = [float(v) for v in estimates]
    v = [float(x) for x in variances]
    if not y or len(y) != len(v):
        raise ValueError(f"need one variance per estimate and at least one study, got {len(y)} and {len(v)}")
    if any(not math.isfinite(x) or x <= 0 for x in v) or any(not math.isfinite(x) for x in y):
        raise ValueError("every estimate must be finite and every variance finite and > 0")
    k = len(y)
    w = [1.0 / x for x in v]
    sw = sum(w)
    fixed = sum(wi * yi for wi, yi in zip(w, y)) / sw
    q = sum(wi * (yi - fixed) ** 2 for wi, yi in zip(w, y))
    c = sw - sum(wi * wi for wi in w) / sw
    tau2 = max(0.0, (q - (k - 1)) / c) if k > 1 and c > 0 else 0.0
    ws = [1.0 / (x + tau2) for x in v]
    est = sum(wi * yi for wi, yi in zip(ws, y)) / sum(ws)
    se = math.sqrt(1.0 / sum(ws))
    z = _z(confidence)
    i2 = max(0.0, (q - (k - 1)) / q) if q > 0 and k > 1 else 0.0
    return RandomEffects(est, se, est - z * se, est + z * se, tau2, q, i2, k)


def study_variance(beauty_index: float, lo: float | None, hi: float | None, answers: int) -> float:
    """A study's variance of a tool's Beauty Index (points^2): from its bootstrap interval, never
    below the binomial variance of its answers."""
    n = max(int(answers), 1)
    p = (beauty_index / 100.0 * n + 0.5) / (n + 1)
    floor = (100.0 * math.sqrt(p * (1 - p) / n)) ** 2
    if lo is None or hi is None:
        return floor
    return max(((hi - lo) / (2 * Z95)) ** 2, floor)


@dataclass(frozen=True)
class PooledTool:
    tool: str
    pooled: RandomEffects
    studies: tuple[dict, ...]  # each: study_id, beauty_index, beauty_index_lo, beauty_index_hi, answers, weight


def pool_tools(index_rows: Sequence[dict], min_studies: int = 2) -> list[PooledTool]:
    """One pooled estimate per tool that ``min_studies`` or more studies ran. ``index_rows``:
    ``study_index`` rows of panel group "all" (study_id, tool, beauty_index, beauty_index_lo,
    beauty_index_hi, answers) of several studies. Best pooled estimate first."""
    by_tool: dict[str, list[dict]] = defaultdict(list)
    for r in index_rows:
        if r.get("panel_group", "all") == "all" and r.get("beauty_index") is not None:
            by_tool[r["tool"]].append(r)
    out = []
    for tool, rows in sorted(by_tool.items()):
        rows = sorted(rows, key=lambda r: r["study_id"])
        if len({r["study_id"] for r in rows}) != len(rows):
            raise ValueError(f"tool {tool}: a study gives it twice")
        if len(rows) < min_studies:
            continue
        var = [study_variance(r["beauty_index"], r.get("beauty_index_lo"), r.get("beauty_index_hi"), r["answers"]) for r in rows]
        re = dersimonian_laird([r["beauty_index"] for r in rows], var)
        ws = [1.0 / (x + re.tau2) for x in var]
        studies = tuple({"study_id": r["study_id"], "beauty_index": r["beauty_index"], "beauty_index_lo": r.get("beauty_index_lo"),
                         "beauty_index_hi": r.get("beauty_index_hi"), "answers": r["answers"], "weight": w / sum(ws)}
                        for r, w in zip(rows, ws))
        out.append(PooledTool(tool, re, studies))
    return sorted(out, key=lambda p: (-p.pooled.estimate, p.tool))
