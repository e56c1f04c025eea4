"""Scores and pre-registered hypotheses of a Beauty Index study: pure functions, no I/O.

Input is always an answers table with the schema ``schemas.study.STUDY_ANSWERS`` (one row per
judge x image). docs/BEAUTY.md ("Analysis") has the methods and the reasons; in short:

- ``yes_rates``: per (tool, prompt), % of the judges who answered that image who said yes.
- ``beauty_index``: per tool, the mean over the study's prompts of those % yes (every prompt
  weighs the same whatever its number of answers), overall (panel_group "all") and per panel
  group, with intervals from the variance of a two-way cluster bootstrap: each resample draws the
  prompts with replacement AND, independently, the judges with replacement within their declared
  panel group (the panel's composition is part of the design), so both sources of sampling
  noise are in the interval (Owen 2007, "the pigeonhole bootstrap"); the interval is a logit-scale
  one that stays valid at 0% and 100% (tasks/scores/intervals.py: a tool every judge said yes to
  gets the Wilson interval of its answers, not [100, 100]).
- ``test_hypotheses``: H1-H5 of the published protocol, each with a test, an effect size, an
  interval, a p-value, its Holm-adjusted p-value across the five and a verdict.

Every random draw comes from ``numpy.random.default_rng(seed)``: the same answers and seed give
the same numbers, bit for bit.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from schemas.study import HYPOTHESES, STUDY_ANSWERS, STUDY_INDEX, STUDY_RATES, AnalysisSettings, PreRegistration
from tasks.scores.intervals import bounded_mean_interval

__all__ = [
    "APHANTASIA_GROUP",
    "ALL_GROUPS",
    "HypothesisResult",
    "Panel",
    "beauty_index",
    "bootstrap_weights",
    "holm",
    "hypotheses_rows",
    "panel_from_answers",
    "test_hypotheses",
    "variance_components",
    "yes_rates",
]

ALL_GROUPS = "all"
APHANTASIA_GROUP = "aphantasia"  # H2's group, as named in schemas.study.PUBLISHED_GROUPS
DEFAULT_CONFIDENCE = 0.95
# H3 refits a mixed model per resample (about 0.3 s each on one core): its bootstrap is capped
# separately from the cheap ones so `study analyze` stays around a minute.
DEFAULT_MIXED_RESAMPLES = 100
_BATCH = 250  # resamples per vectorised step: bounds memory, never changes a number

Verdict = Literal["supported", "not supported", "not tested"]


# --------------------------------------------------------------------------------------------
# The answers as arrays
@dataclass(frozen=True)
class Panel:
    """An answers table as arrays: ``yes[j, t, p]`` (1.0 = yes) and ``seen[j, t, p]`` (1.0 when
    judge j answered tool t's image for prompt p), with judges, tools and prompts sorted."""

    study_id: str
    judges: tuple[str, ...]
    judge_groups: tuple[str, ...]
    tools: tuple[str, ...]
    prompts: tuple[str, ...]
    yes: np.ndarray
    seen: np.ndarray
    simulated: bool

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.judge_groups)))


