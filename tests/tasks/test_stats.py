"""Leaderboard statistics: hand-computed Capability, the paired bootstrap, rank bands, compare."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from tasks.scores.eps import eps as scoring_eps
from tasks.scores.intervals import mover_difference, nan_correlation, wilson
from tasks.scores.stats import (
    AXES,
    CapabilityResult,
    bootstrap_draws,
    bootstrap_scores,
    capability,
    capability_breakdown,
    compare,
    effective_verdict,
    effective_verdicts,
    eps_contributions,
    judge_decided,
    pass_values,
    rank_bands,
)

P = 192  # prompts of the suite
ELIGIBLE = np.arange(P) >= 27  # 165 EPS-eligible prompts, as in ImageBench V1


def _bernoulli(rng: np.random.Generator, p: float, n: int = P) -> np.ndarray:
    return (rng.random(n) < p).astype(np.float64)


def _eps_row(rng: np.random.Generator, a: float = 2.0, b: float = 2.0, n: int = P) -> np.ndarray:
    e = rng.beta(a, b, n)
    e[~ELIGIBLE[:n]] = np.nan if n == P else e[~ELIGIBLE[:n]]
    return e


# --------------------------------------------------------------------------------------------
# Capability
# --------------------------------------------------------------------------------------------
def test_capability_hand_computed_undecided_excluded():
    v = ["PASS", "FAIL", "PASS", "ERROR", None, "UNPARSABLE", "PASS"]
    r = capability(v)
    assert r == CapabilityResult(
        capability=75.0, passed=3, failed=1, undecided=3, total=7, coverage=4 / 7, provisional=True, judged=4
    )
    assert r.decided == 4 and type(r.capability) is float


def test_missing_image_fails_alone_are_not_a_judged_capability():
    """Issue 8 item 9: a figure where no judge decided anything is "not judged", with its count."""
    states = ["missing", "quarantined", "ok", "ok", "missing", "ok"]
    raw = [None, "PASS", None, "ERROR", None, "PASS"]
    verdicts = effective_verdicts(states, raw)
    judged = judge_decided(states, raw)
    assert judged == [False, False, False, False, False, True]
    by = capability_breakdown(verdicts, ["a", "a", "a", "a", "b", "b"], judged)
    assert math.isnan(by["a"].capability) and by["a"].judged == 0 and by["a"].counts == "2/4"
    assert by["b"].capability == 50.0 and by["b"].judged == 1 and by["b"].counts == "2/2"
    whole = capability(verdicts[:4], judged[:4])
    assert math.isnan(whole.capability) and (whole.failed, whole.undecided) == (2, 2)
    assert capability(verdicts, judged).capability == pytest.approx(100 / 4)
    with pytest.raises(ValueError, match="judged flags"):
        capability(verdicts, judged[:2])


def test_capability_complete_is_not_provisional():
    r = capability(["PASS", "FAIL", "FAIL", "PASS", "PASS"])
    assert r.capability == 60.0 and r.coverage == 1.0 and not r.provisional and r.undecided == 0


def test_capability_nothing_decided_is_nan_and_nan_means_not_judged():
    r = capability([None, "ERROR", float("nan")])
    assert math.isnan(r.capability) and r.coverage == 0.0 and r.provisional and r.undecided == 3


def test_capability_rejects_unknown_values_naming_them():
    with pytest.raises(ValueError, match=r"'OK'.*'pass'|'pass'.*'OK'"):
        capability(["PASS", "pass", "OK", "FAIL"])
    with pytest.raises(ValueError, match="zero prompts"):
        capability([])
    with pytest.raises(ValueError, match="single string"):
        capability("PASS")
    with pytest.raises(ValueError, match="1"):
        capability(["PASS", 1])


def test_capability_breakdown_hand_computed():
    v = ["PASS", "FAIL", "PASS", "ERROR", "PASS", "FAIL"]
    cats = ["Truthfulness", "Truthfulness", "Human Realism", "Human Realism", "Truthfulness"]
    cats.append("Text Rendering")
    out = capability_breakdown(v, cats)
    assert list(out) == ["Truthfulness", "Human Realism", "Text Rendering"]  # first appearance
    assert out["Truthfulness"].capability == pytest.approx(200 / 3, rel=1e-15)
    assert (out["Truthfulness"].passed, out["Truthfulness"].failed, out["Truthfulness"].total) == (2, 1, 3)
    assert out["Human Realism"].capability == 100.0 and out["Human Realism"].provisional
    assert out["Human Realism"].coverage == 0.5
    assert out["Text Rendering"].capability == 0.0 and not out["Text Rendering"].provisional
    by_diff = capability_breakdown(v, ["easy", "hard", "easy", "easy", "hard", "hard"])
    assert by_diff["easy"].capability == 100.0 and by_diff["hard"].capability == pytest.approx(100 / 3)


def test_capability_breakdown_errors():
    with pytest.raises(ValueError, match="3 verdicts but 2 group labels"):
        capability_breakdown(["PASS", "FAIL", "PASS"], ["a", "b"])
    with pytest.raises(ValueError, match="group label None"):
        capability_breakdown(["PASS", "FAIL"], ["a", None])
    with pytest.raises(ValueError, match="'Pass'"):
        capability_breakdown(["Pass"], ["a"])


def test_missing_and_quarantined_images_are_fail():
    assert effective_verdict("missing", None) == "FAIL"
    assert effective_verdict("quarantined", "PASS") == "FAIL"
    assert effective_verdict("ok", "PASS") == "PASS"
    assert effective_verdict("ok", None) is None
    assert effective_verdict("ok", "ERROR") == "ERROR"
    states = ["ok", "ok", "missing", "quarantined", "ok"]
    verdicts = ["PASS", None, None, "PASS", "UNPARSABLE"]
    mapped = effective_verdicts(states, verdicts)
    assert mapped == ["PASS", None, "FAIL", "FAIL", "UNPARSABLE"]
    r = capability(mapped)
    assert (r.passed, r.failed, r.undecided, r.capability) == (1, 2, 2, pytest.approx(100 / 3))
    with pytest.raises(ValueError, match="'broken'"):
        effective_verdict("broken", "PASS")
    with pytest.raises(ValueError, match="'gone'"):
        effective_verdicts(["ok", "gone"], ["PASS", "PASS"])
    with pytest.raises(ValueError, match="2 image states but 1 verdicts"):
        effective_verdicts(["ok", "ok"], ["PASS"])
    with pytest.raises(ValueError, match="'YES'"):
        effective_verdict("missing", "YES")  # an invalid verdict is refused even when overridden


def test_pass_values():
    out = pass_values(["PASS", "FAIL", None, "ERROR", "UNPARSABLE"])
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [1.0, 0.0, np.nan, np.nan, np.nan])


def test_eps_contributions_match_scoring_eps():
    ids = ["a", "b", "c", "d", "e"]
    eligible = ["b", "c", "d", "e"]
    ref = {"b": 0.0, "c": 2.0, "d": 0.0, "e": 1.0}
    mu = {"a": 9.0, "b": 1.0, "c": 2.0, "d": math.log(3.0)}  # "e" lost
    e = eps_contributions(mu, ref, ids, eligible)
    assert e.dtype == np.float64 and math.isnan(e[0]) and e[4] == 0.0
    assert e[2] == 0.5 and e[3] == pytest.approx(0.75, rel=1e-15)
    assert 100 * np.nanmean(e) == pytest.approx(scoring_eps(mu, ref, eligible).eps, rel=1e-14)
    with pytest.raises(ValueError, match="mu_ref"):
        eps_contributions(mu, {"b": 0.0}, ids, eligible)
    with pytest.raises(ValueError, match="non-finite mu"):
        eps_contributions({"b": math.inf}, ref, ids, eligible)
    with pytest.raises(ValueError, match="not in prompt_ids"):
        eps_contributions(mu, ref, ids, ["zz"])
    with pytest.raises(ValueError, match="no EPS-eligible"):
        eps_contributions(mu, ref, ids, [])


# --------------------------------------------------------------------------------------------
# Bootstrap
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def field():
    """Five models on the 192-prompt suite with some undecided verdicts and lost images."""
    rng = np.random.default_rng(42)
    models = ["m-a", "m-b", "m-c", "m-d", "m-e"]
    pv = np.stack([_bernoulli(rng, p) for p in (0.3, 0.5, 0.55, 0.8, 0.95)])
    pv[rng.random(pv.shape) < 0.05] = np.nan  # undecided
    ev = np.stack([_eps_row(rng, a, 2.0) for a in (1.0, 2.0, 2.0, 3.0, 6.0)])
    ev[0, 100:110] = 0.0  # lost images
    return models, pv, ev


def test_bootstrap_point_estimates_and_intervals_contain_them(field):
    models, pv, ev = field
    out = bootstrap_scores(models, pv, ev, ELIGIBLE, n_resamples=1000, seed=3)
    assert list(out) == models
    for m, row_p, row_e in zip(models, pv, ev):
        iv = out[m]
        verdicts = ["PASS" if x == 1 else "FAIL" if x == 0 else None for x in row_p]
        assert iv.estimate.capability == capability(verdicts).capability
        # EPS estimate = tasks.scores.eps.eps of a model whose mu is logit(e) against mu_ref = 0
        # (a contribution of 0.0 is a lost image: no mu).
        ids = [str(i) for i in range(P) if ELIGIBLE[i]]
        mu = {str(i): math.log(x / (1 - x)) for i, x in enumerate(row_e) if ELIGIBLE[i] and x > 0}
        ref = {p: 0.0 for p in ids}
        assert len(mu) < len(ids) if m == "m-a" else len(mu) == len(ids)
        assert iv.estimate.eps == pytest.approx(scoring_eps(mu, ref, ids).eps, rel=1e-13)
        assert iv.estimate.overall == 0.5 * iv.estimate.capability + 0.5 * iv.estimate.eps
        for axis in AXES:
            lo, hi = iv[axis]
            est = getattr(iv.estimate, axis)
            assert 0.0 <= lo < est < hi <= 100.0, (m, axis, lo, est, hi)
            assert type(lo) is float


def test_bootstrap_is_deterministic_and_seeded(field):
    models, pv, ev = field
    a = bootstrap_draws(models, pv, ev, ELIGIBLE, n_resamples=300, seed=7)
    b = bootstrap_draws(models, pv, ev, ELIGIBLE, n_resamples=300, seed=7)
    c = bootstrap_draws(models, pv, ev, ELIGIBLE, n_resamples=300, seed=8)
    np.testing.assert_array_equal(a.draws, b.draws)
    np.testing.assert_array_equal(a.ci, b.ci)
    assert not np.array_equal(a.draws, c.draws)
    assert a.draws.shape == (3, 5, 300) and a.draws.dtype == np.float64


def test_a_models_intervals_depend_only_on_its_own_data(field):
    """Same seed: a model's draws are bit-identical alone, in a field, or in another order."""
    models, pv, ev = field
    joint = bootstrap_draws(models, pv, ev, ELIGIBLE, n_resamples=500, seed=1)
    alone = bootstrap_draws(["m-c"], pv[2:3], ev[2:3], ELIGIBLE, n_resamples=500, seed=1)
    rev = bootstrap_draws(models[::-1], pv[::-1], ev[::-1], ELIGIBLE, n_resamples=500, seed=1)
    np.testing.assert_array_equal(alone.draws[:, 0], joint.draws[:, 2])
    np.testing.assert_array_equal(rev.draws[:, 2], joint.draws[:, 2])
    assert alone.intervals()["m-c"] == joint.intervals()["m-c"]


