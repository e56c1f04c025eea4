"""tasks.store.ingest: every bad object quarantined with the right reason, good ones all ingested,
identical results from a local directory and from a real S3 server."""

from __future__ import annotations

import hashlib
import io
import json
import random
import struct
import zlib
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from PIL import Image, ImageFile

from schemas.lake import IMAGE_STATES, IMAGES, QUARANTINE, QUARANTINE_REASONS
from tasks.store.ingest import (
    ImageInfo,
    ImageLimits,
    Rejected,
    ingest_model,
    inspect_image,
    mark_duplicate_images,
    plan_objects,
)
from tasks.store.storage import InvalidModelId, LocalStore, S3Store, StoredObject, StoreError, listing_fingerprint
from tasks.scores.suite import parse_suite

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

# ------------------------------------------------------------------------------------------
# Image crafting


def _img(mode: str, size: tuple[int, int], seed: int) -> Image.Image:
    """A deterministic image whose bytes differ per seed (no accidental duplicate_image)."""
    rng = random.Random(seed)
    w, h = size
    im = Image.frombytes("RGB", size, rng.randbytes(w * h * 3)).convert(mode)
    if mode in ("RGBA", "LA"):  # a real alpha channel, or encoders may drop it
        im.putalpha(Image.linear_gradient("L").resize(size))
    return im


def encode(fmt: str, mode: str = "RGB", size=(96, 80), seed: int = 0, **kw) -> bytes:
    buf = io.BytesIO()
    _img(mode, size, seed).save(buf, fmt, **kw)
    return buf.getvalue()


