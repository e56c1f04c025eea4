"""(a) HPSv3 preprocessing throughput: ours (``tasks.hpsv3.preprocess.preprocess_image``) vs the
official-style path (Qwen's smart_resize + PIL bicubic, then transformers' Qwen2-VL image
processor), on the same files, after checking both give the same pixel_values.

Both paths start from the file path and include the decode (``Image.open(...).convert("RGB")``)
and the bicubic resize, which they share; the difference between them is only the last step
(rescale/normalise/patchify). That step is also timed alone, on the already-resized images.

Timing is paired, because other processes may share the machine: in every round each image goes
through both paths back to back (which one goes first alternates per image and per round), and
each image's time is the median over the rounds; throughput = images / sum of those medians.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from common import CpuMeter, image_bytes
from harness import Context, Report, disturbed_note, round_order, summary_row

# (label, width, height, format): mixed sizes and formats, as labs upload them.
SIZE_CLASSES = (
    ("512x512 PNG", 512, 512, "PNG"),
    ("1024x768 JPEG", 1024, 768, "JPEG"),
    ("1920x1080 JPEG", 1920, 1080, "JPEG"),
    ("300x1200 PNG", 300, 1200, "PNG"),
)


@dataclass
class Files:
    paths: list[Path]
    labels: list[str]


def make_files(root: Path, per_class: int) -> Files:
    root.mkdir(parents=True, exist_ok=True)
    paths, labels = [], []
    for c, (label, w, h, fmt) in enumerate(SIZE_CLASSES):
        for i in range(per_class):
            path = root / f"c{c}-{i:03d}.{'jpg' if fmt == 'JPEG' else 'png'}"
            if not path.exists():
                path.write_bytes(image_bytes(100_000 * (c + 1) + i, w, h, fmt))
            paths.append(path)
            labels.append(label)
    # Interleave the classes so a slow patch of the run does not land on one class only.
    order = sorted(range(len(paths)), key=lambda k: (k % per_class, k // per_class))
    return Files([paths[k] for k in order], [labels[k] for k in order])


def official_processor(min_pixels: int, max_pixels: int):
    """transformers' Qwen2-VL image processor (the PIL backend here: torchvision is not installed,
    and transformers falls back to ``Qwen2VLImageProcessorPil`` by itself)."""
    from transformers import Qwen2VLImageProcessor

    from tasks.hpsv3.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Qwen2VLImageProcessor(
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            patch_size=14,
            temporal_patch_size=2,
            merge_size=2,
            image_mean=list(OPENAI_CLIP_MEAN),
            image_std=list(OPENAI_CLIP_STD),
        )


def official_resize(path: Path) -> Image.Image:
    """hpsv3's fetch_image: open, convert("RGB"), qwen-vl-utils smart_resize (256*28*28), BICUBIC."""
    from tasks.hpsv3.preprocess import HPSV3_PIXELS, IMAGE_FACTOR, smart_resize

    with Image.open(path) as img:
        rgb = img.convert("RGB")
    width, height = rgb.size
    h, w = smart_resize(height, width, IMAGE_FACTOR, HPSV3_PIXELS, HPSV3_PIXELS)
    return rgb.resize((w, h), Image.BICUBIC)


def official_preprocess(path: Path, processor) -> tuple[np.ndarray, np.ndarray]:
    out = processor(images=official_resize(path), return_tensors="np")
    return out["pixel_values"], out["image_grid_thw"]