def test_intervals_are_wilson_and_bootstrap_variance_and_overall_is_coherent(field):
    """Capability: Wilson of PASS / decided; EPS and Overall: from the draws' variance (issue 26
    item 4). Inside (0, 100), 192 prompts, they agree with the percentile interval to a point."""
    models, pv, ev = field
    d = bootstrap_draws(models, pv, ev, ELIGIBLE, n_resamples=2000, confidence=0.9, seed=2)
    np.testing.assert_array_equal(d.draws[2], 0.5 * d.draws[0] + 0.5 * d.draws[1])
    decided = ~np.isnan(pv)
    lo, hi = wilson(np.nansum(pv, axis=1), decided.sum(axis=1), 0.9)
    np.testing.assert_allclose(d.ci[0], 100 * np.stack([lo, hi], axis=-1), rtol=0, atol=1e-12)
    alpha = (1 - 0.9) / 2
    q = np.quantile(d.draws, [alpha, 1 - alpha], axis=-1)
    np.testing.assert_allclose(d.ci[..., 0], q[0], rtol=0, atol=1.5)
    np.testing.assert_allclose(d.ci[..., 1], q[1], rtol=0, atol=1.5)


def test_eps_ignores_non_eligible_prompts_capability_counts_them(field):
    models, pv, ev = field
    ev2 = ev.copy()
    ev2[:, ~ELIGIBLE] = 0.123  # ignored
    a = bootstrap_draws(models, pv, ev, ELIGIBLE, n_resamples=200)
    b = bootstrap_draws(models, pv, ev2, ELIGIBLE, n_resamples=200)
    np.testing.assert_array_equal(a.draws, b.draws)
    pv2 = pv.copy()
    pv2[:, ~ELIGIBLE] = 1.0  # Capability uses every prompt
    c = bootstrap_draws(models, pv2, ev, ELIGIBLE, n_resamples=200)
    assert (c.estimate[0] > a.estimate[0]).all()
    np.testing.assert_array_equal(c.draws[1], a.draws[1])  # EPS unchanged


