"""Leaderboard statistics: Capability, paired bootstrap intervals, rank bands, compare.

Pure functions over sequences and numpy arrays, float64 everywhere, no I/O. The protocol
(docs/STATISTICS.md has the formulas, the reasons and worked examples):

- A verdict per (model, prompt) is ``"PASS"``, ``"FAIL"``, ``"ERROR"``, ``"UNPARSABLE"`` or not
  judged (``None``; a float NaN, as pandas writes a null, is read the same). A missing or
  quarantined image is a FAIL (:func:`effective_verdict`). ERROR, UNPARSABLE and not judged are
  *undecided*: counted in neither the numerator nor the denominator::

      Capability = 100 * PASS / (PASS + FAIL)       coverage = (PASS + FAIL) / prompts
      provisional = coverage < 1                    Capability = NaN when nothing is decided

- ``EPS = 100 * mean over eligible prompts of e`` where ``e = sigmoid(mu - mu_ref)`` and a lost
  image contributes 0 (:func:`eps_contributions`, the same numbers as :func:`tasks.scores.eps.eps`).
  With no eligible prompt scored, every contribution is NaN and EPS is NaN (absent, never 0),
  as Capability is with no judged verdict.
- ``Overall = 0.5 * Capability + 0.5 * EPS``.

Intervals come from ONE bootstrap over the suite's prompts (:func:`bootstrap_draws`): each resample
draws ``P`` prompt indices with replacement out of all ``P`` prompts, the same indices for every
model and for every axis. In a resample, Capability is passes / decided among the drawn prompts,
EPS the mean of ``e`` over the drawn prompts that are EPS-eligible, Overall their average
(``scipy.stats.bootstrap``, ``paired=True``). The index draws depend only on ``P``, the number of
resamples and the seed, never on the other models, so a model's intervals depend only on its own
data (bit for bit: every reduction runs one model at a time).

The intervals stay valid at 0% and 100% (tasks/scores/intervals.py): Capability is the Wilson
score interval of PASS / decided; EPS and Overall are Wilson intervals with the effective sample
size of their bootstrap variance, Overall's Capability half never less variable than its Wilson
interval says; ``compare`` combines the two models' intervals with the correlation of their paired
draws (MOVER). A percentile interval would claim certainty from 15 PASS of 15 ([100, 100]).

NaN rules: a score is NaN when its denominator is 0 (no decided verdict; no eligible prompt scored:
a model's EPS row all NaN). A
resample in which a model's Capability is undefined (no decided prompt drawn) is left out of that
model's Capability and Overall intervals, of its rank and of its comparisons; when every resample
is undefined the interval is ``(nan, nan)``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.stats

from schemas.judges import VERDICTS
from schemas.lake import IMAGE_STATES
from tasks.scores.eps import sigmoid
from tasks.scores.intervals import bounded_mean_interval, mover_difference, nan_correlation, wilson, wilson_variance

__all__ = [
    "AXES",
    "BootstrapDraws",
    "CapabilityResult",
    "Comparison",
    "Intervals",
    "Scores",
    "bootstrap_draws",
    "bootstrap_scores",
    "capability",
    "capability_breakdown",
    "compare",
    "effective_verdict",
    "effective_verdicts",
    "eps_contributions",
    "judge_decided",
    "pass_values",
    "rank_bands",
]

AXES = ("capability", "eps", "overall")
DECIDED = ("PASS", "FAIL")
UNDECIDED = ("ERROR", "UNPARSABLE")  # and None: not judged
DEFAULT_N_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95
DEFAULT_SEED = 0
# Resamples per vectorised call of the statistic: bounds memory to about
# 8 bytes * 2 arrays * models * _BATCH * prompts. The index draws do not depend on it.
_BATCH = 100


# --------------------------------------------------------------------------------------------
# Verdicts and Capability
# --------------------------------------------------------------------------------------------
def _not_judged(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _check_verdicts(verdicts: Sequence[Any], what: str = "verdicts") -> list[str | None]:
    if isinstance(verdicts, (str, bytes)):
        raise ValueError(f"{what} must be a sequence of verdicts, not a single string")
    out: list[str | None] = []
    unknown: set[str] = set()
    for v in verdicts:
        if _not_judged(v):
            out.append(None)
        elif isinstance(v, str) and v in VERDICTS:
            out.append(v)
        else:
            unknown.add(repr(v))
            out.append(None)
    if unknown:
        raise ValueError(
            f"unknown verdict value(s) in {what}: {sorted(unknown)[:10]} "
            f"(allowed: {', '.join(VERDICTS)}, or None for not judged)"
        )
    return out


def effective_verdict(image_state: str, verdict: str | None) -> str | None:
    """The verdict Capability counts for one (model, prompt).

    ``image_state`` is the ``images.status`` of the prompt's image (``ok``, ``quarantined``,
    ``missing``). A missing or quarantined image is a ``"FAIL"`` whatever ``verdict`` says (there
    is nothing the model answered with); an ``ok`` image keeps its verdict (``None``: not judged
    yet). Raises ``ValueError`` on an unknown state or verdict."""
    if image_state not in IMAGE_STATES:
        raise ValueError(f"unknown image state {image_state!r} (known: {', '.join(IMAGE_STATES)})")
    (v,) = _check_verdicts([verdict], "verdict")
    return v if image_state == "ok" else "FAIL"


def effective_verdicts(image_states: Sequence[str], verdicts: Sequence[str | None]) -> list[str | None]:
    """:func:`effective_verdict` element-wise; both sequences in the same prompt order."""
    states = list(image_states)
    vs = list(verdicts)
    if len(states) != len(vs):
        raise ValueError(f"{len(states)} image states but {len(vs)} verdicts")
    bad = sorted({repr(s) for s in states if s not in IMAGE_STATES})
    if bad:
        raise ValueError(f"unknown image state(s) {bad[:10]} (known: {', '.join(IMAGE_STATES)})")
    checked = _check_verdicts(vs)
    return [v if s == "ok" else "FAIL" for s, v in zip(states, checked)]


def judge_decided(image_states: Sequence[str], verdicts: Sequence[str | None]) -> list[bool]:
    """True where a judge decided the prompt: an ``ok`` image with a PASS or FAIL verdict (the
    ``judged`` argument of :func:`capability`). A missing or quarantined image's FAIL is not."""
    states = list(image_states)
    checked = _check_verdicts(verdicts)
    if len(states) != len(checked):
        raise ValueError(f"{len(states)} image states but {len(checked)} verdicts")
    return [s == "ok" and v in ("PASS", "FAIL") for s, v in zip(states, checked)]


