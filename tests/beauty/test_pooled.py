"""tasks.beauty.pooled: DerSimonian-Laird against statsmodels' meta-analysis (an implementation
no one here wrote, itself checked against R's metafor), and the pooling of study_index rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.beauty.pooled import dersimonian_laird, pool_tools, study_variance


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dersimonian_laird_matches_statsmodels(seed):
    from statsmodels.stats.meta_analysis import combine_effects

    rng = np.random.default_rng(seed)
    k = 3 + seed * 4
    y = rng.normal(50, 15, k)  # heterogeneous: Q > k - 1, where statsmodels (which does not
    v = rng.uniform(4, 30, k)  # truncate tau^2 at 0) and DerSimonian-Laird agree
    ours = dersimonian_laird(y, v)
    ref = combine_effects(y, v, method_re="dl")
    assert ref.q > k - 1
    assert ours.tau2 == pytest.approx(ref.tau2, rel=1e-10, abs=1e-12)
    assert ours.estimate == pytest.approx(ref.mean_effect_re, rel=1e-12)
    assert ours.se == pytest.approx(ref.sd_eff_w_re, rel=1e-10)
    lo, hi = ref.summary_frame(alpha=0.05).loc["random effect", ["ci_low", "ci_upp"]]
    assert (ours.lo, ours.hi) == (pytest.approx(lo, rel=1e-9), pytest.approx(hi, rel=1e-9))
    assert ours.q == pytest.approx(ref.q, rel=1e-10) and ours.k == k


def test_homogeneous_studies_have_no_between_study_variance():
    re = dersimonian_laird([40.0, 40.0, 40.0], [9.0, 16.0, 25.0])
    assert re.tau2 == 0.0 and re.i2 == 0.0 and re.estimate == pytest.approx(40.0)
    # inverse-variance weights: se = sqrt(1 / sum(1/v))
    assert re.se == pytest.approx(math.sqrt(1 / (1 / 9 + 1 / 16 + 1 / 25)))


def test_heterogeneous_studies_widen_the_interval():
    het = dersimonian_laird([20.0, 80.0], [4.0, 4.0])
    assert het.tau2 > 1000 and het.i2 > 0.9 and het.hi - het.lo > 60


def test_bad_inputs_are_refused():
    for y, v in (([], []), ([1.0], [0.0]), ([1.0, 2.0], [1.0]), ([float("nan")], [1.0])):
        with pytest.raises(ValueError):
            dersimonian_laird(y, v)


def test_pool_tools_pools_only_shared_tools_and_weights_sum_to_one():
    rows = [
        {"study_id": "a", "tool": "x", "panel_group": "all", "beauty_index": 60.0, "beauty_index_lo": 50.0, "beauty_index_hi": 70.0, "answers": 200},
        {"study_id": "b", "tool": "x", "panel_group": "all", "beauty_index": 40.0, "beauty_index_lo": 30.0, "beauty_index_hi": 50.0, "answers": 200},
        {"study_id": "a", "tool": "only-a", "panel_group": "all", "beauty_index": 10.0, "beauty_index_lo": 5.0, "beauty_index_hi": 15.0, "answers": 200},
        {"study_id": "b", "tool": "x", "panel_group": "photographers", "beauty_index": 1.0, "beauty_index_lo": 0.0, "beauty_index_hi": 2.0, "answers": 20},
    ]
    (pooled,) = pool_tools(rows)
    assert pooled.tool == "x" and pooled.pooled.k == 2 and pooled.pooled.estimate == pytest.approx(50.0)
    assert sum(s["weight"] for s in pooled.studies) == pytest.approx(1.0)
    v = ((70.0 - 50.0) / (2 * 1.959963984540054)) ** 2
    assert study_variance(60.0, 50.0, 70.0, 200) == pytest.approx(v)
    # no spread in the bootstrap: the binomial floor keeps a study from taking all the weight
    assert study_variance(100.0, 100.0, 100.0, 10) > 0
