"""How far the CPU's kernels move the golden set's mu: the measurement behind the canary's bf16
tolerance (docs/REFERENCE.md, "What a bf16 reference built on one machine means on another").

Scores the shipped golden set (24 images) with the tiny model in each (dtype, kernel setting),
each in a fresh process with the setting in its environment before torch starts, and reports
the largest |mu - mu(default kernels)| per setting beside the canary tolerance of its dtype.

    .venv/bin/python bench/bench_kernel_spread.py [--out bench/kernel-spread.json]

On an AMD CPU MKL ignores MKL_ENABLE_INSTRUCTIONS (it dispatches its generic path there), so the
MKL part of the cross-machine spread (up to 7.3e-3 in official bf16 between an AMX/AVX-512 Intel
machine and an AVX2 one, measured with the official code) is only seen on Intel machines: the
JSON records the CPU, its flags and MKL's own line so the numbers say where they were made.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS: dict[str, dict[str, str]] = {
    "default kernels": {},
    "ATen AVX2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "ATen AVX-512": {"ATEN_CPU_CAPABILITY": "avx512"},
    "oneDNN AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "MKL AVX2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "all pinned AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "1 thread": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
}
KERNEL_VARS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

_CHILD = """
import json, sys
from tasks.scores.golden import load_golden_set
from tasks.hpsv3.scorer import HPSv3Scorer
base, ckpt, dtype, batch = sys.argv[1:5]
golden = load_golden_set("reference")
scorer = HPSv3Scorer.load(base, ckpt, device="cpu", dtype=dtype, uncalibrated=True)
print(json.dumps(scorer.score(golden.paths(), golden.prompts(), batch_size=int(batch))[:, 0].tolist()))
"""


def score(base: Path, ckpt: Path, dtype: str, batch: int, setting: dict[str, str]) -> list[float]:
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_VARS}
    env.update(setting)
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(base), str(ckpt), dtype, str(batch)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{dtype} {setting}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    from tasks.scores.golden import TOLERANCE_BY_DTYPE
    from tasks.hpsv3.cpu import cpu_facts
    from tasks.hpsv3.tiny import write_tiny_base_model, write_tiny_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "kernel-spread.json")
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = write_tiny_base_model(Path(tmp) / "tiny-qwen2vl")
        ckpt = write_tiny_checkpoint(base, Path(tmp) / "HPSv3-tiny.safetensors", seed=0)
        rows = []
        for dtype in ("bfloat16", "float32"):
            ref = score(base, ckpt, dtype, args.batch, {})
            variants = {name: (setting, args.batch) for name, setting in SETTINGS.items() if setting}
            variants["batch 1"] = ({}, 1)
            for name, (setting, batch) in variants.items():
                mus = score(base, ckpt, dtype, batch, setting)
                spread = max(abs(a - b) for a, b in zip(mus, ref, strict=True))
                tol = TOLERANCE_BY_DTYPE[dtype]
                rows.append({"dtype": dtype, "setting": name, "max_abs_diff": spread, "tolerance": tol, "tolerance_over_spread": tol / spread if spread else None})
                print(f"{dtype:9s} {name:18s} max |mu - default| {spread:.3g}   canary tolerance {tol:g}", flush=True)
    result = {"machine": cpu_facts(), "golden_images": 24, "batch": args.batch, "rows": rows}
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
