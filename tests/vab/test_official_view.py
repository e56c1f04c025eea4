"""The official toolkit's p^3 and ap@1 as the report page shows them (tasks.vab.official_view),
against cases computed by hand from summarize.py's rules: errors left out (a task of only errors
leaves the total), unparsable answers wrong in p^3 but outside best-and-worst's ap@1, a 2-image
task's worst derived from its best, one-trial judges with ap@1 only."""

from __future__ import annotations

import pytest

from tasks.vab.official_view import official_scores
from tests.vab.test_metrics import TASKS, _right, _row


def _typed(rows, ptype):
    return [dict(r, prompt_type=ptype) for r in rows]


def _err(judge, tid, trial):
    return _row(judge, tid, trial, None, None, state="error")


def test_combined_prompt_by_hand():
    t4_worst_wrong = dict(_right("T4", 1), worst=3)  # best right (2), worst 3 instead of 1
    rows = ([_right("T1", k) for k in range(3)]  # all right
            + [_right("T2", 0), _row("right", "T2", 1, None, None, "unparsable"), _right("T2", 2)]  # 2 valid trials
            + [dict(_err("right", "T3", k)) for k in range(3)]  # only errors: left out
            + [_right("T4", 0), t4_worst_wrong, _err("right", "T4", 2)])
    s = official_scores(TASKS, rows)["right"]["combined"]
    assert s["tasks"] == 3 and s["trials_per_task"] == 3
    # p^3: only T1 has 3 valid trials, all right
    assert (s["p3_best"], s["p3_worst"], s["p3_both"]) == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    # ap@1 over valid trials: trial 0 {T1, T2, T4} all right; trial 1 {T1, T4}: worst 1/2; trial 2 {T1, T2}
    assert s["ap1_best"] == pytest.approx(1.0)
    assert s["ap1_worst"] == pytest.approx((1 + 0.5 + 1) / 3)
    assert s["ap1_both"] == pytest.approx((1 + 0.5 + 1) / 3)


def test_two_image_worst_is_the_image_not_named_best():
    wrong = _row("j", "T2", 0, 1, None)  # T2 (best = stored 2) shown [1, 2] in trial 0: names stored 1
    rows = [wrong] + [dict(_right("T2", k), judge="j") for k in (1, 2)]
    s = official_scores(TASKS, rows)["j"]["combined"]
    assert s["tasks"] == 1 and s["p3_both"] == 0.0 and s["p3_worst"] == 0.0
    assert s["ap1_worst"] == pytest.approx(2 / 3) == s["ap1_best"] == s["ap1_both"]


def test_the_three_official_prompt_types_by_hand():
    best_rows = _typed([_right("T1", 0), _row("right", "T1", 1, None, None, "unparsable"), _right("T1", 2)]
                       + [_err("right", "T2", k) for k in range(3)], "pick_best")
    # T2 has 2 images and no worst label: eval.py asks pick_worst all the same, the worst being the image
    # not labelled best (stored 1): right in trials 0 and 2, trial 1 names the best (stored 2) -> wrong
    t2_worst = [_row("right", "T2", 0, None, 1), _row("right", "T2", 1, None, 1), _row("right", "T2", 2, None, 2)]
    worst_rows = _typed([_right("T3", k) for k in range(3)] + t2_worst, "pick_worst")
    both_rows = _typed([_right("T4", k) for k in range(3)], "pick_best_and_worst")
    got = official_scores(TASKS, best_rows + worst_rows + both_rows)["right"]
    assert list(got) == ["pick_best", "pick_worst", "pick_best_and_worst"]
    pb = got["pick_best"]
    # pick_best: the unparsable trial is a wrong trial, in p^3 and in ap@1 (trial 1 accuracy 0/1)
    assert (pb["tasks"], pb["p3_best"], pb["ap1_best"]) == (1, 0.0, pytest.approx(2 / 3))
    assert pb["p3_both"] is None and pb["ap1_worst"] is None
    pw = got["pick_worst"]
    assert [r["worst"] for r in t2_worst] == [1, 2, 1]  # T2's orders: [1, 2], [2, 1], [2, 1]
    # T3 right x3, T2 wrong in trial 1: p^3 1/2; ap@1 per trial 2/2, 1/2, 2/2
    assert (pw["tasks"], pw["p3_worst"], pw["ap1_worst"], pw["p3_best"]) == (2, 0.5, pytest.approx(5 / 6), None)
    bw = got["pick_best_and_worst"]
    assert (bw["tasks"], bw["p3_both"], bw["ap1_both"]) == (1, 1.0, 1.0)


