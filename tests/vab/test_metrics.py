"""VAB trials and metrics against hand-computed cases (tasks.vab.trials, tasks.vab.metrics)."""

from __future__ import annotations

import math

import pytest

from schemas.vab import VabTask
from tasks.vab.metrics import (
    bootstrap_interval,
    compare_judges,
    identity_is_uncalibrated,
    mcnemar,
    position_bias,
    random_baselines,
    strict_metrics,
    task_outcomes,
    wilson_interval,
)
from tasks.vab.trials import check_order, map_back, map_forward, permutation, trial_orders


def _task(tid, domain, n, best, worst):
    return VabTask(task_id=tid, domain=domain, images=[f"{tid}/{i}.png" for i in range(1, n + 1)], best=best, worst=worst)


TASKS = [
    _task("T1", "photography", 3, 1, 3),
    _task("T2", "fine_art", 2, 2, None),
    _task("T3", "illustration", 4, 4, 2),
    _task("T4", "photography", 3, 2, 1),
]
ORDERS = {
    "T1": [[1, 2, 3], [3, 1, 2], [2, 3, 1]],
    "T2": [[1, 2], [2, 1], [2, 1]],
    "T3": [[1, 2, 3, 4], [4, 3, 2, 1], [4, 1, 3, 2]],
    "T4": [[1, 2, 3], [2, 3, 1], [2, 1, 3]],
}
LABELS = {t.task_id: (t.best, t.worst) for t in TASKS}


def _row(judge, tid, trial, best_shown, worst_shown, state="ok"):
    order = ORDERS[tid][trial]
    return {"sets": "s", "judge": judge, "judge_kind": "vlm", "task_id": tid, "trial": trial, "order": order,
            "best_shown": best_shown, "worst_shown": worst_shown,
            "best": None if best_shown is None else map_back(order, best_shown),
            "worst": None if worst_shown is None else map_back(order, worst_shown), "state": state}


def _right(tid, trial):
    best, worst = LABELS[tid]
    order = ORDERS[tid][trial]
    return _row("right", tid, trial, map_forward(order, best), None if worst is None else map_forward(order, worst))


ROWS = (
    [_right(t, k) for t in ORDERS for k in range(3)]
    # always the first shown image as best, the last shown as worst
    + [_row("slot1", t, k, 1, None if len(ORDERS[t][0]) == 2 else len(ORDERS[t][0])) for t in ORDERS for k in range(3)]
    # right on T1, T2; T3 worst wrong in trial 2; T4: trial 0 right, trial 1 unparsable, trial 2 missing
    + [_right(t, k) for t in ("T1", "T2") for k in range(3)]
    + [_right("T3", 0), _right("T3", 1), _row("mostly", "T3", 2, map_forward(ORDERS["T3"][2], 4), map_forward(ORDERS["T3"][2], 1)),
       _right("T4", 0), _row("mostly", "T4", 1, None, None, state="unparsable")]
)
ROWS = ROWS[:24] + [dict(r, judge="mostly") for r in ROWS[24:]]


def test_trials_orders_are_reproducible_permutations():
    assert permutation("task-1", 4, 0) == [1, 2, 3, 4]
    # Pinned: the first scheme, kept for collections pinned before the official one
    assert permutation("task-1", 4, 1, "imagebench-sha256-v1") == [2, 1, 4, 3]
    assert permutation("task-1", 4, 2, "imagebench-sha256-v1") == [4, 2, 1, 3]
    for scheme in ("vab-official-v1", "imagebench-sha256-v1"):
        for tid in ("a", "b", "x:7"):
            for n in range(2, 7):
                for order in trial_orders(tid, n, scheme):
                    assert sorted(order) == list(range(1, n + 1))
    with pytest.raises(ValueError, match="unknown trial scheme"):
        permutation("t", 3, 1, "mine")
    assert map_back([3, 1, 2], 1) == 3 and map_back([3, 1, 2], 3) == 2
    with pytest.raises(ValueError, match="out of range 1..3"):
        map_back([3, 1, 2], 4)
    with pytest.raises(ValueError, match="trial must be 0..2"):
        permutation("t", 3, 3)
    with pytest.raises(ValueError, match="2 to 6 images"):
        permutation("t", 7, 1)
    with pytest.raises(ValueError, match="not a permutation of 1..3"):
        check_order([1, 1, 2], 3)