@dataclass(frozen=True)
class CapabilityResult:
    capability: float  # 100 * passed / (passed + failed); NaN when no judge decided anything
    passed: int
    failed: int
    undecided: int  # ERROR, UNPARSABLE or not judged
    total: int  # prompts (passed + failed + undecided)
    coverage: float  # (passed + failed) / total
    provisional: bool  # coverage < 1
    judged: int  # decided by a judge (the rest of the decided are missing/quarantined images)

    @property
    def decided(self) -> int:
        return self.passed + self.failed

    @property
    def counts(self) -> str:
        """``decided/total``: what every Capability figure is shown with."""
        return f"{self.decided}/{self.total}"


def _capability_of(checked: Sequence[str | None], judged: Sequence[bool]) -> CapabilityResult:
    total = len(checked)
    passed = sum(1 for v in checked if v == "PASS")
    failed = sum(1 for v in checked if v == "FAIL")
    decided = passed + failed
    n_judged = sum(1 for j, v in zip(judged, checked) if j and v in ("PASS", "FAIL"))
    return CapabilityResult(
        # Missing-image FAILs alone are not a judged figure: no judge looked at anything.
        capability=100.0 * passed / decided if n_judged else math.nan,
        passed=passed,
        failed=failed,
        undecided=total - decided,
        total=total,
        coverage=decided / total,
        provisional=decided < total,
        judged=n_judged,
    )


def _judged_mask(judged: Sequence[bool] | None, n: int) -> list[bool]:
    if judged is None:  # plain verdicts: every decided one came from a judge
        return [True] * n
    mask = [bool(j) for j in judged]
    if len(mask) != n:
        raise ValueError(f"{n} verdicts but {len(mask)} judged flags")
    return mask


