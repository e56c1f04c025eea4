"""Judges inside real flow runs: verdicts beside HPSv3, Capability/Overall, no repeat calls."""

from __future__ import annotations

import json

import pytest

from tests.fake_openai import FakeOpenAI, Reply
from tests.flows.conftest import put_model

pytestmark = pytest.mark.slow


def _verdict_for(req) -> Reply:
    # Deterministic: PASS when the generation prompt has an even length, else FAIL; one prompt
    # gets an answer with no verdict line (stays UNPARSABLE: the fallback says the same).
    text = req.generation_prompt or ""
    if "three" in text.lower():
        return Reply(text="I am not sure what to say about this picture.")
    return Reply(text="Looked at it.\nVERDICT: " + ("PASS" if len(text) % 2 == 0 else "FAIL"))


@pytest.fixture()
def judges(workspace, monkeypatch, tmp_path):
    with FakeOpenAI(model="fake-qwen", responder=_verdict_for) as qwen, FakeOpenAI(
        model="fake-gemma", responder=_verdict_for
    ) as gemma:
        cfg = tmp_path / "judges.yaml"
        cfg.write_text(
            json.dumps(
                {
                    "judges": {
                        "qwen3-vl": {"backend": "openai", "base_url": qwen.base_url, "model": "fake-qwen", "concurrency": 4, "max_retries": 1},
                        "gemma": {"backend": "openai", "base_url": gemma.base_url, "model": "fake-gemma", "concurrency": 2, "max_retries": 1},
                    }
                }
            )
        )
        monkeypatch.setenv("IMAGEBENCH_JUDGES_CONFIG", str(cfg))
        yield qwen, gemma


def test_score_judges_and_rejudge(prefect_harness, workspace, judges, tmp_path):
    from flows.pipeline import nightly_flow, reference_build_flow, score_model_flow
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.scores.suite import load_suite

    qwen, gemma = judges
    s = load_settings()
    suite = load_suite(s.suite_path)
    objects = workspace / "objects"
    eligible = list(suite.eligible_ids)
    put_model(objects, "base-a", eligible, seed=1)
    reference_build_flow("t1", ["base-a"])

    # 20 images: some Text Rendering (OCR judge), the rest to the HTTP judges; 4 prompts missing.
    ids = [p.prompt_id for p in suite.prompts][:24]
    put_model(objects, "judged", ids[:20], seed=11)
    row = score_model_flow("judged")
    lake = Lake(s.lake_dir)
    verdicts = {r["prompt_id"]: r for r in lake.read("verdicts", ["judged"]).to_pylist()}
    http_ids = [p for p in ids[:20] if suite.by_id[p].category != "Text Rendering"]
    assert set(http_ids) <= set(verdicts)
    for p in http_ids:
        expected = "UNPARSABLE" if "three" in suite.by_id[p].prompt.lower() else (
            "PASS" if len(suite.by_id[p].prompt) % 2 == 0 else "FAIL")
        assert verdicts[p]["verdict"] == expected, p
        assert verdicts[p]["judge"] in ("qwen3-vl", "gemma")
    # Capability counts PASS / (PASS + FAIL) with missing images as FAIL; UNPARSABLE is undecided.
    decided = [verdicts[p]["verdict"] for p in verdicts if verdicts[p]["verdict"] in ("PASS", "FAIL")]
    passes = decided.count("PASS")
    fails = decided.count("FAIL") + (len(suite.prompts) - 20)  # every missing prompt is a FAIL
    assert row["verdicts_pass"] == passes and row["verdicts_fail"] == fails
    assert row["capability"] == pytest.approx(100 * passes / (passes + fails))
    assert row["overall"] == pytest.approx(0.5 * row["capability"] + 0.5 * row["eps"])
    assert row["provisional"] is (row["verdicts_undecided"] > 0)
    assert row["capability_lo"] <= row["capability"] <= row["capability_hi"]
    calls = lake.read("judge_calls", ["judged"]).to_pylist()
    assert calls and all(c["raw_text"] is not None or c["error"] for c in calls)

    # The first nightly judges the baseline model (its EPS came with the reference build: up to
    # date, only its missing verdicts are asked for); a second one asks nobody again: every
    # identity is in the lake. --rejudge asks again.
    first = nightly_flow()
    assert first["scored"] == [] and first["up_to_date"] == ["base-a", "judged"] and "base-a" in first["rejudged"]
    before = len(qwen.completions) + len(gemma.completions)
    second = nightly_flow()
    assert second["scored"] == [] and second["rejudged"] == []
    assert len(qwen.completions) + len(gemma.completions) == before
    score_model_flow("judged", rejudge=True)
    assert len(qwen.completions) + len(gemma.completions) >= before + len(http_ids)
