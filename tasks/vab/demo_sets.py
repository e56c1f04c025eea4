"""Demo and test VAB sets with a known best and worst: scikit-image's bundled photos (offline), each
set one photo at graded levels of degradation. Level 0 is the clean photo (the best), the highest
level the most degraded (the worst); levels in between are ordered too. Every level blurs more
than the one before and adds the set's own kind of damage (JPEG, crop-and-upscale, noise under
the blur), so a plain focus measure (tasks.vab.judges.SharpnessScorer) can recover the order:
the flow's end-to-end check. The stored order is shuffled per task (seeded by the task id) so that
"always slot 1" is not the right answer.

:func:`write_demo_sets` writes PNGs and a ``manifest.jsonl`` in the format of
``imagebench vab import-sets`` (paths relative to the manifest; best/worst 1-based in stored order).

`make demo` imports them as collection ``demo-graded``. Its second collection, ``demo-suite``, is
built *from the lake* (:func:`write_suite_labels`): for the first prompt of every suite category,
the images of three demo models at graded blur (demo-baseline-a pristine = best, demo-baseline-c
blur r=1, demo-blur-r3 = worst; stored order shuffled per prompt). The run: flows/demo_vab.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageFilter

SIDE = 192  # px: small, fast to score and to send
# (photo, kind of damage, number of images): set sizes 2..5, every kind.
DEMO_SPECS: tuple[tuple[str, str, int], ...] = (
    ("astronaut", "blur", 4),
    ("coffee", "jpeg", 3),
    ("chelsea", "crop", 5),
    ("rocket", "noise", 3),
    ("camera", "blur", 2),
    ("coins", "jpeg", 4),
)
BLUR_RADII = (0.0, 1.2, 2.4, 3.6, 5.0)


@dataclass(frozen=True)
class DemoTask:
    task_id: str
    images: list[str]  # file names, stored order
    best: int
    worst: int | None


def _photo(name: str) -> Image.Image:
    from skimage import data

    arr = getattr(data, name)()
    img = Image.fromarray(arr).convert("RGB")
    w, h = img.size
    s = min(w, h)
    return img.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)).resize((SIDE, SIDE), Image.LANCZOS)


def degrade(img: Image.Image, kind: str, level: int, seed: int) -> Image.Image:
    """Level 0: unchanged. Level k: the set's damage at strength k, then Gaussian blur BLUR_RADII[k]."""
    if level == 0:
        return img.copy()
    out = img
    if kind == "jpeg":
        buf = io.BytesIO()
        out.save(buf, format="JPEG", quality=max(5, 60 - 15 * level))
        out = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    elif kind == "crop":
        m = int(SIDE * 0.08 * level)  # crop the border away and scale back up: detail lost
        out = out.crop((m, m, SIDE - m, SIDE - m)).resize((SIDE, SIDE), Image.BILINEAR)
    elif kind == "noise":
        rng = np.random.default_rng(seed + level)
        a = np.asarray(out, dtype=np.float64) + rng.normal(0, 6 * level, (SIDE, SIDE, 3))
        out = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
    elif kind != "blur":
        raise ValueError(f"unknown degradation {kind!r}; known: blur, jpeg, crop, noise")
    return out.filter(ImageFilter.GaussianBlur(BLUR_RADII[level]))


def _stored_order(task_id: str, n: int) -> list[int]:
    """levels in stored order: a permutation of 0..n-1 seeded by the task id."""
    levels = list(range(n))
    random.Random(int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16)).shuffle(levels)
    return levels


def write_demo_sets(out_dir: str | Path, specs: tuple[tuple[str, str, int], ...] = DEMO_SPECS) -> Path:
    """Write the demo sets' PNGs and ``manifest.jsonl`` under ``out_dir``; returns the manifest path.
    Deterministic: the same files every time (PNG of the same pixels)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (photo, kind, n) in enumerate(specs):
        task_id = f"demo-{photo}-{kind}"
        clean = _photo(photo)
        levels = _stored_order(task_id, n)
        names = []
        for level in levels:
            name = f"{task_id}-L{level}.png"
            path = out / name
            if not path.exists():
                degrade(clean, kind, level, seed=i * 100).save(path, format="PNG")
            names.append(name)
        best = levels.index(0) + 1
        worst = levels.index(n - 1) + 1 if n >= 3 else None
        lines.append(json.dumps({"task_id": task_id, "domain": "photography", "substyle": f"graded-{kind}",
                                 "images": names, "best": best, "worst": worst}))
    manifest = out / "manifest.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


# ---- make demo's collections (the run: flows/demo_vab.py) -------------------------------------------
DEMO_SETS = "demo-graded"
DEMO_JUDGES = ["sharpness", "hpsv3"]
SUITE_SETS = "demo-suite"
SUITE_MODELS = ("demo-baseline-a", "demo-baseline-c", "demo-blur-r3")  # best ... worst, by construction


def write_suite_labels(settings: Any, path: Path) -> Path:
    """Labels CSV for `vab build-sets` (tasks.vab.sets.read_lake_labels): one prompt per category."""
    from tasks.runs.pinned import load_pinned_suite
    from tasks.store.spreadsheet import write_csv

    first: dict[str, str] = {}
    for p in load_pinned_suite(settings).prompts:
        first.setdefault(p.category, p.prompt_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for pid in first.values():
        models = list(SUITE_MODELS)
        random.Random(int(hashlib.sha256(pid.encode()).hexdigest()[:8], 16)).shuffle(models)
        rows.append([pid, "photography", " ".join(models), SUITE_MODELS[0], SUITE_MODELS[-1]])
    with path.open("w", newline="") as fh:
        write_csv(fh, ["prompt_id", "domain", "models", "best", "worst"], rows, lineterminator="\r\n")
    return path