def test_intervals_shrink_with_more_prompts():
    rng = np.random.default_rng(5)
    widths = []
    for n in (48, 768):
        pv = _bernoulli(rng, 0.6, n)[None]
        ev = rng.beta(2, 2, n)[None]
        iv = bootstrap_scores(["m"], pv, ev, None, n_resamples=1000)["m"]
        widths.append({a: iv[a][1] - iv[a][0] for a in AXES})
    for a in AXES:  # 16x the prompts: about a quarter of the width
        assert 0.15 < widths[1][a] / widths[0][a] < 0.4, (a, widths)


def test_bootstrap_is_paired_across_models():
    """B = A - 0.1 on every prompt: every resample shifts EPS by exactly 10 points."""
    rng = np.random.default_rng(11)
    ea = rng.uniform(0.2, 0.9, P)
    eb = ea - 0.1
    pv = np.stack([_bernoulli(rng, 0.5), _bernoulli(rng, 0.5)])
    d = bootstrap_draws(["a", "b"], pv, np.stack([ea, eb]), None, n_resamples=1000)
    np.testing.assert_allclose(d.draws[1, 0] - d.draws[1, 1], 10.0, rtol=0, atol=1e-9)
    # each model's own interval is several points wide ...
    assert d.ci[1, 0, 1] - d.ci[1, 0, 0] > 3.0
    c = compare(ea, eb, axis="eps", n_resamples=1000)
    assert c.diff == pytest.approx(10.0, abs=1e-9)
    # The draws move together (correlation 1): the two intervals' widths cancel but for the
    # logit interval's asymmetry, a few hundredths of a point.
    assert c.ci == (pytest.approx(10.0, abs=0.1), pytest.approx(10.0, abs=0.1))
    assert c.p_a_beats_b == 1.0
    # ... and an unpaired bootstrap of the same difference would be wide.
    unpaired = scipy.stats.bootstrap(
        (ea, eb), lambda x, y, axis: 100 * (x.mean(axis) - y.mean(axis)), paired=False,
        method="percentile", n_resamples=1000, rng=0,
    ).confidence_interval
    assert unpaired.high - unpaired.low > 4.0


