"""Capability judging at the rate a paid API allows (issue 25 item 1), in real flow runs: a model's
judge requests split over several Prefect tasks at once (IMAGEBENCH_JUDGE_TASK_SIZE=4), against a
fake API that answers 429 beyond 4 requests in flight or 120 per minute. Before, each task built
its own client and semaphore: 4 per task in flight, no rate at all.

- On the Prefect server (the test harness; ``judge_limits: auto``): the server's global limits.
- On a local Dask cluster of 2 worker processes (``judge_limits: local``): this machine's lock files.
"""

from __future__ import annotations

import json

import pytest

from tests.fake_openai import FakeOpenAI, Reply, ServerLimits
from tests.flows.conftest import put_model

pytestmark = pytest.mark.slow

N_IMAGES = 24


def _verdict_for(req) -> Reply:
    text = req.generation_prompt or ""
    return Reply(text="Looked at it.\nVERDICT: " + ("PASS" if len(text) % 2 == 0 else "FAIL"), delay_s=0.2)


@pytest.fixture()
def paid_api(built_reference, monkeypatch, tmp_path):
    """qwen3-vl behind the limiting fake (the routing's preferred judge for every category but
    Text Rendering); gemma, the fallback, on a server of its own (never needed here)."""
    limits = ServerLimits(max_in_flight=4, requests_per_minute=120, burst=3)
    with FakeOpenAI(model="fake-qwen", responder=_verdict_for, limits=limits) as qwen, \
            FakeOpenAI(model="fake-gemma", responder=_verdict_for) as gemma:
        cfg = tmp_path / "judges.yaml"
        cfg.write_text(json.dumps({"judges": {
            "qwen3-vl": {"backend": "openai", "base_url": qwen.base_url, "model": "fake-qwen", "concurrency": 4,
                         "requests_per_minute": 120, "max_retries": 2},
            "gemma": {"backend": "openai", "base_url": gemma.base_url, "model": "fake-gemma", "concurrency": 4},
        }}))
        monkeypatch.setenv("IMAGEBENCH_JUDGES_CONFIG", str(cfg))
        monkeypatch.setenv("IMAGEBENCH_JUDGE_TASK_SIZE", "4")
        yield built_reference[1], qwen, gemma


def _judged_prompts() -> list[str]:
    from schemas.settings import load_settings
    from tasks.scores.suite import load_suite

    suite = load_suite(load_settings().suite_path)
    return [p.prompt_id for p in suite.prompts if p.category != "Text Rendering"][:N_IMAGES]


def _check(model_id: str, prompts: list[str], qwen: FakeOpenAI, gemma: FakeOpenAI) -> None:
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.scores.suite import load_suite

    settings = load_settings()
    suite = load_suite(settings.suite_path)
    assert qwen.refused == 0, [r.refused for r in qwen.completions if r.refused]  # never beyond either limit
    assert qwen.max_in_flight <= 4
    assert len(qwen.completions) == N_IMAGES and gemma.completions == []  # one request per image, none refused
    verdicts = {r["prompt_id"]: r for r in Lake(settings.lake_dir).read("verdicts", [model_id]).to_pylist()}
    for p in prompts:  # every verdict kept, as the judge gave it
        expected = "PASS" if len(suite.by_id[p].prompt) % 2 == 0 else "FAIL"
        assert verdicts[p]["verdict"] == expected and verdicts[p]["judge"] == "qwen3-vl", p


def test_capability_judging_holds_the_endpoint_limits_on_a_prefect_server(prefect_harness, paid_api) -> None:
    from prefect.client.orchestration import get_client

    from flows.pipeline import score_model_flow

    objects, qwen, gemma = paid_api
    prompts = _judged_prompts()
    put_model(objects, "judged", prompts, seed=11)
    with get_client(sync_client=True) as client:  # the session's server holds earlier tests' endpoints too
        before = {g.name for g in client.read_global_concurrency_limits(limit=200)}
    row = score_model_flow("judged")
    assert row["verdicts_pass"] + row["verdicts_fail"] >= N_IMAGES
    _check("judged", prompts, qwen, gemma)
    with get_client(sync_client=True) as client:  # the limits were the server's
        names = {g.name: g for g in client.read_global_concurrency_limits(limit=200)}
    from tasks.judges.prefect_limits import RATE_UNITS, RPM_SLOTS

    ours = [g for n, g in names.items() if n.startswith("imagebench-judge-qwen3-vl-") and n not in before]
    assert {(g.name.rsplit("-", 1)[1], g.limit) for g in ours} == {("concurrency", 4), ("rpm", RPM_SLOTS * RATE_UNITS)}


def test_capability_judging_holds_the_endpoint_limits_across_dask_workers(prefect_harness, paid_api, monkeypatch) -> None:
    from flows import runners
    from flows.pipeline import score_model_flow

    objects, qwen, gemma = paid_api
    monkeypatch.setenv("IMAGEBENCH_JUDGE_LIMITS", "local")  # this machine's lock files, as on the embedded API
    prompts = _judged_prompts()
    put_model(objects, "judged-dask", prompts, seed=12)
    score_model_flow.with_options(task_runner=runners.task_runner("dask", workers=2))("judged-dask")
    _check("judged-dask", prompts, qwen, gemma)
