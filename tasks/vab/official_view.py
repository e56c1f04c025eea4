"""The official toolkit's two metrics, per judge and prompt type, for the report page (pure, no I/O).

``official_scores(tasks, trials)`` is the page's one interface to them: it takes the pinned tasks
and the ``vab_trials`` rows (a pyarrow Table or dicts; a ``prompt_type`` column where there is one,
else every row is our combined best-and-worst prompt) and returns, per judge and prompt type,
``p3`` (pass^3: right in all three trials) and ``ap1`` (avg pass@1: the mean over trials of that
trial's accuracy) as fractions 0-1, for best, worst and both.

- The official prompt types (``pick_best``, ``pick_worst``, ``pick_best_and_worst``) are scored
  by tasks.vab.official (``official_trials``, ``prompt_type_scores``), the code `vab summarize`
  uses and tests against summarize.py's own output: the page's numbers are summarize.py's, a
  2-image task's pick_worst included (eval.py asks it on every task; the worst of 2 images is the
  one not labelled best). A prompt type with no counted task has no row (summarize.py writes 0).
- Our combined prompt (``combined``; rows without an official prompt type), which summarize.py
  never sees, is scored here by summarize.py's best-and-worst rules: error rows dropped, a task of
  only errors left out of the total; only trials with a parsed answer (state ``ok``) are *valid*;
  p^3 needs 3+ valid trials, all right; ap@1 counts valid trials only (an unparsable answer lowers
  p^3 but not ap@1); a 2-image task's worst is the image not named best, so its worst and both are
  right exactly when its best is; ap@1 averages the trials (0, 1, 2) that have a valid answer.
- A judge that answers once (a person) gets ap@1 over that one trial and no p^3 (None).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from schemas.vab import OFFICIAL_PROMPT_TYPES, PICK_BEST, PICK_BEST_AND_WORST, PICK_WORST, TRIALS, VabTask
from tasks.vab.official import official_trials, prompt_type_scores

COMBINED = "combined"  # our own prompt (vab-best-worst-v1): rows without a prompt_type
PROMPT_TYPE_ORDER = (PICK_BEST, PICK_WORST, PICK_BEST_AND_WORST, COMBINED)


def _rows(trials: Any) -> list[dict]:
    if hasattr(trials, "to_pylist"):
        return trials.to_pylist()
    return [dict(r) for r in trials]


def _right(row: dict, task: VabTask) -> tuple[bool, bool]:
    """(best right, worst right) of one answered trial; a 2-image task's worst is the other image."""
    best = row["state"] == "ok" and row.get("best") == task.best
    if task.worst is None:
        return best, best
    return best, row["state"] == "ok" and row.get("worst") == task.worst


def _score_group(task: VabTask, rows: list[dict]) -> dict | None:
    """One task of our combined prompt: None when left out (no non-error row); else the p^3 flags
    and the per-trial (trial, best, worst) outcomes that count toward ap@1 (summarize.py's
    best-and-worst rule: only parsed answers count)."""
    if all(r["state"] == "error" for r in rows):
        return None
    counted = [r for r in rows if r["state"] == "ok"]
    per_trial = [(int(r["trial"]), *_right(r, task)) for r in counted]
    has_all = len(counted) >= TRIALS
    best = has_all and all(b for _, b, _ in per_trial)
    worst = has_all and all(w for _, _, w in per_trial)
    return {"p3_best": best, "p3_worst": worst, "p3_both": best and worst, "trials": per_trial}


def _ap1(groups: list[dict], key: int) -> float | None:
    """Mean over trial numbers of that trial's accuracy (``key`` 1 best, 2 worst, 3 both)."""
    right: dict[int, int] = defaultdict(int)
    total: dict[int, int] = defaultdict(int)
    for g in groups:
        for trial, b, w in g["trials"]:
            total[trial] += 1
            right[trial] += {1: b, 2: w, 3: b and w}[key]
    accs = [right[t] / total[t] for t in sorted(total)]
    return sum(accs) / len(accs) if accs else None


def official_scores(tasks: Sequence[VabTask], trials: Any) -> dict[str, dict[str, dict]]:
    """``{judge: {prompt_type: {"tasks", "trials_per_task", "p3_best", "p3_worst", "p3_both",
    "ap1_best", "ap1_worst", "ap1_both"}}}`` (fractions 0-1, None where undefined), prompt types
    in PROMPT_TYPE_ORDER. ``pick_best`` has no worst, ``pick_worst`` no best. The official prompt
    types are scored by tasks.vab.official (the numbers `vab summarize` gives); our combined prompt
    here. Raises ValueError naming a row whose task is not in the collection."""
    by_id = {t.task_id: t for t in tasks}
    by_judge: dict[str, list[dict]] = defaultdict(list)
    for r in _rows(trials):
        if r["task_id"] not in by_id:
            raise ValueError(f"judge {r['judge']!r}: task {r['task_id']!r} is not in the set collection")
        by_judge[r["judge"]].append(r)
    out: dict[str, dict[str, dict]] = {}
    for judge in sorted(by_judge):
        rows = by_judge[judge]
        one_trial = all(r.get("judge_kind") == "human" for r in rows)  # a panel expert answers each task once: no p^3
        scored: dict[str, dict] = {}
        for ptype, res in prompt_type_scores(official_trials(tasks, rows)).items():
            if one_trial:
                res.update(p3_best=None, p3_worst=None, p3_both=None)
            scored[ptype] = {"tasks": res.pop("tasks"), "trials_per_task": 1 if one_trial else TRIALS, **res}
        ours: dict[str, list[dict]] = defaultdict(list)
        for r in rows:
            if r.get("prompt_type") not in OFFICIAL_PROMPT_TYPES:
                ours[(r.get("prompt_type") or COMBINED, r["task_id"])].append(r)
        groups: dict[str, list[dict]] = defaultdict(list)
        for (ptype, tid), task_rows in ours.items():
            g = _score_group(by_id[tid], task_rows)
            if g is not None:
                groups[ptype].append(g)
        for ptype, gs in groups.items():
            n = len(gs)

            def p3(key: str) -> float | None:
                return None if one_trial else sum(g[key] for g in gs) / n

            scored[ptype] = {"tasks": n, "trials_per_task": 1 if one_trial else TRIALS,
                             "p3_best": p3("p3_best"), "p3_worst": p3("p3_worst"), "p3_both": p3("p3_both"),
                             "ap1_best": _ap1(gs, 1), "ap1_worst": _ap1(gs, 2), "ap1_both": _ap1(gs, 3)}
        if scored:
            out[judge] = {p: scored[p] for p in sorted(scored, key=lambda p: (
                PROMPT_TYPE_ORDER.index(p) if p in PROMPT_TYPE_ORDER else 99, p))}
    return out