@pytest.mark.parametrize(
    ("axis", "truth"),
    [("capability", 70.0), ("eps", 100 * 2 / 7)],  # Bernoulli(0.7); Beta(2, 5) has mean 2/7
)
def test_95_percent_interval_covers_the_truth_about_95_percent_of_the_time(axis, truth):
    rng = np.random.default_rng(2024)
    reps, hits = 200, 0
    k = AXES.index(axis)
    for r in range(reps):
        pv = _bernoulli(rng, 0.7)[None]
        ev = rng.beta(2.0, 5.0, P)[None]
        d = bootstrap_draws(["m"], pv, ev, None, n_resamples=1000, seed=r)
        lo, hi = d.ci[k, 0]
        hits += lo <= truth <= hi
    # Binomial sd over 200 repetitions: 1.5 points. An 80% interval fails both axes; a 90% or 99%
    # interval fails at least one.
    assert 0.91 <= hits / reps <= 0.985, hits / reps


def test_nan_rules_for_sparse_and_empty_capability():
    rng = np.random.default_rng(9)
    pv = np.full((3, P), np.nan)
    pv[0] = _bernoulli(rng, 0.5)
    pv[1, :3] = [1.0, 0.0, 1.0]  # 3 decided: some resamples draw none of them
    ev = np.tile(rng.beta(2, 2, P), (3, 1))
    d = bootstrap_draws(["full", "sparse", "none"], pv, ev, None, n_resamples=2000)
    assert np.isnan(d.draws[0, 1]).any() and not np.isnan(d.draws[0, 1]).all()
    lo, hi = d.ci[0, 1]
    assert 0.0 <= lo <= hi <= 100.0  # defined resamples only
    iv = d.intervals()
    assert math.isnan(iv["none"].estimate.capability) and math.isnan(iv["none"].estimate.overall)
    assert all(math.isnan(x) for x in iv["none"].capability + iv["none"].overall)
    assert iv["none"].eps == iv["full"].eps  # EPS does not need verdicts
    assert not any(math.isnan(x) for x in iv["full"].capability)


