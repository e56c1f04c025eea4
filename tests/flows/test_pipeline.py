"""Real Prefect flow runs (prefect_test_harness) over a temporary workspace with the tiny model."""

from __future__ import annotations

import hashlib
import math

import duckdb
import numpy as np
import pytest

from tests.flows.conftest import PROMPT_IDS, put_model

pytestmark = pytest.mark.slow


def _eligible():
    from schemas.settings import load_settings
    from tasks.scores.suite import load_suite

    return list(load_suite(load_settings().suite_path).eligible_ids)


def _model_scores():
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake

    t = Lake(load_settings().lake_dir).read("model_scores")
    return {r["model_id"]: r for r in t.to_pylist()}


def _expected_eps(model_id: str) -> float:
    """EPS recomputed by hand from the lake's mu and the reference file's mu_ref."""
    import json

    from schemas.settings import load_settings
    from tasks.lake.tables import Lake

    s = load_settings()
    ref = json.loads(s.reference_path.read_text())
    mu_ref = {p["prompt_id"]: p["mu_ref"] for p in ref["prompts"]}
    t = Lake(s.lake_dir).read("hps_scores", [model_id]).to_pylist()
    mu = {r["prompt_id"]: r["mu"] for r in t if r["scorer_id"] == ref["scorer_id"]}
    total = sum(1.0 / (1.0 + math.exp(-(mu[p] - mu_ref[p]))) if p in mu else 0.0 for p in mu_ref)
    return 100.0 * total / len(mu_ref)


def test_reference_nightly_and_rerun(built_reference):
    from flows.pipeline import nightly_flow
    from schemas.settings import load_settings

    home, objects, ref_path = built_reference
    settings = load_settings()
    sums = (settings.reference_dir / "SHA256SUMS").read_text()
    assert hashlib.sha256(open(ref_path, "rb").read()).hexdigest() in sums

    eligible = _eligible()
    put_model(objects, "full", eligible, seed=3)
    put_model(objects, "partial", eligible[:40], seed=4)
    (objects / "models" / "partial" / f"{eligible[40]}.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")

    summary = nightly_flow()
    # The baselines got their result when the reference was built: up to date already.
    assert sorted(summary["scored"]) == ["full", "partial"] and summary["up_to_date"] == ["base-a", "base-b"]
    rows = _model_scores()
    assert rows["full"]["eps_prompts_lost"] == 0 and rows["full"]["eps_prompts_scored"] == 165
    # complete needs an ok image for every prompt of the suite: its 27 non-eligible ones have none
    assert rows["full"]["complete"] is False and rows["full"]["images_missing"] == 27
    assert rows["partial"]["complete"] is False
    assert rows["partial"]["eps_prompts_scored"] == 40
    assert rows["partial"]["eps_prompts_lost"] == 125
    assert rows["partial"]["images_quarantined"] == 1
    for m in rows:
        assert rows[m]["eps"] == pytest.approx(_expected_eps(m), abs=1e-9)
        assert rows[m]["eps_prompts_eligible"] == 165

    # The catalog is a plain DuckDB file an analyst opens without imagebench.
    con = duckdb.connect(str(settings.catalog_path), read_only=True)
    lb = con.execute("SELECT model_id, eps, complete FROM leaderboard").fetchall()
    assert {r[0] for r in lb} == {"base-a", "base-b", "full", "partial"}
    assert con.execute("SELECT count(*) FROM prompts").fetchall()[0][0] == 192
    assert con.execute("SELECT count(*) FROM quarantine WHERE model_id='partial'").fetchall()[0][0] == 1
    con.close()

    # A second nightly recomputes nothing.
    hps_file = settings.lake_dir / "hps_scores" / "model_id=full" / "data.parquet"
    before = hps_file.stat().st_mtime_ns
    again = nightly_flow()
    assert again["scored"] == []
    assert hps_file.stat().st_mtime_ns == before

    # Adding a model never changes another model's EPS.
    eps_before = {m: r["eps"] for m, r in _model_scores().items()}
    put_model(objects, "newcomer", eligible[:30], seed=5)
    third = nightly_flow()
    assert third["scored"] == ["newcomer"]
    after = _model_scores()
    for m, e in eps_before.items():
        assert after[m]["eps"] == e

    # New images of a known model are scored incrementally: only they go through HPSv3.
    partial_before = {r["prompt_id"]: r for r in Lake_read(settings, "hps_scores", "partial")}
    put_model_extra = eligible[41:44]
    from tests.flows.conftest import image_bytes

    for i, pid in enumerate(put_model_extra):
        (objects / "models" / "partial" / f"{pid}.png").write_bytes(image_bytes(777_000 + i))
    fourth = nightly_flow()
    assert fourth["scored"] == ["partial"]
    after_partial = {r["prompt_id"]: r for r in Lake_read(settings, "hps_scores", "partial")}
    assert set(after_partial) == set(partial_before) | set(put_model_extra)
    assert all(after_partial[p]["scored_at"] == partial_before[p]["scored_at"] for p in partial_before)

    # A changed image re-scores that model whole: every row of its scorer is replaced at once.
    last_scored = max(r["scored_at"] for r in Lake_read(settings, "hps_scores", "full"))
    (objects / "models" / "full" / f"{eligible[0]}.png").write_bytes(image_bytes(999_999))
    fifth = nightly_flow()
    assert fifth["scored"] == ["full"]
    t = Lake_read(settings, "hps_scores", "full")
    assert len(t) == 165 and all(r["scored_at"] > last_scored for r in t)

    # Every run left a record: what it discovered and did, and how long each stage took.
    from tasks.lake.tables import Lake

    runs = sorted(Lake(settings.lake_dir).read_runs().to_pylist(), key=lambda r: r["started_at"])
    nightly_runs = [r for r in runs if r["flow"] == "nightly"]
    assert [r["status"] for r in nightly_runs] == ["completed"] * 5
    assert nightly_runs[0]["models_new"] == ["full", "partial"] and nightly_runs[0]["ingest_s"] > 0
    assert nightly_runs[1]["models_up_to_date"] == ["base-a", "base-b", "full", "partial"]
    assert nightly_runs[1]["hps_images_scored"] == 0
    assert nightly_runs[3]["models_incremental"] == ["partial"] and nightly_runs[3]["hps_images_scored"] == 3
    assert nightly_runs[4]["models_replaced"] == ["full"] and nightly_runs[4]["hps_images_scored"] == 165


