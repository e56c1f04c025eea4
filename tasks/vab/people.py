"""VAB expert panels, the math (pure functions; no I/O): consensus labels, agreement,
leave-one-expert-out accuracy (the human baseline) and the scores-vs-ranking study.

Inputs are plain rows, as the panel store exports them (tasks/vab/store.py):
- rank rows ``{"expert", "task_id", "best", "worst"}``: 1-based positions in the task's *stored*
  order (``worst`` None on 2-image tasks);
- score rows ``{"expert", "task_id", "scores"}``: one 0-10 score per image, in stored order;
- ``n_images``: task id -> number of images.

Consensus tie rule (written down because 10 experts on a 3-image task tie often):
the best image is the one with the most best votes; among images tied on best votes, the one with
the fewest worst votes; if still tied, the task has **no best consensus** (None). The worst image
is symmetric (most worst votes, then fewest best votes, else None). If both rules pick the same
image, neither label stands. A task without a consensus label is left out of every accuracy that
needs that label and counted in ``excluded``; it is never guessed.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np


class PeopleError(ValueError):
    """Answers the analysis refuses, named."""


@dataclass(frozen=True)
class Consensus:
    task_id: str
    n_images: int
    best: int | None
    worst: int | None
    best_votes: tuple[int, ...]  # per stored position 1..n
    worst_votes: tuple[int, ...]
    experts: int


def _check_rank_rows(rows: Iterable[Mapping], n_images: Mapping[str, int]) -> list[Mapping]:
    rows = list(rows)
    seen: set[tuple[str, str]] = set()
    for r in rows:
        tid, who = r["task_id"], r["expert"]
        if tid not in n_images:
            raise PeopleError(f"rank answer of expert {who!r} names unknown task {tid!r}")
        n = n_images[tid]
        if (who, tid) in seen:
            raise PeopleError(f"expert {who!r} answered task {tid!r} twice")
        seen.add((who, tid))
        if not 1 <= int(r["best"]) <= n:
            raise PeopleError(f"task {tid!r}, expert {who!r}: best={r['best']} out of range 1..{n}")
        w = r.get("worst")
        if n == 2 and w is not None:
            raise PeopleError(f"task {tid!r}, expert {who!r}: a 2-image task has no worst (got {w})")
        if n >= 3 and (w is None or not 1 <= int(w) <= n or int(w) == int(r["best"])):
            raise PeopleError(f"task {tid!r}, expert {who!r}: worst={w} must be in 1..{n} and differ from best")
    return rows


def _pick(primary: list[int], secondary: list[int]) -> int | None:
    """Most ``primary`` votes, then fewest ``secondary`` votes; None when still tied (1-based)."""
    top = max(primary)
    if top == 0:
        return None
    cands = [i for i, v in enumerate(primary) if v == top]
    low = min(secondary[i] for i in cands)
    cands = [i for i in cands if secondary[i] == low]
    return cands[0] + 1 if len(cands) == 1 else None


def consensus_of(task_id: str, n: int, votes: Iterable[tuple[int, int | None]]) -> Consensus:
    """The consensus of ``(best, worst)`` votes on one task of ``n`` images (tie rule: module doc)."""
    bv, wv, k = [0] * n, [0] * n, 0
    for b, w in votes:
        bv[b - 1] += 1
        if w is not None:
            wv[w - 1] += 1
        k += 1
    best = _pick(bv, wv) if k else None
    worst = _pick(wv, bv) if k and n >= 3 else None
    if best is not None and best == worst:
        best = worst = None
    return Consensus(task_id, n, best, worst, tuple(bv), tuple(wv), k)


def consensus_labels(rank_rows: Iterable[Mapping], n_images: Mapping[str, int],
                     exclude_expert: str | None = None) -> dict[str, Consensus]:
    """Consensus per task over every expert (or every expert but ``exclude_expert``)."""
    rows = _check_rank_rows(rank_rows, n_images)
    votes: dict[str, list[tuple[int, int | None]]] = defaultdict(list)
    for r in rows:
        if r["expert"] != exclude_expert:
            votes[r["task_id"]].append((int(r["best"]), None if r.get("worst") is None else int(r["worst"])))
    return {tid: consensus_of(tid, n_images[tid], votes.get(tid, [])) for tid in sorted(n_images)}


def _nan_to_none(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def agreement(labels: Iterable[Mapping], what: str = "best") -> dict:
    """Agreement of the experts' ``what`` labels ("best" or "worst"), categories = stored positions.

    Krippendorff's alpha (nominal; the ``krippendorff`` package) uses every answer, missing ones
    allowed. Fleiss' kappa (statsmodels) needs the same raters on every item, so it is computed on
    the tasks every expert answered (``fleiss_tasks``). Either is None when undefined (e.g. every
    answer is the same category: no disagreement to measure against)."""
    import krippendorff
    from statsmodels.stats.inter_rater import aggregate_raters, fleiss_kappa

    rows = [r for r in labels if r.get(what) is not None]
    experts = sorted({r["expert"] for r in rows})
    tasks = sorted({r["task_id"] for r in rows})
    out = {"what": what, "experts": len(experts), "tasks": len(tasks), "fleiss_kappa": None,
           "fleiss_tasks": 0, "krippendorff_alpha": None}
    if len(experts) < 2 or not tasks:
        return out
    ei, ti = {e: i for i, e in enumerate(experts)}, {t: i for i, t in enumerate(tasks)}
    data = np.full((len(experts), len(tasks)), np.nan)
    for r in rows:
        data[ei[r["expert"]], ti[r["task_id"]]] = int(r[what])
    values = data[~np.isnan(data)]
    if len(np.unique(values)) > 1:
        out["krippendorff_alpha"] = _nan_to_none(krippendorff.alpha(reliability_data=data, level_of_measurement="nominal"))
    full = data[:, ~np.isnan(data).any(axis=0)]
    out["fleiss_tasks"] = int(full.shape[1])
    if full.shape[1] >= 1:
        table, _cats = aggregate_raters(full.T.astype(int))
        with np.errstate(divide="ignore", invalid="ignore"):
            out["fleiss_kappa"] = _nan_to_none(fleiss_kappa(table, method="fleiss"))
    return out


def leave_one_expert_out(rank_rows: Iterable[Mapping], n_images: Mapping[str, int]) -> dict:
    """Each expert scored against the consensus of the *other* experts (the human baseline).

    Per expert and pooled over (expert, task): ``best`` (tasks with a best consensus), ``worst``
    (3+ images with a worst consensus), ``both`` (best right and, for 3+ images, worst right; tasks
    where a needed consensus label is missing are ``excluded``). Percentages; each expert answers
    each task once, in one permutation (not the three trials of a model)."""
    rows = _check_rank_rows(rank_rows, n_images)
    experts = sorted({r["expert"] for r in rows})
    per: list[dict] = []
    pooled = Counter()
    for e in experts:
        cons = consensus_labels(rows, n_images, exclude_expert=e)
        c = Counter()
        for r in (r for r in rows if r["expert"] == e):
            k = cons[r["task_id"]]
            n = n_images[r["task_id"]]
            b_ok = k.best is not None and int(r["best"]) == k.best
            if k.best is not None:
                c["best_n"] += 1
                c["best_ok"] += b_ok
            w_ok = None
            if n >= 3 and k.worst is not None:
                c["worst_n"] += 1
                w_ok = int(r["worst"]) == k.worst
                c["worst_ok"] += w_ok
            if k.best is None or (n >= 3 and k.worst is None):
                c["excluded"] += 1
            else:
                c["both_n"] += 1
                c["both_ok"] += b_ok and (n == 2 or bool(w_ok))
        pooled.update(c)
        per.append({"expert": e, **_rates(c)})
    return {"experts": per, "pooled": _rates(pooled)}


def _rates(c: Mapping) -> dict:
    def pct(ok, n):
        return round(100.0 * c.get(ok, 0) / c[n], 4) if c.get(n) else None

    return {"best": pct("best_ok", "best_n"), "worst": pct("worst_ok", "worst_n"), "both": pct("both_ok", "both_n"),
            "tasks_best": c.get("best_n", 0), "tasks_worst": c.get("worst_n", 0), "tasks_both": c.get("both_n", 0),
            "excluded": c.get("excluded", 0)}


def direct_ranks(n: int, best: int, worst: int | None) -> list[int]:
    """The (partial) ranking a best/worst answer induces, as a score per stored position:
    best 2, worst 0, the others tied at 1 (2-image task: best 1, the other 0)."""
    if n == 2:
        return [1 if i == best else 0 for i in (1, 2)]
    return [2 if i == best else 0 if i == worst else 1 for i in range(1, n + 1)]


def score_labels(scores: list[float]) -> tuple[int | None, int | None]:
    """Best/worst a score vector induces: the unique highest / lowest score; a tie gives None
    (a tied top is *not* a choice, so it never counts as self-consistent)."""
    hi, lo = max(scores), min(scores)
    best = [i + 1 for i, s in enumerate(scores) if s == hi]
    worst = [i + 1 for i, s in enumerate(scores) if s == lo]
    return (best[0] if len(best) == 1 else None,
            worst[0] if len(worst) == 1 and len(scores) >= 3 else None)


def scores_vs_ranking(rank_rows: Iterable[Mapping], score_rows: Iterable[Mapping], n_images: Mapping[str, int]) -> dict:
    """The paper's scores-vs-ranking study, per expert and overall.

    For every (expert, task) with both a direct answer and scores: Kendall tau-b (scipy; ties
    handled) between the scores and the direct (partial) ranking of :func:`direct_ranks`; undefined
    (all scores equal) taus are counted in ``tau_undefined`` and left out of the means. Top-1
    self-consistency: the share of those pairs whose unique top score is the image the expert named
    best. Also the agreement (Krippendorff/Fleiss) of score-induced best labels, to set beside the
    agreement of direct labels."""
    from scipy.stats import kendalltau

    rank = {(r["expert"], r["task_id"]): r for r in _check_rank_rows(rank_rows, n_images)}
    per: dict[str, Counter] = defaultdict(Counter)
    taus: dict[str, list[float]] = defaultdict(list)
    induced: list[dict] = []
    seen = set()
    for s in score_rows:
        who, tid, scores = s["expert"], s["task_id"], [float(x) for x in s["scores"]]
        if tid not in n_images:
            raise PeopleError(f"score answer of expert {who!r} names unknown task {tid!r}")
        if (who, tid) in seen:
            raise PeopleError(f"expert {who!r} scored task {tid!r} twice")
        seen.add((who, tid))
        if len(scores) != n_images[tid] or any(not 0 <= x <= 10 for x in scores):
            raise PeopleError(f"task {tid!r}, expert {who!r}: needs {n_images[tid]} scores in 0..10, got {scores}")
        b, w = score_labels(scores)
        induced.append({"expert": who, "task_id": tid, "best": b, "worst": w})
        r = rank.get((who, tid))
        if r is None:
            continue
        c = per[who]
        c["pairs"] += 1
        c["top1"] += b is not None and b == int(r["best"])
        tau = kendalltau(scores, direct_ranks(n_images[tid], int(r["best"]),
                                              None if r.get("worst") is None else int(r["worst"]))).statistic
        if math.isfinite(tau):
            taus[who].append(float(tau))
        else:
            c["tau_undefined"] += 1
    experts = []
    all_taus: list[float] = []
    tot = Counter()
    for e in sorted(per):
        c = per[e]
        tot.update(c)
        all_taus += taus[e]
        experts.append({"expert": e, "pairs": c["pairs"], "mean_tau": _mean(taus[e]),
                        "tau_undefined": c["tau_undefined"], "top1_consistency": round(100.0 * c["top1"] / c["pairs"], 4)})
    return {"experts": experts, "pairs": tot["pairs"], "mean_tau": _mean(all_taus),
            "tau_undefined": tot["tau_undefined"],
            "top1_consistency": round(100.0 * tot["top1"] / tot["pairs"], 4) if tot["pairs"] else None,
            "agreement_direct_best": agreement(rank.values(), "best"),
            "agreement_scores_best": agreement(induced, "best")}


def _mean(xs: list[float]) -> float | None:
    return round(float(np.mean(xs)), 6) if xs else None
