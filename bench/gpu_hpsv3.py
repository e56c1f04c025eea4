"""HPSv3 throughput on a GPU with the full-size Qwen2-VL-7B architecture and random weights.

    .venv/bin/python bench/gpu_hpsv3.py                         # CUDA machine: bf16, batch 1/4/8/16/32
    .venv/bin/python bench/gpu_hpsv3.py --out gpu.json          # also write the numbers as JSON
    .venv/bin/python bench/gpu_hpsv3.py --cpu-smoke             # tiny config on CPU, 2 batch sizes: checks the code path

What it measures, per batch size:
- forward images/s: ``HPSv3Scorer.run_batch`` (collate, host->device copy, forward, scores back
  to the host) on inputs prepared beforehand, CUDA-synchronised, after warm-up iterations;
- end-to-end images/s: ``HPSv3Scorer.score`` over image files (decode, resize, patchify and
  tokenise on its prefetch thread, overlapped with the GPU), i.e. what a pipeline task gets;
- peak GPU memory (``torch.cuda.max_memory_allocated``); a batch size that runs out of memory is
  reported as OOM (not halved and retried as production does);
- model FLOP utilisation against the peak given by ``--peak-tflops`` (default 790 dense bf16),
  with two FLOP counts per image: the planning figure ``--tflop-per-image`` (default 12) and this
  script's analytic count from the actual sequence lengths (matmuls + attention; embedding
  lookups, norms and activations ignored).

The model is built exactly as ``tasks.hpsv3.model.load_hpsv3`` builds it (meta device, sdpa,
official rotary numerics, float32 reward head) except that the weights are random, initialised
in place on the device (deterministic from ``--seed``), so no 16 GB checkpoint is needed. The
tokenizer is the tiny BPE of ``tasks/hpsv3/tiny.py`` (Qwen's special tokens, a small vocabulary):
text token counts differ somewhat from Qwen's tokenizer, so the script prints the sequence length
it actually ran. Scores from random weights mean nothing; only the speed does.

Without CUDA (and without --cpu-smoke) it prints "CUDA not available" and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("BENCH_SRC") or str(REPO))

DEFAULT_BATCH_SIZES = (1, 4, 8, 16, 32)
SMOKE_BATCH_SIZES = (1, 2)
IMAGE_SIZES = ((1024, 1024), (1344, 768), (768, 1344), (1024, 1024))  # typical T2I outputs; all -> ~448x448


# --------------------------------------------------------------------------------------------
# Model with random weights
# --------------------------------------------------------------------------------------------


def random_init_(model, seed: int) -> None:
    """Fill every parameter in place on its device, with the scaling of
    ``tasks.hpsv3.tiny.random_official_state_dict`` (activations O(1), distinct scores): norm
    scales 1 + 0.1 N(0,1), biases 0.1 N(0,1), matrices N(0,1)/sqrt(fan_in), embeddings N(0,1)."""
    import torch

    with torch.no_grad():
        for k, (name, param) in enumerate(sorted(model.named_parameters())):
            gen = torch.Generator(device=param.device).manual_seed(seed * 1_000_003 + k)
            values = torch.randn(param.shape, generator=gen, device=param.device, dtype=torch.float32)
            if param.dim() == 1:
                values = 1.0 + 0.1 * values if name.endswith("weight") else 0.1 * values
            elif not name.endswith("embed_tokens.weight"):
                values /= math.sqrt(math.prod(param.shape[1:]))
            param.copy_(values.to(param.dtype))
            del values


def build_scorer(work: Path, full_size: bool, device, dtype, seed: int):
    """(HPSv3Scorer, transformers config) for the full-size 7B architecture or the tiny one."""
    from tasks.hpsv3 import model as M
    from tasks.hpsv3.preprocess import VisionPreprocessConfig
    from tasks.hpsv3.scorer import HPSv3Scorer
    from tasks.hpsv3.tiny import full_size_qwen2vl_7b_config, write_tiny_base_model

    base_dir = write_tiny_base_model(work / "base", config=full_size_qwen2vl_7b_config() if full_size else None)
    base_config = M.read_base_config(base_dir)
    tokenizer = M.load_tokenizer(base_dir)
    chat_template = M.load_chat_template(base_dir, tokenizer)
    vision = VisionPreprocessConfig.from_preprocessor_config(base_dir)
    config = M.build_config(base_config, tokenizer)
    attention = M.choose_attention(device)  # the official rule: flash-attention 2 when installed
    model = M.build_reward_model_meta(config, tokenizer.convert_tokens_to_ids(M.REWARD_TOKEN), dtype, attention)
    M.materialize_(model, device)  # allocates (uninitialised) storage, computes rotary buffers
    random_init_(model, seed)
    loaded = M.LoadedHPSv3(
        model=model,
        tokenizer=tokenizer,
        chat_template=chat_template,
        vision=vision,
        base_dir=base_dir,
        checkpoint_path=base_dir / "random-weights",  # no file: never read (uncalibrated=True below)
        base_config=base_config,
        device=device,
        dtype=dtype,
        attention_impl=attention,
    )
    return HPSv3Scorer(loaded, str(base_dir), uncalibrated=True), config


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------------------------


def flops_per_image(config, n_patches: int, seq_len: int) -> dict[str, float]:
    """Analytic forward FLOPs of one (image, prompt) item: 2 x multiply-adds of every matmul,
    plus attention scores and weighted sums (causal attention counted at half)."""
    v = config.vision_config
    t = config.text_config
    d, depth = v.embed_dim, v.depth
    d_mlp = int(d * v.mlp_ratio)
    patch_in = 3 * v.temporal_patch_size * v.patch_size**2
    p = n_patches
    vision = 2 * p * patch_in * d  # patch embedding
    vision += depth * (2 * p * d * 3 * d + 2 * p * d * d + 2 * 2 * p * d * d_mlp + 2 * 2 * p * p * d)
    merged = p // (v.spatial_merge_size**2)
    m_in = d * v.spatial_merge_size**2
    vision += 2 * merged * (m_in * m_in + m_in * t.hidden_size)  # merger MLP
    h, layers, inter = t.hidden_size, t.num_hidden_layers, t.intermediate_size
    head_dim = h // t.num_attention_heads
    kv = t.num_key_value_heads * head_dim
    L = seq_len
    per_layer = 2 * L * h * h * 2 + 2 * L * h * kv * 2 + 2 * 3 * L * h * inter  # q,o + k,v + gate/up/down
    per_layer += 2 * L * L * h  # QK^T and AV, causal (half of 2 x 2 L^2 h)
    text = layers * per_layer
    head = 2 * (h * 1024 + 1024 * 16 + 16 * 2)
    return {"vision": float(vision), "text": float(text), "head": float(head), "total": float(vision + text + head)}


# --------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------


def write_images(root: Path, n: int) -> list[str]:
    import io

    import numpy as np
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        w, h = IMAGE_SIZES[i % len(IMAGE_SIZES)]
        rng = np.random.default_rng(10_000 + i)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        base = rng.integers(0, 255, size=3).astype(np.float32)
        arr = base + ((xx + yy) * (rng.uniform(-0.2, 0.2) * 255 / (w + h)))[..., None] + rng.normal(0, 18, (h, w, 3))
        buf = io.BytesIO()
        Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
        path = root / f"{i:04d}.jpg"
        path.write_bytes(buf.getvalue())
        paths.append(str(path))
    return paths


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(scorer, config, device, batch_sizes, paths, prompts, args) -> list[dict]:
    import torch

    rows = []
    for bs in batch_sizes:
        row: dict = {"batch_size": bs}
        items = scorer.prepare([paths[i % len(paths)] for i in range(bs)], [prompts[i % len(prompts)] for i in range(bs)])
        seq = [len(it.input_ids) for it in items]
        patches = [it.pixel_values.shape[0] for it in items]
        flops = [flops_per_image(config, p, s)["total"] for p, s in zip(patches, seq)]
        row.update(seq_len=max(seq), patches=max(patches), analytic_tflop_per_image=sum(flops) / len(flops) / 1e12)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        try:
            for _ in range(args.warmup):
                scorer.run_batch(items)
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(args.iters):
                out = scorer.run_batch(items)
            _sync(device)
            dt = time.perf_counter() - t0
        except torch.cuda.OutOfMemoryError:
            row["forward"] = "OOM"
            rows.append(row)
            torch.cuda.empty_cache()
            print(f"batch {bs}: out of memory", file=sys.stderr, flush=True)
            continue
        assert out.shape == (bs, 2) and bool((out == out).all()), "non-finite scores"
        row["forward_ms_per_batch"] = 1000 * dt / args.iters
        row["forward_images_per_s"] = bs * args.iters / dt
        if device.type == "cuda":
            row["peak_gpu_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        # End to end: decode + resize + patchify + tokenise on the prefetch thread, overlapped.
        n_e2e = max(args.e2e_batches * bs, bs)
        e2e_paths = [paths[i % len(paths)] for i in range(n_e2e)]
        e2e_prompts = [prompts[i % len(prompts)] for i in range(n_e2e)]
        scorer.score(e2e_paths[:bs], e2e_prompts[:bs], batch_size=bs)  # warm-up (page cache, allocator)
        _sync(device)
        t0 = time.perf_counter()
        res = scorer.score(e2e_paths, e2e_prompts, batch_size=bs)
        _sync(device)
        dt = time.perf_counter() - t0
        assert res.shape == (n_e2e, 2)
        row["e2e_images"] = n_e2e
        row["e2e_images_per_s"] = n_e2e / dt
        rows.append(row)
        print(
            f"batch {bs:>3}: forward {row['forward_images_per_s']:7.2f} img/s ({row['forward_ms_per_batch']:8.1f} ms/batch), "
            f"end-to-end {row['e2e_images_per_s']:7.2f} img/s, seq {row['seq_len']}, "
            f"{row['analytic_tflop_per_image']:.2f} TFLOP/img"
            + (f", peak {row['peak_gpu_gib']:.1f} GiB" if "peak_gpu_gib" in row else ""),
            file=sys.stderr,
            flush=True,
        )
    return rows


def prep_rate(scorer, paths, prompts, n: int) -> float:
    """CPU preprocessing alone (decode, resize, patchify, tokenise), one thread: images/s."""
    sel = [paths[i % len(paths)] for i in range(n)]
    t0 = time.perf_counter()
    scorer.prepare(sel, [prompts[i % len(prompts)] for i in range(n)])
    return n / (time.perf_counter() - t0)


def markdown(meta: dict, rows: list[dict]) -> str:
    peak = meta["peak_tflops"]
    plan = meta["tflop_per_image"]
    lines = [
        f"Device: {meta['device_name']}; dtype {meta['dtype']}; model {meta['architecture']} "
        f"({meta['parameters'] / 1e9:.2f} B parameters, random weights); torch {meta['torch']}, "
        f"transformers {meta['transformers']}.",
        f"FLOP bound at {peak:g} TFLOP/s: {peak / plan:.1f} images/s with the planning figure of {plan:g} TFLOP/image; "
        f"{peak / meta['analytic_tflop_per_image']:.1f} images/s with this run's analytic count "
        f"({meta['analytic_tflop_per_image']:.2f} TFLOP/image at {meta['seq_len']} text tokens, "
        f"{meta['patches']} ViT patches). CPU preprocessing alone (one thread): {meta['prep_images_per_s']:.1f} images/s.",
        "",
        "| batch | forward images/s | ms/batch | MFU (planning) | MFU (analytic) | end-to-end images/s | peak GPU memory |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("forward") == "OOM":
            lines.append(f"| {r['batch_size']} | OOM | | | | | |")
            continue
        ips = r["forward_images_per_s"]
        mfu_plan = ips * plan / peak
        mfu_an = ips * r["analytic_tflop_per_image"] / peak
        mem = f"{r['peak_gpu_gib']:.1f} GiB" if "peak_gpu_gib" in r else "n/a"
        lines.append(
            f"| {r['batch_size']} | {ips:.2f} | {r['forward_ms_per_batch']:.1f} | {mfu_plan:.0%} | {mfu_an:.0%} "
            f"| {r['e2e_images_per_s']:.2f} | {mem} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", default=None, help="comma-separated (default 1,4,8,16,32; smoke: 1,2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed forward passes per batch size (default 2)")
    ap.add_argument("--iters", type=int, default=None, help="timed forward passes per batch size (default 5)")
    ap.add_argument("--e2e-batches", type=int, default=None, help="batches per end-to-end score() call (default 4)")
    ap.add_argument("--peak-tflops", type=float, default=790.0, help="dense bf16 peak of the GPU, TFLOP/s")
    ap.add_argument("--tflop-per-image", type=float, default=12.0, help="planning FLOP figure per image")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny config on CPU (float32), 2 small batch sizes: checks this script's code path")
    args = ap.parse_args(argv)

    import torch

    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print(
            "CUDA not available: this benchmark needs an NVIDIA GPU with a CUDA build of torch "
            f"(this torch is {torch.__version__}). Use --cpu-smoke to check the code path on CPU.",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cpu") if smoke else torch.device("cuda")
    dtype = torch.float32 if smoke else getattr(torch, args.dtype)
    batch_sizes = [int(x) for x in args.batch_sizes.split(",")] if args.batch_sizes else list(
        SMOKE_BATCH_SIZES if smoke else DEFAULT_BATCH_SIZES
    )
    args.warmup = args.warmup if args.warmup is not None else (1 if smoke else 2)
    args.iters = args.iters if args.iters is not None else (1 if smoke else 5)
    args.e2e_batches = args.e2e_batches if args.e2e_batches is not None else (2 if smoke else 4)
    if min(batch_sizes) < 1 or args.iters < 1 or args.warmup < 0 or args.e2e_batches < 1:
        ap.error("batch sizes and --iters must be >= 1, --warmup >= 0, --e2e-batches >= 1")

    import transformers

    from tasks.suite import load_suite

    suite = load_suite(Path(os.environ.get("BENCH_SRC") or REPO) / "reference" / "suite-imagebench-v1.jsonl")
    prompts = [p.prompt for p in suite.prompts if p.eps_eligible]
    with tempfile.TemporaryDirectory(prefix="gpu-hpsv3-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        scorer, config = build_scorer(work, full_size=not smoke, device=device, dtype=dtype, seed=args.seed)
        n_params = count_parameters(scorer.model)
        print(f"model built in {time.perf_counter() - t0:.1f}s: {n_params / 1e9:.2f} B parameters on {device}",
              file=sys.stderr, flush=True)
        paths = write_images(work / "images", min(64, max(8, max(batch_sizes))))
        prep = prep_rate(scorer, paths, prompts, min(len(paths), 32))
        rows = measure(scorer, config, device, batch_sizes, paths, prompts, args)

    ok = [r for r in rows if r.get("forward") != "OOM"]
    ref = ok[0] if ok else rows[0]
    meta = {
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke test)",
        "dtype": str(dtype).removeprefix("torch."),
        "architecture": "tiny Qwen2-VL (smoke)" if smoke else "Qwen2-VL-7B (full size)",
        "parameters": n_params,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peak_tflops": args.peak_tflops,
        "tflop_per_image": args.tflop_per_image,
        "analytic_tflop_per_image": ref["analytic_tflop_per_image"],
        "seq_len": ref["seq_len"],
        "patches": ref["patches"],
        "prep_images_per_s": prep,
        "smoke": smoke,
    }
    print(markdown(meta, rows))
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