def test_bootstrap_accepts_verdict_strings():
    rng = np.random.default_rng(1)
    pv = _bernoulli(rng, 0.5, 20)
    pv[3] = np.nan
    verdicts = [["PASS" if x == 1 else "FAIL" if x == 0 else None for x in pv]]
    ev = rng.beta(2, 2, (1, 20))
    a = bootstrap_draws(["m"], pv[None], ev, None, n_resamples=100)
    b = bootstrap_draws(["m"], verdicts, ev, None, n_resamples=100)
    np.testing.assert_array_equal(a.draws, b.draws)


def test_bootstrap_input_validation():
    pv = np.ones((2, 10))
    ev = np.full((2, 10), 0.5)
    ok = dict(n_resamples=10)
    with pytest.raises(ValueError, match=r"shape \(2, 10\), expected \(3, prompts\)"):
        bootstrap_draws(["a", "b", "c"], pv, ev, **ok)
    with pytest.raises(ValueError, match="must match"):
        bootstrap_draws(["a", "b"], pv, np.full((1, 10), 0.5), **ok)
    with pytest.raises(ValueError, match="eligible mask has"):
        bootstrap_draws(["a", "b"], pv, np.full((2, 9), 0.5), **ok)
    with pytest.raises(ValueError, match="more than once"):
        bootstrap_draws(["a", "a"], pv, ev, **ok)
    with pytest.raises(ValueError, match="no models"):
        bootstrap_draws([], pv[:0], ev[:0], **ok)
    with pytest.raises(ValueError, match=r"1.0 \(PASS\), 0.0 \(FAIL\) or NaN.*0.5"):
        bootstrap_draws(["a", "b"], np.full((2, 10), 0.5), ev, **ok)
    with pytest.raises(ValueError, match="'MAYBE'"):
        bootstrap_draws(["a"], [["PASS", "MAYBE"]], [[0.5, 0.5]], **ok)
    bad = ev.copy()
    bad[0, 3] = np.nan
    with pytest.raises(ValueError, match="not a finite number in"):
        bootstrap_draws(["a", "b"], pv, bad, **ok)
    bad[0, 3] = 1.5
    with pytest.raises(ValueError, match="not a finite number in"):
        bootstrap_draws(["a", "b"], pv, bad, **ok)
    with pytest.raises(ValueError, match="boolean mask"):
        bootstrap_draws(["a", "b"], pv, ev, np.ones(10), **ok)
    with pytest.raises(ValueError, match=r"expected \(10,\)"):
        bootstrap_draws(["a", "b"], pv, ev, np.ones(9, bool), **ok)
    with pytest.raises(ValueError, match="no EPS-eligible"):
        bootstrap_draws(["a", "b"], pv, ev, np.zeros(10, bool), **ok)
    with pytest.raises(ValueError, match="at least 2 prompts"):
        bootstrap_draws(["a"], [[1.0]], [[0.5]], **ok)
    with pytest.raises(ValueError, match="n_resamples"):
        bootstrap_draws(["a", "b"], pv, ev, n_resamples=0)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_draws(["a", "b"], pv, ev, confidence=95, **ok)
    with pytest.raises(ValueError, match="seed"):
        bootstrap_draws(["a", "b"], pv, ev, seed=-1, **ok)


# --------------------------------------------------------------------------------------------
# Rank bands
# --------------------------------------------------------------------------------------------
def test_rank_bands_constructed():
    bands = rank_bands(
        {
            "top": (80.0, 90.0),
            "near": (70.0, 85.0),  # overlaps top
            "mid": (60.0, 70.0),  # touches near's lower bound: not separated from it
            "low1": (40.0, 50.0),
            "low2": (40.0, 50.0),  # exact tie with low1
        }
    )
    assert bands == {
        "top": (1, 1, 2),
        "near": (1, 1, 3),
        "mid": (2, 2, 3),
        "low1": (4, 4, 5),
        "low2": (4, 4, 5),
    }
    assert rank_bands({"only": (10.0, 20.0)}) == {"only": (1, 1, 1)}
    assert rank_bands({}) == {}


