"""bench/gpu_hpsv3.py's pure parts, without a GPU and without spawning the script: GPU-hours per
1,000 models, the plan table, real-length sequences on the tiny model, attention availability."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        import gpu_hpsv3
        import gpu_plan

        yield gpu_plan, gpu_hpsv3
    finally:
        sys.path.remove(str(BENCH))


def test_gpu_hours_per_1000_models(bench):
    P, _ = bench
    # 1,000 models x 165 images at 32.7 images/s (the H200's saturated forward rate).
    assert P.gpu_hours(32.7, 165) == pytest.approx(165_000 / 32.7 / 3600)
    assert P.gpu_hours(33.0, 165, models=1) == pytest.approx(1 / 720)
    with pytest.raises(ValueError, match="images_per_s"):
        P.gpu_hours(0.0, 165)


def test_plan_picks_the_default_and_the_best_batch(bench):
    P, G = bench
    rows = [
        {"batch_size": 1, "forward_images_per_s": 20.0, "e2e_images_per_s": 5.0, "peak_gpu_gib": 13.6},
        {"batch_size": 8, "forward_images_per_s": 31.0, "e2e_images_per_s": 24.0, "peak_gpu_gib": 14.6},
        {"batch_size": 32, "forward_images_per_s": 33.0, "e2e_images_per_s": 26.0, "peak_gpu_gib": 17.8},
        {"batch_size": 48, "forward_images_per_s": 32.0, "e2e_images_per_s": 27.0, "e2e_halved_to": 24},
        {"batch_size": 64, "forward": "OOM"},
    ]
    default = G.default_batch_size()
    assert default == 8  # the Settings default of IMAGEBENCH_BATCH_SIZE
    entries = P.plan_entries(rows, default, 165)
    got = {(e["measure"], e["which"]): (e["batch_size"], round(e["gpu_hours_per_1000_models"], 3)) for e in entries}
    assert got == {
        ("forward", "default"): (8, round(P.gpu_hours(31.0, 165), 3)),
        ("forward", "best"): (32, round(P.gpu_hours(33.0, 165), 3)),
        ("end-to-end", "default"): (8, round(P.gpu_hours(24.0, 165), 3)),
        ("end-to-end", "best"): (32, round(P.gpu_hours(26.0, 165), 3)),
    }
    table = P.plan_table(entries, 165, "Plan")
    assert "| end-to-end | 32 (best) | 26.00 | 1.76 | 17.8 GiB |" in table
    # A default batch that ran out of memory is named, not silently replaced by another batch.
    assert "48 (best)" not in table  # its end-to-end run was halved to 24 by a CUDA OOM
    missing = P.plan_entries(rows, 64, 165)
    assert [e["batch_size"] for e in missing if e.get("missing")] == [64, 64]


def test_real_length_sequences_still_score(bench, scorer, sample_images):
    P, G = bench
    prompts = ["a red bicycle leaning on a wall", "two cats asleep on a windowsill at dusk"]
    items = scorer.prepare(sample_images[:2], prompts)
    loaded = scorer.loaded
    image_id, reward_id = loaded.model.image_token_id, loaded.reward_token_id
    seq = G.SeqLength("real", scorer, prompts, P.RealLengthTokens())
    fitted = seq.fit(items)
    for item, new, prompt in zip(items, fitted, prompts):
        n_image = int((item.input_ids == image_id).sum())
        assert len(new.input_ids) == P.estimate_real_length(prompt, n_image)
        assert len(new.input_ids) < len(item.input_ids)  # the tiny tokenizer's sequences are longer
        head = int(np.flatnonzero(item.input_ids == image_id)[-1]) + 2
        np.testing.assert_array_equal(new.input_ids[:head], item.input_ids[:head])  # system turn + image block
        tail = item.input_ids[int(np.flatnonzero(item.input_ids == reward_id)[0]) :]
        np.testing.assert_array_equal(new.input_ids[-len(tail) :], tail)  # <|Reward|> to the end
        assert new.pixel_values is item.pixel_values
    out = scorer.run_batch(fitted)
    assert out.shape == (2, 2) and np.isfinite(out).all()
    # --tokenizer DIR counts exactly with that tokenizer: given the tiny one, the lengths stay.
    exact = G.SeqLength("real", scorer, prompts, P.RealLengthTokens(str(loaded.base_dir)))
    assert [len(it.input_ids) for it in exact.fit(items)] == [len(it.input_ids) for it in items]
    with pytest.raises(SystemExit, match="--tokenizer"):
        P.RealLengthTokens(str(loaded.base_dir / "nowhere"))
    # Longer than the tiny tokenizer's: the text is repeated; shorter than the fixed parts: refused.
    longer = P.fit_length(items[0].input_ids, len(items[0].input_ids) + 40, image_id, reward_id)
    assert len(longer) == len(items[0].input_ids) + 40
    with pytest.raises(ValueError, match="shorter than the image block"):
        P.fit_length(items[0].input_ids, 10, image_id, reward_id)


def test_end_to_end_runs_at_the_real_length(bench, scorer, sample_images):
    """``sequences_at`` wraps the batch runner, so ``score`` (any preprocessing path) feeds the
    model real-length sequences, and only while it is active."""
    P, G = bench
    prompts = ["a lighthouse in fog", "a bowl of ramen, top view", "a lighthouse in fog"]
    seq = G.SeqLength("real", scorer, prompts, P.RealLengthTokens())
    seen: list[int] = []
    original = scorer.batch_runner

    def spy(items):
        seen.extend(len(it.input_ids) for it in items)
        return original(items)

    image_id = scorer.loaded.model.image_token_id
    n_image = [int((it.input_ids == image_id).sum()) for it in scorer.prepare(sample_images[:3], prompts)]
    # One thread beside the forward, and (where the scorer has one) its pool of worker processes.
    paths = [0, 1] if hasattr(scorer, "preprocess_workers") else [None]
    scorer.batch_runner = spy
    try:
        for workers in paths:
            seen.clear()
            if workers is not None:
                scorer.preprocess_workers = workers
            with G.sequences_at(scorer, seq):
                res = scorer.score(sample_images[:3], prompts, batch_size=2)
            assert seen == [P.estimate_real_length(p, n) for p, n in zip(prompts, n_image)], workers
            assert res.shape == (3, 2) and np.isfinite(res).all()
            assert scorer.batch_runner is spy  # restored
    finally:
        scorer.batch_runner = original
        if paths != [None]:
            scorer.preprocess_workers = None
            scorer.close()


def test_every_parameter_has_an_official_name_for_the_shared_random_weights(bench, scorer):
    """The official worker draws each parameter by imagebench's name order: every parameter must
    map to an official key, one to one, matching the official checkpoint layout."""
    _, G = bench
    from tasks.hpsv3.model import expected_checkpoint_layout, internal_to_official

    plan = G.init_plan(scorer.model)
    official = [internal_to_official(name) for name, _, _ in plan]
    assert None not in official and len(set(official)) == len(plan)
    assert set(official) == set(expected_checkpoint_layout(scorer.model))
    assert sorted(k for _, k, _ in plan) == list(range(len(plan)))


def test_attention_variants_and_cuda_absence(bench):
    P, G = bench
    assert P.parse_attention("sdpa, flash_attention_2,sdpa") == ["sdpa", "flash_attention_2"]
    with pytest.raises(ValueError, match="--attn 'flash'"):
        P.parse_attention("flash")
    assert P.attention_unavailable("sdpa", "cpu") is None
    assert P.attention_unavailable("flash_attention_2", "cpu") == "needs CUDA"
    import torch

    if not torch.cuda.is_available():
        assert G.main([]) == 2  # says so and exits before building anything


def test_official_preflight_refuses_transformers_5(bench):
    """The official code pins transformers 4.45.2: an environment without it is refused before any
    GPU time is spent, with the way out named."""
    import transformers

    from gpu_official import preflight

    assert preflight("/nonexistent/python3", None) == "--official-python /nonexistent/python3: not found"
    if int(transformers.__version__.split(".")[0]) >= 5:  # this venv (imagebench needs transformers 5)
        problem = preflight(sys.executable, None)
        assert problem is not None and "needs 4.45.2" in problem and "--official-wheels" in problem