def Lake_read(settings, table, model_id):
    from tasks.lake.tables import Lake

    return Lake(settings.lake_dir).read(table, [model_id]).to_pylist()


def test_reference_is_never_rewritten_and_tampering_is_refused(built_reference):
    from flows.pipeline import reference_build_flow, score_model_flow
    from schemas.settings import load_settings
    from tasks.scores.reference import ReferenceExists, ReferenceTampered

    home, objects, ref_path = built_reference
    before = open(ref_path, "rb").read()
    with pytest.raises(ReferenceExists):
        reference_build_flow("t1", ["base-b"])
    assert open(ref_path, "rb").read() == before

    # Edit one mu_ref by hand: every scoring run refuses, and the lake is untouched.
    settings = load_settings()
    lake_files = sorted(p for p in settings.lake_dir.rglob("*.parquet"))
    snapshot = {p: p.read_bytes() for p in lake_files}
    import os
    import stat

    os.chmod(ref_path, stat.S_IWUSR | stat.S_IRUSR)
    text = before.decode().replace('"mu_ref": ', '"mu_ref": 1', 1)
    open(ref_path, "w").write(text)
    put_model(objects, "victim", _eligible()[:5], seed=7)
    with pytest.raises(ReferenceTampered):
        score_model_flow("victim")
    assert {p: p.read_bytes() for p in lake_files} == snapshot
    assert not (settings.lake_dir / "images" / "model_id=victim").exists()


def test_reference_build_ends_with_the_eps_of_every_model_already_scored(built_reference):
    """Issue 8 item 8: no model scored by the reference's scorer is left without EPS."""
    from flows.pipeline import reference_build_flow
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake

    lake = Lake(load_settings().lake_dir)
    built = {r["model_id"]: r for r in lake.read("model_scores").to_pylist() if r["reference_version"] == "t1"}
    assert set(built) == {"base-a", "base-b"}  # the fixture's build, from base-a and base-b
    # A second reference from base-b alone: base-a (already scored, not in the field) gets EPS
    # too, after the baseline; nothing is scored again.
    hps_before = lake.read("hps_scores").num_rows
    reference_build_flow("t2", ["base-b"])
    assert lake.read("hps_scores").num_rows == hps_before
    rows = {r["model_id"]: r for r in lake.read("model_scores").to_pylist() if r["reference_version"] == "t2"}
    assert set(rows) == {"base-a", "base-b"}
    assert rows["base-b"]["eps"] == pytest.approx(50.0)  # its own mu is the reference: sigmoid(0) everywhere
    assert rows["base-b"]["scored_at"] <= rows["base-a"]["scored_at"]


