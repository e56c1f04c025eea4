"""S3 faults at flow level: `score_model_flow` (real Prefect runs, tiny HPSv3) reading a model from
a real S3 server (SeaweedFS on loopback) through the fault-injecting proxy (tests/faultproxy.py).

One workspace, in order (a reference build is the expensive part, so it is done once):

1. the S3 server process is stopped in the middle of the ingest: the run fails with a StoreError
   naming the object and the endpoint, the lake is readable and exactly as before, the Prefect
   logs show the error and never the credentials;
2. the server is restarted (same port, same data) and the run repeated while SlowDown, resets and
   mid-body resets are injected: it completes;
3. a clean run (no proxy) in a copy of the workspace as it was before 1. gives the same lake;
4. the proxy refuses every connection in the middle of a re-score of the now scored model: the
   run fails, the model's previous results stay in the lake, unchanged and readable.
"""

from __future__ import annotations

import logging
import shutil

import pytest

from tasks.store.storage import StoreError
from tests.faultproxy import FaultProxy
from tests.flows.conftest import eligible_ids, image_bytes
from tests.lakecompare import assert_same_lake, lake_snapshot
from tests.tasks.test_s3_faults import (  # noqa: F401 - fault_server and fenv are fixtures
    assert_no_credentials,
    error_chain,
    fault_server,
    fenv,
)

pytestmark = pytest.mark.slow

MODEL = "s3-faulty"
PREFIX = "bench"


def _prefect_logs() -> str:
    """Every log line the Prefect API holds (what the UI shows), flushed first."""
    from prefect.client.orchestration import get_client
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=5)
    out, offset = [], 0
    with get_client(sync_client=True) as client:
        while True:
            batch = client.read_logs(limit=200, offset=offset)
            out += [log.message for log in batch]
            if len(batch) < 200:
                return "\n".join(out)
            offset += 200


def _run_fails(monkeypatch, endpoint: str) -> BaseException:
    """The flow run fails with the store's error: the StoreError itself, or the run's summary of
    its errors (flows.pipeline.RunFailed) that quotes it."""
    from flows.pipeline import score_model_flow

    monkeypatch.setenv("IMAGEBENCH_S3_ENDPOINT", endpoint)
    with pytest.raises(Exception) as info:  # noqa: PT011 - checked just below
        score_model_flow(MODEL)
    err = info.value
    assert isinstance(err, StoreError) or f"{MODEL}: StoreError: " in str(err), f"{type(err).__name__}: {err}"
    return err


def test_flow_survives_s3_faults_and_outages(built_reference, fenv, tmp_path, monkeypatch, caplog):
    from flows.pipeline import score_model_flow
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.store.storage import S3Store

    caplog.set_level(logging.INFO)
    home, _objects, _ref = built_reference
    if fenv.backend != "seaweedfs":
        pytest.skip("moto keeps its objects in memory: the stop/restart step needs SeaweedFS")
    bucket = fenv.create_bucket("flow")
    direct = S3Store(bucket, PREFIX, endpoint_url=fenv.endpoint_url)
    ids = eligible_ids()[:20]
    for i, pid in enumerate(ids):
        direct.write(f"models/{MODEL}/{pid}.png", image_bytes(70_000 + i))
    direct.write(f"models/{MODEL}/{ids[0]}.jpg", image_bytes(1))  # duplicate_prompt
    direct.write(f"models/{MODEL}/not-a-prompt.png", image_bytes(2))  # unknown_prompt
    monkeypatch.setenv("IMAGEBENCH_STORE", f"s3://{bucket}/{PREFIX}")
    lake_dir = load_settings().lake_dir
    clean_home = tmp_path / "clean-home"
    shutil.copytree(home, clean_home)  # the workspace as it is before any S3 run
    before = lake_snapshot(lake_dir, [home])
    objs = f"/{bucket}/{PREFIX}/models/{MODEL}/"

    with FaultProxy(fenv.endpoint_url) as proxy:
        # 1. The S3 server process goes away after 4 object reads.
        proxy.on_request(lambda m, t: fenv.stop_process(), method="GET", path=objs, after=4, times=1)
        try:
            err = _run_fails(monkeypatch, proxy.endpoint_url)
            assert proxy.counts["call"] == 1 and not fenv.running
        finally:
            fenv.restart()  # same port, same data dir
        msg = str(err)
        assert f"cannot reach S3 endpoint {proxy.endpoint_url}: read s3://{bucket}/{PREFIX}/models/{MODEL}/" in msg, msg
        assert "gave up after" in msg, msg
        assert lake_snapshot(lake_dir, [home]) == before  # nothing published, all still readable
        assert not Lake(lake_dir).read("images", [MODEL]).num_rows
        logs = _prefect_logs()
        assert f"models/{MODEL}/" in logs and "StoreError" in logs, logs[-2000:]
        assert_no_credentials(msg, error_chain(err), logs, caplog.text)

        # 2. Back up; transient faults on the listing and the reads are retried away.
        proxy.clear()
        proxy.slowdown(path="list-type=2", times=1)
        proxy.reset_mid_body(path="list-type=2", times=1)
        proxy.slowdown(method="GET", path=objs, every=4, times=5, fresh_targets_only=True)
        proxy.reset(method="GET", path=objs, every=5, times=3, fresh_targets_only=True)
        proxy.reset_mid_body(method="GET", path=objs, every=6, times=2, fresh_targets_only=True)
        row = score_model_flow(MODEL)
        assert row["eps_prompts_scored"] == 19  # 20 images, one of them a duplicate_prompt
        c = proxy.counts
        assert c["slowdown"] >= 4 and c["reset"] >= 2 and c["reset_mid_body"] >= 2, dict(c)
        warnings = [r.getMessage() for r in caplog.records if r.name == "tasks.store.storage" and r.levelno == logging.WARNING]
        assert any("succeeded after" in w for w in warnings) and any("mid-body" in w for w in warnings), warnings
        proxy.clear()

        # 3. The same lake as a clean run without any fault, from the same starting point.
        monkeypatch.setenv("IMAGEBENCH_HOME", str(clean_home))
        monkeypatch.setenv("IMAGEBENCH_S3_ENDPOINT", fenv.endpoint_url)
        score_model_flow(MODEL)
        monkeypatch.setenv("IMAGEBENCH_HOME", str(home))
        # (the copied baseline rows still name the first workspace's objects: both are roots)
        assert_same_lake(lake_dir, clean_home / lake_dir.relative_to(home), [home], [clean_home, home])
        scored = lake_snapshot(lake_dir, [home])
        q = Lake(lake_dir).read("quarantine", [MODEL]).to_pylist()
        assert sorted(r["reason"] for r in q) == ["duplicate_prompt", "duplicate_prompt", "unknown_prompt"]

        # 4. The endpoint refuses everything in the middle of a re-score: the model's results
        #    from step 2 stay, unchanged and readable.
        proxy.on_request(lambda m, t: proxy.refuse_all(), method="GET", path=objs, after=6, times=1)
        err = _run_fails(monkeypatch, proxy.endpoint_url)
        assert proxy.refusing
        assert f"cannot reach S3 endpoint {proxy.endpoint_url}: read s3://{bucket}/{PREFIX}/models/{MODEL}/" in str(err)
        assert lake_snapshot(lake_dir, [home]) == scored
        assert Lake(lake_dir).read("model_scores", [MODEL]).num_rows == 1
        assert_no_credentials(str(err), error_chain(err), _prefect_logs(), caplog.text)