def png(**kw) -> bytes:
    return encode("PNG", **kw)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def raw_png(width: int, height: int, bit_depth: int, color_type: int, rows: bytes | None = None) -> bytes:
    """A PNG written by hand: lets the header claim any size/bit depth (Pillow cannot write those)."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    idat = zlib.compress(rows if rows is not None else b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def png16(color_type: int, w: int = 80, h: int = 70) -> bytes:
    channels = {0: 1, 2: 3, 6: 4}[color_type]
    rows = b"".join(b"\x00" + bytes([y % 256, 0x34]) * channels * w for y in range(h))
    return raw_png(w, h, 16, color_type, rows)


def animated(fmt: str, size=(96, 80)) -> bytes:
    frames = [_img("RGB", size, s) for s in (1, 2, 3)]
    buf = io.BytesIO()
    frames[0].save(buf, fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)
    return buf.getvalue()


def truncated(fmt: str) -> bytes:
    data = encode(fmt, size=(300, 300), seed=5)
    return data[: len(data) // 2]


BAD_CASES = {
    # name: (bytes, expected reason)
    "empty": (b"", "empty_file"),
    "garbage": (b"this is not an image at all" * 10, "not_decodable"),
    "html": (b"<html><body>404 Not Found</body></html>", "not_decodable"),
    "truncated-png": (truncated("PNG"), "truncated"),
    "truncated-jpeg": (truncated("JPEG"), "truncated"),
    "jpeg-header-only": (encode("JPEG", size=(300, 300))[:200], "truncated"),
    "bomb-100k": (raw_png(100_000, 100_000, 8, 2), "decompression_bomb"),
    "bomb-7000": (raw_png(7000, 7000, 8, 0), "decompression_bomb"),  # 49 MP > 40 MP, < Pillow's limit
    "animated-gif": (animated("GIF"), "animated"),
    "animated-webp": (animated("WEBP"), "animated"),
    "apng": (animated("PNG"), "animated"),
    "cmyk-jpeg": (encode("JPEG", mode="CMYK"), "unsupported_mode"),
    "png-16bit-grey": (png16(0), "unsupported_mode"),
    "png-16bit-rgb": (png16(2), "unsupported_mode"),
    "png-16bit-rgba": (png16(6), "unsupported_mode"),
    "png-16bit-pillow": (png(mode="I;16"), "unsupported_mode"),
    "tiny": (png(size=(16, 16)), "too_small"),
    "thin": (png(mode="L", size=(63, 500)), "too_small"),
    "extreme-aspect": (png(mode="L", size=(10, 2500)), "bad_aspect_ratio"),
    "too-wide": (png(mode="L", size=(9000, 100)), "too_large"),
    "bmp": (encode("BMP"), "unsupported_format"),
    "tiff": (encode("TIFF"), "unsupported_format"),
    "gif": (encode("GIF"), "unsupported_format"),
    "ico": (encode("ICO", size=(64, 64)), "unsupported_format"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_inspect_rejects(case):
    data, reason = BAD_CASES[case]
    name = f"models/m1/{case}.png"
    with pytest.raises(Rejected) as info:
        inspect_image(data, name)
    assert info.value.reason == reason, info.value.detail
    assert info.value.reason in QUARANTINE_REASONS
    assert info.value.detail.startswith(name + ": ")


def test_inspect_detail_messages_are_helpful():
    def detail(data):
        with pytest.raises(Rejected) as info:
            inspect_image(data, "obj")
        return info.value.detail

    assert "re-export as 8-bit sRGB" in detail(BAD_CASES["cmyk-jpeg"][0])
    assert "CMYK" in detail(BAD_CASES["cmyk-jpeg"][0])
    assert "16 bits" in detail(BAD_CASES["png-16bit-rgb"][0])
    assert "3 frames" in detail(BAD_CASES["apng"][0])
    assert "BMP" in detail(BAD_CASES["bmp"][0])
    # Both guards (Pillow's at open, ours from the header) state the limit in force, as the docs do.
    assert "10,000,000,000 pixels exceeds the limit of 40 MP (40,000,000 pixels" in detail(BAD_CASES["bomb-100k"][0])
    assert "7000x7000 = 49,000,000 pixels exceeds the limit of 40 MP" in detail(BAD_CASES["bomb-7000"][0])


def test_inspect_byte_limit():
    data = png()
    with pytest.raises(Rejected) as info:
        inspect_image(data, "big", ImageLimits(max_bytes=len(data) - 1))
    assert info.value.reason == "too_large"
    assert inspect_image(data, "ok", ImageLimits(max_bytes=len(data))).format == "PNG"


def test_inspect_pixel_limit_is_per_call():
    data = png(size=(200, 200))
    with pytest.raises(Rejected) as info:
        inspect_image(data, "x", ImageLimits(min_side=8, max_pixels=200 * 200 - 1))
    assert info.value.reason == "decompression_bomb"
    assert inspect_image(data, "x", ImageLimits(min_side=8, max_pixels=200 * 200)).width == 200
    assert Image.MAX_IMAGE_PIXELS == 89478485  # Pillow's global guard untouched, still on


@pytest.mark.parametrize(
    "data, fmt, mode",
    [
        (png(mode="RGB"), "PNG", "RGB"),
        (png(mode="RGBA"), "PNG", "RGBA"),
        (png(mode="L"), "PNG", "L"),
        (png(mode="LA"), "PNG", "LA"),
        (png(mode="P"), "PNG", "P"),
        (png(mode="1"), "PNG", "1"),
        (encode("JPEG", mode="RGB"), "JPEG", "RGB"),
        (encode("JPEG", mode="L"), "JPEG", "L"),
        (encode("WEBP", mode="RGB"), "WEBP", "RGB"),
        (encode("WEBP", mode="RGBA"), "WEBP", "RGBA"),
        (png(size=(64, 64)), "PNG", "RGB"),  # exactly the minimum side
        (png(mode="L", size=(8192, 64)), "PNG", "L"),  # exactly the maximum side, ratio 128
    ],
)
def test_inspect_accepts(data, fmt, mode):
    info = inspect_image(data, "ok")
    im = Image.open(io.BytesIO(data))
    assert info == ImageInfo(fmt, im.width, im.height, mode)
    Image.open(io.BytesIO(data)).convert("RGB").load()  # what the scorer does


def test_inspect_refuses_when_truncated_images_allowed(monkeypatch):
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(RuntimeError, match="LOAD_TRUNCATED_IMAGES"):
        inspect_image(png(), "x")


def test_rejected_reason_must_be_known():
    with pytest.raises(ValueError):
        Rejected("bad_vibes", "x")


# ------------------------------------------------------------------------------------------
# Suite and a mixed model


PROMPT_IDS = [f"p{i:02d}" for i in range(1, 31)]


def make_suite(prompt_ids=PROMPT_IDS, version="test-v1"):
    lines = [
        json.dumps(
            {
                "prompt_id": pid,
                "category": "Spatial Reasoning",
                "subcategory": "Relations",
                "tag": f"tag-{i // 3}",
                "difficulty": "easy",
                "prompt": f"A red cube to the left of a blue sphere, number {i}",
                "question": "Is the red cube to the left of the blue sphere?",
                "eps_eligible": True,
            }
        )
        for i, pid in enumerate(prompt_ids)
    ]
    return parse_suite("\n".join(lines).encode(), version, check_shape=False)


def mixed_model(model: str = "m1") -> tuple[dict[str, bytes], dict[str, str], dict[str, str]]:
    """Objects of one model. Returns (objects by key, expected quarantine reason by key,
    expected images-row state/reason by prompt: 'ok', 'missing' or the reason)."""
    same = png(seed=99)
    good = {
        "p01.png": png(seed=1),
        "p02.jpg": encode("JPEG", seed=2),
        "p03.jpeg": encode("JPEG", mode="L", seed=3),
        "p04.webp": encode("WEBP", seed=4),
        "p05.png": png(mode="RGBA", seed=5),
        "p06.png": png(mode="P", seed=6),
        "p07.jpg": png(seed=7),  # PNG bytes under .jpg: accepted, format recorded as PNG
        "p08.PNG": png(seed=8),  # upper-case extension
    }
    bad = {
        "p09.png": (BAD_CASES["empty"][0], "empty_file"),
        "p10.png": (BAD_CASES["garbage"][0], "not_decodable"),
        "p11.png": (BAD_CASES["truncated-png"][0], "truncated"),
        "p12.jpg": (BAD_CASES["truncated-jpeg"][0], "truncated"),
        "p13.png": (BAD_CASES["bomb-100k"][0], "decompression_bomb"),
        "p14.png": (BAD_CASES["animated-gif"][0], "animated"),
        "p15.webp": (BAD_CASES["animated-webp"][0], "animated"),
        "p16.png": (BAD_CASES["apng"][0], "animated"),
        "p17.jpg": (BAD_CASES["cmyk-jpeg"][0], "unsupported_mode"),
        "p18.png": (BAD_CASES["png-16bit-grey"][0], "unsupported_mode"),
        "p19.png": (BAD_CASES["tiny"][0], "too_small"),
        "p20.png": (BAD_CASES["extreme-aspect"][0], "bad_aspect_ratio"),
        "p21.png": (BAD_CASES["bmp"][0], "unsupported_format"),
        "p22.png": (BAD_CASES["tiff"][0], "unsupported_format"),
        "p23.png": (BAD_CASES["gif"][0], "unsupported_format"),
        "p24.bmp": (encode("BMP", seed=24), "bad_key"),  # wrong extension: attributed to p24
        "p25.png": (same, "duplicate_image"),
        "p26.png": (same, "duplicate_image"),
        "p27.png": (png(seed=27), "duplicate_prompt"),
        "p27.jpg": (encode("JPEG", seed=27), "duplicate_prompt"),
        "unknown-prompt.png": (png(seed=50), "unknown_prompt"),
        "sub/p28.png": (png(seed=28), "bad_key"),  # sub-folder: attributed to nothing
        "Upper.png": (png(seed=51), "bad_key"),
        ".DS_Store": (b"\x00\x01junk", "bad_key"),
        "notes.txt": (b"hello", "bad_key"),
    }
    objects = {f"models/{model}/{k}": v for k, v in good.items()}
    objects.update({f"models/{model}/{k}": v[0] for k, v in bad.items()})
    q_expected = {f"models/{model}/{k}": v[1] for k, v in bad.items()}
    rows_expected = {pid: "missing" for pid in PROMPT_IDS}
    for k in good:
        rows_expected[k.split(".")[0]] = "ok"
    for k, (_, reason) in bad.items():
        pid = k.split(".")[0]
        if pid in rows_expected:
            rows_expected[pid] = reason
    # p28 (sub-folder only) and p29/p30 (nothing) stay missing
    return objects, q_expected, rows_expected


def seed(store, objects: dict[str, bytes]) -> None:
    for k, v in objects.items():
        store.write(k, v)


def check_tables(result, suite, model="m1"):
    assert result.images.schema == IMAGES
    assert result.quarantine.schema == QUARANTINE
    for table, schema in ((result.images, IMAGES), (result.quarantine, QUARANTINE)):
        for f in schema:
            if not f.nullable:
                assert table.column(f.name).null_count == 0, f.name
    assert result.images.column("prompt_id").to_pylist() == sorted(suite.by_id)
    assert set(result.images.column("state").to_pylist()) <= set(IMAGE_STATES)
    assert set(result.images.column("model_id").to_pylist()) == {model}
    assert set(result.images.column("suite_version").to_pylist()) == {suite.version}
    assert set(result.quarantine.column("reason").to_pylist()) <= set(QUARANTINE_REASONS)


def rows_by_prompt(table: pa.Table) -> dict[str, dict]:
    return {r["prompt_id"]: r for r in table.to_pylist()}


def test_ingest_mixed_model_local(tmp_path):
    suite = make_suite()
    objects, q_expected, rows_expected = mixed_model()
    store = LocalStore(tmp_path / "objects")
    seed(store, objects)
    home = tmp_path / "home"
    seen = []
    result = ingest_model(store, "m1", suite, home, now=NOW, progress=lambda total, n=1: seen.append((total, n)))

    check_tables(result, suite)
    # quarantine: one row per rejected object, the right reason, a detail naming the object
    q = {r["object_uri"]: r for r in result.quarantine.to_pylist()}
    got = {uri.split("/objects/", 1)[1]: r["reason"] for uri, r in q.items()}
    assert got == q_expected
    for uri, r in q.items():
        key = uri.split("/objects/", 1)[1]
        assert key in r["detail"], r
        assert r["quarantined_at"] == NOW
        assert r["model_id"] == "m1"
    by_key = {uri.split("/objects/", 1)[1]: r for uri, r in q.items()}
    assert by_key["models/m1/unknown-prompt.png"]["prompt_id"] == "unknown-prompt"
    assert by_key["models/m1/p24.bmp"]["prompt_id"] == "p24"
    assert by_key["models/m1/sub/p28.png"]["prompt_id"] is None
    assert by_key["models/m1/p25.png"]["image_sha256"] == by_key["models/m1/p26.png"]["image_sha256"]
    assert by_key["models/m1/p10.png"]["image_sha256"] == hashlib.sha256(objects["models/m1/p10.png"]).hexdigest()

    # images: one row per suite prompt, ok / quarantined(reason) / missing
    rows = rows_by_prompt(result.images)
    for pid, want in rows_expected.items():
        r = rows[pid]
        if want in ("ok", "missing"):
            assert (r["state"], r["reason"]) == (want, None), (pid, r)
        else:
            assert (r["state"], r["reason"]) == ("quarantined", want), (pid, r)
        assert r["source_fingerprint"] == result.fingerprint
        assert r["ingested_at"] == NOW
    assert rows["p29"]["object_uri"] is None and rows["p29"]["image_sha256"] is None

    # every good image ingested: content-addressed copy, real format, dimensions, mode
    ok = {pid: r for pid, r in rows.items() if r["state"] == "ok"}
    assert sorted(ok) == [f"p0{i}" for i in range(1, 9)]
    for pid, r in ok.items():
        (key,) = [k for k in objects if k.split("/")[-1].split(".")[0] == pid]
        data = objects[key]
        sha = hashlib.sha256(data).hexdigest()
        assert r["image_sha256"] == sha
        assert r["byte_size"] == len(data)
        assert r["object_uri"] == (store.root / key).as_uri()
        ext = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp"}[r["format"]]
        assert r["image_path"] == f"images/{sha[:2]}/{sha}.{ext}"
        assert (home / r["image_path"]).read_bytes() == data
        im = Image.open(io.BytesIO(data))
        assert (r["format"], r["width"], r["height"], r["source_mode"]) == (im.format, im.width, im.height, im.mode)
    assert ok["p07"]["format"] == "PNG"  # .jpg name, PNG bytes
    assert ok["p05"]["source_mode"] == "RGBA" and ok["p06"]["source_mode"] == "P"

    # quarantined rows carry what is known, never an image_path
    assert rows["p25"]["format"] == "PNG" and rows["p25"]["image_path"] is None
    assert rows["p27"]["object_uri"].endswith("models/m1/p27.jpg")  # first of the duplicates
    assert rows["p24"]["object_uri"].endswith("models/m1/p24.bmp")
    assert all(r["image_path"] is None for r in rows.values() if r["state"] != "ok")

    # cache holds only decodable, valid images (the two duplicate_image copies share one file)
    cached = sorted(p.relative_to(home).as_posix() for p in (home / "images").rglob("*") if p.is_file())
    dup_sha = rows["p25"]["image_sha256"]
    assert cached == sorted({r["image_path"] for r in ok.values()} | {f"images/{dup_sha[:2]}/{dup_sha}.png"})
    assert not [p for p in home.rglob("*") if p.is_file() and "images" not in p.parts]  # nothing else written

    # counts and progress
    assert result.counts == {
        "objects": len(objects),
        "ok": 8,
        "quarantined": sum(1 for v in rows_expected.values() if v not in ("ok", "missing")),
        "missing": 3,
        "rejected_objects": len(q_expected),
    }
    assert result.fingerprint == listing_fingerprint(store.list_model_objects("m1"))
    assert sum(n for _, n in seen) == len(objects)
    assert {t for t, _ in seen} == {len(objects)}


def test_ingest_is_deterministic_and_idempotent(tmp_path):
    suite = make_suite()
    objects, _, _ = mixed_model()
    store = LocalStore(tmp_path / "objects")
    seed(store, objects)
    home = tmp_path / "home"
    first = ingest_model(store, "m1", suite, home, now=NOW, max_workers=8)
    mtimes = {p: p.stat().st_mtime_ns for p in (home / "images").rglob("*") if p.is_file()}
    again = ingest_model(store, "m1", suite, home, now=NOW, max_workers=1)
    assert again.images.equals(first.images)
    assert again.quarantine.equals(first.quarantine)
    assert again.fingerprint == first.fingerprint
    assert {p: p.stat().st_mtime_ns for p in (home / "images").rglob("*") if p.is_file()} == mtimes


def test_ingest_local_and_s3_identical(tmp_path, s3_env, s3_bucket):
    suite = make_suite()
    objects, _, _ = mixed_model()
    local = LocalStore(tmp_path / "objects")
    s3 = S3Store(s3_bucket, "runs/one", endpoint_url=s3_env.endpoint_url, region=s3_env.region)
    seed(local, objects)
    seed(s3, objects)
    a = ingest_model(local, "m1", suite, tmp_path / "home-local", now=NOW)
    b = ingest_model(s3, "m1", suite, tmp_path / "home-s3", now=NOW)

    check_tables(b, suite)

    def normalised(table: pa.Table, prefix: str) -> list[dict]:
        rows = table.to_pylist()
        for r in rows:
            if r["object_uri"] is not None:
                assert r["object_uri"].startswith(prefix), r["object_uri"]
                r["object_uri"] = r["object_uri"][len(prefix) :]
            r.pop("source_fingerprint", None)  # etags differ: size-mtime vs S3 ETag
        return rows

    local_prefix = local.root.as_uri() + "/"
    s3_prefix = f"s3://{s3_bucket}/runs/one/"
    assert normalised(a.images, local_prefix) == normalised(b.images, s3_prefix)
    assert normalised(a.quarantine, local_prefix) == normalised(b.quarantine, s3_prefix)
    assert a.counts == b.counts
    files = lambda home: sorted(p.relative_to(home).as_posix() for p in home.rglob("*") if p.is_file())  # noqa: E731
    assert files(tmp_path / "home-local") == files(tmp_path / "home-s3")


def test_ingest_empty_model_all_missing(tmp_path):
    suite = make_suite(["a1", "a2"])
    result = ingest_model(LocalStore(tmp_path / "objects"), "nobody", suite, tmp_path / "home", now=NOW)
    assert result.images.column("state").to_pylist() == ["missing", "missing"]
    assert result.quarantine.num_rows == 0
    assert result.fingerprint == listing_fingerprint([])
    assert not (tmp_path / "home").exists()


class CountingStore(LocalStore):
    def __init__(self, root, fail_on: str | None = None):
        super().__init__(root)
        self.calls: list[str] = []
        self.fail_on = fail_on

    def list_model_objects(self, model_id, root="models/"):
        self.calls.append("list")
        return super().list_model_objects(model_id, root)

    def read(self, obj):
        self.calls.append(obj.key)
        if self.fail_on and obj.key.endswith(self.fail_on):
            raise StoreError(f"simulated outage reading {obj.key}")
        return super().read(obj)


@pytest.mark.parametrize("bad", ["../m1", "..", "a/b", ".hidden", "", "m1\n", "ｍ1"])
def test_ingest_invalid_model_id_before_anything(tmp_path, bad):
    store = CountingStore(tmp_path / "objects")
    seed(store, {"models/m1/p01.png": png()})
    with pytest.raises(InvalidModelId):
        ingest_model(store, bad, make_suite(), tmp_path / "home")
    assert store.calls == []
    assert not (tmp_path / "home").exists()


def test_ingest_unreachable_s3_raises_store_error_writes_nothing(tmp_path, s3_env):
    store = S3Store("some-bucket", endpoint_url="http://127.0.0.1:1")
    with pytest.raises(StoreError, match="cannot reach S3 endpoint http://127.0.0.1:1"):
        ingest_model(store, "m1", make_suite(), tmp_path / "home")
    assert not (tmp_path / "home").exists()


def test_ingest_read_failure_raises_store_error(tmp_path):
    store = CountingStore(tmp_path / "objects", fail_on="p05.png")
    seed(store, {f"models/m1/p{i:02d}.png": png(seed=i) for i in range(1, 11)})
    with pytest.raises(StoreError, match="simulated outage"):
        ingest_model(store, "m1", make_suite(), tmp_path / "home", max_workers=2)


def test_ingest_object_changed_after_listing(tmp_path):
    class ShrinkingStore(LocalStore):
        def read(self, obj):
            return super().read(obj)[:-1]

    store = ShrinkingStore(tmp_path / "objects")
    seed(store, {"models/m1/p01.png": png()})
    with pytest.raises(StoreError, match="changed while ingesting"):
        ingest_model(store, "m1", make_suite(), tmp_path / "home")


def test_ingest_rejects_oversized_objects_without_reading(tmp_path):
    store = CountingStore(tmp_path / "objects")
    big = png(size=(300, 300), seed=3)
    seed(store, {"models/m1/p01.png": big, "models/m1/p02.png": png(seed=4), "models/m1/p03.png": b""})
    limits = ImageLimits(max_bytes=len(big) - 1)
    result = ingest_model(store, "m1", make_suite(), tmp_path / "home", limits=limits, now=NOW)
    assert [k for k in store.calls if k != "list"] == ["models/m1/p02.png"]
    rows = rows_by_prompt(result.images)
    assert (rows["p01"]["reason"], rows["p02"]["state"], rows["p03"]["reason"]) == ("too_large", "ok", "empty_file")


def test_plan_objects_is_pure_and_sorted():
    suite = make_suite(["p1", "p2"])
    objs = [
        StoredObject("u3", "models/m1/p2.jpg", 5, "e"),
        StoredObject("u1", "models/m1/p1.png", 5, "e"),
        StoredObject("u2", "models/m1/p2.png", 5, "e"),
        StoredObject("u4", "models/m2/p1.png", 5, "e"),  # another model's key: never trusted
    ]
    plans = plan_objects("m1", objs, suite)
    assert [(p.obj.key, p.reason) for p in plans] == [
        ("models/m1/p1.png", None),
        ("models/m1/p2.jpg", "duplicate_prompt"),
        ("models/m1/p2.png", "duplicate_prompt"),
        ("models/m2/p1.png", "bad_key"),
    ]


def test_mark_duplicate_images_only_across_prompts():
    from tasks.store.ingest import ObjectOutcome

    info = ImageInfo("PNG", 64, 64, "RGB")
    a = ObjectOutcome(StoredObject("u", "models/m/a.png", 1, "e"), "a", sha256="s1", info=info, image_path="x")
    b = ObjectOutcome(StoredObject("u", "models/m/b.png", 1, "e"), "b", sha256="s1", info=info, image_path="x")
    c = ObjectOutcome(StoredObject("u", "models/m/c.png", 1, "e"), "c", sha256="s2", info=info, image_path="y")
    bad = ObjectOutcome(StoredObject("u", "models/m/d.png", 1, "e"), "d", "not_decodable", "d", sha256="s1")
    out = mark_duplicate_images([a, b, c, bad])
    assert [o.reason for o in out] == ["duplicate_image", "duplicate_image", None, "not_decodable"]
    assert out[0].image_path is None and "models/m/b.png" in out[0].detail


def test_pillow_global_state_untouched(tmp_path):
    before = (Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES)
    store = LocalStore(tmp_path / "objects")
    seed(store, {"models/m1/p01.png": BAD_CASES["bomb-7000"][0], "models/m1/p02.png": png()})
    ingest_model(store, "m1", make_suite(), tmp_path / "home", now=NOW)
    assert (Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES) == before == (89478485, False)


def test_ingest_cache_written_atomically_and_skipped_if_present(tmp_path):
    store = LocalStore(tmp_path / "objects")
    data = png(seed=11)
    seed(store, {"models/m1/p01.png": data})
    home = tmp_path / "home"
    sha = hashlib.sha256(data).hexdigest()
    target = home / "images" / sha[:2] / f"{sha}.png"
    target.parent.mkdir(parents=True)
    target.write_bytes(data)
    before = target.stat().st_mtime_ns
    result = ingest_model(store, "m1", make_suite(), home, now=NOW)
    assert rows_by_prompt(result.images)["p01"]["image_path"] == f"images/{sha[:2]}/{sha}.png"
    assert target.stat().st_mtime_ns == before
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # no temp files left


def test_now_must_be_aware(tmp_path):
    with pytest.raises(ValueError):
        ingest_model(LocalStore(tmp_path), "m1", make_suite(), tmp_path / "h", now=datetime(2026, 1, 1))


def test_same_image_for_one_prompt_in_two_models_is_fine(tmp_path):
    store = LocalStore(tmp_path / "objects")
    data = png(seed=12)
    seed(store, {"models/m1/p01.png": data, "models/m2/p01.png": data})
    for m in ("m1", "m2"):
        r = ingest_model(store, m, make_suite(), tmp_path / "home", now=NOW)
        assert rows_by_prompt(r.images)["p01"]["state"] == "ok"


def test_path_of_cache_is_relative(tmp_path):
    store = LocalStore(tmp_path / "objects")
    seed(store, {"models/m1/p01.png": png(seed=13)})
    r = ingest_model(store, "m1", make_suite(), tmp_path / "home", now=NOW)
    p = rows_by_prompt(r.images)["p01"]["image_path"]
    assert not Path(p).is_absolute() and p.startswith("images/")


def test_objects_of_another_pinned_suite_are_left_to_its_own_ingest(tmp_path):
    """A model that renders the Beauty Index prompts beside ImageBench's, under the same
    models/<id>/: each protocol's ingest takes its own prompts and quarantines nothing of the other's."""
    from tasks.scores.suite import other_suite_prompt_ids

    repo_reference = Path(__file__).resolve().parents[2] / "reference"
    others = other_suite_prompt_ids(repo_reference, "imagebench-v1")
    assert "kitchen-sunday-morning" in others and "tr-menus-labels-01" not in others
    assert "tr-menus-labels-01" in other_suite_prompt_ids(repo_reference, "beauty-index-v1")

    suite = make_suite()
    objects, _, _ = mixed_model()
    store = LocalStore(tmp_path / "objects")
    seed(store, objects)
    alone = ingest_model(store, "m1", suite, tmp_path / "home", now=NOW)
    store.write("models/m1/kitchen-sunday-morning.png", png(seed=123))
    mixed = ingest_model(store, "m1", suite, tmp_path / "home", now=NOW, other_suites=others)
    assert mixed.images.equals(alone.images) and mixed.quarantine.equals(alone.quarantine)
    assert mixed.fingerprint == alone.fingerprint
    # Without the other suite's ids the same object is this suite's bad input.
    unaware = ingest_model(store, "m1", suite, tmp_path / "home", now=NOW)
    flagged = [u for u in unaware.quarantine.column("object_uri").to_pylist() if "kitchen-sunday-morning" in u]
    assert len(flagged) == 1 and unaware.quarantine.num_rows == alone.quarantine.num_rows + 1
