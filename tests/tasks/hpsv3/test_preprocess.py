"""Preprocessing parity with the official path: official smart_resize + PIL bicubic, then
transformers' Qwen2-VL image processor (PIL backend) with the same config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tasks.hpsv3.preprocess import (
    HPSV3_PIXELS,
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    VisionPreprocessConfig,
    patchify,
    preprocess_image,
    resize_for_hpsv3,
    smart_resize,
    to_rgb,
)

from .conftest import make_image

# (height, width) -> official hpsv3 smart_resize(h, w, 28, 256*28*28, 256*28*28), computed once
# with the function in hpsv3 1.0.0's hpsv3/dataset/utils.py.
OFFICIAL_SMART_RESIZE = [
    ((1, 1), (448, 448)),
    ((1, 200), (56, 6356)),
    ((200, 1), (6356, 56)),
    ((10, 1990), (56, 6328)),
    ((100, 20000), (28, 6328)),
    ((20, 3900), (56, 6272)),
    ((448, 448), (448, 448)),
    ((447, 449), (448, 448)),
    ((512, 512), (448, 448)),
    ((1024, 768), (504, 364)),
    ((1080, 1920), (336, 588)),
    ((4000, 3000), (504, 364)),
    ((28, 28), (448, 448)),
    ((14, 14), (448, 448)),
    ((300, 299), (476, 448)),
    ((1, 2), (336, 644)),
    ((7, 1400), (56, 6356)),
    ((333, 777), (280, 672)),
    ((999, 1001), (420, 448)),
    ((1234, 567), (644, 280)),
    ((720, 1280), (336, 588)),
    ((517, 333), (560, 364)),
    ((3, 5), (364, 588)),
    ((3000, 4000), (364, 504)),
    ((1400, 7), (6356, 56)),
    ((290, 310), (448, 476)),
    ((375, 500), (392, 532)),
    ((480, 640), (364, 504)),
    ((600, 300), (644, 336)),
    ((90, 120), (392, 532)),
    ((20000, 100), (6328, 28)),
    ((1920, 1080), (588, 336)),
    ((1001, 999), (448, 420)),
]


@pytest.mark.parametrize(("hw", "expected"), OFFICIAL_SMART_RESIZE)
def test_smart_resize_matches_official_values(hw: tuple[int, int], expected: tuple[int, int]) -> None:
    assert smart_resize(*hw) == expected


def test_smart_resize_official_defaults_and_ratio_error() -> None:
    # qwen-vl-utils defaults (min 4*28*28, max 16384*28*28), also pinned from the official function
    assert smart_resize(1, 1, 28, 4 * 28 * 28, 16384 * 28 * 28) == (56, 56)
    assert smart_resize(5000, 5000, 28, 4 * 28 * 28, 16384 * 28 * 28) == (3556, 3556)
    assert smart_resize(30, 5000, 28, 4 * 28 * 28, 16384 * 28 * 28) == (28, 5012)
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2001)
    smart_resize(10, 2000)  # exactly 200 is allowed


def _official_pipeline(img: Image.Image, v5_convert_rgb: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """fetch_image (convert RGB, official smart_resize, PIL BICUBIC) -> transformers' processor.

    transformers 4.45's convert_to_rgb returns an RGB image unchanged, so the 4.45 path is the
    v5 processor with do_convert_rgb=False (v5 would composite an RGB image that still carries a
    palette transparency colour onto white: see test_v5_convert_rgb_drift)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    rgb = img.convert("RGB")
    width, height = rgb.size
    h, w = dict(OFFICIAL_SMART_RESIZE)[(height, width)]  # pinned official values only
    resized = rgb.resize((w, h), Image.BICUBIC)
    processor = Qwen2VLImageProcessorPil(
        min_pixels=56 * 56,
        max_pixels=28 * 28 * 16384,
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=list(OPENAI_CLIP_MEAN),
        image_std=list(OPENAI_CLIP_STD),
    )
    out = processor(images=[resized], return_tensors="np", do_convert_rgb=v5_convert_rgb)
    return np.asarray(out["pixel_values"]), np.asarray(out["image_grid_thw"])


def _with_transparency(mode: str) -> Image.Image:
    base = make_image(7, (310, 290))
    if mode == "RGBA":
        img = base.convert("RGBA")
        alpha = np.zeros((290, 310), dtype=np.uint8)
        alpha[:, 150:] = 255
        img.putalpha(Image.fromarray(alpha))
        return img
    if mode == "LA":
        img = base.convert("LA")
        img.putalpha(Image.fromarray(np.tile(np.arange(310, dtype=np.uint8), (290, 1))))
        return img
    if mode == "P":
        img = base.convert("P", palette=Image.ADAPTIVE, colors=16)
        img.info["transparency"] = 3
        return img
    raise AssertionError(mode)