def test_strict_and_single_trial_metrics_by_hand():
    m = strict_metrics(TASKS, ROWS, n_resamples=200)
    assert sorted(m) == ["mostly", "right", "slot1"]
    r = m["right"]
    assert (r["strict_best"], r["strict_worst"], r["strict_both"], r["single_both"], r["tasks"]) == (100.0, 100.0, 100.0, 100.0, 4)
    # Wilson at 4 of 4 (hand: centre (1 + z²/8)/(1 + z²/4) = .75506, half-width .24494): not [100, 100]
    assert r["strict_both_ci"] == pytest.approx((51.0109, 100.0), abs=1e-3)
    assert r["strict_both_boot"] == (100.0, 100.0)  # the bootstrap beside it, degenerate at the edge
    assert r["trials_per_task"] == 3 and r["uncalibrated"] is False
    s = m["slot1"]
    assert (s["strict_best"], s["strict_worst"], s["strict_both"]) == (0.0, 0.0, 0.0)
    assert s["single_best"] == pytest.approx(100 * 7 / 12)
    assert s["single_worst"] == pytest.approx(100 * 3 / 9)
    assert s["single_both"] == pytest.approx(100 * 5 / 12)
    o = m["mostly"]
    assert o["strict_best"] == 75.0 and o["strict_worst"] == pytest.approx(100 / 3) and o["strict_both"] == 50.0
    assert o["single_best"] == pytest.approx(100 * 10 / 12)
    assert o["single_worst"] == pytest.approx(100 * 6 / 9)
    assert o["single_both"] == pytest.approx(75.0)
    assert o["missing_trials"] == 1 and o["invalid_trials"]["unparsable"] == 1
    # by domain and by set size
    assert o["by_domain"]["photography"]["strict_both"] == 50.0  # T1 right, T4 wrong
    assert o["by_domain"]["fine_art"]["strict_worst"] is None  # only a 2-image task
    assert o["by_size"][3]["tasks"] == 2 and o["by_size"][4]["strict_best"] == 100.0 and o["by_size"][4]["strict_both"] == 0.0
    lo, hi = o["strict_both_ci"]
    assert 0.0 <= lo <= 50.0 <= hi <= 100.0


def test_position_bias_by_hand():
    pb = position_bias(TASKS, ROWS, "slot1")
    assert pb["by_size"][3]["counts"] == [6, 0, 0]
    assert pb["by_size"][3]["rates"] == [100.0, 0.0, 0.0]
    assert pb["by_size"][3]["uniform"] == pytest.approx(100 / 3)
    # chi-square with 2 degrees of freedom: statistic 12, p = exp(-12 / 2)
    assert pb["by_size"][3]["p_value"] == pytest.approx(math.exp(-6))
    assert pb["by_size"][2]["counts"] == [3, 0] and pb["by_size"][4]["counts"] == [3, 0, 0, 0]
    pooled = pb["pooled"]
    assert pooled["counts"] == [12, 0, 0, 0]
    # expected per slot: 6/3 + 3/2 + 3/4, the same for slot 2, 6/3 + 3/4, 3/4 (of 12 answers)
    assert pooled["uniform"] == pytest.approx([100 * 4.25 / 12, 100 * 4.25 / 12, 100 * 2.75 / 12, 100 * 0.75 / 12])
    right = position_bias(TASKS, ROWS, "right")
    assert sum(right["pooled"]["counts"]) == 12
    worst = position_bias(TASKS, ROWS, "slot1", what="worst")
    assert worst["by_size"][3]["counts"] == [0, 0, 6] and 2 not in worst["by_size"]


def test_random_baselines_by_hand():
    b = random_baselines(TASKS)
    assert b["by_size"][2]["strict_best"] == pytest.approx(12.5) and b["by_size"][2]["strict_worst"] is None
    assert b["by_size"][3]["single_both"] == pytest.approx(100 / 6)
    assert b["by_size"][3]["strict_both"] == pytest.approx(100 / 216)
    assert b["by_size"][4]["strict_both"] == pytest.approx(100 / 1728)
    # mean over the 4 tasks of (1/216, 1/8, 1/1728, 1/216)
    assert b["overall"]["strict_both"] == pytest.approx(100 * 233 / 6912)


