"""Ingest: validate every object of a model before anything is scored.

Each object under ``models/<model_id>/`` (or a Beauty Index tool's ``beauty/<suite>/<tool>/``) is checked (key, prompt id, duplicates, then the bytes:
decodable, complete, still, PNG/JPEG/WEBP, 8-bit mode, sane dimensions). A bad object is
quarantined with its reason and a message naming it; it never stops the other images. Valid
images are copied, content-addressed, into ``<home>/images/<sha[:2]>/<sha256>.<ext>``.

The result is two Arrow tables shaped exactly like ``schemas.lake.IMAGES`` (one row per prompt of
the suite: ok / quarantined / missing) and ``schemas.lake.QUARANTINE`` (one row per rejected
object). Nothing else is written: the lake is written by the caller.

Pillow's global state is left alone (it is shared with the scorer and other code in the process):
the pixel limit of :class:`ImageLimits` is enforced here, per call, from the header alone before
anything is decoded; Pillow's own decompression-bomb guard stays on at its default as a second
line (its ``DecompressionBombError`` is mapped to ``decompression_bomb``, and any image large enough
to trigger its ``DecompressionBombWarning`` is rejected too, because the effective pixel limit is
never above ``Image.MAX_IMAGE_PIXELS``). ``ImageFile.LOAD_TRUNCATED_IMAGES`` must be False: if some
code turned it on, :func:`inspect_image` refuses to run rather than accept half images.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from PIL import Image, ImageFile

from schemas.lake import IMAGES, QUARANTINE, QUARANTINE_REASONS
from tasks.store.durable import atomic_write
from tasks.store.storage import (
    IMAGE_EXTENSIONS,
    MODELS_PREFIX,
    InvalidKey,
    ObjectStore,
    StoredObject,
    StoreError,
    listing_fingerprint,
    parse_image_key,
    prompt_id_of_key,
    validate_model_id,
)
from tasks.scores.suite import Suite

log = logging.getLogger(__name__)

# Decoded format -> extension of the cached copy.
ACCEPTED_FORMATS: dict[str, str] = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp"}
# Modes that convert("RGB") maps deterministically (alpha dropped, palette expanded).
ACCEPTED_MODES = frozenset({"RGB", "RGBA", "L", "LA", "P", "PA", "1"})

Image.init()  # register every plugin once, before worker threads open images concurrently


@dataclass(frozen=True)
class ImageLimits:
    min_side: int = 64  # px, shorter side
    max_side: int = 8192  # px, longer side
    max_pixels: int = 40_000_000  # width * height; above it: decompression_bomb
    max_bytes: int = 50 * 1024 * 1024
    max_aspect_ratio: float = 200.0  # Qwen2-VL's smart_resize (HPSv3 preprocessing) refuses > 200

    def __post_init__(self) -> None:
        if not (1 <= self.min_side <= self.max_side):
            raise ValueError(f"need 1 <= min_side <= max_side, got {self.min_side}, {self.max_side}")
        if self.max_pixels < self.min_side * self.min_side or self.max_bytes < 1 or self.max_aspect_ratio < 1:
            raise ValueError(f"inconsistent image limits: {self}")

    def effective_max_pixels(self) -> int:
        """``max_pixels``, capped by Pillow's own guard so its warning can never be reached."""
        pil = Image.MAX_IMAGE_PIXELS
        return min(self.max_pixels, int(pil)) if pil else self.max_pixels


DEFAULT_LIMITS = ImageLimits()


@dataclass(frozen=True)
class ImageInfo:
    format: str  # PNG / JPEG / WEBP: the decoded format, whatever the extension says
    width: int
    height: int
    mode: str  # PIL mode before RGB conversion


