"""Session fixtures: one tiny Qwen2-VL base dir (no weights) and one tiny HPSv3 checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image


@pytest.fixture(autouse=True)
def _isolated_imagebench_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The checkpoint-hash sidecar must never land in the developer's real cache.
    monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path / "imagebench-home"))


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tasks.hpsv3.tiny import write_tiny_base_model

    return write_tiny_base_model(tmp_path_factory.mktemp("hpsv3") / "tiny-qwen2vl")


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_base: Path) -> Path:
    from tasks.hpsv3.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tiny_base, tiny_base.parent / "HPSv3-tiny.safetensors", seed=0)


@pytest.fixture(scope="session")
def tiny_layout(tiny_base: Path) -> dict[str, tuple[int, ...]]:
    from tasks.hpsv3.tiny import official_layout_for_base

    return official_layout_for_base(tiny_base)


@pytest.fixture(scope="session")
def scorer(tiny_base: Path, tiny_checkpoint: Path):
    from tasks.hpsv3.scorer import HPSv3Scorer

    return HPSv3Scorer.load(str(tiny_base), str(tiny_checkpoint), device="cpu", dtype="float32", uncalibrated=True)


def make_image(seed: int, size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    """A smooth random image (cheap to resize, and different seeds give different content)."""
    rng = np.random.default_rng(seed)
    w, h = size
    small = rng.integers(0, 256, (max(1, h // 16 + 1), max(1, w // 16 + 1), 3), dtype=np.uint8)
    img = Image.fromarray(small).resize((w, h), Image.BILINEAR)
    noise = rng.integers(-20, 21, (h, w, 3), dtype=np.int16)
    img = Image.fromarray(np.clip(np.asarray(img, dtype=np.int16) + noise, 0, 255).astype(np.uint8))
    return img.convert(mode) if mode != "RGB" else img


@pytest.fixture(scope="session")
def sample_images() -> list[Image.Image]:
    sizes = [(448, 448), (300, 500), (640, 360), (200, 900), (512, 512), (333, 257)]
    return [make_image(i, s) for i, s in enumerate(sizes)]


@pytest.fixture(scope="session")
def sample_prompts() -> list[str]:
    return [
        "a red fox in the snow",
        "an astronaut riding a horse on the moon, cinematic lighting, highly detailed, 4k",
        "two cats",
        "a bowl of ramen with an egg",
        "a minimalist poster with the word HELLO",
        "a lighthouse on a rocky coast during a storm at night with dramatic clouds and waves",
    ]