def test_mcnemar_and_compare_by_hand():
    assert mcnemar([True] * 4, [False] * 4)["p_value"] == pytest.approx(0.125)  # 2 * (1/2)^4
    c = compare_judges(TASKS, ROWS, "mostly", "right")
    assert (c["only_a"], c["only_b"], c["both"], c["neither"]) == (0, 2, 2, 0)
    assert c["p_value"] == pytest.approx(0.5) and c["a_pct"] == 50.0 and c["b_pct"] == 100.0
    w = compare_judges(TASKS, ROWS, "right", "slot1", "strict_worst")
    assert w["tasks"] == 3 and w["only_a"] == 3 and w["p_value"] == pytest.approx(0.25)
    assert mcnemar([True, False], [True, False])["p_value"] == 1.0
    with pytest.raises(ValueError, match="judge 'nobody' has no trials"):
        compare_judges(TASKS, ROWS, "right", "nobody")


def test_bootstrap_interval_and_bad_trials():
    assert bootstrap_interval([True, True, True]) == (100.0, 100.0)
    assert bootstrap_interval([True, False], [False, False]) is None
    a = bootstrap_interval([True, False, True, False, True], seed=3, n_resamples=500)
    assert a == bootstrap_interval([True, False, True, False, True], seed=3, n_resamples=500)
    assert 0.0 <= a[0] < 60.0 < a[1] <= 100.0
    with pytest.raises(ValueError, match="task 'T9' is not in the set collection"):
        task_outcomes(TASKS, [dict(ROWS[0], task_id="T9")], "right")
    with pytest.raises(ValueError, match="task 'T1': trial 0 is recorded twice"):
        task_outcomes(TASKS, [ROWS[0], ROWS[0]], "right")


def test_human_judges_are_scored_on_their_one_trial():
    """A panel expert sees each task once (trial 0, their own permutation): strict = that trial."""
    rows = [dict(_right(t, 0), judge="expert-1", judge_kind="human") for t in ("T1", "T2", "T3")]
    rows[2]["worst"] = 1  # T3: worst wrong
    m = strict_metrics(TASKS, rows, n_resamples=50)["expert-1"]
    # T1, T2 right; T3 best only; T4 not answered (wrong)
    assert (m["strict_best"], m["strict_worst"], m["strict_both"]) == (75.0, pytest.approx(100 / 3), 50.0)
    assert m["single_both"] == 50.0 and m["missing_trials"] == 1
    # the same rows from a machine judge: trials 1 and 2 are missing, nothing is strict
    assert m["trials_per_task"] == 1
    # its one-trial interval is Wilson over the 4 tasks at 2 of 4 right
    assert m["single_both_ci"] == pytest.approx(wilson_interval(2, 4))
    machine = strict_metrics(TASKS, [dict(r, judge_kind="vlm") for r in rows], n_resamples=50)["expert-1"]
    assert machine["strict_best"] == 0.0 and machine["missing_trials"] == 12 - 3 and machine["trials_per_task"] == 3


def test_wilson_interval_is_honest_at_the_edges():
    """Textbook values (Wilson 1927; e.g. Newcombe 1998, table I): 0/10 -> [0, 27.75], 10/10 ->
    [72.25, 100], 5/10 -> [23.66, 76.34]; by hand 3/3 -> [43.850, 100]."""
    assert wilson_interval(0, 10) == pytest.approx((0.0, 27.753), abs=1e-3)
    assert wilson_interval(10, 10) == pytest.approx((72.247, 100.0), abs=1e-3)
    assert wilson_interval(5, 10) == pytest.approx((23.659, 76.341), abs=1e-3)
    assert wilson_interval(3, 3)[0] == pytest.approx(43.850, abs=1e-3)
    assert wilson_interval(0, 0) is None
    with pytest.raises(ValueError, match="successes must be within 0..3"):
        wilson_interval(4, 3)
    # a fractional count (one-trial accuracy as a mean over trials) sits between its neighbours
    lo, hi = wilson_interval(2.5, 10)
    assert wilson_interval(2, 10)[0] < lo < wilson_interval(3, 10)[0] and wilson_interval(2, 10)[1] < hi < wilson_interval(3, 10)[1]


def test_uncalibrated_flag_is_read_from_the_stored_identity():
    hps = '{"identity":{"base_model":"tiny","uncalibrated":true},"judge":"hpsv3","kind":"scalar","scorer":"hpsv3"}'
    assert identity_is_uncalibrated(hps)
    assert not identity_is_uncalibrated(hps.replace("true", "false"))
    assert not identity_is_uncalibrated('{"note": "uncalibrated: true"}')  # words are not the flag
    assert not identity_is_uncalibrated("not json") and not identity_is_uncalibrated(None)
    rows = [dict(_right(t, k), judge_identity=hps) for t in ORDERS for k in range(3)]
    assert strict_metrics(TASKS, rows, n_resamples=20)["right"]["uncalibrated"] is True
