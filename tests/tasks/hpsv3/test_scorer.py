"""HPSv3Scorer: identity, checkpoint hash cache, batching, OOM back-off."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import tasks.hpsv3.scorer as scorer_mod
from schemas.reference import ScorerIdentity
from tasks.hpsv3.scorer import HPSv3Scorer, file_sha256, run_with_oom_backoff
from tasks.hpsv3.tiny import write_tiny_checkpoint

from .conftest import make_image


def test_identity_fields(scorer, tiny_base: Path, tiny_checkpoint: Path) -> None:
    import hashlib

    ident = scorer.identity
    assert isinstance(ident, ScorerIdentity)
    assert ident.scorer_name == "hpsv3" and ident.source == "hpsv3" and ident.uncalibrated is True
    assert ident.checkpoint_sha256 == hashlib.sha256(tiny_checkpoint.read_bytes()).hexdigest()
    assert ident.base_model == tiny_base.name  # a directory is named by its basename, not its path
    assert not hasattr(ident, "transformers_version")  # a runtime property: ScorerRuntime
    assert "smart_resize(factor=28,min=200704,max=200704)" in ident.preprocessing
    config = json.loads((tiny_base / "config.json").read_text())
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    assert ident.base_config_sha256 == hashlib.sha256(canonical).hexdigest()
    assert len(ident.instruction_sha256) == 64 and len(ident.scorer_id) == 16


def test_identity_changes_with_checkpoint(scorer, tiny_base: Path, tmp_path: Path) -> None:
    other_ckpt = write_tiny_checkpoint(tiny_base, tmp_path / "seed1.safetensors", seed=1)
    other = HPSv3Scorer.load(str(tiny_base), str(other_ckpt), device="cpu", dtype="float32", uncalibrated=True)
    assert other.identity.checkpoint_sha256 != scorer.identity.checkpoint_sha256
    assert other.identity.scorer_id != scorer.identity.scorer_id
    same = HPSv3Scorer.load(str(tiny_base), str(tmp_path / "seed1.safetensors"), device="cpu", dtype="float32", uncalibrated=True)
    assert same.identity == other.identity


def test_checkpoint_hash_is_cached_by_path_size_mtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "blob.safetensors"
    f.write_bytes(b"a" * (9 * 1024 * 1024 + 3))  # more than one 8 MiB chunk
    first = file_sha256(f)
    cache = Path(os.environ["IMAGEBENCH_HOME"]) / "cache" / "checkpoint-sha256.json"
    assert first in json.loads(cache.read_text()).values()

    def boom(path: Path) -> str:
        raise AssertionError("re-hashed an unchanged file")

    monkeypatch.setattr(scorer_mod, "_sha256_of_file", boom)
    assert file_sha256(f) == first
    monkeypatch.undo()
    monkeypatch.setenv("IMAGEBENCH_HOME", str(cache.parent.parent))
    f.write_bytes(b"b" * 10)  # new size and mtime: hashed again
    assert file_sha256(f) != first
    cache.write_text("{not json")  # a corrupt cache is ignored and rewritten
    assert file_sha256(f) == file_sha256(f)


def test_score_order_batches_and_progress(scorer, sample_images, sample_prompts) -> None:
    seen: list[int] = []
    one_batch = scorer.score(sample_images, sample_prompts, batch_size=8)
    chunked = scorer.score(sample_images, sample_prompts, batch_size=4, progress=seen.append)
    assert one_batch.dtype == np.float64 and one_batch.shape == (6, 2)
    np.testing.assert_allclose(chunked, one_batch, rtol=0, atol=1e-5)
    assert seen == [4, 2]
    reversed_scores = scorer.score(sample_images[::-1], sample_prompts[::-1], batch_size=4)
    np.testing.assert_allclose(reversed_scores[::-1], one_batch, rtol=0, atol=1e-5)
    assert scorer.score([], []).shape == (0, 2)


def test_score_accepts_paths(scorer, sample_images, sample_prompts, tmp_path: Path) -> None:
    paths = []
    for i, img in enumerate(sample_images[:2]):
        paths.append(tmp_path / f"{i}.png")
        img.save(paths[-1])
    from_paths = scorer.score([str(paths[0]), paths[1]], sample_prompts[:2])
    np.testing.assert_allclose(from_paths, scorer.score(sample_images[:2], sample_prompts[:2]), rtol=0, atol=1e-6)


def test_score_input_errors(scorer, sample_images, sample_prompts, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="2 images but 1 prompts"):
        scorer.score(sample_images[:2], sample_prompts[:1])
    with pytest.raises(ValueError, match="prompt 1: .*reserved token"):
        scorer.score(sample_images[:2], ["ok", "bad <|Reward|>"])
    with pytest.raises(ValueError, match=r"image 1 \(.*missing\.png\)"):
        scorer.score([sample_images[0], tmp_path / "missing.png"], sample_prompts[:2])
    with pytest.raises(ValueError, match="batch_size"):
        scorer.score(sample_images[:1], sample_prompts[:1], batch_size=0)


def _oom_above(limit: int, inner, calls: list[int]):
    def runner(items):
        calls.append(len(items))
        if len(items) > limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return inner(items)

    return runner


def test_oom_halves_the_batch_and_keeps_order(scorer, sample_images, sample_prompts) -> None:
    images = sample_images + [make_image(40 + i, (320 + 16 * i, 480)) for i in range(4)]
    prompts = sample_prompts + [f"extra prompt {i}" for i in range(4)]
    expected = scorer.score(images, prompts, batch_size=8)
    calls: list[int] = []
    flaky = HPSv3Scorer(scorer.loaded, scorer.base_model, True, batch_runner=_oom_above(2, scorer.run_batch, calls))
    seen: list[int] = []
    got = flaky.score(images, prompts, batch_size=8, progress=seen.append)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    assert calls[:3] == [8, 4, 2]  # 8 -> OOM, 4 -> OOM, then 2 works ...
    assert max(calls[3:]) == 2  # ... and stays at 2 for the following batches
    assert sum(seen) == len(images)


def test_oom_at_batch_one_is_raised() -> None:
    calls: list[int] = []
    runner = _oom_above(0, lambda items: np.zeros((len(items), 2)), calls)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        run_with_oom_backoff(list(range(5)), runner, batch_size=4)  # type: ignore[arg-type]
    assert calls == [4, 2, 1]


def test_oom_backoff_pure() -> None:
    calls: list[int] = []
    runner = _oom_above(3, lambda items: np.array([[float(i), -float(i)] for i in items]), calls)
    out, size = run_with_oom_backoff(list(range(11)), runner, batch_size=16)  # type: ignore[arg-type]
    assert size == 2
    np.testing.assert_array_equal(out[:, 0], np.arange(11))
    assert calls == [11, 5, 2, 2, 2, 2, 2, 1]


def test_uncalibrated_flag_comes_from_checkpoint_metadata(tiny_base: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    # no flag passed: the tiny checkpoint's metadata says it is a demo model
    flagged = HPSv3Scorer.load(str(tiny_base), str(tiny_checkpoint), device="cpu", dtype="float32")
    assert flagged.identity.uncalibrated is True
    plain = tmp_path / "plain.safetensors"  # same tensors, no metadata flag
    save_file(load_file(str(tiny_checkpoint)), str(plain), metadata={"format": "pt"})
    calibrated = HPSv3Scorer.load(str(tiny_base), str(plain), device="cpu", dtype="float32")
    assert calibrated.identity.uncalibrated is False
    assert calibrated.identity.scorer_id != flagged.identity.scorer_id
    assert HPSv3Scorer(calibrated.loaded, str(tiny_base), uncalibrated=True).identity.uncalibrated is True


def test_resolve_identity_without_loading_weights(scorer, tiny_base: Path, tiny_checkpoint: Path) -> None:
    from tasks.hpsv3.scorer import resolve_identity

    assert resolve_identity(str(tiny_base), str(tiny_checkpoint)) == scorer.identity


def test_identity_is_the_model_and_the_runtime_is_apart(scorer, tiny_base: Path, tiny_checkpoint: Path) -> None:
    """bfloat16 and float32 give different mu, but from the same model: one scorer id (the
    reference stays usable), two runtimes (recorded per score; the golden-set canary bounds them)."""
    bf16 = HPSv3Scorer.load(str(tiny_base), str(tiny_checkpoint), device="cpu", dtype="bfloat16", uncalibrated=True)
    assert bf16.identity == scorer.identity
    assert bf16.runtime(8).dtype == "bfloat16" and scorer.runtime(8).dtype == "float32"
    assert bf16.runtime(8).runtime_id != scorer.runtime(8).runtime_id
    assert scorer.identity.tokenizer_sha256 and len(scorer.identity.tokenizer_sha256) == 64
