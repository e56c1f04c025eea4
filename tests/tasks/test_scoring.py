"""EPS math: hand-computed examples, float64, purity, errors."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from tasks.scores.eps import EpsResult, eps, reference_medians, sigmoid, table_columns

IDS = ["a", "b", "c", "d"]


def test_sigmoid_values_and_stability():
    assert sigmoid(0.0) == 0.5
    assert sigmoid(800.0) == 1.0 and sigmoid(-800.0) == 0.0  # no overflow
    assert math.isclose(float(sigmoid(1.0)), 1 / (1 + math.exp(-1)), rel_tol=0, abs_tol=1e-16)
    out = sigmoid(np.array([-1.0, 0.0, 1.0], dtype=np.float32))
    assert out.dtype == np.float64
    assert math.isclose(out[0] + out[2], 1.0, abs_tol=1e-15)


def test_eps_equal_to_reference_is_50():
    ref = {p: 1.5 * i for i, p in enumerate(IDS)}
    r = eps(dict(ref), ref, IDS)
    assert r == EpsResult(eps=50.0, prompts_scored=4, prompts_eligible=4, prompts_lost=0)
    assert r.complete and type(r.eps) is float


def test_eps_hand_computed():
    ref = {"a": 0.0, "b": 0.0, "c": 2.0, "d": 0.0}
    mu = {"a": 1.0, "b": -1.0, "c": 2.0, "d": math.log(3.0)}  # sigmoid(ln 3) = 0.75
    s1 = 1 / (1 + math.exp(-1))
    expected = 100 * (s1 + (1 - s1) + 0.5 + 0.75) / 4
    assert math.isclose(eps(mu, ref, IDS).eps, expected, rel_tol=1e-15)
    assert math.isclose(expected, 100 * 2.25 / 4, rel_tol=1e-15)


def test_lost_prompt_counts_zero_and_non_eligible_ignored():
    ref = {p: 0.0 for p in IDS}
    mu = {"a": 0.0, "b": 0.0, "c": 0.0, "zzz-not-eligible": 50.0, "x": float("nan")}  # d lost
    r = eps(mu, ref, IDS)
    assert r.eps == 100 * 1.5 / 4 == 37.5
    assert (r.prompts_scored, r.prompts_eligible, r.prompts_lost) == (3, 4, 1)
    assert not r.complete
    nothing = eps({}, ref, IDS)  # no eligible prompt scored: no figure (NaN), never 0
    assert math.isnan(nothing.eps) and (nothing.prompts_scored, nothing.prompts_eligible, nothing.prompts_lost) == (0, 4, 4)


def test_eps_is_float64_precise():
    ref = {p: 0.0 for p in IDS}
    mu = {p: 1e-9 for p in IDS}  # float32 would round sigmoid(1e-9) to 0.5
    assert eps(mu, ref, IDS).eps > 50.0


def test_eps_order_independent_and_other_models_irrelevant():
    rng = np.random.default_rng(0)
    ids = [f"p{i}" for i in range(165)]
    ref = dict(zip(ids, rng.normal(10, 2, 165).tolist()))
    models = {m: dict(zip(ids, rng.normal(10, 2, 165).tolist())) for m in ("m1", "m2", "m3")}
    alone = eps(models["m1"], ref, ids)
    # score a field one model at a time, with others added, and in reversed prompt order
    field = {m: eps(mu, ref, ids) for m, mu in models.items()}
    models["m4"] = {p: 99.0 for p in ids}
    bigger = {m: eps(mu, ref, ids) for m, mu in models.items()}
    assert field["m1"] == alone == bigger["m1"]
    assert eps(models["m1"], ref, list(reversed(ids))).eps == alone.eps


@pytest.mark.parametrize(
    "mu, ref, ids, match",
    [
        ({"a": 0.0}, {"b": 0.0}, ["a", "b"], "no mu_ref"),
        ({"a": float("inf")}, {"a": 0.0}, ["a"], "non-finite mu"),
        ({"a": float("nan")}, {"a": 0.0}, ["a"], "non-finite mu"),
        ({"a": 0.0}, {"a": float("nan")}, ["a"], "non-finite mu_ref"),
        ({}, {}, [], "no EPS-eligible"),
        ({}, {"a": 0.0}, ["a", "a"], "duplicates"),
    ],
)
def test_eps_errors(mu, ref, ids, match):
    with pytest.raises(ValueError, match=match):
        eps(mu, ref, ids)


def _rows(data: dict[str, dict[str, float]]) -> dict[str, list]:
    rows = [(m, p, v) for m, d in data.items() for p, v in d.items()]
    return {"model_id": [r[0] for r in rows], "prompt_id": [r[1] for r in rows], "mu": [r[2] for r in rows]}


def test_reference_medians_odd_even_and_ignores_others():
    data = {
        "m1": {"a": 1.0, "b": 10.0, "t": 0.0},
        "m2": {"a": 2.0, "b": 20.0},
        "m3": {"a": 4.0, "b": 40.0},
        "m4": {"a": 8.0, "b": 80.0},
        "outsider": {"a": 1000.0},
    }
    odd = reference_medians(_rows(data), ["m1", "m2", "m3"], ["a", "b"])
    assert odd == {"a": (2.0, 3), "b": (20.0, 3)}
    even = reference_medians(_rows(data), ["m1", "m2", "m3", "m4"], ["a", "b"])
    assert even == {"a": (3.0, 4), "b": (30.0, 4)}  # mean of the two middle values
    assert all(type(v[0]) is float for v in even.values())


def test_reference_medians_accepts_arrow_and_row_dicts():
    cols = _rows({"m1": {"a": 1.0}, "m2": {"a": 3.0}})
    expected = {"a": (2.0, 2)}
    assert reference_medians(pa.table(cols), ["m1", "m2"], ["a"]) == expected
    rows = [dict(zip(cols, r)) for r in zip(*cols.values())]
    assert reference_medians(rows, ["m1", "m2"], ["a"]) == expected


def test_reference_medians_names_each_bad_model():
    ids = [f"p{i}" for i in range(10)]
    data = {"good": {p: 1.0 for p in ids}, "partial": {p: 1.0 for p in ids[:3]}}
    cols = _rows(data)
    for k, v in (("model_id", "dup"), ("prompt_id", "p0"), ("mu", 1.0)):
        cols[k] += [v, v]
    cols["prompt_id"][-1] = "p0"
    with pytest.raises(ValueError) as ei:
        reference_medians(cols, ["good", "partial", "dup", "absent"], ids)
    msg = str(ei.value)
    assert "'partial' lacks 7 of 10" in msg and "p3" in msg
    assert "'absent' lacks 10 of 10" in msg
    assert "'dup' has duplicate (model, prompt) rows" in msg
    assert "'good'" not in msg


def test_reference_medians_other_errors():
    with pytest.raises(ValueError, match="non-finite"):
        reference_medians(_rows({"m": {"a": float("inf")}}), ["m"], ["a"])
    with pytest.raises(ValueError, match="more than once"):
        reference_medians(_rows({"m": {"a": 1.0}}), ["m", "m"], ["a"])
    with pytest.raises(ValueError, match="no baseline"):
        reference_medians(_rows({"m": {"a": 1.0}}), [], ["a"])
    with pytest.raises(ValueError, match="lacks column"):
        table_columns({"model_id": []}, ["model_id", "mu"])