def run(work: Path, quick: bool, log) -> dict:
    from tasks.hpsv3.preprocess import (
        HPSV3_PIXELS,
        QWEN2VL_PROCESSOR_MAX_PIXELS,
        QWEN2VL_PROCESSOR_MIN_PIXELS,
        patchify,
        preprocess_image,
    )

    per_class = 12 if quick else 50
    rounds = 3 if quick else 4
    t0 = time.perf_counter()
    files = make_files(work / "preprocess-images", per_class)
    log(f"(a) {len(files.paths)} images written in {time.perf_counter() - t0:.1f}s")

    # The processor as the official pipeline builds it: Qwen2-VL-7B-Instruct's own bounds
    # (preprocessor_config.json: 56*56 .. 28*28*16384). The HPSv3 budget 256*28*28 is applied by
    # smart_resize before the processor; giving the processor that budget too makes it resize again.
    proc = official_processor(QWEN2VL_PROCESSOR_MIN_PIXELS, QWEN2VL_PROCESSOR_MAX_PIXELS)
    proc_hpsv3_budget = official_processor(HPSV3_PIXELS, HPSV3_PIXELS)

    # --- equivalence (untimed) ---------------------------------------------------------------
    mismatched, budget_mismatched, max_abs = 0, 0, 0.0
    for path in files.paths:
        ours = preprocess_image(path)
        ref, grid = official_preprocess(path, proc)
        same = tuple(int(x) for x in grid[0]) == ours.grid_thw and ref.shape == ours.pixel_values.shape
        if same:
            max_abs = max(max_abs, float(np.max(np.abs(ref - ours.pixel_values))))
            same = bool(np.allclose(ours.pixel_values, ref, rtol=0, atol=1e-6))
        mismatched += not same
        alt, alt_grid = official_preprocess(path, proc_hpsv3_budget)
        budget_mismatched += not (alt.shape == ours.pixel_values.shape and np.allclose(alt, ours.pixel_values, rtol=0, atol=1e-6))
    if mismatched:
        raise AssertionError(f"(a) {mismatched}/{len(files.paths)} images: ours != official pixel_values (atol 1e-6)")
    log(f"(a) equivalence: {len(files.paths)}/{len(files.paths)} equal (max |diff| {max_abs:.2e})")

    resized = [official_resize(p) for p in files.paths]

    def ours_fn(p):
        preprocess_image(p)

    def official_fn(p):
        official_preprocess(p, proc)

    def ours_step(img):
        patchify(img)

    def official_step(img):
        proc(images=img, return_tensors="np")

    # warm-up (imports, lookup tables, page cache)
    for p in files.paths[:4]:
        ours_fn(p)
        official_fn(p)

    # Paired timing: each image goes through both paths back to back (order alternating per image
    # and per round), so both see the same background load; per image, the median over rounds.
    n = len(files.paths)
    t_full = {"ours": np.zeros((rounds, n)), "official": np.zeros((rounds, n))}
    t_step = {"ours": np.zeros((rounds, n)), "official": np.zeros((rounds, n))}
    cpu = {"ours": 0.0, "official": 0.0}
    fns = {"ours": (ours_fn, ours_step), "official": (official_fn, official_step)}
    others = []
    for r in range(rounds):
        meter = CpuMeter()
        for i in range(n):
            for name in round_order(("ours", "official"), i + r, "alternate"):
                full_fn, step_fn = fns[name]
                c0, t0 = time.process_time(), time.perf_counter()
                full_fn(files.paths[i])
                t1 = time.perf_counter()
                cpu[name] += time.process_time() - c0
                step_fn(resized[i])
                t_full[name][r, i] = t1 - t0
                t_step[name][r, i] = time.perf_counter() - t1
        others.append(meter.others())
        log(
            f"(a) round {r + 1}/{rounds} (other processes used {others[-1]:.0%} of the CPU): ours {n / t_full['ours'][r].sum():.1f} img/s, "
            f"official {n / t_full['official'][r].sum():.1f} img/s; last step only: "
            f"ours {n / t_step['ours'][r].sum():.0f}, official {n / t_step['official'][r].sum():.0f} img/s"
        )

    med_full = {k: np.median(v, axis=0) for k, v in t_full.items()}  # per image, median over rounds
    med_step = {k: np.median(v, axis=0) for k, v in t_step.items()}
    ratios = [t_full["official"][r].sum() / t_full["ours"][r].sum() for r in range(rounds)]
    step_ratios = [t_step["official"][r].sum() / t_step["ours"][r].sum() for r in range(rounds)]
    by_class = {}
    for label, *_ in SIZE_CLASSES:
        idx = [k for k, lab in enumerate(files.labels) if lab == label]
        t_ours, t_off = med_full["ours"][idx].sum(), med_full["official"][idx].sum()
        s_ours, s_off = med_step["ours"][idx].sum(), med_step["official"][idx].sum()
        by_class[label] = {
            "ours_ms": 1000 * t_ours / len(idx),
            "official_ms": 1000 * t_off / len(idx),
            "ratio": t_off / t_ours,
            "step_ours_ms": 1000 * s_ours / len(idx),
            "step_official_ms": 1000 * s_off / len(idx),
        }
    return {
        "images": n,
        "rounds": rounds,
        "equal": n - mismatched,
        "max_abs_diff": max_abs,
        "budget_mismatched": budget_mismatched,
        "ours_ips": n / med_full["ours"].sum(),
        "official_ips": n / med_full["official"].sum(),
        "ratio": med_full["official"].sum() / med_full["ours"].sum(),
        "ratio_range": (min(ratios), max(ratios)),
        "cpu_ratio": cpu["official"] / cpu["ours"],
        "step_ours_ips": n / med_step["ours"].sum(),
        "step_official_ips": n / med_step["official"].sum(),
        "step_ratio": med_step["official"].sum() / med_step["ours"].sum(),
        "step_ratio_range": (min(step_ratios), max(step_ratios)),
        "by_class": by_class,
        "processor_class": type(proc).__name__,
        "others_max": max(others),
        "others": others,
    }