def panel_from_answers(answers: pa.Table) -> Panel:
    """Check an answers table and turn it into arrays. Errors name what is wrong in one line."""
    if not isinstance(answers, pa.Table):
        raise TypeError(f"answers must be a pyarrow.Table with schema STUDY_ANSWERS, got {type(answers).__name__}")
    missing = [n for n in ("study_id", "judge_id", "panel_group", "tool", "prompt_id", "answer") if n not in answers.column_names]
    if missing:
        raise ValueError(f"answers table lacks column(s) {missing} (schema STUDY_ANSWERS: {STUDY_ANSWERS.names})")
    if answers.num_rows == 0:
        raise ValueError("answers table is empty: no judge has answered yet")
    cols = {n: answers.column(n).to_pylist() for n in ("study_id", "judge_id", "panel_group", "tool", "prompt_id", "answer")}
    for name, values in cols.items():
        if any(v is None for v in values):
            raise ValueError(f"answers column {name!r} has a null in row {values.index(None)}")
    studies = sorted(set(cols["study_id"]))
    if len(studies) != 1:
        raise ValueError(f"answers table mixes studies {studies}: analyse one study at a time")
    group_of: dict[str, str] = {}
    for judge, group in zip(cols["judge_id"], cols["panel_group"]):
        if group_of.setdefault(judge, group) != group:
            raise ValueError(f"judge {judge} appears in panel groups {group_of[judge]!r} and {group!r}")
    judges = tuple(sorted(group_of))
    tools = tuple(sorted(set(cols["tool"])))
    prompts = tuple(sorted(set(cols["prompt_id"])))
    # One tool (or one answer) is still analysed: a real panel's first answer must not crash the
    # analysis; what needs more (a ranking, a variance between tools) says "not tested" and why.
    ji = {k: i for i, k in enumerate(judges)}
    ti = {k: i for i, k in enumerate(tools)}
    pi = {k: i for i, k in enumerate(prompts)}
    shape = (len(judges), len(tools), len(prompts))
    yes = np.zeros(shape)
    seen = np.zeros(shape)
    for row, (j, t, p, a) in enumerate(zip(cols["judge_id"], cols["tool"], cols["prompt_id"], cols["answer"])):
        k = (ji[j], ti[t], pi[p])
        if seen[k]:
            raise ValueError(f"answers row {row}: judge {j} answered ({t}, {p}) twice; one answer per judge and image")
        seen[k] = 1.0
        yes[k] = 1.0 if a else 0.0
    sources = set(answers.column("source").to_pylist()) if "source" in answers.column_names else set()
    return Panel(
        study_id=studies[0],
        judges=judges,
        judge_groups=tuple(group_of[j] for j in judges),
        tools=tools,
        prompts=prompts,
        yes=yes,
        seen=seen,
        simulated="simulated" in sources,
    )


# --------------------------------------------------------------------------------------------
# Yes-rates and the Beauty Index
def yes_rates(answers: pa.Table) -> pa.Table:
    """One row per (tool, prompt) that has answers: answers, yes, yes_rate = 100 * yes / answers
    (schema ``STUDY_RATES``), sorted by tool then prompt."""
    panel = panel_from_answers(answers)
    n = panel.seen.sum(axis=0)
    y = panel.yes.sum(axis=0)
    rows: dict[str, list[Any]] = {name: [] for name in STUDY_RATES.names}
    for t, tool in enumerate(panel.tools):
        for p, prompt in enumerate(panel.prompts):
            if n[t, p] == 0:
                continue
            rows["study_id"].append(panel.study_id)
            rows["tool"].append(tool)
            rows["prompt_id"].append(prompt)
            rows["answers"].append(int(n[t, p]))
            rows["yes"].append(int(y[t, p]))
            rows["yes_rate"].append(100.0 * y[t, p] / n[t, p])
    return pa.table(rows, schema=STUDY_RATES)


@dataclass(frozen=True)
class BootstrapWeights:
    """Multiplicities of each judge (``judges[b, j]``) and each prompt (``prompts[b, p]``) in
    resample b. Row weights are how a cluster bootstrap is computed without copying data."""

    judges: np.ndarray
    prompts: np.ndarray


def bootstrap_weights(panel: Panel, resamples: int, seed: int) -> BootstrapWeights:
    """Two-way cluster bootstrap draws: prompts with replacement, and judges with replacement
    within each panel group (independently of the prompts). Depends only on the panel's shape,
    its groups, ``resamples`` and ``seed``."""
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    rng = np.random.default_rng(seed)
    n_j, n_p = len(panel.judges), len(panel.prompts)
    wp = np.zeros((resamples, n_p))
    draws = rng.integers(0, n_p, size=(resamples, n_p))
    np.add.at(wp, (np.arange(resamples)[:, None], draws), 1.0)
    wj = np.zeros((resamples, n_j))
    groups = np.asarray(panel.judge_groups)
    for g in panel.groups:  # sorted: the draw order is fixed
        members = np.flatnonzero(groups == g)
        picks = members[rng.integers(0, len(members), size=(resamples, len(members)))]
        np.add.at(wj, (np.arange(resamples)[:, None], picks), 1.0)
    return BootstrapWeights(judges=wj, prompts=wp)


