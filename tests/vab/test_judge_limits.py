"""`vab run` at the rate a paid API allows (issue 25 item 1): a real `vab-run` flow whose trials go
out in 9 batches at once (batch size 2), each batch with its own judge, client and event loop,
against a fake API that answers 429 beyond 4 requests in flight or 120 per minute. Before, each
batch built its own client and semaphore (63 requests in flight were seen with concurrency 4).

Both scopes a flow can choose (tasks/judges/limits.py): the Prefect server's global limits (the
test harness is a server: ``judge_limits: auto``) and this machine's lock files (``local``, what
the embedded API uses)."""

from __future__ import annotations

import pytest
import yaml

from tests.fake_openai import FakeOpenAI, Reply, ServerLimits

SETS = "demo-limits"


@pytest.mark.parametrize("judge_limits", ["auto", "local"])
def test_vab_run_holds_the_endpoint_limits_across_batches(prefect_harness, tmp_path, monkeypatch, judge_limits) -> None:
    from flows.vab import vab_run_flow
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.vab.demo_sets import write_demo_sets
    from tasks.vab.sets import import_manifest
    from tasks.vab.tables import read_partition

    manifest = write_demo_sets(tmp_path / "sets")
    limits = ServerLimits(max_in_flight=4, requests_per_minute=120, burst=3)

    def answer(req) -> Reply:
        shown = sum(p.get("type") == "image_url" for p in req.body["messages"][-1]["content"])
        return Reply(text="The first one.\nBEST: 1" + ("\nWORST: 2" if shown >= 3 else ""), delay_s=0.2)

    with FakeOpenAI("fake-vlm", answer, limits=limits) as srv:
        cfg = tmp_path / "judges.yaml"
        cfg.write_text(yaml.safe_dump({"judges": {"paid": {
            "backend": "openai", "model": "fake-vlm", "base_url": srv.base_url, "concurrency": 4,
            "requests_per_minute": 120, "max_retries": 2}}}))
        monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("IMAGEBENCH_JUDGES_CONFIG", str(cfg))
        monkeypatch.setenv("IMAGEBENCH_JUDGE_LIMITS", judge_limits)
        for key in ("IMAGEBENCH_STORE", "IMAGEBENCH_CONFIG", "IMAGEBENCH_REFERENCE_DIR"):
            monkeypatch.delenv(key, raising=False)
        settings = load_settings()
        import_manifest(settings, manifest, SETS)
        summary = vab_run_flow(SETS, ["paid"], batch_size=2, use_cache=False, n_resamples=100)

    assert srv.refused == 0, [r.refused for r in srv.completions if r.refused]  # never beyond either limit
    assert srv.max_in_flight <= 4
    m = summary["judges"]["paid"]
    assert m["trials"] == 18 and m["invalid_trials"] == {"unparsable": 0, "error": 0, "tie": 0}
    assert len(srv.completions) == 18  # one request per trial: none refused and asked again
    rows = [r for r in read_partition(Lake(settings.lake_dir), "vab_trials", SETS).to_pylist() if r["judge"] == "paid"]
    assert len(rows) == 18 and all(r["state"] == "ok" and r["best"] is not None for r in rows)  # every answer kept
