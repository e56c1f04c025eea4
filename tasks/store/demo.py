"""Demo data: models "rendered" from scikit-image's bundled photos with graded degradations.

The photos ship inside the scikit-image wheel (public-domain / CC0 images, see
skimage/data/README.txt), so the demo works offline. Every demo model answers prompt ``i`` with the
same source photo, degraded its own way, so the leaderboard order is driven by image quality.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

# Bundled with scikit-image, no download needed (checked offline).
DEMO_PHOTOS = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "colorwheel",
    "camera",
    "moon",
    "coins",
    "brick",
    "grass",
    "gravel",
    "clock",
    "cell",
)
DEMO_SIDE = 320  # px; HPSv3 resizes everything to ~448x448 anyway


@dataclass(frozen=True)
class DemoModel:
    model_id: str
    description: str
    degrade: Callable[[Image.Image, np.random.Generator], Image.Image]
    missing_every: int = 0  # leave out every n-th prompt (0: none)
    corrupt_prompts: int = 0  # replace the first n kept images with invalid objects


def _identity(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    return img


def _blur(radius: float) -> Callable[[Image.Image, np.random.Generator], Image.Image]:
    return lambda img, rng: img.filter(ImageFilter.GaussianBlur(radius))


def _sharpen(percent: int) -> Callable[[Image.Image, np.random.Generator], Image.Image]:
    return lambda img, rng: img.filter(ImageFilter.UnsharpMask(radius=1.0, percent=percent, threshold=2))


def _noise(sigma: float) -> Callable[[Image.Image, np.random.Generator], Image.Image]:
    def degrade(img: Image.Image, rng: np.random.Generator) -> Image.Image:
        arr = np.asarray(img, dtype=np.float64) + rng.normal(0.0, sigma, size=(img.height, img.width, 3))
        return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))

    return degrade


def _jpeg(quality: int) -> Callable[[Image.Image, np.random.Generator], Image.Image]:
    def degrade(img: Image.Image, rng: np.random.Generator) -> Image.Image:
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=quality)
        return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")

    return degrade


BASELINE_FIELD = (
    DemoModel("demo-baseline-a", "pristine photos", _identity),
    DemoModel("demo-baseline-b", "JPEG quality 50", _jpeg(50)),
    DemoModel("demo-baseline-c", "Gaussian blur r=1", _blur(1.0)),
)
CONTENDERS = (
    # Not a copy of demo-baseline-a (same photos, byte for byte, would be one model twice):
    # a contender that post-processes its output, lightly sharpened.
    DemoModel("demo-pristine", "pristine photos, lightly sharpened (unsharp mask 60%)", _sharpen(60)),
    DemoModel("demo-jpeg-q10", "JPEG quality 10", _jpeg(10)),
    DemoModel("demo-blur-r3", "Gaussian blur r=3", _blur(3.0)),
    DemoModel("demo-noise-s40", "Gaussian noise sigma=40", _noise(40.0)),
    DemoModel(
        "demo-patchy",
        "pristine, but every 16th image missing and 3 invalid objects",
        _identity,
        missing_every=16,
        corrupt_prompts=3,
    ),
)


def load_photo(name: str) -> Image.Image:
    import skimage.data

    arr = getattr(skimage.data, name)()
    img = Image.fromarray(arr)
    return img.convert("RGB")


def source_image(photos: Sequence[Image.Image], index: int) -> Image.Image:
    """A square crop of one bundled photo, different for every prompt index, at DEMO_SIDE px.

    Sixteen photos serve 192 prompts, so the crop window (size and position) and a mirror flip
    are drawn from a generator seeded by the index: no two prompts get the same bytes (ingest
    quarantines identical images under different prompts).
    """
    photo = photos[index % len(photos)]
    rng = np.random.default_rng(index)
    side = int(min(photo.size) * rng.uniform(0.5, 1.0))
    dx = int(rng.integers(0, photo.width - side + 1))
    dy = int(rng.integers(0, photo.height - side + 1))
    crop = photo.crop((dx, dy, dx + side, dy + side)).resize((DEMO_SIDE, DEMO_SIDE), Image.BICUBIC)
    return crop.transpose(Image.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else crop


FONT_PATHS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf", "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


def _font(size: int) -> ImageFont.ImageFont:
    for path in FONT_PATHS:
        try:
            return ImageFont.truetype(path, size)
        except OSError:
            continue
    return ImageFont.load_default(size=size)


TEXT_WASH = 0.75  # how far a text prompt's photo is faded to white behind its strings
TEXT_SIZE = 22  # px


def with_text(img: Image.Image, strings: Sequence[str]) -> Image.Image:
    """The prompt's exact strings printed in black on the photo faded to a pale poster
    background, one per line, so the offline OCR judge has real text to read (and degraded
    models lose it, as blurry generators do).

    Why faded, not a white box over the photo: Tesseract's page segmentation read nothing at
    all from a white box over a dark photo (tr-signage-01 "FRESH EGGS" over the night-sky
    rocket failed for every demo model); over a pale background it reads every string of the
    pristine models. Text Rendering prompts are not EPS-eligible, so HPSv3 never weighs this."""
    if not strings:
        return img
    img = Image.blend(img.convert("RGB"), Image.new("RGB", img.size, (255, 255, 255)), TEXT_WASH)
    draw = ImageDraw.Draw(img)
    font = _font(TEXT_SIZE)
    lines: list[str] = []
    for text in strings:  # wrap long strings on word boundaries
        words, line = text.split(), ""
        for w in words:
            trial = f"{line} {w}".strip()
            if draw.textlength(trial, font=font) > DEMO_SIDE - 24 and line:
                lines.append(line)
                line = w
            else:
                line = trial
        lines.append(line)
    top = max(0, (DEMO_SIDE - 30 * len(lines)) // 2)
    for i, line in enumerate(lines):
        draw.text((14, top + 30 * i), line, fill=(0, 0, 0), font=font)
    return img


def _seed(model_id: str, prompt_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{model_id}/{prompt_id}".encode()).digest()[:8], "little")


def render_model(
    model: DemoModel, prompts: Sequence[tuple[str, str]], photos: Sequence[Image.Image]
) -> dict[str, bytes]:
    """Object key -> bytes for one demo model (deterministic). ``prompts``: (prompt id, text)."""
    from tasks.judges.ocr import required_strings

    objects: dict[str, bytes] = {}
    corrupt_left = model.corrupt_prompts
    for i, (prompt_id, text) in enumerate(prompts):
        if model.missing_every and i % model.missing_every == model.missing_every - 1:
            continue
        key = f"models/{model.model_id}/{prompt_id}"
        if corrupt_left > 0:
            # Three kinds of bad input a lab really sends: truncated, not an image, CMYK.
            kind = model.corrupt_prompts - corrupt_left
            corrupt_left -= 1
            if kind == 0:
                good = _encode(source_image(photos, i), "PNG")
                objects[key + ".png"] = good[: len(good) // 2]
            elif kind == 1:
                objects[key + ".jpg"] = b"<html>503 Service Unavailable</html>"
            else:
                buf = io.BytesIO()
                source_image(photos, i).convert("CMYK").save(buf, format="JPEG", quality=90)
                objects[key + ".jpg"] = buf.getvalue()
            continue
        rng = np.random.default_rng(_seed(model.model_id, prompt_id))
        img = model.degrade(with_text(source_image(photos, i), required_strings(text)), rng)
        objects[key + ".jpg"] = _encode(img, "JPEG")
    return objects


def _encode(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    if fmt == "JPEG":
        img.save(buf, format="JPEG", quality=95)
    else:
        img.save(buf, format=fmt)
    return buf.getvalue()


def create_local_root(store) -> None:
    """A local store the demo is about to fill exists before it is listed: listing a directory
    that does not exist warns "treating it as empty", which a first demo run is not news."""
    from tasks.store.storage import LocalStore

    if isinstance(store, LocalStore):
        store.root.mkdir(parents=True, exist_ok=True)


def seed_store(store, prompts: Sequence[tuple[str, str]], models: Sequence[DemoModel]) -> dict[str, int]:
    """Write the demo models' objects into ``store`` unless already there. Returns objects written."""
    create_local_root(store)
    photos = [load_photo(name) for name in DEMO_PHOTOS]
    written: dict[str, int] = {}
    existing = set(store.list_models())
    for model in models:
        if model.model_id in existing:
            written[model.model_id] = 0
            continue
        objects = render_model(model, prompts, photos)
        for key, data in objects.items():
            store.write(key, data)
        written[model.model_id] = len(objects)
    return written