def _rates(panel: Panel, wj: np.ndarray, judge_mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Weighted % yes per (resample, tool, prompt) and the weighted answer counts."""
    if judge_mask is not None:
        wj = wj * judge_mask[None, :]
    n_j, n_t, n_p = panel.yes.shape
    y = (wj @ panel.yes.reshape(n_j, -1)).reshape(-1, n_t, n_p)
    n = (wj @ panel.seen.reshape(n_j, -1)).reshape(-1, n_t, n_p)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, 100.0 * y / np.where(n > 0, n, 1.0), np.nan), n


def _index(rates: np.ndarray, wp: np.ndarray) -> np.ndarray:
    """Beauty Index per (resample, tool): the prompt-weighted mean of the rates that exist."""
    have = ~np.isnan(rates)
    w = wp[:, None, :] * have
    num = np.where(have, rates, 0.0) * wp[:, None, :]
    den = w.sum(axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num.sum(axis=2) / np.where(den > 0, den, 1.0), np.nan)


def _index_draws(panel: Panel, weights: BootstrapWeights, judge_mask: np.ndarray | None = None) -> np.ndarray:
    out = []
    for start in range(0, weights.judges.shape[0], _BATCH):
        rates, _ = _rates(panel, weights.judges[start : start + _BATCH], judge_mask)
        out.append(_index(rates, weights.prompts[start : start + _BATCH]))
    return np.concatenate(out, axis=0)


def _observed_index(panel: Panel, judge_mask: np.ndarray | None = None) -> np.ndarray:
    rates, _ = _rates(panel, np.ones((1, len(panel.judges))), judge_mask)
    return _index(rates, np.ones((1, len(panel.prompts))))[0]


def _percentile_interval(draws: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval per column, ignoring resamples where the value is undefined."""
    a = (1.0 - confidence) / 2.0
    lo = np.full(draws.shape[1:], np.nan)
    hi = np.full(draws.shape[1:], np.nan)
    flat = draws.reshape(draws.shape[0], -1)
    for k in range(flat.shape[1]):
        col = flat[:, k]
        col = col[~np.isnan(col)]
        if col.size:
            lo.flat[k], hi.flat[k] = np.quantile(col, [a, 1.0 - a])
    return lo, hi


def _index_interval(observed: np.ndarray, draws: np.ndarray, answers: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Per tool, in points: the logit-scale interval of the index from the variance of its cluster
    bootstrap draws (defined resamples only), valid at 0% and 100%: where the draws show no spread
    (every answer yes, or every answer no) the Wilson interval of the tool's answers. NaN where
    the tool has no index (no answers in the group) or fewer than two defined draws."""
    ok = ~np.isnan(draws)
    n = ok.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(ok, draws, 0.0).sum(axis=0) / n
        var = np.where(ok, (draws - mean) ** 2, 0.0).sum(axis=0) / (n - 1) / 1e4  # on the 0-1 scale
    defined = ~np.isnan(observed) & (n >= 2)
    est = np.where(defined, np.clip(observed / 100.0, 0.0, 1.0), np.nan)
    lo, hi = bounded_mean_interval(est, np.where(defined, var, np.nan), np.maximum(answers, 1.0), confidence)
    # Logit and Wilson intervals hold their estimate; min/max only absorb the last bits.
    return np.minimum(100.0 * lo, observed), np.maximum(100.0 * hi, observed)


def _ranks(values: np.ndarray) -> np.ndarray:
    """Competition ranks, 1 = highest; ties share the best rank; NaN gets rank 0 (no rank)."""
    out = np.zeros(values.shape, dtype=np.int64)
    ok = ~np.isnan(values)
    for i in np.flatnonzero(ok):
        out[i] = 1 + int(np.sum(values[ok] > values[i]))
    return out


def beauty_index(
    answers: pa.Table,
    resamples: int = 2000,
    seed: int = 0,
    simulated: bool | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> pa.Table:
    """Schema ``STUDY_INDEX``: one row per tool with panel_group "all", then one row per (tool,
    panel group). ``beauty_index`` is 0-100; the interval comes from the two-way cluster
    bootstrap's variance (:func:`_index_interval`); ``rank`` 1 = best within the row's panel group
    (ties share a rank).
    ``simulated``: None reads it from the answers' ``source`` column."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    panel = panel_from_answers(answers)
    is_sim = panel.simulated if simulated is None else bool(simulated)
    weights = bootstrap_weights(panel, resamples, seed)
    groups = np.asarray(panel.judge_groups)
    rows: dict[str, list[Any]] = {name: [] for name in STUDY_INDEX.names}
    for group in (ALL_GROUPS, *panel.groups):
        mask = None if group == ALL_GROUPS else (groups == group).astype(float)
        observed = _observed_index(panel, mask)
        seen = panel.seen if mask is None else panel.seen * mask[:, None, None]
        counts = seen.sum(axis=(0, 2))
        lo, hi = _index_interval(observed, _index_draws(panel, weights, mask), counts, confidence)
        ranks = _ranks(observed)
        for t, tool in enumerate(panel.tools):
            defined = not math.isnan(observed[t])
            rows["study_id"].append(panel.study_id)
            rows["tool"].append(tool)
            rows["panel_group"].append(group)
            rows["beauty_index"].append(float(observed[t]) if defined else None)
            rows["beauty_index_lo"].append(float(lo[t]) if defined and not math.isnan(lo[t]) else None)
            rows["beauty_index_hi"].append(float(hi[t]) if defined and not math.isnan(hi[t]) else None)
            rows["rank"].append(int(ranks[t]) if defined else None)
            rows["answers"].append(int(counts[t]))
            rows["simulated"].append(is_sim)
    n = len(rows["tool"])  # columns filled later (quality control: tasks/beauty/quality.py) are null here
    return pa.table({k: v if len(v) == n else [None] * n for k, v in rows.items()}, schema=STUDY_INDEX)


# --------------------------------------------------------------------------------------------
# Multiple testing
def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (step-down, monotone, capped at 1). NaN (a hypothesis
    not tested) stays NaN and does not count in the family."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(~np.isnan(p))
    m = idx.size
    running = 0.0
    for k, i in enumerate(idx[np.argsort(p[idx], kind="stable")]):
        running = max(running, min(1.0, (m - k) * p[i]))
        out[i] = running
    return out.tolist()


def _bootstrap_p(null_holds: np.ndarray) -> float:
    """Share of resamples where the null holds, with the +1 correction (never exactly 0)."""
    null_holds = np.asarray(null_holds, dtype=bool)
    return float((null_holds.sum() + 1) / (null_holds.size + 1))


# --------------------------------------------------------------------------------------------
# Hypotheses
@dataclass(frozen=True)
class HypothesisResult:
    """One pre-registered hypothesis: its test, effect size with interval, p-values and verdict.
    ``verdict`` is "supported" when the Holm-adjusted p-value is below alpha, "not supported"
    otherwise, "not tested" when the study lacks what the test needs (``detail`` says what)."""

    hypothesis: str
    statement: str
    test: str
    effect_name: str
    effect: float
    effect_lo: float
    effect_hi: float
    p_value: float
    p_holm: float
    verdict: Verdict
    detail: str
    headline: str | None = None
    simulated: bool = False
    values: dict[str, float | str] = field(default_factory=dict)

    def as_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["values"] = {k: str(v) for k, v in self.values.items()}
        return row


def hypotheses_rows(results: Sequence[HypothesisResult]) -> list[dict[str, Any]]:
    """Plain dicts (``values`` as strings) for a table or a report."""
    return [r.as_row() for r in results]


def _untested(h: str, test: str, effect_name: str, why: str, simulated: bool) -> HypothesisResult:
    nan = float("nan")
    return HypothesisResult(h, HYPOTHESES[h], test, effect_name, nan, nan, nan, nan, nan, "not tested", why, None, simulated)


def _metric_column(metrics: pa.Table | None, name: str, tools: Sequence[str]) -> np.ndarray | None:
    """The metric per tool in ``tools`` order, or None when the table lacks it for some tool."""
    if metrics is None or name not in metrics.column_names or "tool" not in metrics.column_names:
        return None
    by_tool = {t: v for t, v in zip(metrics.column("tool").to_pylist(), metrics.column(name).to_pylist())}
    values = [by_tool.get(t) for t in tools]
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
        return None
    return np.asarray(values, dtype=float)


def _kendall_tau(x: np.ndarray, y: np.ndarray) -> float:
    import scipy.stats

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(scipy.stats.kendalltau(x, y).statistic)


def _h1(panel: Panel, bi: np.ndarray, bi_draws: np.ndarray, metrics: pa.Table | None, conf: float) -> HypothesisResult:
    test = "bootstrap share of resamples in which the FID-best tool is also Beauty-Index-best (ties count as best)"
    fid = _metric_column(metrics, "fid", panel.tools)
    if fid is None:
        return _untested("H1", test, "Kendall tau (FID ranking vs Beauty Index ranking)", "no FID for every tool (run the pixel metrics)", panel.simulated)
    good = -fid  # lower FID is better
    tau = _kendall_tau(good, bi)
    taus = np.array([_kendall_tau(good, d) if not np.isnan(d).any() else np.nan for d in bi_draws])
    lo, hi = _percentile_interval(taus[:, None], conf)
    best_fid = int(np.argmin(fid))
    ok = ~np.isnan(bi_draws).any(axis=1)
    fid_best_is_bi_best = bi_draws[ok, best_fid] >= bi_draws[ok].max(axis=1)
    p = _bootstrap_p(fid_best_is_bi_best)
    place = int(_ranks(bi)[best_fid])
    tool = panel.tools[best_fid]
    detail = (
        f"FID-best tool {tool} places {place} of {len(panel.tools)} on the Beauty Index "
        f"(Beauty-Index-best in {fid_best_is_bi_best.mean():.0%} of resamples); Kendall tau {tau:+.2f} between "
        f"the FID ranking and the Beauty Index ranking. The interval holds FID fixed (its own interval is in the pixel metrics)."
    )
    return HypothesisResult(
        "H1", HYPOTHESES["H1"], test, "Kendall tau (FID ranking vs Beauty Index ranking)", tau, float(lo[0]), float(hi[0]),
        p, math.nan, "not supported", detail, None, panel.simulated,
        {"fid_best_tool": tool, "fid_best_bi_place": float(place), "share_fid_best_is_bi_best": float(fid_best_is_bi_best.mean())},
    )


def _h2(panel: Panel, settings: AnalysisSettings, conf: float) -> HypothesisResult:
    test = "one-sided permutation test of panel-group labels over judges (judges are the unit)"
    name = "yes-rate difference, aphantasia minus the others (percentage points)"
    groups = np.asarray(panel.judge_groups)
    aph = groups == APHANTASIA_GROUP
    if aph.sum() == 0 or (~aph).sum() == 0:
        return _untested("H2", test, name, f"needs judges in panel group {APHANTASIA_GROUP!r} and in others", panel.simulated)
    n = panel.seen.sum(axis=(1, 2))
    rate = 100.0 * panel.yes.sum(axis=(1, 2)) / n
    observed = float(rate[aph].mean() - rate[~aph].mean())
    n_j, k = len(rate), int(aph.sum())
    rng = np.random.default_rng(settings.seed + 2)
    total = rate.sum()
    if math.comb(n_j, k) <= settings.permutations:  # exact: every assignment of the labels
        sums = np.array([rate[list(c)].sum() for c in itertools.combinations(range(n_j), k)])
        diffs = sums / k - (total - sums) / (n_j - k)
        p = float(np.mean(diffs >= observed - 1e-12))
        how = f"exact over all {len(diffs)} assignments"
    else:
        perms = np.argsort(rng.random((settings.permutations, n_j)), axis=1)[:, :k]
        sums = rate[perms].sum(axis=1)
        diffs = sums / k - (total - sums) / (n_j - k)
        p = float((np.sum(diffs >= observed - 1e-12) + 1) / (settings.permutations + 1))
        how = f"{settings.permutations} random permutations"
    # Interval: judges resampled within each of the two sets.
    a_idx, r_idx = np.flatnonzero(aph), np.flatnonzero(~aph)
    boot = rate[a_idx[rng.integers(0, k, (settings.bootstrap_resamples, k))]].mean(axis=1) - rate[
        r_idx[rng.integers(0, n_j - k, (settings.bootstrap_resamples, n_j - k))]
    ].mean(axis=1)
    lo, hi = _percentile_interval(boot[:, None], conf)
    pooled = np.sqrt(((k - 1) * rate[aph].var(ddof=1 if k > 1 else 0) + (n_j - k - 1) * rate[~aph].var(ddof=1 if n_j - k > 1 else 0)) / max(n_j - 2, 1))
    g = observed / pooled * (1 - 3 / (4 * n_j - 9)) if pooled > 0 and n_j > 2 else math.nan
    detail = (
        f"{k} judge(s) with aphantasia say yes to {rate[aph].mean():.1f}% of images, the other {n_j - k} to "
        f"{rate[~aph].mean():.1f}%; Hedges' g {g:+.2f}; permutation p {how}."
    )
    return HypothesisResult(
        "H2", HYPOTHESES["H2"], test, name, observed, float(lo[0]), float(hi[0]), p, math.nan, "not supported", detail,
        None, panel.simulated, {"hedges_g": float(g), "aphantasia_judges": float(k), "other_judges": float(n_j - k)},
    )


def variance_components(yes: np.ndarray, seen: np.ndarray, start: np.ndarray | None = None) -> tuple[dict[str, float], np.ndarray]:
    """Variances (logit scale) of the random intercepts of tool, prompt and judge in the mixed
    logistic model ``answer ~ 1 + (1|tool) + (1|prompt) + (1|judge)``, fitted by variational Bayes
    (statsmodels ``BinomialBayesMixedGLM.fit_vb``; a variance is exp(2 * the posterior mean of its
    log standard deviation)). ``yes``/``seen`` are [judge, tool, prompt] arrays; ``start`` warm-
    starts the fit (the returned vector), which changes nothing but the time it takes."""
    import scipy.sparse as sparse
    from statsmodels.genmod.bayes_mixed_glm import BinomialBayesMixedGLM

    j, t, p = np.nonzero(seen)
    y = yes[j, t, p]
    n = y.size
    blocks, ident = [], []
    for k, (codes, levels) in enumerate(((t, yes.shape[1]), (p, yes.shape[2]), (j, yes.shape[0]))):
        blocks.append(sparse.csr_matrix((np.ones(n), (np.arange(n), codes)), shape=(n, levels)))
        ident += [k] * levels
    model = BinomialBayesMixedGLM(y, np.ones((n, 1)), sparse.hstack(blocks).tocsr(), np.asarray(ident), vcp_p=1.0, fe_p=2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter: the estimates are checked by the tests
        fit = model.fit_vb(mean=start)
    var = np.exp(2.0 * np.asarray(fit.vcp_mean))
    return {"tool": float(var[0]), "prompt": float(var[1]), "judge": float(var[2])}, np.asarray(fit.params)


def _h3(panel: Panel, weights: BootstrapWeights, mixed_resamples: int, conf: float) -> HypothesisResult:
    test = "mixed logistic model (tool, prompt, judge random intercepts); one-sided z-test of log(tool/prompt variance) < 0 with its two-way cluster bootstrap standard error (judges x prompts)"
    name = "variance ratio tool / prompt (logit scale)"
    if len(panel.prompts) < 2 or len(panel.judges) < 2 or len(panel.tools) < 2:
        return _untested("H3", test, name, "needs answers for at least two tools, two prompts and two judges", panel.simulated)
    answered = panel.yes[panel.seen > 0]
    if answered.min() == answered.max():
        return _untested("H3", test, name, f"every answer is {'yes' if answered[0] else 'no'}: a logistic model cannot be fitted", panel.simulated)
    try:
        comps, start = variance_components(panel.yes, panel.seen)
    except (ValueError, np.linalg.LinAlgError, FloatingPointError) as exc:
        return _untested("H3", test, name, f"the mixed model could not be fitted to the answers ({_reason(exc)})", panel.simulated)
    ratio = comps["tool"] / comps["prompt"]
    ratios, failed, reasons = [], 0, set()
    tried = min(mixed_resamples, weights.judges.shape[0])
    for b in range(tried):
        # Materialise resample b: each drawn copy of a judge or prompt is its own cluster.
        js = np.repeat(np.arange(len(panel.judges)), weights.judges[b].astype(int))
        ps = np.repeat(np.arange(len(panel.prompts)), weights.prompts[b].astype(int))
        yes = panel.yes[js][:, :, ps]
        seen = panel.seen[js][:, :, ps]
        drawn = yes[seen > 0]
        # A resample can draw only judges who all said the same (partial panels do): no model
        # exists for it. It is counted and reported, never fatal (issue 16).
        if drawn.size == 0 or drawn.min() == drawn.max() or len(np.unique(np.nonzero(seen)[1])) < 2:
            failed += 1
            reasons.add("every drawn answer the same, or one tool drawn")
            continue
        try:
            c, _ = variance_components(yes, seen, start)
        except (ValueError, np.linalg.LinAlgError, FloatingPointError) as exc:
            failed += 1
            reasons.add(_reason(exc))
            continue
        r = c["tool"] / c["prompt"]
        if not math.isfinite(r) or r <= 0:
            failed += 1
            reasons.add("a non-finite variance ratio")
            continue
        ratios.append(r)
    draws = np.asarray(ratios)
    unfitted = f"{failed} of {tried} resamples could not be fitted ({'; '.join(sorted(reasons))})" if failed else f"all {tried} resamples fitted"
    values = {f"var_{k}": v for k, v in comps.items()} | {"refits": float(draws.size), "refits_failed": float(failed),
                                                          "refits_tried": float(tried)}
    if draws.size < 2:
        r = _untested("H3", test, name, f"too few bootstrap refits for a standard error: {unfitted}", panel.simulated)
        return replace(r, effect=ratio, values=values)
    lo, hi = _percentile_interval(draws[:, None], conf)
    # Refits are costly, so a share-of-resamples p-value would be coarse (1 / (refits + 1) at
    # best, too coarse to survive Holm). The log ratio is close to normal across resamples: the
    # one-sided p-value of "log ratio >= 0" uses its bootstrap standard error.
    se = float(np.std(np.log(draws), ddof=1))
    p = float(_normal_cdf(math.log(ratio) / se)) if se > 0 else (0.0 if ratio < 1 else 1.0)
    detail = (
        f"variances (logit scale): tool {comps['tool']:.3f}, prompt {comps['prompt']:.3f}, judge {comps['judge']:.3f}; "
        f"ratio interval from {draws.size} refits (the mixed-model bootstrap is capped at {mixed_resamples}); {unfitted}."
    )
    return HypothesisResult(
        "H3", HYPOTHESES["H3"], test, name, ratio, float(lo[0]), float(hi[0]), p, math.nan, "not supported", detail, None,
        panel.simulated, values,
    )


def _reason(exc: BaseException) -> str:
    """An exception as a short phrase for a ``detail`` (its first line)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _rank_rows(values: np.ndarray) -> np.ndarray:
    """Competition ranks (1 = highest) along the last axis of a 2-D array."""
    return 1 + (values[:, None, :] > values[:, :, None]).sum(axis=2)


def _h4(panel: Panel, bi: np.ndarray, bi_draws: np.ndarray, metrics: pa.Table | None, praised: Sequence[str], conf: float) -> HypothesisResult:
    test = "bootstrap share of resamples in which no declared tool ranks worse on the Beauty Index than on HPSv3 (or CLIP)"
    name = "largest rank drop of a declared tool, Beauty Index rank minus aesthetic-metric rank (places)"
    declared = [t for t in praised if t in panel.tools]
    if not declared:
        return _untested("H4", test, name, "no tool declared 'praised for aesthetics' among the answered tools", panel.simulated)
    hps = _metric_column(metrics, "hps_mu", panel.tools)
    clip = _metric_column(metrics, "clip_score", panel.tools)
    aesthetic, metric_name = (hps, "HPSv3 mu") if hps is not None else (clip, "CLIP score")
    if aesthetic is None:
        return _untested("H4", test, name, "no HPSv3 mu or CLIP score for every tool (run the pixel metrics)", panel.simulated)
    idx = np.array([panel.tools.index(t) for t in declared])
    a_rank = _ranks(aesthetic)[idx]
    drop = float((_ranks(bi)[idx] - a_rank).max())
    ok = ~np.isnan(bi_draws).any(axis=1)
    drops = (_rank_rows(bi_draws[ok])[:, idx] - a_rank[None, :]).max(axis=1).astype(float)
    lo, hi = _percentile_interval(drops[:, None], conf)
    p = _bootstrap_p(drops <= 0)
    parts = []
    clip_ranks = _ranks(clip) if clip is not None else None
    for k, t in zip(idx, declared):
        s = f"{t}: Beauty Index rank {_ranks(bi)[k]}, {metric_name} rank {_ranks(aesthetic)[k]}"
        if clip_ranks is not None and metric_name != "CLIP score":
            s += f", CLIP rank {clip_ranks[k]}"
        parts.append(s)
    return HypothesisResult(
        "H4", HYPOTHESES["H4"], test, name, drop, float(lo[0]), float(hi[0]), p, math.nan, "not supported", "; ".join(parts),
        None, panel.simulated, {"aesthetic_metric": metric_name},
    )


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _h5(panel: Panel, bi: np.ndarray, bi_draws: np.ndarray, weights: BootstrapWeights, host: str | None, conf: float) -> HypothesisResult:
    test = "bootstrap share of resamples in which the host tool wins every drawn prompt (ties count as wins)"
    name = "share of prompts the host tool wins"
    if host is None or host not in panel.tools:
        return _untested("H5", test, name, "no host tool declared among the answered tools", panel.simulated)
    if len(panel.tools) < 2:
        # Alone on the panel the host "wins" every prompt by default: no comparison was made.
        return _untested("H5", test, name, f"only {host} was answered; a win needs a second tool", panel.simulated)
    h = panel.tools.index(host)
    rates, _ = _rates(panel, np.ones((1, len(panel.judges))))
    rates = rates[0]
    have = ~np.isnan(rates).all(axis=0)
    wins = rates[h] >= np.nanmax(np.where(np.isnan(rates), -np.inf, rates), axis=0)
    share = float(wins[have].mean())
    all_wins, shares = [], []
    for start in range(0, weights.judges.shape[0], _BATCH):
        r, _ = _rates(panel, weights.judges[start : start + _BATCH])
        wp = weights.prompts[start : start + _BATCH]
        best = np.nanmax(np.where(np.isnan(r), -np.inf, r), axis=1)
        won = (r[:, h, :] >= best) & ~np.isnan(r[:, h, :])
        drawn = wp > 0
        all_wins.append(np.all(won | ~drawn, axis=1))
        shares.append((won * wp).sum(axis=1) / wp.sum(axis=1))
    lo, hi = _percentile_interval(np.concatenate(shares)[:, None], conf)
    p = _bootstrap_p(np.concatenate(all_wins))
    place = int(_ranks(bi)[h])
    ok = ~np.isnan(bi_draws).any(axis=1)
    place_lo, place_hi = _percentile_interval(_rank_rows(bi_draws[ok])[:, h].astype(float)[:, None], conf)
    n_tools = len(panel.tools)
    band = (f"bootstrap place interval {int(place_lo[0])}-{int(place_hi[0])}" if not np.isnan(place_lo[0])
            else "no resample ranks every tool")
    detail = (
        f"{host} wins {int(wins[have].sum())} of {int(have.sum())} prompts and places {place} of {n_tools} on the "
        f"Beauty Index ({band})."
    )
    headline = None
    if place >= 5:
        headline = f"The host lab's own tool, {host}, places {_ordinal(place)} of {n_tools} on the Beauty Index."
        if panel.simulated:
            headline = "SIMULATED: " + headline
    return HypothesisResult(
        "H5", HYPOTHESES["H5"], test, name, share, float(lo[0]), float(hi[0]), p, math.nan, "not supported", detail, headline,
        panel.simulated, {"host_tool": host, "place": float(place), "prompts_won": float(wins[have].sum())},
    )


def test_hypotheses(
    answers: pa.Table,
    prereg: PreRegistration | None,
    metrics: pa.Table | None = None,
    *,
    mixed_resamples: int = DEFAULT_MIXED_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
) -> list[HypothesisResult]:
    """H1-H5 in order, with Holm's correction across the tested ones and verdicts at the
    pre-registered alpha. ``prereg`` supplies the analysis settings (resamples, permutations,
    alpha, seed), the host tool (H5) and the tools praised for aesthetics (H4); None uses the
    defaults and leaves H4/H5 untested. ``metrics`` is the ``pixel_metrics`` table (columns
    ``tool``, ``fid``, ``clip_score``, ``hps_mu``) for H1 and H4; None leaves them untested."""
    if mixed_resamples < 1:
        raise ValueError(f"mixed_resamples must be >= 1, got {mixed_resamples}")
    panel = panel_from_answers(answers)
    settings = prereg.analysis if prereg is not None else AnalysisSettings()
    weights = bootstrap_weights(panel, settings.bootstrap_resamples, settings.seed)
    bi = _observed_index(panel)
    bi_draws = _index_draws(panel, weights)
    tests = [
        ("H1", lambda: _h1(panel, bi, bi_draws, metrics, confidence)),
        ("H2", lambda: _h2(panel, settings, confidence)),
        ("H3", lambda: _h3(panel, weights, mixed_resamples, confidence)),
        ("H4", lambda: _h4(panel, bi, bi_draws, metrics, prereg.praised_for_aesthetics if prereg else [], confidence)),
        ("H5", lambda: _h5(panel, bi, bi_draws, weights, prereg.host_tool if prereg else None, confidence)),
    ]
    results = []
    for h, run in tests:
        # Every analysis finishes on any study with an answer (issue 16): a test that cannot be
        # computed on these answers is "not tested" with the reason, never a crash of the whole.
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                results.append(run())
            except (ValueError, ArithmeticError, IndexError, np.linalg.LinAlgError) as exc:
                results.append(_untested(h, "", "", f"could not be computed on these answers ({_reason(exc)})", panel.simulated))
    adjusted = holm([r.p_value for r in results])
    out = []
    for r, p_adj in zip(results, adjusted):
        if r.verdict == "not tested":
            out.append(r)
            continue
        verdict: Verdict = "supported" if p_adj < settings.alpha else "not supported"
        out.append(replace(r, p_holm=p_adj, verdict=verdict))
    return out


test_hypotheses.__test__ = False  # type: ignore[attr-defined]  # not a pytest test despite its name


