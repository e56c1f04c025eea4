"""HPSv3 throughput on a GPU with the full-size Qwen2-VL-7B architecture and random weights: the
figures a lab plans with (images/s and GPU-hours per 1,000 models), attention kernels, and the
official HPSv3 code on the same GPU in the same run.

    .venv/bin/python bench/gpu_hpsv3.py --out gpu.json          # CUDA machine: bf16, batch 1/4/8/16/32
    .venv/bin/python bench/gpu_hpsv3.py --plan                  # only the planning table(s) on stdout
    .venv/bin/python bench/gpu_hpsv3.py --official-wheels DIR  # + the official code, ratio ours/official
    .venv/bin/python bench/gpu_hpsv3.py --cpu-smoke             # tiny config on CPU: checks every code path

What it measures, per attention implementation (``--attn``, default sdpa and flash_attention_2;
one that cannot run here is reported with the reason), per sequence length (``--seq-len``,
default real and tiny) and per batch size:
- forward images/s: ``HPSv3Scorer.run_batch`` (collate, host->device copy, forward, scores back
  to the host) on inputs prepared beforehand, CUDA-synchronised, after warm-up iterations;
- end-to-end images/s: ``HPSv3Scorer.score`` over image files (decode, resize, patchify and
  tokenise ahead of the device: the scorer's preprocessing pool where it has one,
  ``--preprocess-workers``), i.e. what a pipeline task gets;
- peak GPU memory (``torch.cuda.max_memory_allocated``); a batch size that runs out of memory is
  reported as OOM (not halved and retried as production does);
- model FLOP utilisation against the peak given by ``--peak-tflops`` (default 790 dense bf16),
  with two FLOP counts per image: the planning figure ``--tflop-per-image`` (default 12) and this
  script's analytic count from the actual sequence lengths (matmuls + attention);
- GPU-hours per 1,000 models (1,000 x the suite's EPS-eligible images / images/s / 3600) at the
  scorer's default batch (``IMAGEBENCH_BATCH_SIZE``'s default) and at the best measured batch,
  forward-only and end to end: the plan table (``--plan`` prints only that).

Sequence length. The tokenizer is the tiny BPE of ``tasks/hpsv3/tiny.py`` (the real one is not
shipped): it makes ~926-token sequences where Qwen2-VL's tokenizer makes ~812 (256 of them the
image's). ``--seq-len real`` cuts each prepared sequence to the real count (instruction text only;
the image block, the prompt, ``<|Reward|>`` and the turn's end stay: ``gpu_plan.fit_length``),
counted exactly with ``--tokenizer DIR`` (a local copy of Qwen2-VL's tokenizer files) or else
estimated as documented in ``bench/gpu_plan.py`` (within 7 tokens on the suite). ``tiny`` runs the
sequences as the tiny tokenizer makes them (what the official code gets from the same base dir);
an integer N runs every sequence at N tokens.

The model is built exactly as ``tasks.hpsv3.model.load_hpsv3`` builds it (meta device, official
rotary numerics, float32 reward head) except that the weights are random, initialised in place on
the device (deterministic from ``--seed``), so no 16 GB checkpoint is needed. Scores from random
weights mean nothing; only the speed does.

``--official``: after imagebench's model is freed, bench/gpu_official.py runs the official
``HPSv3RewardInferencer`` (hpsv3 1.0.0) on the same GPU, with the same random weights, the same
image files and prompts and the tiny-tokenizer sequences, at ``--official-batch-sizes`` (1,8); the
ratios ours/official compare with imagebench's ``tiny`` rows, same attention. The official code
pins transformers 4.45.2: ``--official-wheels DIR`` (wheels of hpsv3 1.0.0, transformers 4.45.2,
tokenizers 0.20.3, huggingface_hub 0.36.2; no network needed) installs them into a temporary
directory that is put first on the worker's path, shadowing transformers 5 and reusing this
venv's torch; or ``--official-wheel FILE --official-python PY`` runs it in another environment.

Without CUDA (and without --cpu-smoke) it prints "CUDA not available" and exits with code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import inspect
import json
import os
import sys
import tempfile
import time
import weakref
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("BENCH_SRC") or str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_plan as P  # noqa: E402  (bench/, no torch at import)
from gpu_official import init_rule, init_values, install_wheels, locate_source, preflight, run_official  # noqa: E402

DEFAULT_BATCH_SIZES = (1, 4, 8, 16, 32)
SMOKE_BATCH_SIZES = (1, 8)  # 8: the default batch, so the plan table has its row
OFFICIAL_BATCH_SIZES = (1, 8)
IMAGE_SIZES = ((1024, 1024), (1344, 768), (768, 1344), (1024, 1024))  # typical T2I outputs; all -> ~448x448
PREPROCESS_WORKERS_ENV = "IMAGEBENCH_HPSV3_PREPROCESS_WORKERS"


def default_batch_size() -> int:
    """The scorer's default batch (``IMAGEBENCH_BATCH_SIZE`` unset), from the settings model."""
    from schemas.settings import Settings

    return int(Settings.model_fields["batch_size"].default)


