"""Numerics as a pinned, recorded part of a run (docs/RELIABILITY.md, "Numerics"): the same
settings give the same bits in any process; what moves the last bits (the forward batch) is
recorded with every score and bounded by a stated tolerance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tasks.hpsv3.scorer import HPSv3Scorer, pin_intra_op_threads, run_with_oom_backoff

pytestmark = pytest.mark.numeric  # compares torch numbers: run again under AVX2 MKL + 1 thread (.ci/run)

REPO = Path(__file__).resolve().parents[3]

# A forward batch of other images pads each sequence to another length and changes the GEMM
# shapes: float32 mu moves in its last bits (measured up to 3e-7 on the tiny model). Compared
# across batch compositions with this tolerance; with the same composition, bit for bit.
FLOAT32_BATCH_COMPOSITION_TOLERANCE = 1e-5

_CHILD = """
import json, os, sys
import numpy as np
from PIL import Image
from tasks.hpsv3.scorer import HPSv3Scorer, pin_intra_op_threads
base, ckpt, images, prompts, threads = json.loads(sys.argv[1])
scorer = HPSv3Scorer.load(base, ckpt, device="cpu", dtype="float32")
pin_intra_op_threads(threads)
out, sizes = scorer.score_with_batch_sizes(images, prompts, batch_size=3)
print(json.dumps({"mu": out[:, 0].tolist(), "runtime": scorer.runtime(sizes[0]).model_dump()}))
"""


def _write_images(sample_images, tmp_path: Path) -> list[str]:
    paths = []
    for i, img in enumerate(sample_images):
        path = tmp_path / f"img{i}.png"
        img.save(path)
        paths.append(str(path))
    return paths


def test_same_settings_same_bits_in_another_process_with_another_thread_env(
    scorer, tiny_base: Path, tiny_checkpoint: Path, sample_images, sample_prompts, tmp_path: Path, recorded_machine
) -> None:
    """A Dask worker starts with OMP_NUM_THREADS=1, a CLI with the machine's default: pinning the
    setting's thread count in each scoring process gives both the same runtime and the same bits.
    The default count is the (recorded) machine's cores, which the child reads the same way."""
    import torch

    paths = _write_images(sample_images, tmp_path)
    before = torch.get_num_threads()
    try:
        threads = pin_intra_op_threads(0)
        assert threads == recorded_machine.usable_cores == torch.get_num_threads()
        here, sizes = scorer.score_with_batch_sizes(paths, list(sample_prompts), batch_size=3)
        runtime_here = scorer.runtime(sizes[0]).model_dump()
    finally:
        torch.set_num_threads(before)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    args = json.dumps([str(tiny_base), str(tiny_checkpoint), paths, list(sample_prompts), 0])
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, child.stderr[-3000:]
    there = json.loads(child.stdout.strip().splitlines()[-1])
    assert there["runtime"] == runtime_here and there["runtime"]["intra_op_threads"] == threads
    assert there["mu"] == here[:, 0].tolist()  # bit for bit


def test_batch_composition_moves_mu_only_within_the_stated_tolerance(scorer, sample_images, sample_prompts) -> None:
    one = scorer.score(sample_images, sample_prompts, batch_size=1)
    six = scorer.score(sample_images, sample_prompts, batch_size=6)
    assert np.max(np.abs(one - six)) <= FLOAT32_BATCH_COMPOSITION_TOLERANCE
    # ... and the same composition twice is bit-identical.
    assert np.array_equal(six, scorer.score(sample_images, sample_prompts, batch_size=6))


def test_runtime_names_what_decides_the_bits(scorer) -> None:
    import torch
    import transformers

    rt = scorer.runtime(4)
    assert rt.batch_size == 4 and rt.dtype == "float32" and rt.device == "cpu"
    assert rt.torch_version == torch.__version__ and rt.transformers_version == transformers.__version__
    assert rt.intra_op_threads == torch.get_num_threads()
    assert rt.runtime_id != scorer.runtime(8).runtime_id
    assert json.loads(rt.to_json())["batch_size"] == 4


def test_oom_halving_is_recorded_per_item() -> None:
    import torch

    def runner(items):
        if len(items) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return np.zeros((len(items), 2))

    sizes: list[int] = []
    out, size = run_with_oom_backoff(list(range(5)), runner, batch_size=8, sizes_out=sizes)
    assert out.shape == (5, 2) and size == 2 and sizes == [2, 2, 2, 2, 2]


def test_scorer_records_halved_batches(scorer, sample_images, sample_prompts) -> None:
    import torch

    def flaky(items):
        if len(items) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return scorer.run_batch(items)

    halving = HPSv3Scorer(scorer.loaded, scorer.base_model, True, batch_runner=flaky)
    _, sizes = halving.score_with_batch_sizes(sample_images, sample_prompts, batch_size=4)
    assert sizes == [2] * len(sample_images)
