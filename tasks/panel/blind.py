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


def blind_image(data: bytes, long_side: int = BLIND_LONG_SIDE) -> BlindedImage:
    """Decode ``data`` and re-encode it with the study's one encoder (see the module doc)."""
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
    w, h = im.size
    scale = long_side / max(w, h)
    size = (min(long_side, max(1, round(w * scale))), min(long_side, max(1, round(h * scale))))
    im = im.resize(size, Image.Resampling.LANCZOS)
    # A fresh canvas (no info dict: exif, icc, comments) of one size, the picture centred on the grey.
    clean = Image.new("RGB", (long_side, long_side), BACKGROUND)
    clean.paste(im, ((long_side - size[0]) // 2, (long_side - size[1]) // 2))
    out = io.BytesIO()
    clean.save(out, BLIND_FORMAT, quality=BLIND_QUALITY, subsampling=BLIND_SUBSAMPLING, optimize=False,
               progressive=False, exif=b"", icc_profile=None)
    return BlindedImage(out.getvalue(), long_side, long_side, size)


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


def blinding_report(before: list[ImageFacts], after: list[ImageFacts], content: list[tuple[str, tuple[int, int]]]) -> BlindingReport:
    """The report ``study open`` prints, and the leaks that make it refuse to open: a served size,
    aspect ratio, alpha or format that only one tool's images have, or two tools' served byte
    ranges that do not overlap. ``content``: (tool, picture size inside the canvas): the letterbox
    bands still show a source's aspect, a warning (not a leak: the canvas is the protocol's choice)."""
    rep = BlindingReport()
    rep.lines.append(f"blinding report: every image served as one {BLIND_LONG_SIDE}x{BLIND_LONG_SIDE} canvas, letterboxed and "
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


def blind_study(sources: list[tuple[str, bytes]]) -> tuple[list[bytes], BlindingReport]:
    """Blind every (tool, source bytes) of a study onto the one canvas, pad all files to one byte
    size, and report. Returns the served bytes in the order given, and the report."""
    before = [image_facts(tool, data) for tool, data in sources]
    blinded = [blind_image(data) for _, data in sources]
    size = max(len(b.data) for b in blinded)
    served = [pad_to(b.data, size) for b in blinded]
    after = [image_facts(tool, data) for (tool, _), data in zip(sources, served)]
    return served, blinding_report(before, after, [(tool, b.content) for (tool, _), b in zip(sources, blinded)])


def metadata_markers_in(data: bytes) -> list[str]:
    """Which of :data:`METADATA_MARKERS` occur in ``data`` (exact bytes: chunk and box types are
    case-sensitive, and a case-folded scan of compressed bytes would hit by chance)."""
    return [m.decode("latin-1") for m in METADATA_MARKERS if m in data]
