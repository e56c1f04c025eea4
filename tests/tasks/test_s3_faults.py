"""S3 faults are survived and visible: `ingest_model` on a real S3 server (SeaweedFS on loopback)
reached through a fault-injecting proxy (tests/faultproxy.py), or while the server itself is
stopped and restarted.

- Transient faults (503 SlowDown, connection resets before the response and mid-body, read
  timeouts) at a rate that retries absorb: the same images/quarantine rows as a clean run, and
  the faults were really injected (proxy counters) and are visible (store counters, warnings).
- A persistent outage (connections refused, 503 on every request, the server stopped mid-ingest):
  a StoreError naming the endpoint and the object, with how many attempts were made, never the
  credentials; nothing returned, no partial image in the cache; after the outage a re-run
  completes with the clean run's rows.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from tasks.store.ingest import ingest_model
from tasks.store.storage import S3Store, StoreError
from tests.conftest import isolate_aws_env
from tests.faultproxy import FaultProxy
from tests.s3server import S3Server, S3ServerError, start_moto, start_seaweedfs
from tests.tasks.test_ingest import NOW, make_suite, mixed_model, seed

# Distinctive fake credentials: the server is started with them (SeaweedFS makes them its admin
# identity), boto3 reads them from the environment, and no message or log may ever show them.
ACCESS_KEY = "AKIAFAULTPROXY7TEST42"
SECRET_KEY = "fAuLt+Pr0xy/S3cr3t-9f8e7d6c5b4a-NEVER-PRINT-ME"
PREFIX = "runs/faults"
MODEL = "m1"
VOLATILE = ("ingested_at", "quarantined_at")


@pytest.fixture(scope="module")
def fault_server():
    """A server of its own (distinctive credentials; stopped and restarted by a test)."""
    backend = (os.environ.get("IMAGEBENCH_TEST_S3") or "auto").lower()
    server: S3Server
    if backend == "moto":
        server = start_moto()
    else:
        try:
            server = start_seaweedfs(access_key=ACCESS_KEY, secret_key=SECRET_KEY)
        except S3ServerError:
            if backend == "seaweedfs":
                raise
            server = start_moto()
    server.access_key, server.secret_key = ACCESS_KEY, SECRET_KEY  # moto accepts any
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fenv(fault_server, monkeypatch, tmp_path) -> S3Server:
    isolate_aws_env(monkeypatch, tmp_path)
    for k, v in fault_server.env().items():
        monkeypatch.setenv(k, v)
    if not fault_server.running:  # a previous test failed while the server was down
        fault_server.restart()
    return fault_server


@pytest.fixture
def proxy(fenv):
    with FaultProxy(fenv.endpoint_url) as p:
        yield p


@pytest.fixture
def seeded(fenv) -> tuple[str, dict[str, bytes]]:
    """A fresh bucket holding the mixed model of test_ingest (good and bad objects)."""
    bucket = fenv.create_bucket("faults")
    objects, _, _ = mixed_model(MODEL)
    seed(S3Store(bucket, PREFIX, endpoint_url=fenv.endpoint_url), objects)
    return bucket, objects


def rows(table: pa.Table) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in table.to_pylist()]


def cache_files(home: Path) -> dict[str, bytes]:
    root = home / "images"
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_cache_complete(home: Path) -> None:
    """Every cached image is whole: its bytes hash to its content-addressed name (no partial copy,
    no temp file left behind)."""
    for rel, data in cache_files(home).items():
        name = rel.rsplit("/", 1)[-1]
        assert not name.startswith("."), f"temp file left in the cache: {rel}"
        assert hashlib.sha256(data).hexdigest() == name.split(".")[0], f"partial image in the cache: {rel}"


def assert_no_credentials(*texts: str) -> None:
    for text in texts:
        assert SECRET_KEY not in text
        assert ACCESS_KEY not in text


def error_chain(exc: BaseException) -> str:
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def clean_run(server: S3Server, bucket: str, home: Path):
    store = S3Store(bucket, PREFIX, endpoint_url=server.endpoint_url, region=server.region)
    return ingest_model(store, MODEL, make_suite(), home, now=NOW)


# ------------------------------------------------------------------------------------------


def test_transient_faults_are_survived_and_visible(fenv, proxy, seeded, tmp_path, caplog):
    """503 SlowDown, resets (before the response and mid-body) and read timeouts on object reads
    and on the listing: the same rows as a clean run, the faults counted on both sides."""
    caplog.set_level(logging.DEBUG)
    bucket, objects = seeded
    clean = clean_run(fenv, bucket, tmp_path / "home-clean")

    objs = f"/{bucket}/{PREFIX}/models/{MODEL}/"  # object GETs; the listing names the prefix url-encoded
    proxy.slowdown(path="list-type=2", times=1)  # the listing: first try throttled,
    proxy.reset(path="list-type=2", times=1)  # the second reset,
    proxy.reset_mid_body(path="list-type=2", times=1)  # the third cut off mid-body
    proxy.slowdown(method="GET", path=objs, every=4, times=8, fresh_targets_only=True)
    proxy.reset(method="GET", path=objs, every=5, times=5, fresh_targets_only=True)
    proxy.reset_mid_body(method="GET", path=objs, every=6, times=4, fresh_targets_only=True)
    proxy.delay(2.5, method="GET", path=objs, every=7, times=2, fresh_targets_only=True)  # > the 1 s read timeout below
    store = S3Store(bucket, PREFIX, endpoint_url=proxy.endpoint_url, region=fenv.region, read_timeout=1.0)
    t0 = time.monotonic()
    faulty = ingest_model(store, MODEL, make_suite(), tmp_path / "home-faulty", now=NOW)
    elapsed = time.monotonic() - t0

    assert rows(faulty.images) == rows(clean.images)
    assert rows(faulty.quarantine) == rows(clean.quarantine)
    assert faulty.fingerprint == clean.fingerprint  # S3 ETags: same listing either way
    assert faulty.counts == clean.counts
    assert cache_files(tmp_path / "home-faulty") == cache_files(tmp_path / "home-clean")

    # The faults really happened...
    c = proxy.counts
    assert c["slowdown"] >= 5 and c["reset"] >= 4 and c["reset_mid_body"] >= 3 and c["delay"] >= 1, dict(c)
    # ...and are visible: counted by the store and logged as warnings naming the call.
    assert store.retry_counts["retried_calls"] >= 5, dict(store.retry_counts)
    assert store.retry_counts["body_retries"] >= 2, dict(store.retry_counts)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "tasks.store.storage"]
    assert any("succeeded after" in w and "SlowDown" in w for w in warnings), warnings
    assert any("broke off mid-body" in w for w in warnings), warnings
    assert any("ListObjectsV2" in w for w in warnings), warnings
    assert_no_credentials(caplog.text)
    assert elapsed < 60, f"took {elapsed:.1f}s"


def test_refused_connections_mid_ingest_fail_cleanly_then_rerun_completes(fenv, proxy, seeded, tmp_path, caplog):
    """The endpoint stops answering after a few object reads (connections refused, open ones
    reset): StoreError naming endpoint + object + attempts, no credentials, nothing returned, no
    partial image; after the outage the same home re-runs to the clean rows."""
    caplog.set_level(logging.DEBUG)
    bucket, _ = seeded
    clean = clean_run(fenv, bucket, tmp_path / "home-clean")
    objs = f"/{bucket}/{PREFIX}/models/{MODEL}/"
    proxy.on_request(lambda method, target: proxy.refuse_all(), method="GET", path=objs, after=5, times=1)
    store = S3Store(bucket, PREFIX, endpoint_url=proxy.endpoint_url, region=fenv.region)
    home = tmp_path / "home"
    t0 = time.monotonic()
    with pytest.raises(StoreError) as info:
        ingest_model(store, MODEL, make_suite(), home, now=NOW)
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert proxy.counts["refuse_all"] == 1 and proxy.refusing
    assert msg.startswith(f"cannot reach S3 endpoint {proxy.endpoint_url}: read s3://{bucket}/{PREFIX}/models/{MODEL}/"), msg
    assert "gave up after" in msg and "attempt" in msg, msg
    assert_no_credentials(msg, error_chain(info.value), caplog.text)
    assert elapsed < 30, f"took {elapsed:.1f}s to give up"
    assert_cache_complete(home)

    proxy.heal()
    again = ingest_model(store, MODEL, make_suite(), home, now=NOW)
    assert rows(again.images) == rows(clean.images)
    assert rows(again.quarantine) == rows(clean.quarantine)
    assert cache_files(home) == cache_files(tmp_path / "home-clean")


def test_503_on_every_read_gives_up_with_attempt_count(fenv, proxy, seeded, tmp_path, caplog):
    """SlowDown on every object read: botocore backs off and retries, then the StoreError says
    which object, which endpoint, how many attempts and why. Then the throttling ends."""
    caplog.set_level(logging.DEBUG)
    bucket, _ = seeded
    proxy.slowdown(method="GET", path=f"/{bucket}/{PREFIX}/models/{MODEL}/")
    # 2 retries = 3 attempts: keeps the throttling backoff (1 s, 2 s scale) short in a test.
    store = S3Store(bucket, PREFIX, endpoint_url=proxy.endpoint_url, region=fenv.region, max_attempts=2)
    home = tmp_path / "home"
    with pytest.raises(StoreError) as info:
        ingest_model(store, MODEL, make_suite(), home, now=NOW, max_workers=2)
    msg = str(info.value)
    assert f"s3://{bucket}/{PREFIX}/models/{MODEL}/" in msg and proxy.endpoint_url in msg, msg
    assert "SlowDown" in msg and "gave up after 3 attempts: 503 SlowDown x3" in msg, msg
    assert_no_credentials(msg, error_chain(info.value), caplog.text)
    assert proxy.counts["slowdown"] >= 3
    assert not (home / "images").exists()  # every read failed: nothing cached

    proxy.clear()
    result = ingest_model(store, MODEL, make_suite(), home, now=NOW)
    assert result.n_ok > 0


def test_server_stopped_mid_ingest_then_restarted(fenv, seeded, tmp_path, caplog):
    """The real S3 server process goes away in the middle of an ingest (SIGTERM): StoreError
    naming the server's endpoint and the object; restarted on the same port and data dir, the
    re-run completes with the clean rows (the objects survived the restart)."""
    if fenv.backend != "seaweedfs":
        pytest.skip("moto keeps its objects in memory: a restart loses them")
    caplog.set_level(logging.DEBUG)
    bucket, _ = seeded
    clean = clean_run(fenv, bucket, tmp_path / "home-clean")
    store = S3Store(bucket, PREFIX, endpoint_url=fenv.endpoint_url, region=fenv.region)
    done = []

    def progress(total, n=1):
        done.append(n)
        if len(done) == 3:
            fenv.stop_process()  # synchronous: the remaining reads meet a dead server

    home = tmp_path / "home"
    try:
        with pytest.raises(StoreError) as info:
            ingest_model(store, MODEL, make_suite(), home, now=NOW, max_workers=2, progress=progress)
        assert not fenv.running
        msg = str(info.value)
        assert fenv.endpoint_url in msg and f"s3://{bucket}/{PREFIX}/models/{MODEL}/" in msg, msg
        assert "gave up after" in msg, msg
        assert_no_credentials(msg, error_chain(info.value), caplog.text)
        assert_cache_complete(home)
    finally:
        fenv.restart()

    again = ingest_model(store, MODEL, make_suite(), home, now=NOW)
    assert rows(again.images) == rows(clean.images)
    assert rows(again.quarantine) == rows(clean.quarantine)
    assert again.fingerprint == clean.fingerprint


def test_read_that_keeps_breaking_off_mid_body_gives_up(fenv, proxy, seeded):
    """botocore does not retry a body that breaks off; S3Store.read repeats the GET, then says so."""
    bucket, _ = seeded
    store = S3Store(bucket, PREFIX, endpoint_url=proxy.endpoint_url, region=fenv.region)
    obj = next(o for o in store.list_model_objects(MODEL) if o.key.endswith("p01.png"))
    proxy.reset_mid_body(path=obj.key, times=2)
    assert store.read(obj) == S3Store(bucket, PREFIX, endpoint_url=fenv.endpoint_url).read(obj)
    assert store.retry_counts["body_retries"] == 2
    proxy.reset_mid_body(path=obj.key)
    with pytest.raises(StoreError) as info:
        store.read(obj)
    msg = str(info.value)
    assert msg.startswith(f"S3 endpoint {proxy.endpoint_url} broke off the response: read {obj.uri}: "), msg
    assert msg.endswith("(gave up after 3 attempts: ResponseStreamingError x3)"), msg
    assert_no_credentials(msg, error_chain(info.value))


# ------------------------------------------------------------------------------------------
# The proxy itself


def test_rule_matching_every_after_times():
    from tests.faultproxy import Rule

    r = Rule("slowdown", every=2, after=1, times=2, method="GET", path="/b/")
    assert not r.matches("PUT", "/b/k") and not r.matches("GET", "/a/k") and r.matches("GET", "/b/k?x=1")
    assert [r.take() for _ in range(8)] == [False, False, True, False, True, False, False, False]
    assert r.injected == 2 and r.exhausted
    with pytest.raises(ValueError):
        Rule("explode")


class _Upstream:
    """A tiny raw HTTP/1.1 server: answers each request with the sha256 of the body it received,
    framed as the path asks (/cl, /chunked, /close, /empty)."""

    def __init__(self):
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import threading

        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        from tests.faultproxy import _read_body, _read_head

        rf = c.makefile("rb")
        try:
            while (head := _read_head(rf)) is not None:
                method, path = head.start.split()[:2]
                if b"100-continue" in head.get("expect").encode():
                    c.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                raw = _read_body(rf, head, request=True)
                body = _dechunk(raw) if head.chunked else raw
                digest = hashlib.sha256(body).hexdigest().encode() * 100  # 6.4 kB answer
                if path == b"/chunked":
                    parts = [digest[i : i + 1000] for i in range(0, len(digest), 1000)]
                    c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    c.sendall(b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\nX-T: 1\r\n\r\n")
                elif path == b"/close":
                    c.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + digest)
                    return
                elif path == b"/empty":
                    c.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
                else:
                    cl = b"Content-Length: %d\r\n" % len(digest)
                    c.sendall(b"HTTP/1.1 200 OK\r\n" + cl + b"\r\n" + (b"" if method == b"HEAD" else digest))
        except Exception:
            pass
        finally:
            c.close()

    def close(self):
        self.sock.close()


def _dechunk(raw: bytes) -> bytes:
    out, rest = b"", raw
    while True:
        line, rest = rest.split(b"\r\n", 1)
        n = int(line.split(b";")[0], 16)
        if n == 0:
            return out
        out, rest = out + rest[:n], rest[n + 2 :]


def test_proxy_forwards_bodies_byte_for_byte_with_keep_alive():
    import http.client
    import socket

    up = _Upstream()
    try:
        with FaultProxy(up.url) as p:
            conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=5)
            payload = os.urandom(300_000)
            want = hashlib.sha256(payload).hexdigest().encode() * 100
            for path in ("/cl", "/chunked"):
                conn.request("PUT", path, body=payload)  # Content-Length body
                assert conn.getresponse().read() == want
                conn.request("PUT", path, body=iter([payload[:1000], payload[1000:]]), encode_chunked=True)
                assert conn.getresponse().read() == want
                conn.request("PUT", path, body=payload, headers={"Expect": "100-continue"})
                assert conn.getresponse().read() == want
            conn.request("HEAD", "/cl")
            r = conn.getresponse()
            assert r.status == 200 and r.read() == b"" and int(r.getheader("Content-Length")) == len(want)
            conn.request("GET", "/empty")
            r = conn.getresponse()
            assert r.status == 204 and r.read() == b""
            assert p.counts["connections"] == 1 and up.connections == 1  # kept alive both sides
            conn.request("GET", "/close")
            r = conn.getresponse()
            assert r.read() == hashlib.sha256(b"").hexdigest().encode() * 100
            # Expect: 100-continue: the proxy says "go on" before the body is sent.
            with socket.create_connection(("127.0.0.1", p.port), timeout=5) as raw:
                raw.sendall(b"PUT /cl HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
                assert raw.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
                raw.sendall(b"abc")
                answer = raw.recv(100)
                assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"100 Continue" not in answer
            assert p.counts["forwarded"] == 10 and p.injected == 0
    finally:
        up.close()


def test_proxy_refuse_all_and_heal_on_the_same_port():
    import http.client
    import socket

    up = _Upstream()
    try:
        with FaultProxy(up.url) as p:
            port = p.port
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/cl")
            conn.getresponse().read()
            p.refuse_all()
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=2)
            with pytest.raises((ConnectionError, http.client.HTTPException)):  # the open one was reset
                conn.request("GET", "/cl")
                conn.getresponse().read()
            p.heal()
            assert p.port == port
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/cl")
            r = conn.getresponse()
            assert r.status == 200 and len(r.read()) == 6400
            p.slowdown(times=1)
            conn.request("GET", "/cl?x")
            r = conn.getresponse()
            assert r.status == 503 and b"<Code>SlowDown</Code>" in r.read()
            assert p.counts["slowdown"] == 1 and p.counts["refuse_all"] == 1
    finally:
        up.close()


def test_proxy_s3_uploads_and_downloads(fenv, proxy):
    """boto3 through the proxy: PUT of bytes and of a file object (Expect: 100-continue),
    multipart upload, GET, HEAD, listing; all byte-exact."""
    import io

    import boto3
    from boto3.s3.transfer import TransferConfig

    bucket = fenv.create_bucket("proxy")
    c = boto3.session.Session().client(  # fenv.client()'s settings, through the proxy
        "s3", endpoint_url=proxy.endpoint_url, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        region_name=fenv.region, config=fenv.client().meta.config,
    )  # fmt: skip
    data = os.urandom(2_500_000)
    c.put_object(Bucket=bucket, Key="a", Body=data)
    c.put_object(Bucket=bucket, Key="b", Body=io.BytesIO(data))  # file object: Expect: 100-continue
    big = data * 3
    c.upload_fileobj(io.BytesIO(big), bucket, "c", Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
    assert c.get_object(Bucket=bucket, Key="a")["Body"].read() == data
    assert c.get_object(Bucket=bucket, Key="b")["Body"].read() == data
    assert c.get_object(Bucket=bucket, Key="c")["Body"].read() == big
    assert c.head_object(Bucket=bucket, Key="c")["ContentLength"] == len(big)
    assert sorted(o["Key"] for o in c.list_objects_v2(Bucket=bucket)["Contents"]) == ["a", "b", "c"]
    assert proxy.injected == 0 and proxy.counts["forwarded"] >= 9
