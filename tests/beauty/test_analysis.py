"""tasks.beauty.analysis on synthetic answers whose true effects are planted (and on nulls)."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pyarrow as pa
import pytest

from schemas.study import STUDY_ANSWERS, STUDY_INDEX, STUDY_RATES, AnalysisSettings, PreRegistration
from tasks.beauty import analysis as A

T0 = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.timezone.utc)


def answers_table(rows: list[tuple[str, str, str, str, bool]], study_id: str = "s1", source: str = "panel") -> pa.Table:
    """rows: (judge, group, tool, prompt, yes)."""
    n = len(rows)
    return pa.table(
        {
            "study_id": [study_id] * n,
            "judge_id": [r[0] for r in rows],
            "panel_group": [r[1] for r in rows],
            "tool": [r[2] for r in rows],
            "prompt_id": [r[3] for r in rows],
            "image_id": [None] * n,
            "position": [None] * n,
            "answer": [r[4] for r in rows],
            "shown_at": [T0] * n,
            "answered_at": [T0 + dt.timedelta(seconds=3)] * n,
            "memo": [False] * n,
            "source": [source] * n,
            "image_loaded": [None] * n,  # quality-control evidence (tasks/beauty/quality.py): none here
            "seconds_on_screen": [None] * n,
            "qc_flag": [None] * n,
        },
        schema=STUDY_ANSWERS,
    )


def synth(tool_eff, prompt_sd, judge_sd, aph_shift, groups, n_prompts, seed, source="panel") -> pa.Table:
    """Answers from a logistic model: logit P(yes) = tool + prompt + judge (+ aph_shift for the
    aphantasia group), every judge sees every (tool, prompt) image."""
    rng = np.random.default_rng(seed)
    prompt = rng.normal(0.0, prompt_sd, n_prompts)
    rows = []
    for g, size in groups.items():
        for k in range(size):
            judge = rng.normal(0.0, judge_sd) + (aph_shift if g == "aphantasia" else 0.0)
            for t, te in enumerate(tool_eff):
                for p in range(n_prompts):
                    eta = te + prompt[p] + judge
                    rows.append((f"{g}-{k}", g, f"tool{t}", f"p{p:02d}", bool(rng.random() < 1 / (1 + math.exp(-eta)))))
    return answers_table(rows, source=source)


def prereg(host=None, praised=(), **analysis) -> PreRegistration:
    return PreRegistration(
        study_id="s1",
        created_at="2026-11-26T12:00:00Z",
        definition_sha256="0" * 64,
        suite="beauty-index-v1",
        suite_sha256="0" * 64,
        hypotheses={},
        analysis=AnalysisSettings(**({"bootstrap_resamples": 400, "permutations": 2000} | analysis)),
        order_seed=1,
        host_tool=host,
        praised_for_aesthetics=list(praised),
    )


def metrics_table(tools, fid=None, hps=None, clip=None) -> pa.Table:
    n = len(tools)
    return pa.table({"tool": list(tools), "fid": fid or [None] * n, "hps_mu": hps or [None] * n, "clip_score": clip or [None] * n})


# ---- yes-rates and the Beauty Index ------------------------------------------------------------
def test_yes_rates_and_index_are_means_of_per_prompt_rates():
    # tool a: p1 3/4 yes, p2 0/2 yes (two judges did not see p2) -> BI (75 + 0) / 2 = 37.5, not 3/6.
    rows = [(f"j{i}", "g", "a", "p1", i < 3) for i in range(4)] + [(f"j{i}", "g", "a", "p2", False) for i in range(2)]
    rows += [(f"j{i}", "g", "b", p, i % 2 == 0) for i in range(4) for p in ("p1", "p2")]
    answers = answers_table(rows)
    rates = A.yes_rates(answers)
    assert rates.schema == STUDY_RATES
    got = {(r["tool"], r["prompt_id"]): (r["answers"], r["yes"], r["yes_rate"]) for r in rates.to_pylist()}
    assert got == {("a", "p1"): (4, 3, 75.0), ("a", "p2"): (2, 0, 0.0), ("b", "p1"): (4, 2, 50.0), ("b", "p2"): (4, 2, 50.0)}
    index = A.beauty_index(answers, resamples=200, seed=3)
    assert index.schema == STUDY_INDEX
    overall = {r["tool"]: r for r in index.to_pylist() if r["panel_group"] == "all"}
    assert overall["a"]["beauty_index"] == pytest.approx(37.5)
    assert overall["b"]["beauty_index"] == pytest.approx(50.0)
    assert (overall["b"]["rank"], overall["a"]["rank"]) == (1, 2)
    assert (overall["a"]["answers"], overall["b"]["answers"]) == (6, 8)
    assert not overall["a"]["simulated"]


def test_beauty_index_intervals_groups_and_reproducibility():
    answers = synth([-1.0, 0.0, 1.0], 0.5, 0.5, 0.0, {"photographers": 5, "aphantasia": 3}, 6, seed=1, source="simulated")
    a = A.beauty_index(answers, resamples=300, seed=7)
    assert a.equals(A.beauty_index(answers, resamples=300, seed=7))  # same seed: same numbers
    assert not a.equals(A.beauty_index(answers, resamples=300, seed=8))
    rows = a.to_pylist()
    assert [(r["panel_group"], r["tool"]) for r in rows] == [(g, f"tool{t}") for g in ("all", "aphantasia", "photographers") for t in range(3)]
    assert all(r["simulated"] for r in rows)  # read from the answers' source column
    for r in rows:
        assert r["beauty_index_lo"] <= r["beauty_index"] <= r["beauty_index_hi"]
    overall = [r for r in rows if r["panel_group"] == "all"]
    assert [r["rank"] for r in overall] == [3, 2, 1]  # the planted order
    assert overall[0]["beauty_index_hi"] < overall[2]["beauty_index_lo"]  # -1 vs +1 logit: separated
    # Group rows use only that group's judges: their answers add up to the overall count.
    for t in range(3):
        assert sum(r["answers"] for r in rows if r["tool"] == f"tool{t}" and r["panel_group"] != "all") == overall[t]["answers"] == 8 * 6


def test_two_way_bootstrap_resamples_judges_within_groups_and_prompts():
    answers = synth([0.0, 0.5], 0.5, 0.5, 0.0, {"photographers": 5, "aphantasia": 3}, 4, seed=2)
    panel = A.panel_from_answers(answers)
    w = A.bootstrap_weights(panel, 50, seed=1)
    groups = np.asarray(panel.judge_groups)
    assert (w.prompts.sum(axis=1) == 4).all()
    assert (w.judges[:, groups == "aphantasia"].sum(axis=1) == 3).all()  # the panel's composition is kept
    assert (w.judges[:, groups == "photographers"].sum(axis=1) == 5).all()
    assert len({tuple(r) for r in w.prompts}) > 1 and len({tuple(r) for r in w.judges}) > 1


@pytest.mark.parametrize(
    "rows, message",
    [
        ([("j1", "g", "a", "p", True), ("j1", "g", "a", "p", False), ("j1", "g", "b", "p", True)], "judge j1 answered (a, p) twice"),
        ([("j1", "g", "a", "p", True), ("j1", "h", "b", "p", True)], "judge j1 appears in panel groups"),
    ],
)
def test_bad_answers_are_refused_with_a_clear_message(rows, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        A.yes_rates(answers_table(rows))


def test_mixed_studies_are_refused():
    t = pa.concat_tables([answers_table([("j", "g", "a", "p", True)], "s1"), answers_table([("j", "g", "b", "p", True)], "s2")])
    with pytest.raises(ValueError, match=r"mixes studies \['s1', 's2'\]"):
        A.beauty_index(t, resamples=100)


def test_holm_matches_the_textbook_procedure():
    from statsmodels.stats.multitest import multipletests

    p = [0.01, 0.04, 0.03, 0.005, 0.2]
    assert A.holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]))
    out = A.holm([0.01, float("nan"), 0.04])  # an untested hypothesis is not in the family
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)


# ---- hypotheses ----------------------------------------------------------------------------
GROUPS = {"photographers": 4, "art-therapists": 4, "aphantasia": 4}


def test_planted_effects_are_detected():
    # Strong tool differences, weak prompts: H3 (tools vary less than prompts) must NOT hold.
    # Aphantasia judges +2 logits. Host = tool0, the worst. Praised tool1: best HPSv3, 2nd worst BI.
    # FID-best = tool0 (BI-worst).
    tools = [-2.0, -1.0, 0.0, 1.0, 2.0]
    answers = synth(tools, 0.2, 0.3, 2.0, GROUPS, 6, seed=11)
    names = [f"tool{t}" for t in range(5)]
    metrics = metrics_table(names, fid=[10.0, 30.0, 40.0, 50.0, 60.0], hps=[1.0, 9.0, 2.0, 3.0, 4.0], clip=[20.0, 30.0, 21.0, 22.0, 23.0])
    res = A.test_hypotheses(answers, prereg(host="tool0", praised=["tool1"]), metrics, mixed_resamples=12)
    by = {r.hypothesis: r for r in res}
    assert [r.hypothesis for r in res] == ["H1", "H2", "H3", "H4", "H5"]
    assert by["H1"].verdict == "supported" and by["H1"].effect < 0  # FID order runs against BI order
    assert by["H2"].verdict == "supported" and by["H2"].effect_lo > 0
    assert by["H3"].verdict == "not supported" and by["H3"].effect > 1
    assert by["H3"].values["var_tool"] > by["H3"].values["var_prompt"]
    assert by["H4"].verdict == "supported" and by["H4"].effect >= 2 and "tool1: Beauty Index rank 4, HPSv3 mu rank 1" in by["H4"].detail
    assert by["H5"].verdict == "supported" and by["H5"].effect == 0.0
    assert by["H5"].headline == "The host lab's own tool, tool0, places 5th of 5 on the Beauty Index."
    # Holm: adjusted p-values are >= the raw ones and every verdict follows alpha.
    for r in res:
        assert r.p_holm >= r.p_value and (r.verdict == "supported") == (r.p_holm < 0.05)
        assert r.effect_lo <= r.effect <= r.effect_hi or r.hypothesis in ("H3", "H4")
    assert A.hypotheses_rows(res)[0]["hypothesis"] == "H1"


def test_nulls_are_not_detected():
    # Tools nearly equal, prompts vary a lot (H3 holds); no aphantasia effect; host tool4 best
    # on every prompt; praised tool4 is also HPSv3-best; FID agrees with the Beauty Index.
    tools = [0.0, 0.05, 0.1, 0.15, 1.5]
    answers = synth(tools, 2.5, 0.3, 0.0, GROUPS, 8, seed=7, source="simulated")
    names = [f"tool{t}" for t in range(5)]
    bi = {r["tool"]: r["beauty_index"] for r in A.beauty_index(answers, resamples=100).to_pylist() if r["panel_group"] == "all"}
    order = sorted(names, key=lambda t: -bi[t])
    fid = [10.0 * (1 + order.index(t)) for t in names]  # FID ranks = BI ranks
    metrics = metrics_table(names, fid=fid, hps=[bi[t] for t in names])
    res = A.test_hypotheses(answers, prereg(host="tool4", praised=["tool4"]), metrics, mixed_resamples=12)
    by = {r.hypothesis: r for r in res}
    assert by["H1"].verdict == "not supported" and by["H1"].effect > 0.6  # tau-b: near-equal tools may tie
    assert by["H2"].verdict == "not supported" and by["H2"].p_value > 0.05
    assert by["H3"].verdict == "supported" and by["H3"].effect_hi < 1
    assert by["H4"].verdict == "not supported" and by["H4"].effect == 0
    assert by["H5"].verdict == "not supported" and by["H5"].effect == 1.0 and by["H5"].headline is None
    assert all(r.simulated for r in res)


def test_hypotheses_without_what_they_need_are_not_tested():
    answers = synth([0.0, 1.0], 0.5, 0.5, 0.0, {"photographers": 3, "art-therapists": 3}, 3, seed=3)
    res = A.test_hypotheses(answers, None, None, mixed_resamples=3)
    by = {r.hypothesis: r for r in res}
    for h, why in (("H1", "no FID"), ("H2", "aphantasia"), ("H4", "no tool declared"), ("H5", "no host tool")):
        assert by[h].verdict == "not tested" and why in by[h].detail and math.isnan(by[h].p_holm)
    assert by["H3"].verdict in ("supported", "not supported")
    assert by["H3"].p_holm == pytest.approx(by["H3"].p_value)  # alone in the family


def test_h2_permutation_p_is_exact_on_a_small_panel():
    # 4 judges, 2 with aphantasia holding the two highest yes-rates: exact p = 1 / C(4, 2).
    rows = []
    for judge, group, n_yes in (("a1", "aphantasia", 4), ("a2", "aphantasia", 3), ("o1", "photographers", 1), ("o2", "photographers", 0)):
        rows += [(judge, group, t, f"p{k}", k < n_yes) for t in ("x", "y") for k in range(4)]
    res = A.test_hypotheses(answers_table(rows), prereg(), None, mixed_resamples=3)
    h2 = res[1]
    assert h2.p_value == pytest.approx(1 / 6)
    assert h2.effect == pytest.approx((100 + 75) / 2 - (25 + 0) / 2)
    assert "exact over all 6 assignments" in h2.detail


# ---- partial panels (issue 16 item 3): every analysis finishes on any study with an answer ------
def test_partial_panel_counts_unfittable_resamples_instead_of_crashing():
    """Judges who stopped halfway: a resample that draws only the all-yes judges has no logistic
    model (statsmodels: "endog values must be 0 and 1, and not all identical"); it is counted and
    reported, and H3 is still tested on the refits that could be fitted."""
    tools, prompts = ("a", "b", "c"), [f"p{k}" for k in range(6)]
    rows = [("full-yes", "photographers", t, p, True) for t in tools for p in prompts]
    rows += [("stopped", "photographers", t, p, (k + len(t)) % 2 == 0) for t in tools for k, p in enumerate(prompts[:2])]
    rows += [("aph-yes", "aphantasia", t, p, True) for t in tools for p in prompts]
    rows += [("aph-mixed", "aphantasia", t, p, (k * 7 + len(t)) % 3 == 0) for t in tools for k, p in enumerate(prompts[:3])]
    answers = answers_table(rows)
    results = {r.hypothesis: r for r in A.test_hypotheses(answers, prereg(host="a"), mixed_resamples=40)}
    h3 = results["H3"]
    assert h3.verdict in ("supported", "not supported"), h3.detail
    failed, tried = int(h3.values["refits_failed"]), int(h3.values["refits_tried"])
    assert tried == 40 and 0 < failed < tried and int(h3.values["refits"]) == tried - failed
    assert f"{failed} of {tried} resamples could not be fitted" in h3.detail
    index = A.beauty_index(answers, resamples=200, seed=3)
    assert index.num_rows == len(tools) * 3  # all + two groups


def test_one_answer_analyses_and_says_why_each_hypothesis_is_not_tested():
    answers = answers_table([("j1", "photographers", "a", "p1", True)])
    assert A.yes_rates(answers).to_pylist()[0]["yes_rate"] == 100.0
    (row, *_), = [A.beauty_index(answers, resamples=100).to_pylist()]
    assert row["beauty_index"] == 100.0 and row["rank"] == 1 and row["beauty_index_hi"] == 100.0
    assert row["beauty_index_lo"] == pytest.approx(20.65, abs=0.01)  # one yes is no certainty: Wilson of 1 of 1
    results = A.test_hypotheses(answers, prereg(host="a", praised=("a",)), mixed_resamples=5)
    by = {r.hypothesis: r for r in results}
    assert by["H3"].verdict == "not tested" and "two tools, two prompts and two judges" in by["H3"].detail
    assert by["H2"].verdict == "not tested" and "aphantasia" in by["H2"].detail
    # the one answer is the host tool's: alone it "wins" every prompt, which is no comparison
    assert by["H5"].verdict == "not tested" and "a win needs a second tool" in by["H5"].detail
    assert all(r.verdict == "not tested" and r.detail for r in results)


def test_all_identical_answers_leave_h3_untested_with_the_reason():
    rows = [(f"j{i}", "photographers", t, p, True) for i in range(3) for t in ("a", "b") for p in ("p1", "p2")]
    h3 = {r.hypothesis: r for r in A.test_hypotheses(answers_table(rows), prereg(), mixed_resamples=5)}["H3"]
    assert h3.verdict == "not tested" and "every answer is yes" in h3.detail