def test_rank_bands_errors():
    with pytest.raises(ValueError, match="'b'"):
        rank_bands({"a": (1.0, 2.0), "b": (math.nan, math.nan)})
    with pytest.raises(ValueError, match="lower bound above upper bound.*'a'"):
        rank_bands({"a": (3.0, 2.0)})


# --------------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------------
def test_compare_clearly_better_and_identical():
    rng = np.random.default_rng(3)
    a = _bernoulli(rng, 0.9)
    b = _bernoulli(rng, 0.3)
    c = compare(a, b, axis="capability", n_resamples=1000)
    assert c.p_a_beats_b == 1.0 and c.ci[0] > 40.0 and c.diff == pytest.approx(100 * (a.mean() - b.mean()))
    rev = compare(b, a, axis="capability", n_resamples=1000)
    assert rev.p_a_beats_b == 0.0 and rev.diff == -c.diff
    same = compare(a, a.copy(), axis="capability", n_resamples=1000)
    # Same verdicts on every prompt: no discordant prompt seen is not proof of equal pass rates
    # (Newcombe's paired interval): a narrow interval around 0, not (0, 0).
    assert same.p_a_beats_b == 0.5 and same.diff == 0.0 and same.ci[0] == -same.ci[1] and 0.0 < same.ci[1] < 2.0
    verdicts = ["PASS" if x else "FAIL" for x in a]
    assert compare(verdicts, b, n_resamples=1000) == c


def test_compare_close_models_is_uncertain_and_symmetric():
    rng = np.random.default_rng(4)
    a, b = _bernoulli(rng, 0.6), _bernoulli(rng, 0.6)
    ab = compare(a, b, n_resamples=2000, seed=5)
    ba = compare(b, a, n_resamples=2000, seed=5)
    assert 0.02 < ab.p_a_beats_b < 0.98 and ab.ci[0] < 0 < ab.ci[1]
    assert ab.p_a_beats_b + ba.p_a_beats_b == pytest.approx(1.0, abs=1e-12)


def test_compare_agrees_exactly_with_the_joint_bootstrap(field):
    models, pv, ev = field
    d = bootstrap_draws(models, pv, ev, ELIGIBLE, n_resamples=800, seed=6)
    for axis in AXES:
        k = AXES.index(axis)
        if axis == "capability":
            args = (pv[3], pv[1])
        elif axis == "eps":
            args = (ev[3], ev[1])
        else:
            args = ((pv[3], ev[3]), (pv[1], ev[1]))
        c = compare(*args, axis=axis, eligible=ELIGIBLE, n_resamples=800, seed=6)
        diff = d.draws[k, 3] - d.draws[k, 1]
        # Each model's interval is its leaderboard interval; MOVER with the draws' correlation.
        want = mover_difference(d.estimate[k, 3], tuple(d.ci[k, 3]), d.estimate[k, 1], tuple(d.ci[k, 1]),
                                nan_correlation(d.draws[k, 3], d.draws[k, 1]), 100.0)
        assert c.ci == pytest.approx(want, abs=1e-9)
        assert c.p_a_beats_b == pytest.approx((np.sum(diff > 0) + 0.5 * np.sum(diff == 0)) / diff.size)
        assert c.diff == pytest.approx(d.estimate[k, 3] - d.estimate[k, 1], abs=1e-12)


def test_compare_input_validation():
    a = np.array([1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="unknown axis 'quality'"):
        compare(a, a, axis="quality")
    with pytest.raises(ValueError, match="lengths"):
        compare(a, a[:2])
    with pytest.raises(ValueError, match="must be a pair"):
        compare(a, a, axis="overall")
    with pytest.raises(ValueError, match="one-dimensional"):
        compare(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="undefined for B"):
        compare(a, np.full(3, np.nan))
    with pytest.raises(ValueError, match="'WIN'"):
        compare(["PASS", "WIN", "FAIL"], a)
    with pytest.raises(ValueError, match="not a finite number"):
        compare(np.array([0.5, 2.0, 0.5]), np.full(3, 0.5), axis="eps")
