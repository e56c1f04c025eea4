"""The golden-set canary (tasks/scores/golden.py): the shipped set, the pure comparison, and a real
tiny HPSv3 scorer in an untouched and in a deliberately perturbed runtime."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from schemas.reference import GoldenMu, GoldenRecord, ReferenceFile, ReferencePrompt, ScorerIdentity, ScorerRuntime, SuiteRef
from tasks.scores.golden import (
    TOLERANCE_BY_DTYPE,
    CanaryDrift,
    GoldenSetError,
    compare,
    copy_golden_set,
    golden_record,
    load_golden_set,
    run_canary,
    score_golden,
    tolerance_for,
)
from tasks.scores.reference import ReferenceTampered

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "reference"

pytestmark = pytest.mark.numeric  # compares torch numbers: run again under AVX2 MKL + 1 thread (.ci/run)


def _runtime(**kw) -> ScorerRuntime:
    base = dict(torch_version="2.13.0", transformers_version="5.24.0", device="cpu", dtype="float32",
                rope_mode="official", attention="sdpa", batch_size=8, intra_op_threads=2)
    return ScorerRuntime(**{**base, **kw})


def _reference(golden: GoldenRecord | None) -> ReferenceFile:
    return ReferenceFile(
        version="t1", suite=SuiteRef(version="s", sha256="0" * 64),
        scorer=ScorerIdentity(scorer_name="hpsv3", source="hpsv3"), scorer_id="x",
        baseline_models=["a"], created_at="2026-11-26T00:00:00Z",
        prompts=[ReferencePrompt(prompt_id="p", mu_ref=0.0, n_models=1)], golden=golden,
    )


def test_shipped_golden_set_is_pinned_and_spread_over_the_categories() -> None:
    from tasks.scores.suite import load_suite

    golden = load_golden_set(SHIPPED)
    suite = load_suite(SHIPPED / "suite-imagebench-v1.jsonl")
    assert len(golden.items) == 24
    per_category = Counter(suite.by_id[it.prompt_id].category for it in golden.items)
    assert sorted(per_category.values()) == [4] * 6
    assert all(it.prompt == suite.by_id[it.prompt_id].prompt for it in golden.items)


def test_a_modified_golden_image_or_manifest_is_refused_by_name(tmp_path: Path) -> None:
    copy = copy_golden_set(SHIPPED, tmp_path / "ref")
    victim = copy.root / copy.items[3].file
    victim.write_bytes(victim.read_bytes() + b"\0")
    with pytest.raises(ReferenceTampered, match=copy.items[3].item_id):
        load_golden_set(tmp_path / "ref")
    # An unpinned manifest is not trusted either.
    other = tmp_path / "other"
    other.mkdir()
    shutil.copyfile(SHIPPED / "golden-v1.jsonl", other / "golden-v1.jsonl")
    with pytest.raises(ReferenceTampered, match="not pinned"):
        load_golden_set(other)


def test_compare_is_pure_and_names_the_images_beyond_tolerance() -> None:
    golden = load_golden_set(SHIPPED)
    built = golden_record(golden, [float(i) for i in range(24)], _runtime())
    ref = _reference(built)
    same = compare(ref, golden, [float(i) + 3e-7 for i in range(24)], _runtime(batch_size=4))
    assert same.passed and same.tolerance == TOLERANCE_BY_DTYPE["float32"]
    assert same.runtime_changes() == {"batch_size": (8, 4)}
    moved = [float(i) for i in range(24)]
    moved[5] += 7e-4
    drift = compare(ref, golden, moved, _runtime(rope_mode="float32"))
    assert not drift.passed and [k for k, _ in drift.offenders] == [golden.items[5].item_id]
    text = drift.describe()
    assert golden.items[5].item_id in text and "rope_mode 'official' -> 'float32'" in text
    # The looser dtype's tolerance applies across dtypes; an unknown dtype is refused.
    assert tolerance_for("float32", "bfloat16") == TOLERANCE_BY_DTYPE["bfloat16"]
    with pytest.raises(CanaryDrift, match="float64"):
        tolerance_for("float64", "float32")
    with pytest.raises(GoldenSetError, match="no golden-set mu"):
        compare(_reference(None), golden, [0.0] * 24, _runtime())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tasks.hpsv3.tiny import write_tiny_base_model, write_tiny_checkpoint

    root = tmp_path_factory.mktemp("golden-tiny")
    base = write_tiny_base_model(root / "base")
    return base, write_tiny_checkpoint(base, root / "ckpt.safetensors", seed=0)


def test_canary_passes_an_untouched_runtime_and_refuses_the_float32_rotary_mode(tiny, tmp_path, monkeypatch) -> None:
    from tasks.hpsv3.model import load_hpsv3
    from tasks.hpsv3.scorer import HPSv3Scorer

    monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path / "home"))  # the checkpoint-hash cache
    base, ckpt = tiny
    golden = load_golden_set(SHIPPED)
    built = HPSv3Scorer.load(str(base), str(ckpt), device="cpu", dtype="float32")
    mus, runtime = score_golden(built, golden, batch_size=8)
    ref = _reference(golden_record(golden, mus, runtime))

    # Untouched: another process's scorer, another forward batch size.
    again = HPSv3Scorer.load(str(base), str(ckpt), device="cpu", dtype="float32")
    result = run_canary(again, ref, SHIPPED, batch_size=3)
    assert result.passed and result.max_drift <= 1e-6

    # Perturbed: the exact float32 rotary arithmetic instead of the trained bf16-rounded one.
    perturbed = HPSv3Scorer(load_hpsv3(str(base), str(ckpt), device="cpu", dtype="float32", rope_mode="float32"), str(base))
    with pytest.raises(CanaryDrift, match="beyond tolerance") as info:
        run_canary(perturbed, ref, SHIPPED, batch_size=8)
    assert "g0" in str(info.value) or "g1" in str(info.value) or "g2" in str(info.value)


# MKL's instruction set moved the official code's bf16 mu by up to 7.3e-3 on an AMX/AVX-512 Intel
# machine (issue 15; docs/REFERENCE.md). MKL ignores its pin on AMD, so bench/kernel-spread.json,
# made on an AMD EPYC, reads 0 for it: the Intel figure is added here by hand.
MKL_SPREAD_INTEL_BF16 = 7.3e-3


def test_canary_tolerances_cover_the_measured_kernel_spread_with_margin() -> None:
    """docs/REFERENCE.md's claim, from the committed measurement (bench/bench_kernel_spread.py):
    a reference moved to a CPU that differs in every kernel (ATen/oneDNN, plus MKL) is not refused
    for its kernels, with 1.5x to spare; a tolerance changed without a new measurement fails here."""
    import json

    spread = json.loads((REPO / "bench" / "kernel-spread.json").read_text(encoding="utf-8"))
    for dtype in ("bfloat16", "float32"):
        rows = [r for r in spread["rows"] if r["dtype"] == dtype]
        assert {r["tolerance"] for r in rows} == {TOLERANCE_BY_DTYPE[dtype]}, (
            f"bench/kernel-spread.json was measured against another {dtype} tolerance: rerun bench/bench_kernel_spread.py")
        kernels = max(r["max_abs_diff"] for r in rows if r["setting"] != "batch 1")  # one batch size in a run
        worst = kernels + (MKL_SPREAD_INTEL_BF16 if dtype == "bfloat16" else 0.0)
        assert TOLERANCE_BY_DTYPE[dtype] >= 1.5 * worst, (dtype, TOLERANCE_BY_DTYPE[dtype], worst)
