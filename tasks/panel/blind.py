"""Blinding: every image a judge sees is on one canvas, re-encoded by one fixed encoder with fixed settings.

Why each step (issue 9 item 3): generators stamp their names in metadata (EXIF Software, XMP,
PNG tEXt/iTXt/zTXt "parameters", C2PA/JUMBF manifests), and format, pixel size and file size can
betray a tool too. So: decode; apply the EXIF orientation (what the judge should see); convert
to sRGB through the embedded ICC profile when there is one (PIL.ImageCms), then drop the profile;
composite any alpha over a fixed neutral grey; fit inside one square canvas (1024x1024) and
letterbox on the same grey (issue 16 item 8: each tool kept its own size and aspect before);
encode as baseline JPEG, quality 90, 4:2:0 chroma subsampling, with no EXIF/XMP/ICC/comment; then
pad every file of a study with zero bytes after its end-of-image marker to the study's largest
(decoders stop at EOI), so byte sizes cannot cluster by tool. Nothing of the source file's bytes
survives but its pixels. The served name is an opaque random id (:func:`opaque_id`).
:func:`blinding_report` states, per tool, sizes, aspect ratios, alpha and bytes before and after,
and names any property by which a tool can still be told apart (``study open`` refuses then).
"""

from __future__ import annotations

import io
import math
import secrets
from collections import Counter
from dataclasses import dataclass, field

from PIL import Image, ImageCms, ImageOps

BLIND_FORMAT = "JPEG"
BLIND_EXTENSION = "jpg"
BLIND_MEDIA_TYPE = "image/jpeg"
BLIND_LONG_SIDE = 1024  # px: every blinded image is a BLIND_LONG_SIDE square canvas (one size, one aspect)
BLIND_QUALITY = 90
BLIND_SUBSAMPLING = 2  # Pillow's code for 4:2:0
BACKGROUND = (128, 128, 128)  # alpha is composited over neutral grey, the same for every tool

# Byte patterns of metadata a blinded file must never contain (tests scan every response too).
METADATA_MARKERS: tuple[bytes, ...] = (
    b"Exif\x00\x00", b"http://ns.adobe.com/xap", b"<x:xmpmeta", b"ICC_PROFILE", b"iCCP", b"tEXt", b"iTXt",
    b"zTXt", b"eXIf", b"c2pa", b"jumb", b"jumd", b"caBX", b"Photoshop 3.0",
)

_SRGB = ImageCms.createProfile("sRGB")


@dataclass(frozen=True)
class BlindedImage:
    data: bytes
    width: int
    height: int
    content: tuple[int, int] = (0, 0)  # the picture's size inside the canvas (the rest is letterbox)


@dataclass(frozen=True)
class ImageFacts:
    """What a judge could measure of one served file without looking at the picture."""

    tool: str
    width: int
    height: int
    alpha: bool
    n_bytes: int
    format: str

    @property
    def aspect(self) -> str:
        g = math.gcd(self.width, self.height) or 1
        return f"{self.width // g}:{self.height // g}"


def image_facts(tool: str, data: bytes) -> ImageFacts:
    with Image.open(io.BytesIO(data)) as im:
        w, h = ImageOps.exif_transpose(im).size if im.getexif().get(0x0112) else im.size
        alpha = im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info
        return ImageFacts(tool, w, h, alpha, len(data), im.format or "?")


def opaque_id() -> str:
    """An unguessable id (128 random bits, URL-safe): image and memo names carry nothing else."""
    return secrets.token_urlsafe(16)


def _to_srgb(im: Image.Image) -> Image.Image:
    icc = im.info.get("icc_profile")
    if icc:
        try:
            src = ImageCms.ImageCmsProfile(io.BytesIO(icc))
            mode = "RGBA" if "A" in im.getbands() else "RGB"
            im = im.convert(mode) if im.mode != mode else im
            return ImageCms.profileToProfile(im, src, _SRGB, renderingIntent=ImageCms.Intent.PERCEPTUAL, outputMode=mode)
        except (ImageCms.PyCMSError, OSError, ValueError):
            pass  # an unreadable profile: treat the pixels as sRGB (the common case anyway)
    return im


