"""The catalog's compacted copy of the per-model tables (tasks/lake/compact.py, docs/LAKE.md): fresh
writes show without a refresh, a refresh rewrites only the buckets of changed models, a write
racing a compaction is never lost, corrupt files are named and set aside, incremental = full."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from schemas.lake import MODEL_SCORES
from tasks.lake import compact
from tasks.lake.tables import Lake, LakeCorrupt, query, refresh_catalog
from tests.tasks.test_lake import hps_rows, model_score, small_suite


def _refresh(tmp_path: Path, full: bool = False) -> Path:
    return refresh_catalog(tmp_path / "lake", tmp_path / "ib.duckdb", small_suite(), "r1", full=full)


def _mus(cat: Path, model: str | None = None) -> dict[tuple[str, str], float]:
    con = duckdb.connect(str(cat), read_only=True)  # a plain client, as an analyst opens it
    try:
        rows = con.execute("SELECT model_id, prompt_id, mu FROM hps_scores").fetchall()
    finally:
        con.close()
    assert len(rows) == len({(m, p) for m, p, _ in rows}), "a row shows twice"
    return {(m, p): mu for m, p, mu in rows if model is None or m == model}


def _models(n: int) -> list[str]:
    return [f"m{i:02d}" for i in range(n)]


def _bucket_files(lake_dir: Path, table: str) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in (lake_dir / compact.COMPACT_DIR / table).glob("b*.parquet")}


def _listed(lake_dir: Path, table: str) -> set[str]:
    """The bucket files the current catalog reads."""
    state = compact.read_state(lake_dir)
    return {compact.bucket_file(lake_dir, table, int(b), g).name for b, g in state["tables"][table]["files"].items()}


def _fill(lake: Lake, models: list[str], mu: float = 1.0) -> None:
    for i, m in enumerate(models):
        lake.write_partition("hps_scores", m, hps_rows(m, {"sr-1": mu + i, "hr-1": -mu - i}))


def test_views_show_writes_after_the_refresh_and_hide_set_aside_models(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake, ["a", "b", "c"])
    cat = _refresh(tmp_path)
    assert _mus(cat, "a") == {("a", "sr-1"): 1.0, ("a", "hr-1"): -1.0}
    # rewritten, new and emptied after the refresh: the views show it at once
    lake.write_partition("hps_scores", "a", hps_rows("a", {"sr-2": 7.0}))
    lake.write_partition("hps_scores", "d", hps_rows("d", {"sr-1": 8.0}))
    lake.write_partition("hps_scores", "c", hps_rows("c", {}))
    assert _mus(cat) == {("a", "sr-2"): 7.0, ("b", "sr-1"): 2.0, ("b", "hr-1"): -2.0, ("d", "sr-1"): 8.0}
    # moved aside (corrupt): gone from the views, and its fresh entry is a tombstone, not a link
    dest = lake.set_aside("hps_scores", "a", "test")
    assert ("a", "sr-2") not in _mus(cat)
    fresh = list((tmp_path / "lake" / compact.FRESH_DIR / "hps_scores").glob("gen-*/a.parquet"))
    assert fresh and all(f.stat().st_ino != dest.stat().st_ino for f in fresh)
    after = _mus(_refresh(tmp_path))
    assert after == {("b", "sr-1"): 2.0, ("b", "hr-1"): -2.0, ("d", "sr-1"): 8.0}
    # what plain readers of the per-model files see is unchanged: the truth has no extra files
    assert sorted(p.parent.name for p in (tmp_path / "lake/hps_scores").glob("*/data.parquet")) == [
        "_schema", "model_id=b", "model_id=c", "model_id=d"]


def test_refresh_rewrites_only_the_buckets_of_changed_models(tmp_path):
    lake = Lake(tmp_path / "lake")
    models = _models(40)
    _fill(lake, models)
    for m in models:
        lake.write_partition("model_scores", m, pa.Table.from_pylist([model_score(m, 50.0)], schema=MODEL_SCORES))
    cat = _refresh(tmp_path)
    before = _bucket_files(tmp_path / "lake", "hps_scores")
    assert len(before) > 20  # 40 models spread over many of the 256 buckets
    assert _bucket_files(tmp_path / "lake", "hps_scores") == before
    lake.write_partition("hps_scores", "m07", hps_rows("m07", {"sr-1": 70.0}))
    _refresh(tmp_path)
    after = _bucket_files(tmp_path / "lake", "hps_scores")
    changed = compact.bucket_of("m07")
    listed = _listed(tmp_path / "lake", "hps_scores")
    assert {n for n in listed if n not in before} == {f"b{changed:03d}-gen-000002.parquet"}
    assert all(after[n] == before[n] for n in listed if n in before)  # the others: the same files
    assert _mus(cat, "m07") == {("m07", "sr-1"): 70.0}
    # nothing changed: nothing rewritten (model_scores neither); the bucket file no catalog reads is gone
    ms_before = _listed(tmp_path / "lake", "model_scores")
    _refresh(tmp_path)
    assert _listed(tmp_path / "lake", "hps_scores") == listed
    assert _listed(tmp_path / "lake", "model_scores") == ms_before
    assert set(_bucket_files(tmp_path / "lake", "hps_scores")) == listed
    assert query(cat, "SELECT count(*) FROM leaderboard")[1] == [(40,)]


def test_writes_racing_a_compaction_are_not_lost(tmp_path, monkeypatch):
    lake = Lake(tmp_path / "lake")
    _fill(lake, ["a", "b", "c", "d"])
    _refresh(tmp_path)

    def writer(step: str, gen: int) -> None:
        if step == "opened":  # the new generation exists, the truth files are not scanned yet
            lake.write_partition("hps_scores", "a", hps_rows("a", {"sr-1": 10.0}))
        elif step == "built":  # buckets written, the catalog not swapped yet
            lake.write_partition("hps_scores", "b", hps_rows("b", {"sr-1": 20.0}))
            lake.write_partition("hps_scores", "e", hps_rows("e", {"sr-1": 30.0}))
            lake.set_aside("hps_scores", "c", "test")

    monkeypatch.setattr(compact, "_test_hook", writer)
    cat = _refresh(tmp_path)
    monkeypatch.setattr(compact, "_test_hook", None)
    expected = {("a", "sr-1"): 10.0, ("b", "sr-1"): 20.0, ("e", "sr-1"): 30.0, ("d", "sr-1"): 4.0, ("d", "hr-1"): -4.0}
    assert _mus(cat) == expected
    # a writer killed between its file and its link: the next refresh finds it by stat
    monkeypatch.setattr(compact, "publish", lambda *a, **k: None)
    lake.write_partition("hps_scores", "d", hps_rows("d", {"sr-2": 40.0}))
    monkeypatch.undo()
    assert _mus(cat)[("d", "sr-1")] == 4.0  # not published yet: the previous rows
    cat = _refresh(tmp_path)
    expected = {k: v for k, v in expected.items() if k[0] != "d"} | {("d", "sr-2"): 40.0}
    assert _mus(cat) == expected
    assert _mus(_refresh(tmp_path, full=True)) == expected


def test_corrupt_truth_file_is_named_and_the_previous_catalog_stays(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake, ["a", "b", "c"])
    cat = _refresh(tmp_path)
    path_b = lake.partition_path("hps_scores", "b")
    path_b.write_bytes(path_b.read_bytes()[:40])  # truncated in place, after it was compacted
    with pytest.raises(LakeCorrupt, match="hps_scores/model_id=b/data.parquet"):
        _refresh(tmp_path)
    assert _mus(cat, "b") == {("b", "sr-1"): 2.0, ("b", "hr-1"): -2.0}  # the previous catalog still answers
    # a file published after the refresh is read through its fresh link: damage shows at once
    lake.write_partition("hps_scores", "c", hps_rows("c", {"sr-1": 9.0}))
    path_c = lake.partition_path("hps_scores", "c")
    path_c.write_bytes(path_c.read_bytes()[:40])
    with pytest.raises(duckdb.Error, match="hps_scores/gen-000001/c.parquet"):
        _mus(cat)
    # the flows set them aside (docs/RELIABILITY.md): gone from the views, the next refresh succeeds
    found = sorted((t, m, p) for t, m, p, _ in lake.find_corrupt())
    assert found == [("hps_scores", "b", path_b), ("hps_scores", "c", path_c)]
    for table, model, _ in found:
        lake.set_aside(table, model, "truncated")
    assert _mus(cat) == {("a", "sr-1"): 1.0, ("a", "hr-1"): -1.0}
    assert _mus(_refresh(tmp_path)) == {("a", "sr-1"): 1.0, ("a", "hr-1"): -1.0}


def test_a_damaged_compacted_file_is_rebuilt_from_the_truth(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake, _models(6))
    cat = _refresh(tmp_path)
    want = _mus(cat)
    victim = sorted((tmp_path / "lake" / compact.COMPACT_DIR / "hps_scores").glob("b*.parquet"))[0]
    victim.write_bytes(b"garbage")
    assert _mus(_refresh(tmp_path)) == want


def test_incremental_refreshes_equal_a_full_rebuild_and_the_truth(tmp_path):
    lake = Lake(tmp_path / "lake")
    models = _models(30)
    _fill(lake, models)
    cat = _refresh(tmp_path)
    for round_ in range(3):
        for m in models[round_::7]:
            lake.write_partition("hps_scores", m, hps_rows(m, {"sr-1": 100.0 + round_, "sr-2": float(round_)}))
        lake.set_aside("hps_scores", models[round_ + 10], "gone")
        cat = _refresh(tmp_path)
    incremental = _mus(cat)
    truth = {(r["model_id"], r["prompt_id"]): r["mu"] for r in lake.read("hps_scores").to_pylist()}
    assert incremental == truth
    assert _mus(_refresh(tmp_path, full=True)) == truth
    # generations no catalog reads any more are removed (this one and the one before are kept)
    gens = {p.name for p in (tmp_path / "lake" / compact.FRESH_DIR / "hps_scores").iterdir()}
    assert len(gens) == 2
    assert _listed(tmp_path / "lake", "hps_scores") <= set(_bucket_files(tmp_path / "lake", "hps_scores"))
    assert not [p for p in (tmp_path / "lake").rglob("*.tmp")]
    assert sorted(os.listdir(tmp_path / "lake" / "hps_scores" / "model_id=m00")) == [".lock", "data.parquet"]