class Rejected(Exception):
    """An object fails validation: ``reason`` is one of QUARANTINE_REASONS, ``detail`` names it."""

    def __init__(self, reason: str, detail: str):
        if reason not in QUARANTINE_REASONS:
            raise ValueError(f"unknown quarantine reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _rawmodes(im: Image.Image) -> list[str]:
    out = []
    for tile in getattr(im, "tile", None) or []:
        args = tile[3] if len(tile) > 3 else None
        if isinstance(args, str):
            out.append(args)
        elif isinstance(args, tuple) and args and isinstance(args[0], str):
            out.append(args[0])
    return out


def _bomb(name: str, size: str, max_px: int) -> Rejected:
    """One message for both guards (ours from the header, Pillow's at open), stating the limit
    as the docs do: ``40 MP (40,000,000 pixels)``."""
    return Rejected(
        "decompression_bomb",
        f"{name}: {size} exceeds the limit of {max_px / 1e6:g} MP ({max_px:,} pixels; decompression-bomb guard); "
        "nothing was decoded",
    )


def _open_error(name: str, exc: BaseException, stage: str, max_px: int) -> Rejected:
    msg = str(exc) or type(exc).__name__
    if isinstance(exc, Image.DecompressionBombError) or "decompressed data too large" in msg.lower():
        # Pillow's text names its own limit (178,956,970 pixels), not the one in force here.
        pixels = re.search(r"\((\d+) pixels\)", msg)
        return _bomb(name, f"{int(pixels.group(1)):,} pixels" if pixels else "the decompressed image", max_px)
    if "truncat" in msg.lower():
        return Rejected("truncated", f"{name}: image data is truncated ({msg}); re-upload the complete file")
    if isinstance(exc, Image.UnidentifiedImageError):
        return Rejected("not_decodable", f"{name}: not a recognisable image file")
    return Rejected("not_decodable", f"{name}: cannot {stage} image: {type(exc).__name__}: {msg}")


def inspect_image(data: bytes, name: str, limits: ImageLimits = DEFAULT_LIMITS) -> ImageInfo:
    """Validate one image's bytes and fully decode it. Returns its :class:`ImageInfo` or raises
    :class:`Rejected` with the first failing rule (checked in this order):

    empty_file, too_large (bytes), not_decodable / truncated / decompression_bomb (header),
    decompression_bomb (pixels), animated, unsupported_format, unsupported_mode, too_large (side),
    bad_aspect_ratio, too_small, then a full decode: truncated / not_decodable.
    """
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise RuntimeError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is True in this process: refusing to validate images "
            "(truncated files would be accepted); find the code that sets it"
        )
    if not data:
        raise Rejected("empty_file", f"{name}: zero-byte object")
    if len(data) > limits.max_bytes:
        raise Rejected("too_large", f"{name}: {len(data)} bytes exceeds the limit of {limits.max_bytes} bytes")
    try:
        im = Image.open(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - any decoder failure is this object's problem
        raise _open_error(name, exc, "open", limits.effective_max_pixels()) from exc
    with im:
        width, height = im.size
        fmt = im.format or "unknown"
        max_px = limits.effective_max_pixels()
        if width * height > max_px:
            raise _bomb(name, f"{width}x{height} = {width * height:,} pixels", max_px)
        try:
            frames = int(getattr(im, "n_frames", 1) or 1)
        except Exception as exc:  # noqa: BLE001 - broken frame table
            raise _open_error(name, exc, "read frames of", limits.effective_max_pixels()) from exc
        if frames > 1 or getattr(im, "is_animated", False):
            also = "" if fmt in ACCEPTED_FORMATS else f" ({fmt} is not an accepted format either)"
            raise Rejected(
                "animated",
                f"{name}: animated or multi-frame {fmt} with {frames} frames{also}; "
                "submit one still image as PNG, JPEG or WEBP",
            )
        if fmt not in ACCEPTED_FORMATS:
            raise Rejected(
                "unsupported_format", f"{name}: format {fmt} is not accepted; re-export as PNG, JPEG or WEBP"
            )
        sixteen = [r for r in _rawmodes(im) if ";16" in r]
        if im.mode not in ACCEPTED_MODES or sixteen:
            what = f"{im.mode} with 16 bits per channel ({sixteen[0]})" if sixteen else im.mode
            raise Rejected(
                "unsupported_mode",
                f"{name}: colour mode {what} is not supported (we do not guess a colour conversion); "
                "re-export as 8-bit sRGB (RGB, RGBA or greyscale)",
            )
        long_side, short_side = max(width, height), min(width, height)
        if long_side > limits.max_side:
            raise Rejected(
                "too_large", f"{name}: {width}x{height} exceeds the maximum side of {limits.max_side} px"
            )
        if short_side > 0 and long_side / short_side > limits.max_aspect_ratio:
            raise Rejected(
                "bad_aspect_ratio",
                f"{name}: {width}x{height} has aspect ratio {long_side / short_side:.1f}, "
                f"above {limits.max_aspect_ratio:g} (HPSv3 preprocessing refuses it)",
            )
        if short_side < limits.min_side:
            raise Rejected(
                "too_small", f"{name}: {width}x{height} is below the minimum side of {limits.min_side} px"
            )
        try:
            im.load()
        except Exception as exc:  # noqa: BLE001
            raise _open_error(name, exc, "decode", limits.effective_max_pixels()) from exc
        return ImageInfo(format=fmt, width=width, height=height, mode=im.mode)


# --------------------------------------------------------------------------------------------
# Per-object outcomes


@dataclass(frozen=True)
class ObjectOutcome:
    """What happened to one listed object."""

    obj: StoredObject
    prompt_id: str | None  # the prompt it names, when the key says so
    reason: str | None = None  # None: accepted
    detail: str | None = None
    sha256: str | None = None
    byte_size: int | None = None
    info: ImageInfo | None = None
    image_path: str | None = None  # relative to home, set for accepted images
    key_ok: bool = True  # False: bad_key (the object maps to no suite row)

    @property
    def ok(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class ObjectPlan:
    """Key-level decision for one object, before any bytes are read (pure)."""

    obj: StoredObject
    prompt_id: str | None
    reason: str | None = None
    detail: str | None = None
    key_ok: bool = True

    @property
    def needs_read(self) -> bool:
        return self.reason is None


def plan_objects(
    model_id: str, objects: Sequence[StoredObject], suite: Suite, limits: ImageLimits = DEFAULT_LIMITS,
    root: str = MODELS_PREFIX,
) -> list[ObjectPlan]:
    """Decide from the listing alone: bad_key, unknown_prompt, duplicate_prompt, and the size checks
    (empty_file, too_large) that need no read. The rest must be read. Sorted by key. ``root``: the
    folder the model's folder is in (``models/``, or a Beauty suite's ``beauty/<suite>/``)."""
    plans: dict[str, ObjectPlan] = {}
    by_prompt: dict[str, list[StoredObject]] = defaultdict(list)
    for obj in sorted(objects, key=lambda o: o.key):
        try:
            key_model, prompt_id, _ext = parse_image_key(obj.key, root)
            if key_model != model_id:
                raise InvalidKey(f"object key {obj.key!r} is not under {root}{model_id}/")
        except InvalidKey as exc:
            plans[obj.key] = ObjectPlan(
                obj,
                prompt_id_of_key(obj.key, root),
                "bad_key",
                f"{exc} (expected {root}{model_id}/<prompt_id>.<{'|'.join(IMAGE_EXTENSIONS)}>)",
                key_ok=False,
            )
            continue
        if prompt_id not in suite.by_id:
            plans[obj.key] = ObjectPlan(
                obj,
                prompt_id,
                "unknown_prompt",
                f"{obj.key}: prompt id {prompt_id!r} is not in suite {suite.version}",
            )
            continue
        by_prompt[prompt_id].append(obj)
    for prompt_id, objs in by_prompt.items():
        if len(objs) > 1:
            keys = _some([o.key for o in objs])
            for o in objs:
                plans[o.key] = ObjectPlan(
                    o,
                    prompt_id,
                    "duplicate_prompt",
                    f"{o.key}: prompt {prompt_id!r} has {len(objs)} objects ({keys}); keep exactly one",
                )
            continue
        (o,) = objs
        if o.size == 0:
            plans[o.key] = ObjectPlan(o, prompt_id, "empty_file", f"{o.key}: zero-byte object")
        elif o.size > limits.max_bytes:
            plans[o.key] = ObjectPlan(
                o, prompt_id, "too_large", f"{o.key}: {o.size} bytes exceeds the limit of {limits.max_bytes} bytes"
            )
        else:
            plans[o.key] = ObjectPlan(o, prompt_id)
    return [plans[k] for k in sorted(plans)]


def _some(items: Sequence[str], n: int = 5) -> str:
    """At most ``n`` items for a message, then how many more."""
    shown = ", ".join(items[:n])
    return shown if len(items) <= n else f"{shown} and {len(items) - n} more"


def cache_relpath(sha256: str, fmt: str) -> str:
    """``images/<sha[:2]>/<sha256>.<ext>``, relative to the workspace home."""
    return f"images/{sha256[:2]}/{sha256}.{ACCEPTED_FORMATS[fmt]}"


def cache_image(home: Path, sha256: str, fmt: str, data: bytes) -> str:
    """Copy valid image bytes into the content-addressed cache (atomic; skipped if present)."""
    rel = cache_relpath(sha256, fmt)
    path = Path(home) / rel
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
    return rel


def process_object(store: ObjectStore, plan: ObjectPlan, home: Path, limits: ImageLimits) -> ObjectOutcome:
    """Read one object, validate it and cache it when valid. Store failures raise StoreError."""
    obj = plan.obj
    data = store.read(obj)
    if len(data) != obj.size:
        raise StoreError(
            f"object {obj.uri} changed while ingesting (listed {obj.size} bytes, read {len(data)}): run again"
        )
    sha = hashlib.sha256(data).hexdigest()
    try:
        info = inspect_image(data, obj.key, limits)
    except Rejected as rej:
        return ObjectOutcome(obj, plan.prompt_id, rej.reason, rej.detail, sha, len(data))
    rel = cache_image(home, sha, info.format, data)
    return ObjectOutcome(obj, plan.prompt_id, None, None, sha, len(data), info, rel)


def mark_duplicate_images(outcomes: Sequence[ObjectOutcome]) -> list[ObjectOutcome]:
    """Accepted images whose bytes (sha256) were submitted for several prompts: all become
    duplicate_image (we cannot know which prompt they answer). Pure."""
    groups: dict[str, list[ObjectOutcome]] = defaultdict(list)
    for o in outcomes:
        if o.ok and o.sha256:
            groups[o.sha256].append(o)
    dup: dict[str, str] = {}
    for sha, group in groups.items():
        prompts = sorted({o.prompt_id for o in group if o.prompt_id})
        if len(prompts) > 1:
            keys = _some(sorted(o.obj.key for o in group))
            for o in group:
                dup[o.obj.key] = (
                    f"{o.obj.key}: the same bytes (sha256 {sha[:16]}...) were submitted for "
                    f"{len(prompts)} prompts ({keys}); an image can answer only one prompt"
                )
    out = []
    for o in outcomes:
        if o.obj.key in dup:
            o = replace(o, reason="duplicate_image", detail=dup[o.obj.key], image_path=None)
        out.append(o)
    return out


# --------------------------------------------------------------------------------------------
# Tables


@dataclass(frozen=True)
class IngestResult:
    model_id: str
    images: pa.Table  # schemas.lake.IMAGES, one row per suite prompt, sorted by prompt_id
    quarantine: pa.Table  # schemas.lake.QUARANTINE, one row per rejected object, sorted by object
    fingerprint: str  # listing_fingerprint of every object listed for the model
    n_objects: int
    n_ok: int
    n_quarantined: int
    n_missing: int
    n_rejected_objects: int
    outcomes: tuple[ObjectOutcome, ...] = field(default=(), repr=False)

    @property
    def counts(self) -> dict[str, int]:
        return {
            "objects": self.n_objects,
            "ok": self.n_ok,
            "quarantined": self.n_quarantined,
            "missing": self.n_missing,
            "rejected_objects": self.n_rejected_objects,
        }


def build_tables(
    model_id: str, suite: Suite, outcomes: Sequence[ObjectOutcome], fingerprint: str, now: datetime
) -> tuple[pa.Table, pa.Table]:
    """The IMAGES and QUARANTINE tables from per-object outcomes (pure, deterministic)."""
    by_prompt: dict[str, list[ObjectOutcome]] = defaultdict(list)
    bad_key_by_prompt: dict[str, list[ObjectOutcome]] = defaultdict(list)
    for o in sorted(outcomes, key=lambda o: o.obj.key):
        if o.prompt_id is None or o.prompt_id not in suite.by_id:
            continue
        (by_prompt if o.key_ok else bad_key_by_prompt)[o.prompt_id].append(o)

    rows = []
    for prompt_id in sorted(suite.by_id):
        row = {
            "model_id": model_id,
            "prompt_id": prompt_id,
            "suite_version": suite.version,
            "state": "missing",
            "reason": None,
            "object_uri": None,
            "image_sha256": None,
            "image_path": None,
            "format": None,
            "width": None,
            "height": None,
            "source_mode": None,
            "byte_size": None,
            "source_fingerprint": fingerprint,
            "ingested_at": now,
        }
        cands = by_prompt.get(prompt_id) or []
        if len(cands) > 1:  # duplicate_prompt: every candidate carries that reason
            row.update(state="quarantined", reason="duplicate_prompt", object_uri=cands[0].obj.uri)
        elif cands:
            o = cands[0]
            row.update(
                state="ok" if o.ok else "quarantined",
                reason=o.reason,
                object_uri=o.obj.uri,
                image_sha256=o.sha256,
                image_path=o.image_path if o.ok else None,
                byte_size=o.byte_size if o.byte_size is not None else o.obj.size,
            )
            if o.info is not None:
                row.update(format=o.info.format, width=o.info.width, height=o.info.height, source_mode=o.info.mode)
        elif bad_key_by_prompt.get(prompt_id):
            o = bad_key_by_prompt[prompt_id][0]
            row.update(state="quarantined", reason="bad_key", object_uri=o.obj.uri, byte_size=o.obj.size)
        rows.append(row)

    qrows = [
        {
            "model_id": model_id,
            "object_uri": o.obj.uri,
            "prompt_id": o.prompt_id,
            "reason": o.reason,
            "detail": o.detail,
            "byte_size": o.byte_size if o.byte_size is not None else o.obj.size,
            "image_sha256": o.sha256,
            "quarantined_at": now,
        }
        for o in sorted(outcomes, key=lambda o: o.obj.key)
        if not o.ok
    ]
    images = pa.Table.from_pylist(rows, schema=IMAGES)
    quarantine = pa.Table.from_pylist(qrows, schema=QUARANTINE)
    return images, quarantine


# --------------------------------------------------------------------------------------------


Progress = Callable[[int, int], None]  # (total objects, objects just finished)


def ingest_model(
    store: ObjectStore,
    model_id: str,
    suite: Suite,
    home: Path,
    limits: ImageLimits = DEFAULT_LIMITS,
    now: datetime | None = None,
    max_workers: int = 8,
    progress: Progress | None = None,
    other_suites: frozenset[str] = frozenset(),
    root: str = MODELS_PREFIX,
) -> IngestResult:
    """Validate every object of ``<root><model_id>/`` and build its IMAGES/QUARANTINE rows.

    ``root``: ``models/`` (ImageBench) or a Beauty suite's ``beauty/<suite>/`` (tasks/beauty/images.py).
    ``other_suites``: prompt ids of the other pinned suites (before issue 26 item 2 a lab put the
    Beauty Index images beside ImageBench's under the same ``models/<id>/``): their objects belong
    to the other protocol and are left out here, neither validated nor quarantined.

    Raises InvalidModelId before anything is read, StoreError when the store fails (the listing,
    or any read: nothing is returned then; the image cache may already hold copies of valid
    images read before the failure, which are content-addressed and reused by the next run).
    Writes nothing but the image cache under ``home/images``.
    """
    validate_model_id(model_id)
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    now = now or datetime.now(UTC)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC)")
    home = Path(home)

    objects = [o for o in store.list_model_objects(model_id, root) if prompt_id_of_key(o.key, root) not in other_suites]
    fingerprint = listing_fingerprint(objects)
    plans = plan_objects(model_id, objects, suite, limits, root)
    total = len(plans)

    outcomes: dict[str, ObjectOutcome] = {}
    decided = [p for p in plans if not p.needs_read]
    for p in decided:
        outcomes[p.obj.key] = ObjectOutcome(
            p.obj, p.prompt_id, p.reason, p.detail, None, p.obj.size, key_ok=p.key_ok
        )
    if progress and decided:
        progress(total, len(decided))

    to_read = [p for p in plans if p.needs_read]
    if to_read:
        pool = ThreadPoolExecutor(max_workers=min(max_workers, len(to_read)), thread_name_prefix="ingest")
        try:
            pending = {pool.submit(process_object, store, p, home, limits) for p in to_read}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    o = fut.result()  # re-raises StoreError (the rest is cancelled below)
                    outcomes[o.obj.key] = o
                    if progress:
                        progress(total, 1)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    ordered = mark_duplicate_images([outcomes[k] for k in sorted(outcomes)])
    images, quarantine = build_tables(model_id, suite, ordered, fingerprint, now)
    states = images.column("state").to_pylist()
    result = IngestResult(
        model_id=model_id,
        images=images,
        quarantine=quarantine,
        fingerprint=fingerprint,
        n_objects=len(objects),
        n_ok=states.count("ok"),
        n_quarantined=states.count("quarantined"),
        n_missing=states.count("missing"),
        n_rejected_objects=quarantine.num_rows,
        outcomes=tuple(ordered),
    )
    log.info(
        "ingested %s: %d objects, %d ok, %d quarantined, %d missing, %d objects rejected",
        model_id,
        result.n_objects,
        result.n_ok,
        result.n_quarantined,
        result.n_missing,
        result.n_rejected_objects,
    )
    return result