def capability(verdicts: Sequence[str | None], judged: Sequence[bool] | None = None) -> CapabilityResult:
    """Capability of one model over its verdicts, one per prompt of the suite (a missing or
    quarantined image must already be ``"FAIL"``: :func:`effective_verdicts`). ``judged``
    (:func:`judge_decided`) says which verdicts a judge gave; without it, all of them. With no
    verdict from a judge, Capability is NaN (not judged), whatever the image FAILs say.

    Raises ``ValueError`` when ``verdicts`` is empty or holds an unknown value (naming it)."""
    checked = _check_verdicts(verdicts)
    if not checked:
        raise ValueError("no verdicts: Capability is undefined over zero prompts")
    return _capability_of(checked, _judged_mask(judged, len(checked)))


def capability_breakdown(
    verdicts: Sequence[str | None], groups: Sequence[Hashable], judged: Sequence[bool] | None = None
) -> dict[Hashable, CapabilityResult]:
    """Capability per group (category, tag or difficulty): ``groups[i]`` is the group of the
    prompt of ``verdicts[i]``. Keys in order of first appearance; each group's coverage,
    provisional flag and judged count are its own (``judged`` as in :func:`capability`). Raises
    ``ValueError`` on a length mismatch, an unknown verdict, or a ``None`` group."""
    checked = _check_verdicts(verdicts)
    gs = list(groups)
    if len(gs) != len(checked):
        raise ValueError(f"{len(checked)} verdicts but {len(gs)} group labels")
    if not checked:
        raise ValueError("no verdicts: Capability is undefined over zero prompts")
    if any(g is None for g in gs):
        raise ValueError("group label None: every prompt needs a group")
    mask = _judged_mask(judged, len(checked))
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(gs):
        members.setdefault(g, []).append(i)
    return {g: _capability_of([checked[i] for i in idx], [mask[i] for i in idx]) for g, idx in members.items()}


def pass_values(verdicts: Sequence[str | None]) -> np.ndarray:
    """Verdicts as float64: PASS -> 1.0, FAIL -> 0.0, undecided -> NaN (the bootstrap's input)."""
    checked = _check_verdicts(verdicts)
    return np.array(
        [1.0 if v == "PASS" else 0.0 if v == "FAIL" else math.nan for v in checked], dtype=np.float64
    )


def eps_contributions(
    mu_by_prompt: Mapping[str, float | None],
    mu_ref: Mapping[str, float],
    prompt_ids: Sequence[str],
    eligible_ids: Sequence[str] | set[str],
) -> np.ndarray:
    """Per-prompt EPS contributions of one model, float64, in ``prompt_ids`` order:
    ``sigmoid(mu - mu_ref)`` for an eligible prompt with a mu, ``0.0`` for an eligible prompt
    without one (lost image), NaN for a non-eligible prompt. When no eligible prompt has a mu, every
    entry is NaN: the model has no EPS (absent, not 0; the bootstrap reads such a row so).
    ``100 * nanmean`` of the result is :func:`tasks.scores.eps.eps` of the same inputs (up to the
    last bits: scoring uses ``fsum``; NaN for NaN).

    Raises ``ValueError`` on duplicate prompt ids, eligible ids outside ``prompt_ids``, no
    eligible prompt, or a missing / non-finite reference or a non-finite mu of an eligible
    prompt."""
    ids = list(prompt_ids)
    if len(set(ids)) != len(ids):
        raise ValueError("prompt_ids has duplicates")
    eligible = set(eligible_ids)
    if not eligible:
        raise ValueError("no EPS-eligible prompts: EPS is undefined")
    outside = sorted(eligible - set(ids))
    if outside:
        raise ValueError(f"eligible ids not in prompt_ids: {outside[:5]}")
    out = np.full(len(ids), math.nan, dtype=np.float64)
    no_ref: list[str] = []
    for i, p in enumerate(ids):
        if p not in eligible:
            continue
        if p not in mu_ref or not math.isfinite(float(mu_ref[p])):
            no_ref.append(p)
            continue
        mu = mu_by_prompt.get(p)
        if mu is None:
            out[i] = 0.0
            continue
        mu = float(mu)
        if not math.isfinite(mu):
            raise ValueError(f"non-finite mu {mu!r} for eligible prompt {p!r}")
        out[i] = float(sigmoid(mu - float(mu_ref[p])))
    if no_ref:
        raise ValueError(f"missing or non-finite mu_ref for eligible prompt(s) {no_ref[:5]}")
    if not any(mu_by_prompt.get(p) is not None for p in eligible):
        out[:] = math.nan  # nothing scored: lost images alone are no figure
    return out