CASES = {
    "rgb-square": lambda: make_image(0, (448, 448)),
    "rgb-non-multiple": lambda: make_image(1, (333, 517)),
    "tiny-1x1": lambda: make_image(2, (1, 1)),
    "tiny-3x5": lambda: make_image(3, (5, 3)),
    "huge": lambda: make_image(4, (4000, 3000)),
    "extreme-wide": lambda: make_image(5, (3900, 20)),
    "extreme-tall": lambda: make_image(6, (7, 1400)),
    "rgba": lambda: _with_transparency("RGBA"),
    "la": lambda: _with_transparency("LA"),
    "p-transparency": lambda: _with_transparency("P"),
    "l": lambda: make_image(8, (500, 375), "L"),
    "1-bit": lambda: make_image(9, (640, 480), "1"),
    "cmyk": lambda: make_image(10, (300, 600), "CMYK"),
    "i16": lambda: Image.fromarray((np.arange(120 * 90, dtype=np.uint16).reshape(90, 120) * 7)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_preprocess_matches_official_processor(name: str) -> None:
    img = CASES[name]()
    ours = preprocess_image(img)
    ref_pixels, ref_grid = _official_pipeline(img)
    assert tuple(ref_grid[0]) == ours.grid_thw
    assert ours.pixel_values.dtype == np.float32
    assert ours.pixel_values.shape == ref_pixels.shape
    np.testing.assert_allclose(ours.pixel_values, ref_pixels, rtol=0, atol=1e-6)
    assert ours.n_image_tokens == ours.grid_thw[1] * ours.grid_thw[2] // 4


def test_v5_convert_rgb_drift() -> None:
    # Documents why the reference above disables v5's convert_to_rgb: for a P image with a
    # transparent index, v5 composites onto white; the official 4.45 path (and we) do not.
    img = _with_transparency("P")
    official, _ = _official_pipeline(img)
    v5, _ = _official_pipeline(img, v5_convert_rgb=True)
    np.testing.assert_array_equal(preprocess_image(img).pixel_values, official)
    assert np.abs(v5 - official).max() > 0.5


def test_preprocess_from_path_equals_pil(tmp_path: Path) -> None:
    img = _with_transparency("RGBA")
    path = tmp_path / "x.png"
    img.save(path)
    a, b = preprocess_image(path), preprocess_image(img)
    np.testing.assert_array_equal(a.pixel_values, b.pixel_values)
    assert a.grid_thw == b.grid_thw


def test_alpha_is_dropped_not_composited() -> None:
    img = Image.new("RGBA", (56, 56), (200, 10, 10, 0))  # fully transparent red
    assert to_rgb(img).getpixel((0, 0)) == (200, 10, 10)


def test_token_count_near_256() -> None:
    for size in [(448, 448), (1920, 1080), (300, 299), (999, 1001)]:
        out = preprocess_image(make_image(0, size))
        assert 200 <= out.n_image_tokens <= 300
        assert out.n_image_tokens * 4 == out.grid_thw[1] * out.grid_thw[2]


def test_resized_aspect_over_200_is_refused_like_the_official_processor() -> None:
    # 100x20000 is allowed by the first smart_resize but resizes to 28x6328 (ratio 226), which the
    # official Qwen2-VL processor refuses; we refuse too instead of inventing a score.
    img = make_image(0, (20000, 100))
    with pytest.raises(ValueError, match="aspect ratio"):
        preprocess_image(img)
    with pytest.raises(ValueError, match="aspect ratio"):
        _official_pipeline(img)


def test_patchify_rejects_unresized_input() -> None:
    with pytest.raises(ValueError, match="multiple of 28"):
        patchify(make_image(0, (100, 100)))


def test_config_from_preprocessor_json(tmp_path: Path) -> None:
    assert VisionPreprocessConfig.from_preprocessor_config(tmp_path) == VisionPreprocessConfig()
    (tmp_path / "preprocessor_config.json").write_text(
        '{"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,'
        ' "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.25, 0.25]}'
    )
    cfg = VisionPreprocessConfig.from_preprocessor_config(tmp_path)
    assert cfg.image_mean == (0.5, 0.5, 0.5) and cfg.image_std == (0.25, 0.25, 0.25)
    assert cfg.min_pixels == cfg.max_pixels == HPSV3_PIXELS  # HPSv3's budget is not the processor's
    white = preprocess_image(Image.new("RGB", (448, 448), (255, 255, 255)), cfg)
    np.testing.assert_allclose(white.pixel_values, 2.0, atol=1e-6)  # (1 - 0.5) / 0.25
    assert resize_for_hpsv3(Image.new("L", (10, 10))).mode == "RGB"


def test_preprocess_module_does_not_import_torch() -> None:
    code = "import sys, tasks.hpsv3.preprocess; sys.exit(1 if 'torch' in sys.modules else 0)"
    root = Path(__file__).resolve().parents[3]
    assert subprocess.run([sys.executable, "-c", code], cwd=root).returncode == 0
