"""tasks.store.storage against a real directory and a real S3 server over loopback (no boto3 patching)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tasks.store.storage import (
    InvalidKey,
    InvalidModelId,
    LocalStore,
    ObjectStore,
    S3Store,
    StoredObject,
    StoreError,
    check_key,
    listing_fingerprint,
    open_store,
    open_store_from_settings,
    parse_image_key,
    prompt_id_of_key,
    validate_model_id,
)

# ------------------------------------------------------------------------------------------
# Names and keys

GOOD_IDS = ["m1", "SDXL-1.0", "flux_dev", "a", "A" * 128, "model.v2", "0x"]
BAD_IDS = [
    "",
    ".",
    "..",
    "../x",
    "x/..",
    "a/b",
    "a\\b",
    "/abs",
    ".hidden",
    "-dash",
    "_under",
    "a..b",
    "a\x00b",
    "m1\n",  # '$' would match before a trailing newline: fullmatch must be used
    " m1",
    "m 1",
    "m1/",
    "A" * 129,
    "modèle",  # non-ASCII letter
    "ｍ1",  # fullwidth m
    "m1\u200b",  # zero-width space
    "mоdel",  # Cyrillic o
    "m\u2024\u2024x",  # one-dot leaders that render like '..'
    "m%2F1",
]


@pytest.mark.parametrize("model_id", GOOD_IDS)
def test_validate_model_id_accepts(model_id):
    assert validate_model_id(model_id) == model_id


@pytest.mark.parametrize("model_id", BAD_IDS)
def test_validate_model_id_rejects_path_tricks(model_id):
    with pytest.raises(InvalidModelId) as info:
        validate_model_id(model_id)
    assert repr(model_id) in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", [None, 3, b"m1"])
def test_validate_model_id_rejects_non_strings(value):
    with pytest.raises(InvalidModelId):
        validate_model_id(value)


@pytest.mark.parametrize(
    "key, expected",
    [
        ("models/m1/tr-sign-01.png", ("m1", "tr-sign-01", "png")),
        ("models/SDXL-1.0/a.jpg", ("SDXL-1.0", "a", "jpg")),
        ("models/m1/p1.jpeg", ("m1", "p1", "jpeg")),
        ("models/m1/p1.WEBP", ("m1", "p1", "webp")),
        ("models/m1/p1.PNG", ("m1", "p1", "png")),
    ],
)
def test_parse_image_key(key, expected):
    assert parse_image_key(key) == expected


@pytest.mark.parametrize(
    "key, fragment",
    [
        ("models/m1/sub/p1.png", "sub-folders"),
        ("models/m1/p1.bmp", "extension"),
        ("models/m1/p1.png.bak", "extension"),
        ("models/m1/p1", "extension"),
        ("models/m1/P1.png", "prompt id"),
        ("models/m1/.p1.png", "prompt id"),
        ("models/m1/.png", "prompt id"),
        ("models/m1/p 1.png", "prompt id"),
        ("models/../p1.png", "model id"),
        ("models/.hidden/p1.png", "model id"),
        ("models/m1/../p1.png", "sub-folders"),
        ("other/m1/p1.png", "not under models/"),
        ("p1.png", "not under models/"),
        ("models/m1/p1\x00.png", "prompt id"),
    ],
)
def test_parse_image_key_rejects(key, fragment):
    with pytest.raises(InvalidKey) as info:
        parse_image_key(key)
    assert repr(key) in str(info.value) or key in str(info.value)
    assert fragment in str(info.value)


def test_prompt_id_of_key_only_for_top_level_keys():
    assert prompt_id_of_key("models/m1/p1.bmp") == "p1"
    assert prompt_id_of_key("models/m1/p1") == "p1"
    assert prompt_id_of_key("models/m1/sub/p1.png") is None
    assert prompt_id_of_key("models/m1/P1.png") is None
    assert prompt_id_of_key("models/../p1.png") is None


@pytest.mark.parametrize("key", ["", "/abs", "../x", "a/../b", "a//b", "a/./b", "a\\b", "a\x00b", "x" * 1025, "a/"])
def test_check_key_rejects(key):
    with pytest.raises(InvalidKey):
        check_key(key)


def test_listing_fingerprint_is_order_free_and_sensitive():
    a = StoredObject("s3://b/models/m/a.png", "models/m/a.png", 10, "e1")
    b = StoredObject("s3://b/models/m/b.png", "models/m/b.png", 20, "e2")
    fp = listing_fingerprint([a, b])
    assert fp == listing_fingerprint([b, a])
    assert len(fp) == 64
    assert fp != listing_fingerprint([a])
    assert fp != listing_fingerprint([a, StoredObject(b.uri, b.key, 20, "e3")])
    assert fp != listing_fingerprint([a, StoredObject(b.uri, b.key, 21, "e2")])
    assert listing_fingerprint([]) == listing_fingerprint(())


# ------------------------------------------------------------------------------------------
# open_store


def test_open_store_parses_uris(tmp_path, s3_env):
    s = open_store("s3://my-bucket/some/prefix/", endpoint=s3_env.endpoint_url, region="us-east-1")
    assert isinstance(s, S3Store)
    assert (s.bucket, s.prefix, s.endpoint_url) == ("my-bucket", "some/prefix/", s3_env.endpoint_url)
    assert s.uri == "s3://my-bucket/some/prefix"
    assert open_store("s3://my-bucket").uri == "s3://my-bucket"
    local = open_store(tmp_path.as_uri())
    assert isinstance(local, LocalStore) and local.root == tmp_path
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert open_store(tmp_path).uri == tmp_path.as_uri()


def test_open_store_s3_client_config_is_bounded(s3_env):
    s = open_store("s3://my-bucket", endpoint=s3_env.endpoint_url)
    assert s.config.connect_timeout <= 5
    assert s.config.read_timeout <= 60
    # botocore turns retries={"mode": "standard", "max_attempts": 5} into 5 retries, 6 calls in all
    assert s.config.retries == {"mode": "standard", "total_max_attempts": 6}


@pytest.mark.parametrize(
    "uri",
    ["gs://bucket/x", "s3://", "s3:///prefix", "s3://Bad_Bucket/x", "s3://ab", "file://otherhost/x", "s3://bkt/a/../b", ""],
)
def test_open_store_rejects(uri):
    with pytest.raises(StoreError):
        open_store(uri)


def test_open_store_from_settings(tmp_path, monkeypatch):
    from schemas.settings import load_settings

    monkeypatch.delenv("IMAGEBENCH_STORE", raising=False)
    monkeypatch.delenv("IMAGEBENCH_CONFIG", raising=False)
    store = open_store_from_settings(load_settings(home=tmp_path))
    assert isinstance(store, LocalStore)
    assert store.root == (tmp_path / "objects").resolve()
    monkeypatch.setenv("IMAGEBENCH_STORE", "s3://bench-bucket/run1")
    monkeypatch.setenv("IMAGEBENCH_S3_ENDPOINT", "http://127.0.0.1:9")
    s3 = open_store_from_settings(load_settings(home=tmp_path))
    assert isinstance(s3, S3Store)
    assert (s3.bucket, s3.prefix, s3.endpoint_url) == ("bench-bucket", "run1/", "http://127.0.0.1:9")


# ------------------------------------------------------------------------------------------
# One contract, every implementation


@pytest.fixture(params=["local", "s3", "s3-prefix"])
def store(request, tmp_path) -> ObjectStore:
    if request.param == "local":
        return LocalStore(tmp_path / "objects")
    server = request.getfixturevalue("s3_env")
    bucket = request.getfixturevalue("s3_bucket")
    prefix = "team/run-1" if request.param == "s3-prefix" else ""
    return S3Store(bucket, prefix, endpoint_url=server.endpoint_url, region=server.region)


CONTENT = {
    "models/m1/p1.png": b"one",
    "models/m1/p2.jpg": b"two-two",
    "models/m1/sub/p3.png": b"nested",
    "models/m1/notes.txt": b"txt",
    "models/m10/p1.png": b"other model",
    "models/.hidden/p1.png": b"hidden",
    "models/bad name/p1.png": b"space",
    "models/readme.txt": b"not a model",
    "elsewhere/x.png": b"outside models/",
}


def _seed(store: ObjectStore) -> dict[str, StoredObject]:
    return {k: store.write(k, v) for k, v in CONTENT.items()}


def test_contract_write_list_read(store):
    written = _seed(store)
    for key, obj in written.items():
        assert obj.key == key
        assert obj.size == len(CONTENT[key])
        assert obj.etag
        quoted = key.replace(" ", "%20") if obj.uri.startswith("file:") else key
        assert obj.uri == f"{store.uri}/{quoted}"

    assert store.list_models() == sorted([".hidden", "bad name", "m1", "m10"])

    objs = store.list_model_objects("m1")
    want = ["models/m1/p1.png", "models/m1/p2.jpg", "models/m1/sub/p3.png", "models/m1/notes.txt"]
    assert [o.key for o in objs] == sorted(want)
    for o in objs:
        assert o.size == len(CONTENT[o.key])
        assert o.etag == written[o.key].etag
        assert o.uri == written[o.key].uri
        assert store.read(o) == CONTENT[o.key]
    assert [o.key for o in store.list_model_objects("m10")] == ["models/m10/p1.png"]
    assert store.list_model_objects("nobody") == []


def test_contract_each_protocol_lists_its_own_place(store, tmp_path):
    """Issue 26 item 2: the Beauty Index's tools at beauty/<suite>/<tool>/ are listed, read and
    ingested from there, and never show among the ImageBench models under models/."""
    from tasks.beauty.suite import load_beauty_suite
    from tasks.store.ingest import ingest_model
    from tasks.store.storage import beauty_root
    from tests.flows.conftest import image_bytes

    _seed(store)
    suite = load_beauty_suite(Path(__file__).resolve().parents[2] / "reference")
    place = beauty_root(suite.version)
    assert place == "beauty/beauty-index-v1/"
    ids = [p.prompt_id for p in suite.prompts]
    for i, pid in enumerate(ids[:3]):
        store.write(f"{place}t1/{pid}.png", image_bytes(i, side=64))
    store.write(f"{place}t2/{ids[0]}.png", image_bytes(9, side=64))
    store.write(f"{place}t2/notes.txt", b"stray")
    assert store.list_models() == sorted([".hidden", "bad name", "m1", "m10"])  # no tool among the models
    assert store.list_models(place) == ["t1", "t2"]
    assert store.list_models("beauty/") == ["beauty-index-v1"]
    assert [o.key for o in store.list_model_objects("t1", place)] == sorted(f"{place}t1/{p}.png" for p in ids[:3])
    assert store.list_model_objects("t1") == [] and store.list_model_objects("m1", place) == []
    for bad in ("beauty", "/beauty/", "beauty/../models/", ""):
        with pytest.raises(InvalidKey):
            store.list_models(bad)
    result = ingest_model(store, "t2", suite, tmp_path / "home", root=place)
    rows = {r["prompt_id"]: r for r in result.images.to_pylist()}
    assert rows[ids[0]]["state"] == "ok" and rows[ids[0]]["object_uri"].endswith(f"/{place}t2/{ids[0]}.png")
    assert sum(r["state"] == "missing" for r in rows.values()) == len(ids) - 1
    (bad,) = result.quarantine.to_pylist()
    assert bad["reason"] == "bad_key" and f"expected {place}t2/<prompt_id>" in bad["detail"]


def test_contract_rejects_bad_model_ids_and_keys(store):
    _seed(store)
    for bad in ["../x", "..", "a/b", ".hidden", ""]:
        with pytest.raises(InvalidModelId):
            store.list_model_objects(bad)
    for key in ["../escape.png", "models/../../escape.png", "/abs.png", "models//x.png", "a\\b.png"]:
        with pytest.raises(StoreError):
            store.write(key, b"x")
    with pytest.raises(StoreError):
        store.read(StoredObject("x", "../escape.png", 1, "e"))


def test_contract_missing_object_names_key(store):
    with pytest.raises(StoreError) as info:
        store.read(StoredObject("x", "models/m1/absent.png", 3, "e"))
    assert "models/m1/absent.png" in str(info.value)


def test_contract_fingerprint_tracks_changes(store):
    store.write("models/m1/p1.png", b"one")
    store.write("models/m1/p2.png", b"two")
    fp1 = listing_fingerprint(store.list_model_objects("m1"))
    assert fp1 == listing_fingerprint(store.list_model_objects("m1"))
    store.write("models/m1/p2.png", b"changed!")
    fp2 = listing_fingerprint(store.list_model_objects("m1"))
    assert fp2 != fp1
    store.write("models/m1/p3.png", b"three")
    assert listing_fingerprint(store.list_model_objects("m1")) != fp2


def test_contract_overwrite_replaces(store):
    store.write("models/m1/p1.png", b"first")
    obj = store.write("models/m1/p1.png", b"second version")
    assert store.read(obj) == b"second version"
    assert [o.size for o in store.list_model_objects("m1")] == [len(b"second version")]


# ------------------------------------------------------------------------------------------
# LocalStore specifics


def test_local_missing_root_is_empty_and_write_creates_it(tmp_path):
    store = LocalStore(tmp_path / "does" / "not" / "exist")
    assert store.list_models() == []
    assert store.list_model_objects("m1") == []
    store.write("models/m1/p1.png", b"x")
    assert store.list_models() == ["m1"]


def test_local_root_that_is_a_file_is_an_error(tmp_path):
    f = tmp_path / "file"
    f.write_bytes(b"")
    with pytest.raises(StoreError, match="not a directory"):
        LocalStore(f).list_models()


def test_local_etag_is_size_and_mtime(tmp_path):
    obj = LocalStore(tmp_path).write("models/m1/p1.png", b"abc")
    st = (tmp_path / "models/m1/p1.png").stat()
    assert obj.etag == f"3-{st.st_mtime_ns}"


def test_local_never_follows_symlinks_out_of_root(tmp_path):
    outside = tmp_path / "outside"
    (outside / "m-evil").mkdir(parents=True)
    (outside / "secret.png").write_bytes(b"secret")
    (outside / "m-evil" / "p1.png").write_bytes(b"evil")
    root = tmp_path / "root"
    store = LocalStore(root)
    store.write("models/m1/p1.png", b"good")
    store.write("models/m2/p9.png", b"inside target")
    os.symlink(outside / "secret.png", root / "models/m1/p2.png")  # file link out of root
    os.symlink(outside / "m-evil", root / "models/m-evil")  # model dir link out of root
    os.symlink(outside, root / "models/m1/sub")  # sub-folder link out of root
    os.symlink(root / "models/m2/p9.png", root / "models/m1/p3.png")  # link inside root: fine

    assert store.list_models() == ["m1", "m2"]
    keys = [o.key for o in store.list_model_objects("m1")]
    assert keys == ["models/m1/p1.png", "models/m1/p3.png"]
    assert store.list_model_objects("m-evil") == []
    with pytest.raises(StoreError, match="outside the store root"):
        store.read(StoredObject("x", "models/m1/p2.png", 6, "e"))
    with pytest.raises(StoreError, match="outside the store root"):
        store.write("models/m1/sub/planted.png", b"x")
    assert not (outside / "planted.png").exists()
    assert store.read(StoredObject("x", "models/m1/p3.png", 13, "e")) == b"inside target"


def test_local_write_is_atomic_no_temp_left(tmp_path):
    store = LocalStore(tmp_path)
    store.write("models/m1/p1.png", b"x" * 1000)
    assert sorted(p.name for p in (tmp_path / "models/m1").iterdir()) == ["p1.png"]


# ------------------------------------------------------------------------------------------
# S3 specifics


def _count_list_calls(store: S3Store) -> list[int]:
    calls: list[int] = []
    store._client.meta.events.register("after-call.s3.ListObjectsV2", lambda **kw: calls.append(1))
    return calls


def test_s3_pagination(s3_env, s3_bucket):
    store = S3Store(s3_bucket, endpoint_url=s3_env.endpoint_url, page_size=2)
    for i in range(7):
        store.write(f"models/m1/p{i}.png", bytes([i]) * (i + 1))
    for name in ("a1", "b2", "c3", "d4"):
        store.write(f"models/{name}/p.png", b"x")
    calls = _count_list_calls(store)
    objs = store.list_model_objects("m1")
    assert [o.key for o in objs] == [f"models/m1/p{i}.png" for i in range(7)]
    assert [o.size for o in objs] == [i + 1 for i in range(7)]
    assert len(calls) == 4  # 7 keys, 2 per page
    calls.clear()
    assert store.list_models() == ["a1", "b2", "c3", "d4", "m1"]
    assert len(calls) == 3  # 5 common prefixes, 2 per page


def test_s3_prefix_isolates_stores(s3_env, s3_bucket):
    a = S3Store(s3_bucket, "team-a", endpoint_url=s3_env.endpoint_url)
    b = S3Store(s3_bucket, "team-b", endpoint_url=s3_env.endpoint_url)
    a.write("models/m1/p1.png", b"a")
    assert b.list_models() == []
    assert a.list_models() == ["m1"]
    (obj,) = a.list_model_objects("m1")
    assert obj.uri == f"s3://{s3_bucket}/team-a/models/m1/p1.png"
    assert obj.key == "models/m1/p1.png"


def test_s3_folder_markers_are_not_objects(s3_env, s3_bucket):
    store = S3Store(s3_bucket, endpoint_url=s3_env.endpoint_url)
    store.write("models/m1/p1.png", b"x")
    s3_env.client().put_object(Bucket=s3_bucket, Key="models/m1/sub/", Body=b"")
    assert [o.key for o in store.list_model_objects("m1")] == ["models/m1/p1.png"]


def test_s3_unreachable_endpoint_fails_fast_and_names_it(s3_env):
    endpoint = "http://127.0.0.1:1"
    store = S3Store("some-bucket", endpoint_url=endpoint)  # default timeouts and retries
    t0 = time.monotonic()
    with pytest.raises(StoreError) as info:
        store.list_models()
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert msg.startswith(f"cannot reach S3 endpoint {endpoint}: ")
    assert elapsed < 15, f"took {elapsed:.1f}s"
    assert s3_env.secret_key not in msg and s3_env.access_key not in msg
    with pytest.raises(StoreError, match="cannot reach S3 endpoint http://127.0.0.1:1"):
        store.read(StoredObject("x", "models/m1/p1.png", 1, "e"))


def test_s3_missing_bucket(s3_env):
    store = S3Store("no-such-bucket-imagebench", endpoint_url=s3_env.endpoint_url)
    with pytest.raises(StoreError) as info:
        store.list_models()
    msg = str(info.value)
    assert "no-such-bucket-imagebench" in msg and "does not exist" in msg and s3_env.endpoint_url in msg
    with pytest.raises(StoreError, match="does not exist"):
        store.list_model_objects("m1")


def test_s3_wrong_credentials_access_denied(s3_env, s3_bucket, monkeypatch):
    if s3_env.backend == "moto":
        pytest.skip("moto accepts any credentials")
    S3Store(s3_bucket, endpoint_url=s3_env.endpoint_url).write("models/m1/p1.png", b"x")
    wrong_secret = "wrong-secret-do-not-print-me"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong_secret)
    store = S3Store(s3_bucket, endpoint_url=s3_env.endpoint_url)
    with pytest.raises(StoreError) as info:
        store.list_model_objects("m1")
    msg = str(info.value)
    assert "access denied" in msg and s3_bucket in msg and s3_env.endpoint_url in msg
    assert wrong_secret not in msg
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unknown-key-id")
    with pytest.raises(StoreError, match="access denied"):
        S3Store(s3_bucket, endpoint_url=s3_env.endpoint_url).list_models()


def test_s3_no_credentials(s3_server, no_aws_credentials):
    store = S3Store("some-bucket", endpoint_url=s3_server.endpoint_url)
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="no usable AWS credentials"):
        store.list_models()
    assert time.monotonic() - t0 < 10


def test_s3_write_returns_listing_etag(s3_env, s3_bucket):
    store = S3Store(s3_bucket, endpoint_url=s3_env.endpoint_url)
    obj = store.write("models/m1/p1.png", b"payload")
    (listed,) = store.list_model_objects("m1")
    assert listed == obj
    assert not obj.etag.startswith('"')


def test_s3_and_local_agree(tmp_path, s3_env, s3_bucket):
    local = LocalStore(tmp_path)
    s3 = S3Store(s3_bucket, endpoint_url=s3_env.endpoint_url)
    for k, v in CONTENT.items():
        local.write(k, v)
        s3.write(k, v)
    assert local.list_models() == s3.list_models()
    for m in ("m1", "m10"):
        lo, so = local.list_model_objects(m), s3.list_model_objects(m)
        assert [(o.key, o.size) for o in lo] == [(o.key, o.size) for o in so]
        assert [local.read(o) for o in lo] == [s3.read(o) for o in so]


def test_repr_has_no_secrets(s3_env):
    store = S3Store("some-bucket", "p", endpoint_url=s3_env.endpoint_url)
    assert repr(store) == "S3Store('s3://some-bucket/p')"
    assert s3_env.secret_key not in repr(vars(store))


def test_local_store_path_type(tmp_path):
    assert isinstance(LocalStore(str(tmp_path)).root, Path)