# --------------------------------------------------------------------------------------------
# Model with random weights
# --------------------------------------------------------------------------------------------


def init_plan(model) -> list[tuple[str, int, str]]:
    """(parameter name, seed index, rule) for every parameter, in the order that fixes the seeds."""
    return [(name, k, init_rule(name, tuple(p.shape))) for k, (name, p) in enumerate(sorted(model.named_parameters()))]


def random_init_(model, seed: int) -> None:
    """Fill every parameter in place on its device (``gpu_official.init_values``: activations
    O(1), distinct scores); the official worker draws the same values for the same parameters."""
    import torch

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, k, rule in init_plan(model):
            param = params[name]
            param.copy_(init_values(tuple(param.shape), k, rule, seed, param.device).to(param.dtype))


def build_scorer(work: Path, full_size: bool, device, dtype, seed: int, attention: str, preprocess_workers: int | None):
    """(HPSv3Scorer, transformers config, base dir) for the full-size 7B architecture or the tiny
    one, with the given attention implementation."""
    from tasks.hpsv3 import model as M
    from tasks.hpsv3.preprocess import VisionPreprocessConfig
    from tasks.hpsv3.scorer import HPSv3Scorer
    from tasks.hpsv3.tiny import full_size_qwen2vl_7b_config, write_tiny_base_model

    base_dir = work / "base"
    if not (base_dir / "config.json").is_file():
        write_tiny_base_model(base_dir, config=full_size_qwen2vl_7b_config() if full_size else None)
    base_config = M.read_base_config(base_dir)
    tokenizer = M.load_tokenizer(base_dir)
    chat_template = M.load_chat_template(base_dir, tokenizer)
    vision = VisionPreprocessConfig.from_preprocessor_config(base_dir)
    config = M.build_config(base_config, tokenizer)
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
    kwargs = {}
    if preprocess_workers is not None and "preprocess_workers" in inspect.signature(HPSv3Scorer).parameters:
        kwargs["preprocess_workers"] = preprocess_workers  # else the environment variable set in main()
    return HPSv3Scorer(loaded, str(base_dir), uncalibrated=True, **kwargs), config, base_dir


def scorer_workers(scorer) -> int | None:
    """Preprocessing worker processes the scorer's ``score`` uses (None: a scorer without a pool)."""
    return getattr(scorer, "workers", None)


def close_scorer(scorer) -> None:
    close = getattr(scorer, "close", None)
    if close is not None:
        close()


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