# --------------------------------------------------------------------------------------------
# Bootstrap
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scores:
    capability: float
    eps: float
    overall: float


@dataclass(frozen=True)
class Intervals:
    capability: tuple[float, float]
    eps: tuple[float, float]
    overall: tuple[float, float]
    estimate: Scores  # the point estimates on the whole suite (not bootstrap means)
    confidence: float

    def __getitem__(self, axis: str) -> tuple[float, float]:
        if axis not in AXES:
            raise KeyError(axis)
        return getattr(self, axis)


@dataclass(frozen=True)
class BootstrapDraws:
    """The joint bootstrap of :func:`bootstrap_draws`. Row ``k`` of the first axis is
    ``AXES[k]``; column ``m`` is ``models[m]``."""

    models: tuple[str, ...]
    estimate: np.ndarray  # (3, M) point estimates
    draws: np.ndarray  # (3, M, n_resamples) resampled scores, NaN where undefined
    ci: np.ndarray  # (3, M, 2) intervals (lo, hi): Wilson / effective-size Wilson (_intervals)
    confidence: float
    seed: int

    def intervals(self) -> dict[str, Intervals]:
        out: dict[str, Intervals] = {}
        for m, name in enumerate(self.models):
            ci = {a: (float(self.ci[k, m, 0]), float(self.ci[k, m, 1])) for k, a in enumerate(AXES)}
            est = Scores(*(float(self.estimate[k, m]) for k in range(3)))
            out[name] = Intervals(**ci, estimate=est, confidence=self.confidence)
        return out


def _check_options(n_resamples: int, confidence: float, seed: int) -> None:
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    if not (isinstance(confidence, (int, float)) and 0.0 < float(confidence) < 1.0):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


def _as_pass_array(values: Any, what: str) -> np.ndarray:
    """Verdict strings (object/str arrays, lists) or numbers in {1, 0, NaN} -> float64 array."""
    arr = np.asarray(values)
    if arr.dtype.kind in "US" or (arr.dtype.kind == "O" and any(isinstance(v, str) for v in arr.ravel())):
        flat = pass_values(_check_verdicts(arr.ravel().tolist(), what))
        return flat.reshape(arr.shape)
    try:
        arr = np.asarray(values, dtype=np.float64)  # None -> NaN (undecided)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must hold verdicts or 1.0/0.0/NaN: {exc}") from None
    bad = ~(np.isnan(arr) | (arr == 0.0) | (arr == 1.0))
    if bad.any():
        shown = sorted({repr(float(x)) for x in arr[bad].ravel()[:50]})[:10]
        raise ValueError(f"{what} must hold 1.0 (PASS), 0.0 (FAIL) or NaN (undecided); got {shown}")
    return arr


