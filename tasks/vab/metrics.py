"""VAB metrics, pure (no I/O): strict accuracy as published, single-trial accuracy, breakdowns by
domain and set size, random baselines, bootstrap intervals over tasks, McNemar's paired test and
position bias. Percentages are 0-100.

Scoring rules (docs/VAB.md, "Sets, trials and metrics"):
- a trial is right on *best* when its state is ``ok`` and its mapped-back ``best`` equals the
  label; on *worst* likewise; a 2-image task has no worst, its *both* is its *best*;
- a task is **strict** right when all three trials (0, 1, 2) are right; a missing trial, an
  unparsable answer, an error or a tie is a wrong trial (never dropped). A human judge
  (judge_kind ``human``: a panel expert sees each task once, in their own permutation) is
  scored on trial 0 alone (HUMAN_TRIALS);
- ``strict_worst`` is over the tasks that have a worst label (3+ images); ``strict_best`` and
  ``strict_both`` (the headline) over all tasks of the set collection;
- a one-trial judge (``trials_per_task`` 1) is never ranked in the 3-trial strict column: its
  one-trial accuracy sits beside the models' single-trial accuracy, against the one-trial random
  judge (docs/VAB.md, "One trial and three");
- intervals: Wilson score (honest at 0% and 100%) as the reported one, the task bootstrap beside it;
- absent is never 0: a figure with no trial behind it (a prompt type the judge was never asked, a
  group of tasks where it answered nothing) is None, never 0.0; a figure with trials behind it counts
  its tasks' missing trials as wrong.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas.vab import OFFICIAL_PROMPT_TYPES, PICK_BEST, PICK_BEST_AND_WORST, PICK_WORST, PROMPT_COMBINED, TRIALS, VAB_TRIAL_STATES, VabTask

N_RESAMPLES = 2000
HUMAN_TRIALS = 1  # experts answer each task once (docs/VAB.md, "People")
CONFIDENCE = 0.95


@dataclass(frozen=True)
class TaskOutcome:
    """One judge on one task: per-trial rightness (index = trial; 3 trials, 1 for a human) and
    the strict results."""

    task_id: str
    domain: str
    n_images: int
    best_trials: tuple[bool, ...]
    worst_trials: tuple[bool, ...] | None  # None: a 2-image task (no worst label)
    trials_present: int
    # official prompt types: both comes from the pick_best_and_worst answers, not from best and worst
    both_override: tuple[bool, ...] | None = None
    # trials recorded behind best / worst / both (official: of pick_best / pick_worst /
    # pick_best_and_worst); None: ``trials_present`` (our combined prompt answers all three)
    best_seen: int | None = None
    worst_seen: int | None = None
    both_seen: int | None = None

    def seen(self, figure: str) -> int:
        got = getattr(self, f"{figure}_seen")
        return self.trials_present if got is None else got

    @property
    def has_worst(self) -> bool:
        return self.worst_trials is not None

    @property
    def both_trials(self) -> tuple[bool, ...]:
        if self.both_override is not None:
            return self.both_override
        if self.worst_trials is None:
            return self.best_trials
        return tuple(b and w for b, w in zip(self.best_trials, self.worst_trials))

    @property
    def strict_best(self) -> bool:
        return all(self.best_trials)

    @property
    def strict_worst(self) -> bool | None:
        return None if self.worst_trials is None else all(self.worst_trials)

    @property
    def strict_both(self) -> bool:
        return all(self.both_trials)


def rows_of(trials: Any) -> list[dict]:
    """Rows of a VAB_TRIALS-shaped table: a pyarrow Table, anything with ``to_pylist`` or
    ``to_arrow``, or an iterable of dicts."""
    if hasattr(trials, "to_pylist"):
        return trials.to_pylist()
    if hasattr(trials, "to_arrow"):
        return trials.to_arrow().to_pylist()
    return [dict(r) for r in trials]


_rows = rows_of


def judges_of(trials: Any) -> list[str]:
    """The judges that have rows in ``trials``, sorted."""
    return sorted({r["judge"] for r in _rows(trials)})


def task_outcomes(tasks: Sequence[VabTask], trials: Any, judge: str) -> list[TaskOutcome]:
    """One :class:`TaskOutcome` per task of the collection (in the tasks' order) for ``judge``.
    Raises ValueError naming the task on a trial of an unknown task, a trial number outside
    0..2, an unknown state or the same (task, trial) twice."""
    by_id = {t.task_id: t for t in tasks}
    if len(by_id) != len(tasks):
        dup = next(i for i, c in Counter(t.task_id for t in tasks).items() if c > 1)
        raise ValueError(f"task {dup!r} appears twice in the set collection")
    seen: dict[tuple[str, str, int], dict] = {}
    rows = [r for r in _rows(trials) if r["judge"] == judge]
    required = HUMAN_TRIALS if any(r.get("judge_kind") == "human" for r in rows) else TRIALS
    types = {r.get("prompt_type") or PROMPT_COMBINED for r in rows}
    official = bool(types & set(OFFICIAL_PROMPT_TYPES))
    if official and PROMPT_COMBINED in types:
        raise ValueError(f"judge {judge!r} has answers to our combined question and to the official prompt types: "
                         f"import or run them under two judge names")
    for r in rows:
        tid, trial, pt = r["task_id"], r["trial"], r.get("prompt_type") or PROMPT_COMBINED
        if tid not in by_id:
            raise ValueError(f"judge {judge!r}: task {tid!r} is not in the set collection")
        if trial not in range(TRIALS):
            raise ValueError(f"judge {judge!r}, task {tid!r}: trial {trial!r} is not 0..{TRIALS - 1}")
        if r["state"] not in VAB_TRIAL_STATES:
            raise ValueError(f"judge {judge!r}, task {tid!r}, trial {trial}: unknown state {r['state']!r}")
        if (tid, pt, trial) in seen:
            raise ValueError(f"judge {judge!r}, task {tid!r}: trial {trial}" + (f" of {pt}" if official else "") + " is recorded twice")
        seen[(tid, pt, trial)] = r

    def right(r: dict | None, best: bool, worst: bool, task: VabTask) -> bool:
        if r is None or r["state"] != "ok":
            return False
        return (not best or r["best"] == task.best) and (not worst or task.worst is None or r["worst"] == task.worst)

    out = []
    for t in tasks:
        n, tid = len(t.images), t.task_id
        if official:  # strict over each prompt type's own answers; both = pick_best_and_worst (derived for 2 images)
            best = tuple(right(seen.get((tid, PICK_BEST, k)), True, False, t) for k in range(required))
            worst = tuple(right(seen.get((tid, PICK_WORST, k)), False, True, t) for k in range(required))
            both = tuple(right(seen.get((tid, PICK_BEST_AND_WORST, k)), True, True, t) for k in range(required))
            count = {pt: sum((tid, pt, k) in seen for k in range(required)) for pt in OFFICIAL_PROMPT_TYPES}
            out.append(TaskOutcome(tid, t.domain, n, best, worst if t.worst is not None else None, count[PICK_BEST_AND_WORST], both,
                                   best_seen=count[PICK_BEST], worst_seen=count[PICK_WORST], both_seen=count[PICK_BEST_AND_WORST]))
            continue
        got = [seen.get((tid, PROMPT_COMBINED, k)) for k in range(required)]
        best = tuple(right(r, True, False, t) for r in got)
        worst = tuple(bool(r is not None and r["state"] == "ok" and r["worst"] == t.worst) for r in got)
        out.append(TaskOutcome(tid, t.domain, n, best, worst if t.worst is not None else None, sum(r is not None for r in got)))
    return out


def _pct(num: int, den: int) -> float | None:
    return None if den == 0 else 100.0 * num / den


def answered(outcomes: Sequence[TaskOutcome], figure: str) -> bool:
    """Whether any trial is recorded behind ``figure`` (best, worst, both) of these tasks."""
    return any(o.seen(figure) for o in outcomes if figure != "worst" or o.has_worst)


def summarize(outcomes: Sequence[TaskOutcome]) -> dict:
    """Strict and single-trial accuracies (percent) of a list of outcomes; None where a metric
    has no task (e.g. strict_worst over 2-image tasks only) or no trial behind it."""
    worst = [o for o in outcomes if o.has_worst]
    n, nt = len(outcomes), sum(len(o.best_trials) for o in outcomes)
    best_on, worst_on, both_on = answered(outcomes, "best"), answered(outcomes, "worst"), answered(outcomes, "both")

    def pct(num: int, den: int, on: bool) -> float | None:
        return _pct(num, den) if on else None

    return {
        "tasks": n,
        "tasks_with_worst": len(worst),
        "strict_best": pct(sum(o.strict_best for o in outcomes), n, best_on),
        "strict_worst": pct(sum(bool(o.strict_worst) for o in worst), len(worst), worst_on),
        "strict_both": pct(sum(o.strict_both for o in outcomes), n, both_on),
        "single_best": pct(sum(sum(o.best_trials) for o in outcomes), nt, best_on),
        "single_worst": pct(sum(sum(o.worst_trials) for o in worst), sum(len(o.worst_trials) for o in worst), worst_on),
        "single_both": pct(sum(sum(o.both_trials) for o in outcomes), nt, both_on),
    }


def random_baselines(tasks: Sequence[VabTask]) -> dict:
    """What a judge answering uniformly at random scores (percent), per set size and over the
    collection (the mean of the tasks' chances, so it matches the collection's size mix).
    Single trial: best 1/n, worst 1/n, both 1/(n(n-1)) (best and worst two distinct images;
    1/2 for n = 2); strict: the single-trial chance cubed (three independent trials)."""

    def chances(n: int) -> dict:
        both = 1 / n if n == 2 else 1 / (n * (n - 1))
        return {"single_best": 1 / n, "single_worst": None if n == 2 else 1 / n, "single_both": both,
                "strict_best": (1 / n) ** TRIALS, "strict_worst": None if n == 2 else (1 / n) ** TRIALS,
                "strict_both": both ** TRIALS}

    def pct(d: dict) -> dict:
        return {k: (None if v is None else 100.0 * v) for k, v in d.items()}

    sizes = sorted({len(t.images) for t in tasks})
    per_size = {n: pct(chances(n)) for n in sizes}
    overall: dict[str, float | None] = {}
    for key in chances(3):
        vals = [chances(len(t.images))[key] for t in tasks]
        vals = [v for v in vals if v is not None]
        overall[key] = 100.0 * sum(vals) / len(vals) if vals else None
    return {"by_size": per_size, "overall": overall}


def wilson_interval(successes: float, n: int, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Wilson score interval (percent) of a proportion ``successes / n``: unlike the bootstrap it is
    not [0, 0] at 0% nor [100, 100] at 100% (3 of 3 right gives [43.9, 100]). ``successes`` may be
    fractional (a mean over trials, with ``n`` = tasks: conservative, the trials of a task are
    correlated). None when ``n`` is 0."""
    if not 0 < confidence < 1:
        raise ValueError(f"need 0 < confidence < 1, got {confidence}")
    if n <= 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be within 0..{n}, got {successes}")
    from statistics import NormalDist  # stdlib: the light read commands must stay free of scipy

    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # at the edges the bound is exactly 0 or 100 in reals: no float noise (2.8e-15) in its place
    lo = 0.0 if successes == 0 else max(0.0, 100.0 * (centre - half))
    hi = 100.0 if successes == n else min(100.0, 100.0 * (centre + half))
    return lo, hi


def bootstrap_interval(
    values: Sequence[bool] | np.ndarray,
    mask: Sequence[bool] | np.ndarray | None = None,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile interval (percent) of the mean of ``values`` over ``mask``-ed tasks, resampling
    tasks with replacement (``mask`` keeps the denominator of e.g. strict_worst right). None when
    no task counts. Deterministic for a given ``seed``."""
    if n_resamples < 1 or not 0 < confidence < 1:
        raise ValueError(f"need n_resamples >= 1 and 0 < confidence < 1, got {n_resamples}, {confidence}")
    x = np.asarray(values, dtype=float)
    m = np.ones_like(x) if mask is None else np.asarray(mask, dtype=float)
    if x.shape != m.shape:
        raise ValueError(f"values and mask differ in length: {x.shape[0]} vs {m.shape[0]}")
    if m.sum() == 0:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.shape[0], size=(n_resamples, x.shape[0]))
    num, den = (x * m)[idx].sum(axis=1), m[idx].sum(axis=1)
    means = num[den > 0] / den[den > 0]  # a resample with no counted task has no mean
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(100.0 * lo), float(100.0 * hi)


def position_bias(tasks: Sequence[VabTask], trials: Any, judge: str, what: str = "best") -> dict:
    """How often ``judge`` named each shown slot (``what`` = "best" or "worst") against the
    uniform rate, over its valid answers. Per set size n: counts per slot 1..n, rates (percent),
    the uniform rate 100/n, and a chi-square goodness-of-fit p-value; ``pooled``: all sizes
    together, expected count of slot k = sum over answers of 1/n where k <= n."""
    if what not in ("best", "worst"):
        raise ValueError(f"what must be 'best' or 'worst', got {what!r}")
    sizes = {t.task_id: len(t.images) for t in tasks}
    col = f"{what}_shown"
    asked = (PROMPT_COMBINED, PICK_BEST if what == "best" else PICK_WORST)  # one answer per shown order
    counts: dict[int, Counter] = defaultdict(Counter)
    for r in _rows(trials):
        if r["judge"] != judge or r["state"] != "ok" or r.get(col) is None or r["task_id"] not in sizes:
            continue
        if (r.get("prompt_type") or PROMPT_COMBINED) not in asked:
            continue
        n = sizes[r["task_id"]]
        slot = int(r[col])
        if not 1 <= slot <= n:
            raise ValueError(f"judge {judge!r}, task {r['task_id']!r}: {col}={slot} is out of range 1..{n}")
        counts[n][slot] += 1
    by_size = {}
    pooled_obs: Counter = Counter()
    pooled_exp: Counter = Counter()
    for n in sorted(counts):
        total = sum(counts[n].values())
        obs = [counts[n][k] for k in range(1, n + 1)]
        by_size[n] = {
            "answers": total,
            "counts": obs,
            "rates": [100.0 * c / total for c in obs],
            "uniform": 100.0 / n,
            "p_value": _chi2_uniform(obs, [total / n] * n),
        }
        for k in range(1, n + 1):
            pooled_obs[k] += counts[n][k]
            pooled_exp[k] += total / n
    slots = sorted(pooled_exp)
    total = sum(pooled_obs.values())
    pooled = {
        "answers": total,
        "counts": [pooled_obs[k] for k in slots],
        "rates": [100.0 * pooled_obs[k] / total for k in slots] if total else [],
        "uniform": [100.0 * pooled_exp[k] / total for k in slots] if total else [],
        "p_value": _chi2_uniform([pooled_obs[k] for k in slots], [pooled_exp[k] for k in slots]),
    }
    return {"judge": judge, "what": what, "by_size": by_size, "pooled": pooled}


def _chi2_uniform(observed: Sequence[float], expected: Sequence[float]) -> float | None:
    """Pearson chi-square goodness-of-fit p-value (None with fewer than 2 slots or no answers)."""
    if len(observed) < 2 or sum(observed) == 0:
        return None
    from scipy.stats import chisquare  # lazy: scipy is only needed here

    return float(chisquare(np.asarray(observed, float), np.asarray(expected, float)).pvalue)


def mcnemar(a: Sequence[bool], b: Sequence[bool]) -> dict:
    """McNemar's exact test on paired per-task outcomes of two judges: ``b10`` tasks only A got
    right, ``b01`` only B; two-sided p = min(1, 2 * P(X <= min(b10, b01))), X ~ Bin(b10 + b01, 1/2)."""
    if len(a) != len(b):
        raise ValueError(f"paired outcomes differ in length: {len(a)} vs {len(b)}")
    b10 = sum(1 for x, y in zip(a, b) if x and not y)
    b01 = sum(1 for x, y in zip(a, b) if y and not x)
    n = b10 + b01
    if n == 0:
        p = 1.0
    else:
        k = min(b10, b01)
        p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)
    return {"tasks": len(a), "only_a": b10, "only_b": b01, "both": sum(1 for x, y in zip(a, b) if x and y),
            "neither": sum(1 for x, y in zip(a, b) if not x and not y), "p_value": p}


def identity_is_uncalibrated(identity: str | None) -> bool:
    """Whether a stored ``judge_identity`` (JSON) says ``"uncalibrated": true`` anywhere (HPSv3 on
    the demo's random weights nests it in the scorer identity). Not JSON: not flagged."""
    if not identity:
        return False
    try:
        obj = json.loads(identity)
    except ValueError:
        return False
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if x.get("uncalibrated") is True:
                return True
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return False


def _invalid(trials_rows: Iterable[dict], judge: str) -> dict[str, int]:
    c = Counter(r["state"] for r in trials_rows if r["judge"] == judge and r["state"] != "ok")
    return {s: c.get(s, 0) for s in VAB_TRIAL_STATES if s != "ok"}


def judge_metrics(tasks: Sequence[VabTask], trials: Any, judge: str, n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """Every metric of one judge over the collection: the summary, intervals of strict_best,
    strict_worst, strict_both and single_both (``*_ci`` Wilson, ``*_boot`` the task bootstrap), by
    domain, by set size, invalid trials by state, missing trials, position bias of its best
    answers, ``trials_per_task`` (3, or 1 for a human) and ``uncalibrated`` (demo weights)."""
    rows = _rows(trials)
    outs = task_outcomes(tasks, rows, judge)
    res = {"judge": judge, **summarize(outs)}
    mine = [r for r in rows if r["judge"] == judge]
    kinds = sorted({r["judge_kind"] for r in mine if r.get("judge_kind")})
    res["judge_kind"] = ",".join(kinds) or None
    res["trials_per_task"] = len(outs[0].best_trials) if outs else TRIALS
    res["uncalibrated"] = any(identity_is_uncalibrated(r.get("judge_identity")) for r in mine)
    has_worst = [o.has_worst for o in outs]
    worst = [o for o in outs if o.has_worst]
    # an interval only where its figure has trials behind it (absent is never [0, x])
    on = {f: answered(outs, f) for f in ("best", "worst", "both")}
    res["strict_best_ci"] = wilson_interval(sum(o.strict_best for o in outs), len(outs)) if on["best"] else None
    res["strict_worst_ci"] = wilson_interval(sum(bool(o.strict_worst) for o in worst), len(worst)) if on["worst"] else None
    res["strict_both_ci"] = wilson_interval(sum(o.strict_both for o in outs), len(outs)) if on["both"] else None
    res["single_both_ci"] = (wilson_interval(sum(sum(o.both_trials) / len(o.both_trials) for o in outs), len(outs))
                             if on["both"] else None)
    res["strict_best_boot"] = bootstrap_interval([o.strict_best for o in outs], None, n_resamples, seed=seed) if on["best"] else None
    res["strict_worst_boot"] = (bootstrap_interval([bool(o.strict_worst) for o in outs], has_worst, n_resamples, seed=seed)
                                if on["worst"] else None)
    res["strict_both_boot"] = bootstrap_interval([o.strict_both for o in outs], None, n_resamples, seed=seed) if on["both"] else None
    groups: dict[str, dict] = {"by_domain": defaultdict(list), "by_size": defaultdict(list)}
    for o in outs:
        groups["by_domain"][o.domain].append(o)
        groups["by_size"][o.n_images].append(o)
    res["by_domain"] = {k: summarize(v) for k, v in sorted(groups["by_domain"].items())}
    res["by_size"] = {k: summarize(v) for k, v in sorted(groups["by_size"].items())}
    res["invalid_trials"] = _invalid(rows, judge)
    res["missing_trials"] = sum(len(o.best_trials) - o.trials_present for o in outs)
    res["position_bias"] = position_bias(tasks, rows, judge, "best")
    return res


def strict_metrics(tasks: Sequence[VabTask], trials_table: Any, n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict[str, dict]:
    """:func:`judge_metrics` for every judge in ``trials_table`` (keyed by judge, sorted)."""
    rows = _rows(trials_table)
    return {j: judge_metrics(tasks, rows, j, n_resamples, seed) for j in judges_of(rows)}


def compare_judges(tasks: Sequence[VabTask], trials: Any, judge_a: str, judge_b: str, metric: str = "strict_both") -> dict:
    """McNemar's paired comparison of two judges on one per-task strict metric (``strict_best``,
    ``strict_worst`` over tasks with a worst label, or ``strict_both``)."""
    if metric not in ("strict_best", "strict_worst", "strict_both"):
        raise ValueError(f"metric must be strict_best, strict_worst or strict_both, got {metric!r}")
    rows = _rows(trials)
    known = set(judges_of(rows))
    for j in (judge_a, judge_b):
        if j not in known:
            raise ValueError(f"judge {j!r} has no trials in this set collection; judges: {sorted(known)}")
    oa, ob = task_outcomes(tasks, rows, judge_a), task_outcomes(tasks, rows, judge_b)
    figure = metric.removeprefix("strict_")
    if not (answered(oa, figure) and answered(ob, figure)):  # one of them was never asked it: nothing to pair
        return {**mcnemar([], []), "judge_a": judge_a, "judge_b": judge_b, "metric": metric, "a_pct": None, "b_pct": None}
    keep = [o.has_worst for o in oa] if metric == "strict_worst" else [True] * len(oa)
    a = [bool(getattr(o, metric)) for o, k in zip(oa, keep) if k]
    b = [bool(getattr(o, metric)) for o, k in zip(ob, keep) if k]
    res = mcnemar(a, b)
    res.update({"judge_a": judge_a, "judge_b": judge_b, "metric": metric,
                "a_pct": _pct(sum(a), len(a)), "b_pct": _pct(sum(b), len(b))})
    return res