def test_scorer_identity_mismatch_is_refused(built_reference, monkeypatch, other_tiny_checkpoint):
    from flows.pipeline import score_model_flow
    from tasks.runs import pinned
    from tasks.scores.reference import ScorerMismatch

    home, objects, _ = built_reference
    put_model(objects, "other", _eligible()[:5], seed=8)
    monkeypatch.setenv("IMAGEBENCH_HPSV3_CHECKPOINT", str(other_tiny_checkpoint))
    pinned.scorer_identity.cache_clear()
    with pytest.raises(ScorerMismatch):
        score_model_flow("other")


def test_score_model_matches_direct_scorer(built_reference):
    """The flow's mu equals the scorer's mu on the same files (nothing lost in between)."""
    from flows.pipeline import score_model_flow
    from schemas.settings import load_settings
    from tasks.runs import pinned
    from tasks.lake.tables import Lake

    home, objects, _ = built_reference
    ids = _eligible()[:6]
    put_model(objects, "direct", ids, seed=9)
    row = score_model_flow("direct")
    assert row["eps_prompts_scored"] == 6 and row["complete"] is False
    s = load_settings()
    lake = Lake(s.lake_dir)
    images = {r["prompt_id"]: r for r in lake.read("images", ["direct"]).to_pylist() if r["state"] == "ok"}
    scores = {r["prompt_id"]: r["mu"] for r in lake.read("hps_scores", ["direct"]).to_pylist()}
    from tasks.scores.suite import load_suite

    suite = load_suite(s.suite_path)
    scorer = pinned.get_scorer(pinned.ScorerSpec.from_settings(s))
    direct = scorer.score(
        [str(s.home / images[p]["image_path"]) for p in ids], [suite.by_id[p].prompt for p in ids], batch_size=3
    )
    np.testing.assert_allclose([scores[p] for p in ids], direct[:, 0], rtol=0, atol=1e-5)
    assert set(PROMPT_IDS) >= set(scores)


def test_score_model_from_s3_store(built_reference, s3_bucket, s3_env, monkeypatch):
    """`score` reads a model straight from a real S3 server over HTTP (SeaweedFS on loopback)."""
    from flows.pipeline import score_model_flow
    from tasks.store.storage import open_store
    from tests.flows.conftest import image_bytes

    store = open_store(f"s3://{s3_bucket}/bench", endpoint=s3_env.endpoint_url)
    ids = _eligible()[:8]
    for i, pid in enumerate(ids):
        store.write(f"models/s3-model/{pid}.png", image_bytes(50_000 + i))
    store.write("models/s3-model/not-a-prompt.png", image_bytes(1))
    monkeypatch.setenv("IMAGEBENCH_STORE", f"s3://{s3_bucket}/bench")
    row = score_model_flow("s3-model")
    assert row["eps_prompts_scored"] == 8
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake

    lake = Lake(load_settings().lake_dir)
    q = lake.read("quarantine", ["s3-model"]).to_pylist()
    assert [r["reason"] for r in q] == ["unknown_prompt"]
    uris = [r["object_uri"] for r in lake.read("images", ["s3-model"]).to_pylist() if r["state"] == "ok"]
    assert all(u.startswith(f"s3://{s3_bucket}/bench/models/s3-model/") for u in uris) and len(uris) == 8


def test_nightly_deployment_has_an_explicit_cron_schedule(monkeypatch):
    from flows.deployments import build_deployments

    monkeypatch.setenv("IMAGEBENCH_NIGHTLY_CRON", "30 3 * * *")
    monkeypatch.setenv("IMAGEBENCH_NIGHTLY_TZ", "Europe/Paris")
    deployments = {d.name: d for d in build_deployments()}
    assert set(deployments) == {"nightly", "backfill"}
    (schedule,) = deployments["nightly"].schedules
    assert schedule.schedule.cron == "30 3 * * *"
    assert schedule.schedule.timezone == "Europe/Paris"
    assert not deployments["backfill"].schedules