def test_a_person_has_ap1_only():
    rows = [dict(_right("T1", 0), judge="expert-1", judge_kind="human"),
            dict(_right("T3", 0), judge="expert-1", judge_kind="human", worst=1)]
    s = official_scores(TASKS, rows)["expert-1"]["combined"]
    assert s["trials_per_task"] == 1 and s["p3_both"] is None and s["p3_best"] is None
    assert (s["tasks"], s["ap1_best"], s["ap1_worst"], s["ap1_both"]) == (2, 1.0, 0.5, 0.5)


def test_unknown_task_is_named():
    with pytest.raises(ValueError, match="task 'T9' is not in the set collection"):
        official_scores(TASKS, [dict(_right("T1", 0), task_id="T9")])


def _same(a, b) -> None:
    """Both absent, or the same number."""
    assert (a is None and b is None) or (a is not None and b is not None and a == pytest.approx(b, abs=1e-12)), (a, b)


def test_the_page_and_vab_summarize_agree_on_random_judges():
    """The report page (official_view) and `vab summarize` (tasks.vab.official, checked against
    summarize.py's own output) compute the same p^3 and ap@1 on the official prompt types."""
    import random

    from tasks.vab.official import judge_scores, official_trials

    rng = random.Random(17)
    for _ in range(60):
        rows = []
        for t in TASKS:
            n = len(t.images)
            for ptype in ("pick_best", "pick_worst", "pick_best_and_worst"):
                for k in range(3):
                    state = rng.choice(["ok", "ok", "ok", "unparsable", "error"])
                    best = rng.randint(1, n) if state == "ok" and ptype != "pick_worst" else None
                    worst = rng.choice([i for i in range(1, n + 1) if i != best]) if state == "ok" and ptype != "pick_best" else None
                    if n == 2 and ptype == "pick_best_and_worst" and best is not None:
                        worst = 3 - best  # 2 images: derived from best, as results_import stores it
                    rows.append(dict(_row("j", t.task_id, k, None, None, state), best=best, worst=worst, prompt_type=ptype))
        page = official_scores(TASKS, rows).get("j", {})
        summary = judge_scores(official_trials(TASKS, rows))
        # a prompt type with no counted task: no row on the page, absent (None) in the summary, never 0
        absent = dict.fromkeys(("p3_best", "p3_worst", "p3_both", "ap1_best", "ap1_worst", "ap1_both"))
        pb, pw, bw = (page.get(p, absent) for p in ("pick_best", "pick_worst", "pick_best_and_worst"))
        _same(pb["p3_best"], summary["pick_best"]["accuracy"])
        _same(pb["ap1_best"], summary["avg_pass_at_1"]["pick_best"])
        _same(pw["p3_worst"], summary.get("pick_worst", {}).get("accuracy"))
        _same(pw["ap1_worst"], summary["avg_pass_at_1"].get("pick_worst"))
        both = summary["pick_best_and_worst"]
        for a, b in zip((bw["p3_best"], bw["p3_worst"], bw["p3_both"]), (both["accuracy_best"], both["accuracy_worst"], both["accuracy_both"])):
            _same(a, b)
        _same(bw["ap1_both"], summary["avg_pass_at_1"]["pick_best_and_worst_both"])
        # the breakdowns by image count too: the 2-image tasks (T2) and the others
        for n, want in summary["by_n_images"].items():
            sub = [t for t in TASKS if str(len(t.images)) == n]
            part = official_scores(sub, [r for r in rows if r["task_id"] in {t.task_id for t in sub}]).get("j", {})
            _same(part.get("pick_best", absent)["p3_best"], want["pick_best"])
            _same(part.get("pick_worst", absent)["p3_worst"], want.get("pick_worst"))
            _same(part.get("pick_best_and_worst", absent)["p3_both"], want["pick_best_and_worst_both"])
