"""Confidence intervals that stay valid at 0% and 100% (docs/STATISTICS.md, section 4).

Pure numpy, vectorised, proportions on the 0-1 scale. A percentile bootstrap cannot leave the
values it has seen: 15 PASS of 15 gives every resample 100%, and the interval [100, 100] claims
certainty from 15 prompts. These intervals do not:

- :func:`wilson`: the Wilson score interval of a binomial proportion (Capability: PASS of
  decided). It holds the estimate, stays in [0, 1], and at 15 of 15 gives [79.6, 100].
- :func:`bounded_mean_interval`: a figure that is a mean of per-unit values in [0, 1] with a
  variance from a (paired or clustered) bootstrap (EPS, Overall, the Beauty Index): a t interval
  on the logit scale, inside (0, 1) and stretched away from the near bound as the skew of a mean
  near a bound needs. Where the bootstrap saw no spread (every value at a bound, or all equal)
  there is no variance to use: the Wilson interval of the units as if each were a yes/no, the
  widest a bounded mean can honestly claim.
- :func:`wilson_variance`: an interval turned back into a variance, ``((hi - lo) / 2z)^2``: how
  Overall's Capability half keeps its uncertainty in a resample that never saw a FAIL.
- :func:`mover_difference`: the interval of a difference of two such figures from their two
  intervals and the correlation of their paired bootstrap draws (Zou & Donner 2008, "MOVER";
  for two paired proportions, Newcombe 1998's method 10).
"""

from __future__ import annotations

import numpy as np
import scipy.special
import scipy.stats

__all__ = ["bounded_mean_interval", "mover_difference", "nan_correlation", "wilson", "wilson_variance", "z_value"]


def z_value(confidence: float) -> float:
    """The two-sided normal quantile of ``confidence`` (1.96 at 0.95)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(scipy.stats.norm.ppf(0.5 + confidence / 2.0))


def _wilson(p: np.ndarray, n: np.ndarray, z: float) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(invalid="ignore", divide="ignore"):
        z2n = z * z / n
        center = (p + z2n / 2.0) / (1.0 + z2n)
        half = z / (1.0 + z2n) * np.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n))
    # At p = 0 the lower bound is 0 in reals (and 1 above at p = 1): exactly, not 2e-16 away.
    lo = np.where(p == 0.0, 0.0, np.clip(center - half, 0.0, 1.0))
    return lo, np.where(p == 1.0, 1.0, np.clip(center + half, 0.0, 1.0))


def wilson(successes, n, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of ``successes / n`` (arrays broadcast; n = 0 gives NaN)."""
    k = np.asarray(successes, dtype=np.float64)
    m = np.asarray(n, dtype=np.float64)
    if np.any((k < 0) | (k > m)):
        raise ValueError("successes must lie in [0, n]")
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(m > 0, k / np.where(m > 0, m, 1.0), np.nan)
    return _wilson(p, np.where(m > 0, m, np.nan), z_value(confidence))


def bounded_mean_interval(
    estimate, variance, n_units, confidence: float = 0.95, df: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Interval of a mean of per-unit values in [0, 1] from its (bootstrap) variance (module
    docstring): a t interval on the logit scale, ``expit(logit(m) +- t_df sqrt(v) / (m (1 - m)))``,
    inside (0, 1) by construction and stretched away from the near bound as a skewed mean needs;
    at a bound, or where the draws show no spread, the Wilson interval of ``n_units`` yes/no units.

    ``estimate`` in [0, 1]; ``variance`` >= 0; ``df``: the variance's degrees of freedom (None:
    many, the normal quantile). NaN in ``estimate`` or ``variance`` gives a NaN interval."""
    est = np.asarray(estimate, dtype=np.float64)
    var = np.asarray(variance, dtype=np.float64)
    units = np.asarray(n_units, dtype=np.float64)
    if np.any(est < 0.0) or np.any(est > 1.0):
        raise ValueError("estimate must lie in [0, 1]")
    if np.any(var < 0.0) or np.any(units < 1.0):
        raise ValueError("variance must be >= 0 and n_units >= 1")
    if df is not None and df < 1:
        raise ValueError(f"df must be >= 1, got {df!r}")
    q = z_value(confidence) if df is None else float(scipy.stats.t.ppf(0.5 + confidence / 2.0, df))
    spread = est * (1.0 - est)
    inside = (spread > 0.0) & (var > 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        center = np.log(est / (1.0 - est))
        half = q * np.sqrt(var) / np.where(inside, spread, 1.0)
        lo, hi = scipy.special.expit(center - half), scipy.special.expit(center + half)
    w_lo, w_hi = _wilson(est, np.broadcast_to(units, est.shape), z_value(confidence))
    nan = np.isnan(est) | np.isnan(var)
    # expit(logit(m)) may miss m by a bit when the half-width is tiny: the interval holds m.
    lo, hi = np.minimum(np.where(inside, lo, w_lo), est), np.maximum(np.where(inside, hi, w_hi), est)
    return np.where(nan, np.nan, lo), np.where(nan, np.nan, hi)


def wilson_variance(lo, hi, confidence: float = 0.95) -> np.ndarray:
    """The variance an interval stands for, ``((hi - lo) / 2z)^2``."""
    return ((np.asarray(hi, dtype=np.float64) - np.asarray(lo, dtype=np.float64)) / (2.0 * z_value(confidence))) ** 2


def nan_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation over the entries where both are defined; 0 where either is constant
    (a draw without spread carries no information about how the two move together)."""
    ok = ~(np.isnan(a) | np.isnan(b))
    if ok.sum() < 2:
        return 0.0
    x, y = a[ok] - a[ok].mean(), b[ok] - b[ok].mean()
    sx, sy = float(np.sqrt(np.dot(x, x))), float(np.sqrt(np.dot(y, y)))
    if sx == 0.0 or sy == 0.0:
        return 0.0
    return float(np.clip(np.dot(x, y) / (sx * sy), -1.0, 1.0))


def mover_difference(
    est_a: float, ci_a: tuple[float, float], est_b: float, ci_b: tuple[float, float], r: float, bound: float
) -> tuple[float, float]:
    """MOVER interval of ``est_a - est_b`` from each figure's own interval and the correlation
    ``r`` of their paired draws; clipped to [-bound, bound] (the scale's width). A pair separated
    beyond doubt by its own intervals (lo_a > hi_b) always gets a difference interval above 0."""
    d = est_a - est_b
    below_a, above_a = est_a - ci_a[0], ci_a[1] - est_a
    below_b, above_b = est_b - ci_b[0], ci_b[1] - est_b
    lo = d - float(np.sqrt(max(0.0, below_a**2 + above_b**2 - 2.0 * r * below_a * above_b)))
    hi = d + float(np.sqrt(max(0.0, above_a**2 + below_b**2 - 2.0 * r * above_a * below_b)))
    return max(-bound, lo), min(bound, hi)
