"""HPSv3 image preprocessing: numpy + PIL only (importing this module must not import torch).

The official pipeline (hpsv3 1.0.0 with transformers 4.45.2) does, per image:
  1. ``Image.open(path).convert("RGB")``: alpha is dropped, never composited;
  2. Qwen's ``smart_resize`` with min_pixels = max_pixels = 256*28*28, then a PIL BICUBIC resize;
  3. transformers' Qwen2-VL image processor: convert_to_rgb (a no-op on RGB input in 4.45; v5
     would composite an RGB image still carrying a palette transparency colour onto white, which
     the official path never did), its own smart_resize (an identity on the already resized
     image, except that it refuses an aspect ratio above 200), rescale by 1/255,
     normalise with the OpenAI CLIP mean/std, repeat the frame to temporal_patch_size and flatten
     into patches in merge-block order.

Step 3 is reproduced here with one lookup table per channel (a uint8 pixel has only 256 possible
float32 values) and one transpose, which gives bit-identical output to transformers' float path.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np
from PIL import Image

ImageInput = Union[str, Path, Image.Image]

# HPSv3's fixed resize budget (hpsv3/inference.py: min_pixels = max_pixels = 256 * 28 * 28).
HPSV3_PIXELS = 256 * 28 * 28
IMAGE_FACTOR = 28
MAX_RATIO = 200

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# Qwen2-VL-7B-Instruct's processor bounds; only used to check that the processor-side resize of
# the official pipeline is an identity on our already-resized image.
QWEN2VL_PROCESSOR_MIN_PIXELS = 56 * 56
QWEN2VL_PROCESSOR_MAX_PIXELS = 28 * 28 * 16384


@dataclass(frozen=True)
class VisionPreprocessConfig:
    """The image-processor constants that decide the pixels the model sees."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255
    do_rescale: bool = True
    do_normalize: bool = True
    processor_min_pixels: int = QWEN2VL_PROCESSOR_MIN_PIXELS
    processor_max_pixels: int = QWEN2VL_PROCESSOR_MAX_PIXELS
    min_pixels: int = HPSV3_PIXELS  # HPSv3's own smart_resize budget (not from the config file)
    max_pixels: int = HPSV3_PIXELS

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    @classmethod
    def from_preprocessor_config(cls, source: str | Path | dict[str, Any] | None) -> "VisionPreprocessConfig":
        """Read a ``preprocessor_config.json`` (path, directory or dict); missing keys keep the
        Qwen2-VL defaults. A missing file gives the defaults."""
        if source is None:
            return cls()
        if isinstance(source, dict):
            raw = source
        else:
            path = Path(source)
            if path.is_dir():
                path = path / "preprocessor_config.json"
            if not path.is_file():
                return cls()
            raw = json.loads(path.read_text(encoding="utf-8"))
        size = raw.get("size") or {}
        min_px = raw.get("min_pixels", size.get("min_pixels", size.get("shortest_edge")))
        max_px = raw.get("max_pixels", size.get("max_pixels", size.get("longest_edge")))
        kwargs: dict[str, Any] = {}
        for key in ("patch_size", "temporal_patch_size", "merge_size", "rescale_factor", "do_rescale", "do_normalize"):
            if raw.get(key) is not None:
                kwargs[key] = raw[key]
        for key in ("image_mean", "image_std"):
            if raw.get(key) is not None:
                value = raw[key]
                kwargs[key] = tuple(float(v) for v in (value if isinstance(value, (list, tuple)) else [value] * 3))
        if min_px is not None:
            kwargs["processor_min_pixels"] = int(min_px)
        if max_px is not None:
            kwargs["processor_max_pixels"] = int(max_px)
        return cls(**kwargs)

    def describe(self) -> str:
        """Stable one-line description, recorded in the scorer identity."""
        return (
            f"rgb(convert,drop-alpha)+smart_resize(factor={self.factor},min={self.min_pixels},max={self.max_pixels})"
            f"+pil-bicubic+qwen2vl-image-processor(patch={self.patch_size},temporal={self.temporal_patch_size},"
            f"merge={self.merge_size},rescale={self.rescale_factor if self.do_rescale else None!r},"
            f"mean={list(self.image_mean) if self.do_normalize else None},"
            f"std={list(self.image_std) if self.do_normalize else None})"
        )