class SeqLength:
    """One ``--seq-len`` choice: ``tiny`` (as the tiny tokenizer makes them), ``real`` (Qwen2-VL's
    count, exact or estimated) or a fixed integer. Items are mapped back to their prompt by the
    tokens after the image block (they depend on the prompt only), so it can be applied to any
    batch the scorer runs."""

    def __init__(self, spec: str, scorer, prompts, real: P.RealLengthTokens | None = None) -> None:
        self.spec, self.real, self.scorer = spec, real, scorer
        self.fixed = int(spec) if spec.isdigit() else None
        if spec not in ("tiny", "real") and self.fixed is None:
            raise ValueError(f"--seq-len {spec!r}: expected tiny, real or a token count")
        if spec == "real" and real is None:
            raise ValueError("--seq-len real needs the real-length counter")
        self._prompt_by_key: dict[bytes, str] = {}
        if spec == "real":
            from tasks.hpsv3.model import render_text

            loaded = scorer.loaded
            for p in dict.fromkeys(prompts):
                ids = loaded.tokenizer(render_text(loaded.tokenizer, loaded.chat_template, p, 1))["input_ids"]
                self._prompt_by_key[self._key(ids)] = p

    def _key(self, ids) -> bytes:
        import numpy as np

        ids = np.asarray(ids, dtype=np.int64)
        image = np.flatnonzero(ids == self.scorer.loaded.model.image_token_id)
        return ids[int(image[-1]) + 2 :].tobytes()  # after the pads and <|vision_end|>

    @property
    def label(self) -> str:
        return {"tiny": "tiny tokenizer", "real": "real length"}.get(self.spec, f"{self.spec} tokens")

    def fit(self, items):
        """The items at this length."""
        if self.spec == "tiny":
            return list(items)
        from tasks.hpsv3.model import EncodedItem

        loaded = self.scorer.loaded
        image_id = loaded.model.image_token_id
        out = []
        for it in items:
            if self.fixed is not None:
                target = self.fixed
            else:
                prompt = self._prompt_by_key.get(self._key(it.input_ids))
                if prompt is None:
                    raise ValueError("an item's prompt is not among the benchmark's prompts")
                target = self.real.length(prompt, int((it.input_ids == image_id).sum()))
            ids = P.fit_length(it.input_ids, target, image_id, loaded.reward_token_id)
            out.append(EncodedItem(ids, it.pixel_values, it.grid_thw))
        return out


@contextlib.contextmanager
def sequences_at(scorer, seq: SeqLength):
    """While active, every batch the scorer runs is first brought to ``seq``'s length. Wraps the
    batch runner, so it holds on every preprocessing path (one thread or a worker pool)."""
    if seq.spec == "tiny":
        yield
        return
    original = scorer.batch_runner
    scorer.batch_runner = lambda items: original(seq.fit(items))
    try:
        yield
    finally:
        scorer.batch_runner = original