def _as_eps_array(values: Any, eligible: np.ndarray, what: str) -> np.ndarray:
    """EPS contributions -> float64 array with NaN on non-eligible prompts (ignored there). A row
    (model) NaN on every eligible prompt has no EPS (nothing scored: :func:`eps_contributions`)."""
    try:
        arr = np.array(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be numeric: {exc}") from None
    if arr.shape[-1:] != eligible.shape:
        raise ValueError(f"{what} has {arr.shape[-1:]} prompts, eligible mask has {eligible.shape}")
    arr[..., ~eligible] = math.nan
    vals = arr[..., eligible]
    unscored = np.isnan(vals).all(axis=-1, keepdims=True)  # a model with no eligible prompt scored
    bad = (~np.isfinite(vals) | (vals < 0.0) | (vals > 1.0)) & ~unscored
    if bad.any():
        raise ValueError(
            f"{what}: {int(bad.sum())} eligible entr(y/ies) not a finite number in [0, 1] "
            "(a lost image contributes 0.0, not NaN; NaN on every eligible prompt: nothing scored)"
        )
    return arr


def _as_eligible(eligible: Any, n_prompts: int) -> np.ndarray:
    if eligible is None:
        return np.ones(n_prompts, dtype=bool)
    arr = np.asarray(eligible)
    if arr.dtype != bool:
        raise ValueError(f"eligible must be a boolean mask, got dtype {arr.dtype}")
    if arr.shape != (n_prompts,):
        raise ValueError(f"eligible mask has shape {arr.shape}, expected ({n_prompts},)")
    if not arr.any():
        raise ValueError("no EPS-eligible prompts: EPS is undefined")
    return arr


def _scores(pv: np.ndarray, ev: np.ndarray) -> np.ndarray:
    """(Capability, EPS, Overall) of each row of one model's (..., P) arrays, stacked on a new
    first axis. NaN where a denominator is 0. Sums over the last axis of a C-contiguous array,
    so the result of a row does not depend on how many rows (or models) are computed at once."""
    decided = ~np.isnan(pv)
    n_dec = decided.sum(axis=-1)
    n_pass = np.where(decided, pv, 0.0).sum(axis=-1)
    elig = ~np.isnan(ev)
    n_el = elig.sum(axis=-1)
    s_e = np.where(elig, ev, 0.0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cap = 100.0 * n_pass / n_dec
        eps_ = 100.0 * s_e / n_el
    return np.stack([cap, eps_, 0.5 * cap + 0.5 * eps_])


def _point(pv: np.ndarray, ev: np.ndarray) -> np.ndarray:
    """Point estimates (3,) of one model; EPS with ``fsum``, exactly as tasks.scores.eps.eps."""
    decided = ~np.isnan(pv)
    n_dec = int(decided.sum())
    cap = 100.0 * float(pv[decided].sum()) / n_dec if n_dec else math.nan
    elig = ~np.isnan(ev)
    n_el = int(elig.sum())
    eps_ = 100.0 * math.fsum(ev[elig].tolist()) / n_el if n_el else math.nan
    return np.array([cap, eps_, 0.5 * cap + 0.5 * eps_], dtype=np.float64)


def _nan_variance(values: np.ndarray) -> np.ndarray:
    """Variance over the last axis of the defined entries (NaN where fewer than two)."""
    ok = ~np.isnan(values)
    n = ok.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(ok, values, 0.0).sum(axis=-1) / n
        dev = np.where(ok, values - mean[..., None], 0.0)
        return np.where(n >= 2, (dev * dev).sum(axis=-1) / (n - 1), np.nan)


def _intervals(pv: np.ndarray, elig: np.ndarray, estimate: np.ndarray, draws: np.ndarray, confidence: float) -> np.ndarray:
    """(3, M, 2) intervals, in points, that stay valid at 0 and 100 (docs/STATISTICS.md section 4).

    Capability: Wilson of PASS / decided. EPS: Wilson with the effective size of its bootstrap
    variance, over the eligible prompts (their number where the draws show no spread). Overall:
    the same over all prompts, its bootstrap variance raised by the Capability half's shortfall
    against its Wilson variance (a model with every decided prompt PASS has a Capability that
    never moves in a resample). A bootstrap variance of a mean over n prompts is the plug-in
    s^2 (n-1)/n / n: scaled by n/(n-1), with n-1 degrees of freedom."""
    decided = ~np.isnan(pv)
    cap = np.stack(wilson(np.where(decided, pv, 0.0).sum(axis=-1), decided.sum(axis=-1), confidence), axis=-1)
    var = _nan_variance(draws / 100.0)  # (3, M)
    est = np.clip(estimate / 100.0, 0.0, 1.0)  # the last bits of an fsum may leave [0, 1]
    n_eps, n_all = int(elig.sum()), pv.shape[-1]
    eps = np.stack(bounded_mean_interval(est[1], var[1] * n_eps / max(1, n_eps - 1), n_eps, confidence,
                                    df=max(1, n_eps - 1)), axis=-1)
    shortfall = np.maximum(0.0, wilson_variance(cap[:, 0], cap[:, 1], confidence) - np.nan_to_num(var[0]))
    overall_var = np.nan_to_num(var[2]) * n_all / (n_all - 1) + 0.25 * shortfall
    overall = np.stack(bounded_mean_interval(est[2], np.where(np.isnan(est[2]), np.nan, overall_var), n_all,
                                        confidence, df=n_all - 1), axis=-1)
    return 100.0 * np.stack([cap, eps, overall])


def _paired_bootstrap(data: tuple[np.ndarray, ...], statistic: Any, n_resamples: int, seed: int) -> np.ndarray:
    """scipy.stats.bootstrap over the prompt axis (last), paired: the bootstrap distribution
    (its own percentile interval is not used: :func:`_intervals`)."""
    with warnings.catch_warnings():
        # scipy warns when its percentile interval is NaN (a model whose score is undefined in
        # some resamples); that interval is not used.
        warnings.simplefilter("ignore", scipy.stats.DegenerateDataWarning)
        res = scipy.stats.bootstrap(
            data,
            statistic,
            n_resamples=n_resamples,
            batch=_BATCH,
            vectorized=True,
            paired=True,
            axis=-1,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    return np.asarray(res.bootstrap_distribution, dtype=np.float64)


def bootstrap_draws(
    models: Sequence[str],
    pass_matrix: Any,
    eps_matrix: Any,
    eligible: Any = None,
    *,
    n_resamples: int = DEFAULT_N_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_SEED,
) -> BootstrapDraws:
    """The joint paired bootstrap of every model and every axis over the suite's prompts.

    ``pass_matrix``: (models, P) verdict strings/None (see :func:`pass_values`) or floats in
    {1.0, 0.0, NaN}, missing/quarantined images already FAIL. ``eps_matrix``: (models, P) EPS
    contributions in [0, 1] (0.0 for a lost image; entries of non-eligible prompts are ignored,
    NaN by convention; a row NaN on every eligible prompt: no EPS, nor Overall:
    :func:`eps_contributions`). ``eligible``: (P,) boolean EPS-eligibility mask
    (None: every prompt is eligible). Both matrices use the same prompt order (columns).

    Each of the ``n_resamples`` resamples draws P prompt indices with replacement (numpy
    ``default_rng(seed)`` through ``scipy.stats.bootstrap(paired=True)``); every model and axis
    is evaluated on the same draw. Deterministic given the seed, and a model's draws do not
    depend on the other models. Raises ``ValueError`` on bad shapes, values or options."""
    _check_options(n_resamples, confidence, seed)
    names = list(models)
    if not names:
        raise ValueError("no models given")
    if any(not isinstance(m, str) for m in names):
        raise ValueError("model ids must be strings")
    dup = sorted({m for m in names if names.count(m) > 1})
    if dup:
        raise ValueError(f"models listed more than once: {dup}")
    pv = _as_pass_array(pass_matrix, "pass_matrix")
    if pv.ndim != 2 or pv.shape[0] != len(names):
        raise ValueError(f"pass_matrix has shape {pv.shape}, expected ({len(names)}, prompts)")
    n_prompts = pv.shape[1]
    if n_prompts < 2:
        raise ValueError(f"the bootstrap needs at least 2 prompts, got {n_prompts}")
    elig = _as_eligible(eligible, n_prompts)
    ev = _as_eps_array(eps_matrix, elig, "eps_matrix")
    if ev.shape != pv.shape:
        raise ValueError(f"eps_matrix has shape {ev.shape}, pass_matrix {pv.shape}: they must match")

    def statistic(p: np.ndarray, e: np.ndarray, axis: int = -1) -> np.ndarray:
        # p, e: (M, batch, P) -> (3, M, batch). All models in one call: the sums of e run over the
        # last axis of a C-contiguous array, row by row, so each (model, resample) row gets the
        # same bits as alone (module docstring), without a Python loop over the models. p holds
        # only 0.0 / 1.0 / NaN: its sums are small integers, exact in any order, so it is not copied.
        assert axis == -1
        return _scores(p, np.ascontiguousarray(e))

    dist = _paired_bootstrap((pv, ev), statistic, n_resamples, int(seed))
    estimate = np.stack([_point(pv[m], ev[m]) for m in range(len(names))], axis=1)
    return BootstrapDraws(
        models=tuple(names),
        estimate=estimate,
        draws=dist,
        ci=_intervals(pv, elig, estimate, dist, float(confidence)),
        confidence=float(confidence),
        seed=int(seed),
    )


def bootstrap_scores(
    models: Sequence[str],
    pass_matrix: Any,
    eps_matrix: Any,
    eligible: Any = None,
    *,
    n_resamples: int = DEFAULT_N_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_SEED,
) -> dict[str, Intervals]:
    """Intervals of Capability, EPS and Overall per model, from the joint paired bootstrap
    (:func:`bootstrap_draws`, same arguments). ``{model: Intervals}`` in input order."""
    return bootstrap_draws(
        models, pass_matrix, eps_matrix, eligible, n_resamples=n_resamples, confidence=confidence, seed=seed
    ).intervals()


# --------------------------------------------------------------------------------------------
# Rank bands
# --------------------------------------------------------------------------------------------
def rank_bands(intervals: Mapping[str, tuple[float, float]]) -> dict[str, tuple[int, int, int]]:
    """Arena-style rank bands from one interval per model: ``{model: (rank, best_rank,
    worst_rank)}``.

    ``rank = best_rank = 1 + #{j : lo_j > hi_i}``: one plus the number of models that are better
    beyond doubt (their whole interval is strictly above this one's). ``worst_rank = #{j : hi_j >=
    lo_i}`` (this model included): the models not beyond doubt worse. Intervals that touch are
    not separated; equal intervals get equal bands. ``1 <= rank <= worst_rank <= M``. Raises
    ``ValueError`` on NaN bounds (a model without an interval cannot be ranked: leave it out) or
    ``lo > hi``."""
    names = list(intervals)
    if not names:
        return {}
    b = np.array([tuple(intervals[m]) for m in names], dtype=np.float64)
    if b.ndim != 2 or b.shape[1] != 2:
        raise ValueError("each interval must be a (lo, hi) pair")
    nan = [m for m, row in zip(names, b) if np.isnan(row).any()]
    if nan:
        raise ValueError(f"NaN interval for model(s) {nan[:10]}: leave unranked models out")
    inverted = [m for m, (lo, hi) in zip(names, b) if lo > hi]
    if inverted:
        raise ValueError(f"lower bound above upper bound for model(s) {inverted[:10]}")
    lo, hi = b[:, 0], b[:, 1]
    better = (lo[None, :] > hi[:, None]).sum(axis=1)  # [i] = #{j: lo_j > hi_i}
    not_worse = (hi[None, :] >= lo[:, None]).sum(axis=1)  # [i] = #{j: hi_j >= lo_i}
    return {m: (int(1 + better[i]), int(1 + better[i]), int(not_worse[i])) for i, m in enumerate(names)}


# --------------------------------------------------------------------------------------------
# compare A B
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    axis: str
    diff: float  # score(A) - score(B) on the whole suite
    ci: tuple[float, float]  # MOVER interval of the difference (the two intervals, the draws' correlation)
    p_a_beats_b: float  # share of resamples with A > B, ties counting half
    n_resamples: int  # resamples in which both scores are defined (those counted above)


def _split_axis_values(values: Any, axis: str, what: str) -> tuple[Any, Any]:
    if axis == "capability":
        return values, None
    if axis == "eps":
        return None, values
    if not (isinstance(values, (tuple, list)) and len(values) == 2):
        raise ValueError(f"axis 'overall': {what} must be a pair (pass values, eps contributions)")
    return values[0], values[1]


def compare(
    a_values: Any,
    b_values: Any,
    *,
    axis: str = "capability",
    eligible: Any = None,
    n_resamples: int = DEFAULT_N_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_SEED,
) -> Comparison:
    """Paired comparison of models A and B on one axis, over the same prompts in the same order.

    ``axis="capability"``: ``a_values``/``b_values`` are per-prompt verdicts (or 1/0/NaN).
    ``axis="eps"``: per-prompt EPS contributions (``eligible`` masks the eligible prompts; None:
    all). ``axis="overall"``: each is a pair ``(pass values, eps contributions)`` over all P
    prompts, with ``eligible`` the (P,) mask.

    Both models are bootstrapped with ``scipy.stats.bootstrap(paired=True)``: each resample draws
    the same prompts for A and B. With the same P, seed and number of resamples the draws are those
    of :func:`bootstrap_draws`, so each model's interval is its leaderboard interval. The
    difference's interval combines those two intervals with the correlation of the paired draws
    (MOVER, docs/STATISTICS.md section 7): valid at 0 and 100, and above 0 whenever the two
    intervals are separated. ``p_a_beats_b`` is read off the paired draws; resamples where either
    score is undefined are left out. Raises ``ValueError`` on an unknown axis or bad inputs."""
    if axis not in AXES:
        raise ValueError(f"unknown axis {axis!r} (known: {', '.join(AXES)})")
    _check_options(n_resamples, confidence, seed)
    k = AXES.index(axis)
    parts: list[tuple[np.ndarray | None, Any]] = []
    lengths: set[int] = set()
    for values, what in ((a_values, "a_values"), (b_values, "b_values")):
        p_raw, e_raw = _split_axis_values(values, axis, what)
        pv = None if p_raw is None else _as_pass_array(p_raw, what)
        for arr in (pv, None if e_raw is None else np.asarray(e_raw, dtype=object)):
            if arr is None:
                continue
            if arr.ndim != 1:
                raise ValueError(
                    f"{what} must be one-dimensional (one value per prompt), got shape {arr.shape}"
                )
            lengths.add(arr.shape[0])
        parts.append((pv, e_raw))
    if len(lengths) != 1:
        raise ValueError(f"a_values and b_values must cover the same prompts; lengths {sorted(lengths)}")
    (n_prompts,) = lengths
    if n_prompts < 2:
        raise ValueError(f"the bootstrap needs at least 2 prompts, got {n_prompts}")
    elig = _as_eligible(eligible, n_prompts)
    nan_row = np.full(n_prompts, math.nan, dtype=np.float64)
    data: list[np.ndarray] = []
    for (pv, e_raw), what in zip(parts, ("a_values", "b_values")):
        data.append(nan_row if pv is None else pv)
        data.append(nan_row if e_raw is None else _as_eps_array(e_raw, elig, what))

    def statistic(
        pa: np.ndarray, ea: np.ndarray, pb: np.ndarray, eb: np.ndarray, axis: int = -1
    ) -> np.ndarray:
        assert axis == -1
        return np.stack([_scores(pa, ea), _scores(pb, eb)], axis=1)  # (3, 2, batch)

    point = np.stack([_point(data[0], data[1]), _point(data[2], data[3])], axis=1)  # (3, 2)
    est_a, est_b = float(point[k, 0]), float(point[k, 1])
    if math.isnan(est_a) or math.isnan(est_b):
        what = "no eligible prompt scored" if axis == "eps" else "nothing decided"
        raise ValueError(f"{axis} is undefined for {'A' if math.isnan(est_a) else 'B'} ({what})")
    dist = _paired_bootstrap(tuple(data), statistic, n_resamples, int(seed))  # (3, 2, n_resamples)
    diff = dist[k, 0] - dist[k, 1]
    ok = diff[~np.isnan(diff)]
    if ok.size == 0:
        raise ValueError(f"{axis} difference undefined in every resample")
    p = (np.count_nonzero(ok > 0.0) + 0.5 * np.count_nonzero(ok == 0.0)) / ok.size
    ci = _intervals(np.stack([data[0], data[2]]), elig, point, dist, float(confidence))[k]  # (2, 2): A, B
    lo, hi = mover_difference(est_a, tuple(ci[0]), est_b, tuple(ci[1]), nan_correlation(dist[k, 0], dist[k, 1]), 100.0)
    return Comparison(
        axis=axis,
        diff=float(est_a - est_b),
        ci=(float(lo), float(hi)),
        p_a_beats_b=float(p),
        n_resamples=int(ok.size),
    )