def markdown(res: dict) -> list[str]:
    lo, hi = res["ratio_range"]
    slo, shi = res["step_ratio_range"]
    lines = [
        *disturbed_note(res["others_max"]),
        f"{res['images']} images ({', '.join(lbl for lbl, *_ in SIZE_CLASSES)}, equal numbers of each, made with "
        f"numpy + PIL from fixed seeds), {res['rounds']} timed rounds; paired timing "
        "(each image through both paths back to back, order alternating), per-image median over rounds. Official processor class: "
        f"`{res['processor_class']}` (transformers falls back to it without torchvision).",
        "",
        f"Equivalence check (before timing): **{res['equal']}/{res['images']}** images give the same `pixel_values` "
        f"and `image_grid_thw` (`np.allclose(atol=1e-6)`; max abs diff {res['max_abs_diff']:.1e}).",
        "",
        "| path | images/s |",
        "|---|---|",
        f"| ours: `preprocess_image(path)` | {res['ours_ips']:.1f} |",
        f"| official-style: open + `smart_resize` + PIL bicubic + `Qwen2VLImageProcessor(...)(return_tensors='np')` "
        f"| {res['official_ips']:.1f} |",
        f"| **ratio ours / official** | **{res['ratio']:.2f}x** (single rounds: {lo:.2f} to {hi:.2f}; CPU-time ratio "
        f"{res['cpu_ratio']:.2f}x) |",
        "",
        "Only the last step (rescale, normalise, patchify) on the already-resized image; decode and resize are the "
        "same code in both paths:",
        "",
        "| step | images/s |",
        "|---|---|",
        f"| ours: `patchify(resized)` | {res['step_ours_ips']:.0f} |",
        f"| official: `processor(images=resized, return_tensors='np')` | {res['step_official_ips']:.0f} |",
        f"| **ratio** | **{res['step_ratio']:.1f}x** (single rounds: {slo:.1f} to {shi:.1f}) |",
        "",
        "Per size class (ms per image; the whole path, and the last step alone):",
        "",
        "| class | ours | official | ratio | last step: ours | last step: official |",
        "|---|---|---|---|---|---|",
    ]
    for label, c in res["by_class"].items():
        lines.append(
            f"| {label} | {c['ours_ms']:.1f} | {c['official_ms']:.1f} | {c['ratio']:.2f}x "
            f"| {c['step_ours_ms']:.1f} | {c['step_official_ms']:.1f} |"
        )
    lines += [
        "",
        "The processor is built with Qwen2-VL-7B-Instruct's own bounds (min 56*56, max 28*28*16384, from its "
        "`preprocessor_config.json`), which is what the official HPSv3 code gets from `AutoProcessor`; HPSv3's "
        "256*28*28 budget is applied by `smart_resize` before it. Built with min = max = 256*28*28 instead, the "
        f"processor resizes again and **{res['budget_mismatched']}/{res['images']}** images no longer match "
        "(every size whose smart_resize area is not exactly 200,704 px gets a different grid), so that would "
        "not be the same work.",
    ]
    return lines


def report(ctx: Context) -> Report:
    res = run(ctx.work, ctx.quick, ctx.log)
    summary = summary_row("(a) preprocessing images/s, ours / official-style",
                          f"**{res['ratio']:.2f}x** (last step alone {res['step_ratio']:.1f}x)",
                          f"> 1 (same output: {res['equal']}/{res['images']} equal)", ctx.measured)
    return Report({"a": res}, markdown(res), summary, f"ratio {res['ratio']:.2f}x")