def canvas_size(aspect: tuple[int, int] = (1, 1), long_side: int = BLIND_LONG_SIDE) -> tuple[int, int]:
    """The served canvas of aspect ``W:H`` whose long side is ``long_side``."""
    w, h = aspect
    return (long_side, max(1, round(long_side * h / w))) if w >= h else (max(1, round(long_side * w / h)), long_side)


def picture_box(w: int, h: int, canvas: tuple[int, int]) -> tuple[int, int]:
    """The size of a ``w`` x ``h`` picture letterboxed inside ``canvas`` (whole, centred)."""
    scale = min(canvas[0] / w, canvas[1] / h)
    return min(canvas[0], max(1, round(w * scale))), min(canvas[1], max(1, round(h * scale)))


def _centre_crop(im: Image.Image, canvas: tuple[int, int]) -> Image.Image:
    """The centre of ``im`` cut to the canvas's aspect (the larger side trimmed evenly)."""
    w, h = im.size
    if w * canvas[1] > h * canvas[0]:  # wider than the canvas: trim the sides
        keep = max(1, round(h * canvas[0] / canvas[1]))
        left = (w - keep) // 2
        return im.crop((left, 0, left + keep, h))
    keep = max(1, round(w * canvas[1] / canvas[0]))
    top = (h - keep) // 2
    return im.crop((0, top, w, top + keep))


