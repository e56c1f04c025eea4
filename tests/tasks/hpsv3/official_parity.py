"""The inputs of the official-parity fixture (official_outputs.json), shared by the test and by
bench/hpsv3_official_reference.py, which generated the fixture from the official code."""

from __future__ import annotations

import io
from pathlib import Path

FIXTURE = Path(__file__).with_name("official_outputs.json")
# Aspect ratios that give six different image grids (every image is resized to ~256*28*28 px).
SIZES = [(448, 448), (300, 500), (640, 360), (200, 900), (512, 512), (333, 257)]
PROMPTS = [
    "a red fox in the snow",
    "an astronaut riding a horse on the moon, cinematic lighting, highly detailed, 4k",
    "two cats",
    "a bowl of ramen with an egg",
    "a minimalist poster with the word HELLO",
    "a lighthouse on a rocky coast during a storm at night with dramatic clouds and waves",
]


def parity_cases() -> list[tuple[bytes, str]]:
    """(PNG bytes, prompt) for each case; PNG is lossless, so both sides see the same pixels."""
    from .conftest import make_image

    cases = []
    for i, (size, prompt) in enumerate(zip(SIZES, PROMPTS, strict=True)):
        buf = io.BytesIO()
        make_image(i, size).save(buf, format="PNG")
        cases.append((buf.getvalue(), prompt))
    return cases


def score_cases(base: str, checkpoint: str, runs: list[tuple[str, str]], batches: dict[str, int]) -> dict:
    """imagebench's mu/sigma for the cases: {dtype: {batch label: [[mu, sigma], ...]}} per
    (dtype, rotary mode) in ``runs``, plus the loaded attention kernel and CPU capability."""
    import torch

    from tasks.hpsv3.scorer import HPSv3Scorer

    from PIL import Image

    images = [Image.open(io.BytesIO(png)) for png, _ in parity_cases()]  # decoded from the same PNG bytes
    prompts = [prompt for _, prompt in parity_cases()]
    from tasks.hpsv3.cpu import cpu_facts

    out: dict = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "machine": cpu_facts(), "mu_sigma": {}}
    for dtype, rotary in runs:
        scorer = HPSv3Scorer.load(base, checkpoint, device="cpu", dtype=dtype, rotary=rotary, uncalibrated=True)
        out["attention_impl"] = scorer.loaded.attention_impl
        out["mu_sigma"][f"{dtype}+{rotary}"] = {
            label: scorer.score(images, prompts, batch_size=size).tolist() for label, size in batches.items()
        }
    return out


if __name__ == "__main__":  # run by test_official_parity in a subprocess with the CPU kernels pinned
    import json
    import sys

    base_dir, checkpoint_file, runs_json, batches_json = sys.argv[1:5]
    runs = [tuple(r) for r in json.loads(runs_json)]
    print(json.dumps(score_cases(base_dir, checkpoint_file, runs, json.loads(batches_json))))  # type: ignore[arg-type]
