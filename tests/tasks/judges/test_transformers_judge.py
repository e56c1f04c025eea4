"""The local transformers judge on a tiny random Qwen2-VL (built here): loaded once, batched
greedy generation, and its gibberish ends UNPARSABLE, never a verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.judges import Endpoint, JudgesConfig
from tasks.judges import check_judges, judge_items
from tests.tasks.judges.helpers import FAST, make_routing

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from tasks.hpsv3.tiny import write_tiny_base_model

    out = write_tiny_base_model(tmp_path_factory.mktemp("judge-vlm") / "tiny-qwen2vl")
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(Qwen2VLConfig.from_pretrained(str(out)))
    model.save_pretrained(str(out))  # random weights, transformers' own format
    return out


def test_tiny_random_vlm_ends_unparsable_with_batched_generation(tiny_vlm_dir: Path, make_item, monkeypatch) -> None:
    from tasks.judges import transformers_backend as tb

    tb.load_local_vlm.cache_clear()
    batches: list[int] = []
    real = tb.generate_batch

    def spy(vlm, requests, max_new_tokens):
        batches.append(len(requests))
        return real(vlm, requests, max_new_tokens)

    monkeypatch.setattr(tb, "generate_batch", spy)
    ep = Endpoint(backend="transformers", model=str(tiny_vlm_dir), concurrency=4, max_tokens=16, timeout_s=120)
    cfg = JudgesConfig(judges={"local": ep})
    items = [make_item(size=(96 + 16 * i, 64)) for i in range(3)]
    calls, verdicts = judge_items(items, make_routing("local", None, unparsable_retries=1), cfg, retry=FAST)

    assert batches[0] == 3  # the three concurrent requests went through one generate() call
    assert sum(batches) == 6  # each item asked twice (1 + unparsable_retries)
    v = verdicts.to_pylist()
    assert [r["verdict"] for r in v] == ["UNPARSABLE"] * 3
    assert all(
        r["judge"] == "local" and r["judge_model"] == str(tiny_vlm_dir) and "no final verdict line" in r["reason"]
        for r in v
    )
    c = calls.to_pylist()
    assert len(c) == 6 and {r["outcome"] for r in c} == {"UNPARSABLE"}
    assert all(r["raw_text"] is not None and 0 < r["completion_tokens"] <= 16 and r["prompt_tokens"] > 20 for r in c)
    assert all(r["endpoint"] == "local:transformers" for r in c)

    # loaded once per process: a second run reuses the model
    judge_items([make_item()], make_routing("local", None, unparsable_retries=0), cfg, retry=FAST)
    info = tb.load_local_vlm.cache_info()
    assert info.misses == 1 and info.hits >= 1

    rows = {r["judge"]: r for r in check_judges(cfg)}
    assert rows["local"]["ok"], rows["local"]["detail"]


def test_a_model_outside_the_qwen2vl_family_is_a_clear_error(tmp_path: Path, make_item) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    cfg = JudgesConfig(judges={"local": Endpoint(backend="transformers", model=str(tmp_path))})
    _, verdicts = judge_items([make_item()], make_routing("local", None), cfg, retry=FAST)
    v = verdicts.to_pylist()[0]
    assert v["verdict"] == "ERROR" and "'llama'" in v["reason"] and "qwen2_vl" in v["reason"]