def blind_image(data: bytes, long_side: int = BLIND_LONG_SIDE, *, aspect: tuple[int, int] = (1, 1),
                shape: str = "letterbox") -> BlindedImage:
    """Decode ``data`` and re-encode it with the study's one encoder (see the module doc), on a
    canvas of ``aspect`` (long side ``long_side``): ``letterbox`` fits the whole picture on grey
    bands, ``crop`` cuts its centre to the canvas's aspect and fills it (issue 27 item 7)."""
    with Image.open(io.BytesIO(data)) as src:
        src.load()
        im = ImageOps.exif_transpose(src)
        im = _to_srgb(im)
        if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
            rgba = im.convert("RGBA")
            flat = Image.new("RGB", rgba.size, BACKGROUND)
            flat.paste(rgba, mask=rgba.getchannel("A"))
            im = flat
        else:
            im = im.convert("RGB")
    canvas = canvas_size(aspect, long_side)
    if shape == "crop":
        im = _centre_crop(im, canvas)
        size = canvas
    elif shape == "letterbox":
        size = picture_box(*im.size, canvas)
    else:
        raise ValueError(f"blinding shape {shape!r}: letterbox or crop")
    im = im.resize(size, Image.Resampling.LANCZOS)
    # A fresh canvas (no info dict: exif, icc, comments) of one size, the picture centred on the grey.
    clean = Image.new("RGB", canvas, BACKGROUND)
    clean.paste(im, ((canvas[0] - size[0]) // 2, (canvas[1] - size[1]) // 2))
    out = io.BytesIO()
    clean.save(out, BLIND_FORMAT, quality=BLIND_QUALITY, subsampling=BLIND_SUBSAMPLING, optimize=False,
               progressive=False, exif=b"", icc_profile=None)
    return BlindedImage(out.getvalue(), canvas[0], canvas[1], size)


def pad_to(data: bytes, n_bytes: int) -> bytes:
    """``data`` followed by zero bytes up to ``n_bytes`` (after JPEG's EOI: decoders ignore them)."""
    if len(data) > n_bytes:
        raise ValueError(f"cannot pad {len(data)} bytes down to {n_bytes}")
    return data + bytes(n_bytes - len(data))


@dataclass
class BlindingReport:
    """Per tool, before (the sources) and after (what is served): sizes, aspects, alpha, bytes.
    ``leaks``: each way a tool can still be told apart from the served files (empty: none)."""

    lines: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    shape: dict = field(default_factory=dict)  # the pre-registration's blinding record (schemas.study.BlindingRecord)


def told_apart_by_shape(content: list[tuple[str, tuple[int, int]]]) -> list[str]:
    """The tools that the picture's shape inside the canvas alone tells apart: some box size occurs
    in that tool's images only (the rule of :func:`blinding_report`, for the shape)."""
    owners: dict[tuple[int, int], set[str]] = {}
    for tool, box in content:
        owners.setdefault(box, set()).add(tool)
    if len({tool for tool, _ in content}) < 2:
        return []
    return sorted({next(iter(who)) for who in owners.values() if len(who) == 1})


def shape_sentence(shape: str, aspect: str, canvas: tuple[int, int], told: list[str], n_tools: int) -> str:
    """The blinding report's line on shape, with its figure."""
    how = "each picture whole on grey bands" if shape == "letterbox" else "each picture's centre, no bands"
    who = f" ({', '.join(told)})" if told else ""
    return (f"  shape: {shape} to {aspect} ({canvas[0]}x{canvas[1]}, {how}): the picture's shape inside the canvas "
            f"alone tells apart {len(told)} of {n_tools} tools{who}")


def _tells_apart(facts: list[ImageFacts], what: str, value) -> list[str]:
    """Tools that some served value of ``what`` identifies: a value only one tool's images have
    (categorical), or for bytes, two tools whose byte ranges do not overlap (a threshold splits them)."""
    tools = sorted({f.tool for f in facts})
    if len(tools) < 2:
        return []
    out = []
    if what == "bytes":
        rng = {t: (min(f.n_bytes for f in facts if f.tool == t), max(f.n_bytes for f in facts if f.tool == t)) for t in tools}
        for i, a in enumerate(tools):
            for b in tools[i + 1:]:
                if rng[a][1] < rng[b][0] or rng[b][1] < rng[a][0]:
                    out.append(f"{a} and {b} by bytes ({rng[a][0]}-{rng[a][1]} vs {rng[b][0]}-{rng[b][1]})")
        return out
    owners: dict[object, set[str]] = {}
    for f in facts:
        owners.setdefault(value(f), set()).add(f.tool)
    for v, who in sorted(owners.items(), key=lambda kv: str(kv[0])):
        if len(who) == 1:
            out.append(f"{next(iter(who))} by {what} ({v} only in its images)")
    return out


def _summary(facts: list[ImageFacts]) -> str:
    def counted(values) -> str:
        return ", ".join(f"{v} x{n}" if n > 1 else str(v) for v, n in sorted(Counter(values).items(), key=lambda kv: str(kv[0])))

    sizes = counted(f"{f.width}x{f.height}" for f in facts)
    aspects = counted(f.aspect for f in facts)
    alpha = sum(f.alpha for f in facts)
    b = [f.n_bytes for f in facts]
    return f"sizes {sizes}; aspect {aspects}; alpha {alpha}/{len(facts)}; bytes {min(b)}-{max(b)} (median {sorted(b)[len(b) // 2]})"


def blinding_report(before: list[ImageFacts], after: list[ImageFacts], content: list[tuple[str, tuple[int, int]]],
                    canvas: tuple[int, int] = (BLIND_LONG_SIDE, BLIND_LONG_SIDE), shape: str = "letterbox") -> BlindingReport:
    """The report ``study open`` prints, and the leaks that make it refuse to open: a served size,
    aspect ratio, alpha or format that only one tool's images have, or two tools' served byte
    ranges that do not overlap. ``content``: (tool, picture size inside the canvas): the letterbox
    bands still show a source's aspect, a warning (not a leak: the canvas is the protocol's choice)."""
    rep = BlindingReport()
    fitted = "letterboxed" if shape == "letterbox" else "centre-cropped"
    rep.lines.append(f"blinding report: every image served as one {canvas[0]}x{canvas[1]} canvas, {fitted} and "
                     f"alpha flattened on grey {BACKGROUND}, {BLIND_FORMAT} quality {BLIND_QUALITY} 4:2:0, padded to one byte size")
    for tool in sorted({f.tool for f in before}):
        rep.lines.append(f"  {tool}: before: {_summary([f for f in before if f.tool == tool])}")
        rep.lines.append(f"  {tool}: after:  {_summary([f for f in after if f.tool == tool])}")
    for what, value in (("size", lambda f: f"{f.width}x{f.height}"), ("aspect ratio", lambda f: f.aspect),
                        ("alpha", lambda f: "alpha" if f.alpha else "no alpha"), ("format", lambda f: f.format),
                        ("bytes", None)):
        rep.leaks += _tells_apart(after, what, value)
    boxes = [ImageFacts(t, w, h, False, 0, "") for t, (w, h) in content]
    for leak in _tells_apart(boxes, "aspect ratio", lambda f: f.aspect):
        rep.warnings.append(f"letterbox bands show the source aspect: {leak.replace(' by aspect ratio', '')}"
                            " (generate every tool's images at one aspect to hide it)")
    rep.lines += [f"  LEAK: {x}" for x in rep.leaks] + [f"  warning: {x}" for x in rep.warnings]
    rep.lines.append("  result: " + ("a tool can still be told apart: the study does not open" if rep.leaks
                                      else "no tool can be told apart by size, aspect ratio, alpha, format or bytes"))
    return rep


def source_shapes(facts: list[ImageFacts], canvas: tuple[int, int] = (BLIND_LONG_SIDE, BLIND_LONG_SIDE)) -> list[tuple[str, tuple[int, int]]]:
    """(tool, picture box) of each source letterboxed on ``canvas``: more than one box size means
    mixed aspect ratios, which need a decision before a study opens (tasks/beauty/study.py)."""
    return [(f.tool, picture_box(f.width, f.height, canvas)) for f in facts]


def aspects_by_tool(facts: list[ImageFacts]) -> str:
    """``tool: 16:9 x10; tool: 3:4 x5, 4:3 x5`` (the sources' aspects, for messages)."""
    out = []
    for tool in sorted({f.tool for f in facts}):
        counts = Counter(f.aspect for f in facts if f.tool == tool)
        out.append(f"{tool}: " + ", ".join(f"{a} x{n}" for a, n in sorted(counts.items())))
    return "; ".join(out)


def blind_study(sources: list[tuple[str, bytes]], *, aspect: str = "1:1", shape: str = "letterbox",
                decided: bool = False) -> tuple[list[bytes], BlindingReport]:
    """Blind every (tool, source bytes) of a study onto the one canvas of ``aspect`` (``shape``:
    letterbox or crop; ``decided``: the study chose them, else the default letterbox on the
    square), pad all files to one byte size, and report. Returns the served bytes in the order
    given, and the report (its ``shape``: the pre-registration's record, with the figure)."""
    ratio = tuple(int(x) for x in aspect.split(":"))
    before = [image_facts(tool, data) for tool, data in sources]
    blinded = [blind_image(data, aspect=ratio, shape=shape) for _, data in sources]
    size = max(len(b.data) for b in blinded)
    served = [pad_to(b.data, size) for b in blinded]
    after = [image_facts(tool, data) for (tool, _), data in zip(sources, served)]
    content = [(tool, b.content) for (tool, _), b in zip(sources, blinded)]
    canvas = (blinded[0].width, blinded[0].height)
    report = blinding_report(before, after, content, canvas, shape)
    told = told_apart_by_shape(content)
    n_tools = len({tool for tool, _ in sources})
    report.shape = {"shape": shape, "aspect": aspect, "canvas": f"{canvas[0]}x{canvas[1]}", "decided": decided,
                    "tools": n_tools, "picture_shapes": len({box for _, box in content}),
                    "tools_told_apart_by_shape": len(told), "told_apart_by_shape": told}
    report.lines.insert(-1, shape_sentence(shape, aspect, canvas, told, n_tools))
    return served, report


def metadata_markers_in(data: bytes) -> list[str]:
    """Which of :data:`METADATA_MARKERS` occur in ``data`` (exact bytes: chunk and box types are
    case-sensitive, and a case-folded scan of compressed bytes would hit by chance)."""
    return [m.decode("latin-1") for m in METADATA_MARKERS if m in data]
