"""The golden-set canary in real flow runs: a reference stores the golden set's mu; a run in an
untouched runtime goes on and records it; a deliberately perturbed runtime (the float32 rotary
mode, ~7e-4 on mu) is refused before anything is scored."""

from __future__ import annotations

import json

import pytest

from tests.flows.conftest import eligible_ids, put_model

pytestmark = [pytest.mark.slow, pytest.mark.numeric]


def _last_run(settings) -> dict:
    from tasks.lake.tables import Lake

    return sorted(Lake(settings.lake_dir).read_runs().to_pylist(), key=lambda r: r["started_at"])[-1]


def test_runs_check_their_runtime_against_the_reference_golden_set(built_reference, monkeypatch):
    from flows.pipeline import score_model_flow
    from schemas.settings import load_settings
    from tasks.runs import pinned
    from tasks.scores.golden import CanaryDrift
    from tasks.lake.tables import Lake

    home, objects, reference_file = built_reference
    stored = json.loads(reference_file.read_text())["golden"]
    assert stored["set"] == "golden-v1" and len(stored["items"]) == 24
    assert stored["runtime"]["dtype"] == "float32" and stored["runtime"]["rope_mode"] == "official"

    # Untouched runtime: the run goes on and records its runtime and the drift it measured.
    put_model(objects, "canary-ok", eligible_ids()[:3], seed=61)
    assert score_model_flow("canary-ok")["eps_prompts_scored"] == 3
    settings = load_settings()
    run = _last_run(settings)
    assert run["status"] == "completed" and run["canary_max_drift"] <= 1e-6
    assert json.loads(run["runtime"]) == stored["runtime"]  # same settings, same runtime
    scores = Lake(settings.lake_dir).read("hps_scores", ["canary-ok"])
    assert set(scores["runtime"].to_pylist()) == {run["runtime"]}

    # Perturbed runtime: the exact float32 rotary arithmetic instead of the trained one.
    monkeypatch.setenv("IMAGEBENCH_HPSV3_ROTARY", "float32")
    pinned.scorer_identity.cache_clear()
    put_model(objects, "canary-refused", eligible_ids()[:3], seed=62)
    with pytest.raises(CanaryDrift, match=r"beyond tolerance.*g\d\d") as info:
        score_model_flow("canary-refused")
    assert "rope_mode 'official' -> 'float32'" in str(info.value)
    lake = Lake(settings.lake_dir)
    assert lake.read("hps_scores", ["canary-refused"]).num_rows == 0
    assert lake.read("model_scores", ["canary-refused"]).num_rows == 0
    refused = _last_run(settings)
    assert refused["status"] == "failed" and "beyond tolerance" in refused["error"]