def measure(scorer, config, device, batch_sizes, paths, prompts, args, seq: SeqLength) -> list[dict]:
    import torch

    rows = []
    for bs in batch_sizes:
        row: dict = {"batch_size": bs, "seq": seq.spec}
        items = seq.fit(
            scorer.prepare([paths[i % len(paths)] for i in range(bs)], [prompts[i % len(prompts)] for i in range(bs)])
        )
        lens = [len(it.input_ids) for it in items]
        patches = [it.pixel_values.shape[0] for it in items]
        flops = [flops_per_image(config, p, s)["total"] for p, s in zip(patches, lens)]
        row.update(seq_len=max(lens), seq_len_mean=sum(lens) / len(lens), patches=max(patches),
                   analytic_tflop_per_image=sum(flops) / len(flops) / 1e12)  # fmt: skip
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
            if not (out.shape == (bs, 2) and bool((out == out).all())):
                raise RuntimeError(f"batch {bs}: non-finite or misshapen scores {out.shape}")
            row["forward_ms_per_batch"] = 1000 * dt / args.iters
            row["forward_images_per_s"] = bs * args.iters / dt
        except torch.cuda.OutOfMemoryError:
            row["forward"] = "OOM"
            rows.append(row)
            torch.cuda.empty_cache()
            print(f"batch {bs}: out of memory", file=sys.stderr, flush=True)
            continue
        # End to end: decode + resize + patchify + tokenise ahead of the device, overlapped.
        n_e2e = max(args.e2e_batches * bs, bs)
        e2e_paths = [paths[i % len(paths)] for i in range(n_e2e)]
        e2e_prompts = [prompts[i % len(prompts)] for i in range(n_e2e)]
        with sequences_at(scorer, seq):
            scorer.score(e2e_paths[:bs], e2e_prompts[:bs], batch_size=bs)  # warm-up (workers, page cache)
            _sync(device)
            t0 = time.perf_counter()
            res, sizes = scorer.score_with_batch_sizes(e2e_paths, e2e_prompts, batch_size=bs)
            _sync(device)
            dt = time.perf_counter() - t0
        if res.shape != (n_e2e, 2):
            raise RuntimeError(f"end-to-end scores have shape {res.shape}, expected ({n_e2e}, 2)")
        row["e2e_images"] = n_e2e
        row["e2e_images_per_s"] = n_e2e / dt
        if min(sizes) < bs:  # the scorer halved the batch after a CUDA OOM, as in production
            row["e2e_halved_to"] = min(sizes)
        if device.type == "cuda":  # the peak over the forward-only and the end-to-end runs
            row["peak_gpu_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        rows.append(row)
        print(
            f"{seq.label:>14}, batch {bs:>3}: forward {row['forward_images_per_s']:7.2f} img/s "
            f"({row['forward_ms_per_batch']:8.1f} ms/batch), end-to-end {row['e2e_images_per_s']:7.2f} img/s, "
            f"seq {row['seq_len']}, {row['analytic_tflop_per_image']:.2f} TFLOP/img"
            + (f", peak {row['peak_gpu_gib']:.1f} GiB" if "peak_gpu_gib" in row else ""),
            file=sys.stderr,
            flush=True,
        )
    return rows


def tiny_length(scorer, prompt: str, n_image_tokens: int) -> int:
    """Tokens of the sequence the tiny tokenizer makes for ``prompt``."""
    from tasks.hpsv3.model import render_text

    loaded = scorer.loaded
    return len(loaded.tokenizer(render_text(loaded.tokenizer, loaded.chat_template, prompt, n_image_tokens))["input_ids"])


def prep_rate(scorer, paths, prompts, n: int) -> float:
    """CPU preprocessing alone (decode, resize, patchify, tokenise), one thread: images/s."""
    sel = [paths[i % len(paths)] for i in range(n)]
    t0 = time.perf_counter()
    scorer.prepare(sel, [prompts[i % len(prompts)] for i in range(n)])
    return n / (time.perf_counter() - t0)


def rows_table(rows: list[dict], peak: float, plan: float) -> list[str]:
    lines = [
        "| batch | forward images/s | ms/batch | MFU (planning) | MFU (analytic) | end-to-end images/s | peak GPU memory | tokens (max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("forward") == "OOM":
            lines.append(f"| {r['batch_size']} | OOM | | | | | | {r['seq_len']} |")
            continue
        ips = r["forward_images_per_s"]
        mem = f"{r['peak_gpu_gib']:.1f} GiB" if "peak_gpu_gib" in r else "n/a"
        lines.append(
            f"| {r['batch_size']} | {ips:.2f} | {r['forward_ms_per_batch']:.1f} | {ips * plan / peak:.0%} "
            f"| {ips * r['analytic_tflop_per_image'] / peak:.0%} | {r['e2e_images_per_s']:.2f}"
            + (f" (OOM: halved to {r['e2e_halved_to']})" if "e2e_halved_to" in r else "")
            + f" | {mem} | {r['seq_len']} |"
        )
    return lines


def _by_batch(rows: list[dict]) -> dict[int, dict]:
    return {r["batch_size"]: r for r in rows if r.get("forward") != "OOM"}


def attention_lines(configs: list[dict], seq: str) -> list[str]:
    """flash_attention_2 / sdpa per batch, at one sequence length."""
    ok = {c["attn"]: _by_batch(c["seq"].get(seq, [])) for c in configs if c["status"] == "ok"}
    lines = [f"Attention ({seq} sequences): " + "; ".join(f"{c['attn']}: {c['status']}" for c in configs) + "."]
    if {"sdpa", "flash_attention_2"} <= set(ok):
        sd, fl = ok["sdpa"], ok["flash_attention_2"]
        lines += ["", "| batch | forward flash-attention 2 / SDPA | end-to-end flash-attention 2 / SDPA |", "|---|---|---|"]
        for bs in sorted(set(sd) & set(fl)):
            f = P.ratio(fl[bs]["forward_images_per_s"], sd[bs]["forward_images_per_s"])
            e = P.ratio(fl[bs]["e2e_images_per_s"], sd[bs]["e2e_images_per_s"])
            lines.append(f"| {bs} | {f:.2f}x | {e:.2f}x |")
    return lines


def official_lines(official: dict, configs: list[dict], ours_mu: dict) -> list[str]:
    if "error" in official or "skipped" in official:
        return [f"Official code: {official.get('error') or official.get('skipped')}."]
    lines = [
        f"Official code ({official['source']}; torch {official['torch']}, transformers {official['transformers']}) "
        "on the same device in this run, same random weights, same files and prompts, tiny-tokenizer sequences:",
        "",
        "| attention | batch | forward images/s, ours / official | ratio | end-to-end images/s, ours / official | ratio | peak memory, ours / official | max abs mu diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ours = {c["attn"]: _by_batch(c["seq"].get("tiny", [])) for c in configs if c["status"] == "ok"}
    for res in official["results"]:
        if "error" in res:
            lines.append(f"| {res['attn']} | | official model not built: {res['error']} | | | | | |")
        for r in res["rows"]:
            bs, mine = r["batch_size"], ours.get(res["attn"], {}).get(r["batch_size"])
            if r.get("forward") == "OOM" or mine is None:
                lines.append(f"| {res['attn']} | {bs} | {'OOM' if r.get('forward') == 'OOM' else 'ours not measured'} | | | | | |")
                continue
            fo, fe = r["forward_images_per_s"], r["e2e_images_per_s"]
            mo, me = mine["forward_images_per_s"], mine["e2e_images_per_s"]
            mem = (f"{mine['peak_gpu_gib']:.1f} / {r['peak_gpu_gib']:.1f} GiB" if "peak_gpu_gib" in r and "peak_gpu_gib" in mine
                   else "n/a")  # fmt: skip
            mu = ours_mu.get(res["attn"])
            diff = max(abs(a - b) for a, b in zip(mu, r["mu"])) if mu and r.get("mu") else float("nan")
            lines.append(f"| {res['attn']} | {bs} | {mo:.2f} / {fo:.2f} | **{mo / fo:.2f}x** | {me:.2f} / {fe:.2f} "
                         f"| **{me / fe:.2f}x** | {mem} | {diff:.2g} |")  # fmt: skip
    return lines


def plan_sections(results: dict) -> list[str]:
    meta = results["meta"]
    out = []
    seq = meta["plan_seq"]
    for c in results["configs"]:
        if c["status"] != "ok" or seq not in c["seq"]:
            continue
        entries = P.plan_entries(c["seq"][seq], meta["default_batch"], meta["images_per_model"])
        c["plan"] = entries
        title = f"Plan on {meta['device_name']} ({meta['architecture']}, {meta['dtype']}, {c['attn']}, {seq} sequences"
        title += f", {meta['preprocess_workers']} preprocessing workers)" if meta["preprocess_workers"] is not None else ")"
        out += [P.plan_table(entries, meta["images_per_model"], title), ""]
    return out


def markdown(results: dict) -> str:
    meta = results["meta"]
    peak, plan = meta["peak_tflops"], meta["tflop_per_image"]
    lines = [
        f"Device: {meta['device_name']}; dtype {meta['dtype']}; model {meta['architecture']} "
        f"({meta['parameters'] / 1e9:.2f} B parameters, random weights); torch {meta['torch']}, "
        f"transformers {meta['transformers']}; default batch {meta['default_batch']}; preprocessing workers "
        f"{meta['preprocess_workers'] if meta['preprocess_workers'] is not None else 'n/a (one prefetch thread)'}.",
        f"Sequence lengths (mean over the suite's {meta['images_per_model']} EPS-eligible prompts): tiny tokenizer "
        f"{meta['tiny_len_mean']:.0f}, real {meta['real_len_mean']:.0f} ({meta['real_len_source']}); "
        f"{meta['patches']} ViT patches per image. FLOP bound at {peak:g} TFLOP/s: {peak / plan:.1f} images/s with the "
        f"planning figure of {plan:g} TFLOP/image. CPU preprocessing alone (one thread): {meta['prep_images_per_s']:.1f} images/s.",
        "",
    ]
    lines += plan_sections(results)
    for c in results["configs"]:
        if c["status"] != "ok":
            continue
        for seq, rows in c["seq"].items():
            lines += [f"**{c['attn']}, {seq} sequences**", "", *rows_table(rows, peak, plan), ""]
    lines += attention_lines(results["configs"], meta["plan_seq"]) + [""]
    if "official" in results:
        lines += official_lines(results["official"], results["configs"], results.get("ours_mu", {}))
    return "\n".join(lines).rstrip() + "\n"


def parse_ints(spec: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{name} {spec!r}: expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise SystemExit(f"{name} {spec!r}: expected integers >= 1")
    return values


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
    ap.add_argument("--seq-len", default="real,tiny",
                    help="comma-separated: real (Qwen2-VL's token count), tiny (the tiny tokenizer's), or N tokens; "
                         "the first one is planned with (default real,tiny)")  # fmt: skip
    ap.add_argument("--tokenizer", default=None, help="directory with Qwen2-VL's tokenizer files: exact real lengths")
    ap.add_argument("--attn", default="sdpa,flash_attention_2", help="attention implementations to measure")
    ap.add_argument("--preprocess-workers", type=int, default=None,
                    help=f"preprocessing worker processes of the scorer (sets {PREPROCESS_WORKERS_ENV}; default: the scorer's)")
    ap.add_argument("--plan", action="store_true", help="print only the planning table(s) (images/s, GPU-hours, memory)")
    ap.add_argument("--official", action="store_true",
                    help="also run the official HPSv3 code (--official-wheels, or --official-wheel + --official-python)")
    ap.add_argument("--official-wheels", type=Path, default=None,
                    help="directory of wheels: hpsv3 1.0.0, transformers 4.45.2, tokenizers 0.20, huggingface_hub < 1; "
                         "installed offline into a temporary directory put before this venv on the worker's path")
    ap.add_argument("--official-python", default=None,
                    help="Python of an environment with torch and transformers 4.45.2 (default: this one)")
    ap.add_argument("--official-wheel", type=Path, default=None, help="hpsv3 1.0.0 wheel, sdist or unpacked source")
    ap.add_argument("--official-batch-sizes", default=",".join(map(str, OFFICIAL_BATCH_SIZES)))
    ap.add_argument("--official-timeout", type=float, default=1800.0, help="seconds for the official worker")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny config on CPU (float32), 2 small batch sizes: checks this script's code paths")
    args = ap.parse_args(argv)

    smoke = args.cpu_smoke
    try:
        attns = P.parse_attention(args.attn)
    except ValueError as exc:
        ap.error(str(exc))
    seq_specs = list(dict.fromkeys(s.strip() for s in args.seq_len.split(",") if s.strip()))
    bad = [s for s in seq_specs if s not in ("real", "tiny") and not s.isdigit()]
    if bad or not seq_specs:
        ap.error(f"--seq-len {args.seq_len!r}: expected a comma-separated list of real, tiny or token counts")
    official_bs = parse_ints(args.official_batch_sizes, "--official-batch-sizes")
    if args.official_wheels is not None:
        if not args.official_wheels.is_dir():
            ap.error(f"--official-wheels {args.official_wheels}: not a directory")
        args.official = True
        if args.official_wheel is None:
            found = sorted(args.official_wheels.glob("hpsv3-*"))
            if not found:
                ap.error(f"--official-wheels {args.official_wheels}: no hpsv3-* wheel or sdist there")
            args.official_wheel = found[-1]
    args.official = args.official or args.official_wheel is not None
    if args.official and args.official_wheel is None:
        ap.error("--official needs --official-wheels DIR, or --official-wheel (with --official-python of an "
                 "environment that has transformers 4.45.2)")  # fmt: skip
    if args.official_wheel and not args.official_wheel.exists():
        ap.error(f"--official-wheel {args.official_wheel}: no such file or directory")
    if args.preprocess_workers is not None:
        if args.preprocess_workers < 0:
            ap.error("--preprocess-workers must be >= 0")
        os.environ[PREPROCESS_WORKERS_ENV] = str(args.preprocess_workers)

    import torch

    if not smoke and not torch.cuda.is_available():
        print(
            "CUDA not available: this benchmark needs an NVIDIA GPU with a CUDA build of torch "
            f"(this torch is {torch.__version__}). Use --cpu-smoke to check the code paths on CPU.",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cpu") if smoke else torch.device("cuda")
    dtype = torch.float32 if smoke else getattr(torch, args.dtype)
    batch_sizes = parse_ints(args.batch_sizes, "--batch-sizes") if args.batch_sizes else list(
        SMOKE_BATCH_SIZES if smoke else DEFAULT_BATCH_SIZES
    )
    if args.official:
        batch_sizes = sorted(set(batch_sizes) | set(official_bs))
        if "tiny" not in seq_specs:  # the official code runs the tiny tokenizer's sequences
            seq_specs.append("tiny")
    args.warmup = args.warmup if args.warmup is not None else (1 if smoke else 2)
    args.iters = args.iters if args.iters is not None else (1 if smoke else 5)
    args.e2e_batches = args.e2e_batches if args.e2e_batches is not None else (2 if smoke else 4)
    if args.iters < 1 or args.warmup < 0 or args.e2e_batches < 1:
        ap.error("--iters must be >= 1, --warmup >= 0, --e2e-batches >= 1")
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None

    import transformers

    from tasks.scores.suite import load_suite

    suite = load_suite(Path(os.environ.get("BENCH_SRC") or REPO) / "reference" / "suite-imagebench-v1.jsonl")
    prompts = [p.prompt for p in suite.prompts if p.eps_eligible]
    real = P.RealLengthTokens(args.tokenizer)
    results: dict = {"configs": []}
    with tempfile.TemporaryDirectory(prefix="gpu-hpsv3-") as tmp:
        work = Path(tmp)
        if args.official:  # set up and check the official side before any GPU time is spent
            scratch = work / "official"
            scratch.mkdir()
            official_src = locate_source(args.official_wheel, scratch)
            pythonpath = install_wheels(args.official_wheels, scratch / "site") if args.official_wheels else None
            python = args.official_python or sys.executable
            problem = preflight(python, pythonpath)
            if problem:
                raise SystemExit(f"--official: {problem}")
        paths = write_images(work / "images", min(64, max(8, max(batch_sizes))))
        meta_extra: dict = {}
        for attn in attns:
            why = P.attention_unavailable(attn, device.type, capability)
            config_res: dict = {"attn": attn, "status": "ok" if why is None else why, "seq": {}}
            results["configs"].append(config_res)
            if why is not None:
                print(f"{attn}: {why}", file=sys.stderr, flush=True)
                continue
            t0 = time.perf_counter()
            scorer, config, base_dir = build_scorer(work, not smoke, device, dtype, args.seed, attn, args.preprocess_workers)
            model_ref = weakref.ref(scorer.model)
            seq = None
            try:
                n_params = count_parameters(scorer.model)
                print(f"model built ({attn}) in {time.perf_counter() - t0:.1f}s: {n_params / 1e9:.2f} B parameters on {device}",
                      file=sys.stderr, flush=True)  # fmt: skip
                if not meta_extra:
                    first = scorer.prepare(paths[:1], prompts[:1])[0]
                    n_image = int((first.input_ids == scorer.loaded.model.image_token_id).sum())
                    meta_extra = {
                        "parameters": n_params,
                        "prep_images_per_s": prep_rate(scorer, paths, prompts, min(len(paths), 32)),
                        "tiny_len_mean": sum(tiny_length(scorer, p, n_image) for p in prompts) / len(prompts),
                        "real_len_mean": sum(real.length(p, n_image) for p in prompts) / len(prompts),
                        "patches": int(first.pixel_values.shape[0]),
                        "init_plan": init_plan(scorer.model),
                        "base_dir": base_dir,
                    }
                for spec in seq_specs:
                    seq = SeqLength(spec, scorer, prompts, real if spec == "real" else None)
                    config_res["seq"][spec] = measure(scorer, config, device, batch_sizes, paths, prompts, args, seq)
                if args.official:  # mu on the files the official code scores, for the comparison
                    sel_p = [prompts[i % len(prompts)] for i in range(len(paths))]
                    results.setdefault("ours_mu", {})[attn] = scorer.score(paths, sel_p, batch_size=8)[:, 0].tolist()
                workers = scorer_workers(scorer)
            finally:
                close_scorer(scorer)
                del scorer, seq
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            if model_ref() is not None:  # the next model (or the official code) would share the device with it
                print(f"warning: the {attn} model is still referenced after its measurements", file=sys.stderr, flush=True)
        if not meta_extra:
            raise SystemExit(f"no attention implementation could run: {results['configs']}")
        if args.official:
            ran = [c["attn"] for c in results["configs"] if c["status"] == "ok"]
            job = {
                "official_src": str(official_src), "source": str(args.official_wheel),
                "base_dir": str(meta_extra["base_dir"]), "init_plan": [
                    [name_official, k, rule] for name, k, rule in meta_extra["init_plan"]
                    if (name_official := _official_key(name)) is not None
                ],
                "seed": args.seed, "dtype": str(dtype).removeprefix("torch."), "device": device.type, "attn": ran,
                "paths": paths, "prompts": [prompts[i % len(prompts)] for i in range(len(paths))],
                "batch_sizes": official_bs, "warmup": args.warmup, "iters": args.iters, "e2e_batches": args.e2e_batches,
            }  # fmt: skip
            results["official"] = run_official(python, job, scratch, args.official_timeout, pythonpath)
    meta_extra.pop("init_plan")
    meta_extra.pop("base_dir")
    results["meta"] = {
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke test)",
        "dtype": str(dtype).removeprefix("torch."),
        "architecture": "tiny Qwen2-VL (smoke)" if smoke else "Qwen2-VL-7B (full size)",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peak_tflops": args.peak_tflops,
        "tflop_per_image": args.tflop_per_image,
        "default_batch": default_batch_size(),
        "images_per_model": len(prompts),
        "preprocess_workers": workers,
        "real_len_source": real.source,
        "plan_seq": seq_specs[0],
        "smoke": smoke,
        **meta_extra,
    }
    report = markdown(results)  # also fills each configuration's "plan"
    if args.plan:  # the plan, and the official comparison when it ran (it is not worth a second run)
        extra = official_lines(results["official"], results["configs"], results.get("ours_mu", {})) if "official" in results else []
        print("\n".join(plan_sections(results) + extra).rstrip())
    else:
        print(report, end="")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


def _official_key(name: str) -> str | None:
    from tasks.hpsv3.model import internal_to_official

    return internal_to_official(name)


if __name__ == "__main__":
    raise SystemExit(main())