DEFAULT_VISION_CONFIG = VisionPreprocessConfig()


@dataclass(frozen=True)
class PreprocessedImage:
    pixel_values: np.ndarray  # float32 [n_patches, 3 * temporal * patch * patch]
    grid_thw: tuple[int, int, int]
    n_image_tokens: int  # <|image_pad|> tokens this image takes in the prompt


# --- official resize semantics (qwen-vl-utils as shipped in hpsv3/dataset/utils.py) ------------
def _round_by_factor(number: float, factor: int) -> int:
    return round(number / factor) * factor  # Python round: ties to even, as the official code


def _ceil_by_factor(number: float, factor: int) -> int:
    return math.ceil(number / factor) * factor


def _floor_by_factor(number: float, factor: int) -> int:
    return math.floor(number / factor) * factor


def smart_resize(
    height: int,
    width: int,
    factor: int = IMAGE_FACTOR,
    min_pixels: int = HPSV3_PIXELS,
    max_pixels: int = HPSV3_PIXELS,
) -> tuple[int, int]:
    """(height, width) both divisible by ``factor``, area within [min_pixels, max_pixels] where the
    rounding allows, aspect ratio kept as closely as possible. Same arithmetic as HPSv3's copy of
    qwen-vl-utils (which differs from transformers' own smart_resize in its edge cases)."""
    if min(height, width) <= 0:
        raise ValueError(f"image has an empty side: {height}x{width}")
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise ValueError(
            f"absolute aspect ratio must be smaller than {MAX_RATIO}, got {max(height, width) / min(height, width)}"
        )
    h_bar = max(factor, _round_by_factor(height, factor))
    w_bar = max(factor, _round_by_factor(width, factor))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = _floor_by_factor(height / beta, factor)
        w_bar = _floor_by_factor(width / beta, factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = _ceil_by_factor(height * beta, factor)
        w_bar = _ceil_by_factor(width * beta, factor)
    return h_bar, w_bar


def to_rgb(img: Image.Image) -> Image.Image:
    """``img.convert("RGB")``: the official conversion (drops alpha, ignores palette transparency)."""
    return img.convert("RGB")


def resize_for_hpsv3(img: Image.Image, config: VisionPreprocessConfig = DEFAULT_VISION_CONFIG) -> Image.Image:
    """RGB image resized exactly as the official ``fetch_image``: smart_resize + PIL BICUBIC."""
    if img.mode != "RGB":
        img = to_rgb(img)
    width, height = img.size
    new_h, new_w = smart_resize(height, width, config.factor, config.min_pixels, config.max_pixels)
    if new_h <= 0 or new_w <= 0:
        raise ValueError(f"smart_resize gave an empty size {new_h}x{new_w} for a {height}x{width} image")
    return img.resize((new_w, new_h), Image.BICUBIC)


@functools.lru_cache(maxsize=8)
def _value_lut(config: VisionPreprocessConfig) -> np.ndarray:
    """[3, 256] float32: the processor's value for each uint8 level, computed with its exact
    arithmetic (rescale in float64 then cast to float32; normalise in float32)."""
    levels = np.arange(256, dtype=np.uint8)
    values = np.broadcast_to(levels, (3, 256)).astype(np.float32)
    if config.do_rescale:
        values = (values.astype(np.float64) * config.rescale_factor).astype(np.float32)
    if config.do_normalize:
        mean = np.asarray(config.image_mean, dtype=np.float32)[:, None]
        std = np.asarray(config.image_std, dtype=np.float32)[:, None]
        values = ((values - mean) / std).astype(np.float32)
    return np.ascontiguousarray(values)


def _check_processor_resize_is_identity(height: int, width: int, config: VisionPreprocessConfig) -> None:
    """The official processor re-runs its own smart_resize on the resized image. For a size that is
    already a multiple of the factor it is an identity unless the area is out of the processor's
    bounds; and it refuses aspect ratios above 200. Mirror the refusal instead of scoring an image
    the official pipeline cannot score."""
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise ValueError(
            f"resized image {height}x{width} has aspect ratio {max(height, width) / min(height, width):.1f} > {MAX_RATIO}:"
            " the official Qwen2-VL processor refuses it"
        )
    if not (config.processor_min_pixels <= height * width <= config.processor_max_pixels):
        raise ValueError(
            f"resized image {height}x{width} is outside the processor's pixel bounds "
            f"[{config.processor_min_pixels}, {config.processor_max_pixels}]"
        )


def patch_shape(width: int, height: int, config: VisionPreprocessConfig = DEFAULT_VISION_CONFIG) -> tuple[int, int]:
    """Shape of :func:`patchify`'s pixel_values for a resized image of this size."""
    return (height // config.patch_size) * (width // config.patch_size), config.patch_dim


def patchify(
    img: Image.Image, config: VisionPreprocessConfig = DEFAULT_VISION_CONFIG, out: np.ndarray | None = None
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Qwen2-VL image-processor output for an RGB image whose sides are multiples of the factor:
    (pixel_values float32 [grid_h*grid_w, 3*T*p*p], grid_thw (1, grid_h, grid_w)). ``out``: a
    C-contiguous float32 array of :func:`patch_shape` to write into (the pool's shared memory)."""
    if img.mode != "RGB":
        raise ValueError(f"patchify expects an RGB image, got mode {img.mode!r}")
    width, height = img.size
    p, m, t = config.patch_size, config.merge_size, config.temporal_patch_size
    if height % (p * m) or width % (p * m):
        raise ValueError(f"image size {width}x{height} is not a multiple of {p * m}; resize it first")
    _check_processor_resize_is_identity(height, width, config)
    grid_h, grid_w = height // p, width // p
    pixels = np.asarray(img, dtype=np.uint8)  # [H, W, C]
    lut = _value_lut(config)
    chw = np.stack([lut[c][pixels[..., c]] for c in range(3)])  # uint8 -> float32 via the table
    # [C, H, W] -> (gh/m, gw/m, m_h, m_w, C, p_h, p_w): the processor's patch order ...
    blocks = chw.reshape(3, grid_h // m, m, p, grid_w // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    # ... with the single frame repeated T times right after the channel axis.
    shape = (grid_h // m, grid_w // m, m, m, 3, t, p, p)
    if out is None:
        dest = np.empty(shape, dtype=np.float32)
    else:
        if out.dtype != np.float32 or out.shape != (grid_h * grid_w, 3 * t * p * p) or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous float32 {(grid_h * grid_w, 3 * t * p * p)}, got {out.dtype} {out.shape}")
        dest = out.reshape(shape)  # a view: C-contiguous
    dest[...] = blocks[:, :, :, :, :, None]
    flat = dest.reshape(grid_h * grid_w, 3 * t * p * p)
    return flat, (1, grid_h, grid_w)


def load_image(source: ImageInput) -> Image.Image:
    """Open a path (closing the file) or pass a PIL image through; returns RGB as the official code."""
    if isinstance(source, Image.Image):
        return to_rgb(source)
    with Image.open(source) as img:
        return to_rgb(img)


def preprocess_image(source: ImageInput, config: VisionPreprocessConfig = DEFAULT_VISION_CONFIG) -> PreprocessedImage:
    """Path or PIL image -> the model's pixel patches, grid and number of image tokens."""
    resized = resize_for_hpsv3(load_image(source), config)
    pixel_values, grid_thw = patchify(resized, config)
    n_tokens = grid_thw[0] * grid_thw[1] * grid_thw[2] // (config.merge_size**2)
    return PreprocessedImage(pixel_values=pixel_values, grid_thw=grid_thw, n_image_tokens=n_tokens)
