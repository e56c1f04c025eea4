"""Parquet lake + DuckDB catalog: atomic writes, schema checks, corruption, catalog, read-only."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tasks.lake.tables as lake_mod
from schemas.lake import HPS_SCORES, MODEL_SCORES, TABLES
from tasks.lake.tables import (
    Lake,
    LakeCorrupt,
    LakeSchemaError,
    QueryError,
    ReadOnlyViolation,
    connect_readonly,
    query,
    refresh_catalog,
    validate_model_id,
)
from tasks.scores.suite import parse_suite

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
SHA = "ab" * 32


def small_suite(version: str = "test-v1"):
    def p(pid, cat, sub, tag, elig):
        return {
            "prompt_id": pid, "category": cat, "subcategory": sub, "tag": tag, "difficulty": "easy",
            "prompt": f"a picture for {pid}", "question": f"Is {pid} shown?", "eps_eligible": elig,
        }
    rows = [
        p("tr-1", "Text Rendering", "Signs", "signs", False),
        p("sr-1", "Spatial Reasoning", "Counting", "counting", True),
        p("sr-2", "Spatial Reasoning", "Counting", "counting", True),
        p("hr-1", "Human Realism", "Hands", "hands", True),
    ]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    return parse_suite(data, version, check_shape=False)


def hps_rows(model: str, mus: dict[str, float], scorer_id: str = "0123456789abcdef") -> pa.Table:
    n = len(mus)
    return pa.table(
        {
            "model_id": [model] * n,
            "prompt_id": list(mus),
            "suite_version": ["test-v1"] * n,
            "image_sha256": [SHA] * n,
            "scorer_name": ["hpsv3"] * n,
            "scorer_id": [scorer_id] * n,
            "checkpoint_sha256": [SHA] * n,
            "mu": list(mus.values()),
            "sigma": [1.0] * n,
            "source": ["hpsv3"] * n,
            "uncalibrated": [False] * n,
            "scored_at": [T0] * n,
            "runtime": [None] * n,
        },
        schema=HPS_SCORES,
    )


def model_score(model: str, eps: float, *, ref="r1", scored_at=T0, run="run-1", lost=0) -> dict:
    return {
        "model_id": model, "suite_version": "test-v1", "reference_version": ref, "reference_sha256": SHA,
        "scorer_name": "hpsv3", "scorer_id": "0123456789abcdef", "eps": eps, "eps_prompts_scored": 3 - lost,
        "eps_prompts_eligible": 3, "eps_prompts_lost": lost, "images_ok": 4 - lost, "images_quarantined": lost,
        "images_missing": 0, "complete": lost == 0, "uncalibrated": False, "source_fingerprint": SHA,
        "run_id": run, "scored_at": scored_at,
        "eps_lo": eps - 1, "eps_hi": eps + 1, "capability": None, "capability_lo": None, "capability_hi": None,
        "verdicts_pass": 0, "verdicts_fail": lost, "verdicts_undecided": 4 - lost, "judge_coverage": lost / 4,
        "overall": None, "overall_lo": None, "overall_hi": None, "provisional": True,
    }


# ---------------------------------------------------------------------------------------------
# partitions
# ---------------------------------------------------------------------------------------------


def test_write_and_read_roundtrip(tmp_path):
    lake = Lake(tmp_path / "lake")
    path = lake.write_partition("hps_scores", "m1", hps_rows("m1", {"sr-1": 1.0, "sr-2": 2.0}))
    assert path == tmp_path / "lake/hps_scores/model_id=m1/data.parquet"
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == "ZSTD"
    assert "model_id" in pq.read_schema(path).names  # stored in the file, not only in the path
    lake.write_partition("hps_scores", "m2", hps_rows("m2", {"sr-1": 3.0}))
    assert lake.models("hps_scores") == ["m1", "m2"]
    got = lake.read("hps_scores")
    assert got.schema == HPS_SCORES and got.num_rows == 3
    assert lake.read("hps_scores", ["m2"]).column("mu").to_pylist() == [3.0]
    assert lake.read("hps_scores", ["nope"]).num_rows == 0


def test_empty_lake_reads_typed_empty_table(tmp_path):
    lake = Lake(tmp_path / "lake")
    for name, schema in TABLES.items():
        t = lake.read(name)
        assert t.num_rows == 0 and t.schema == schema
        assert lake.models(name) == []


def test_rewrite_replaces_partition_whole(tmp_path):
    lake = Lake(tmp_path)
    lake.write_partition("hps_scores", "m1", hps_rows("m1", {"sr-1": 1.0, "sr-2": 2.0}))
    lake.write_partition("hps_scores", "m1", hps_rows("m1", {"hr-1": 5.0}))
    assert lake.read("hps_scores").column("prompt_id").to_pylist() == ["hr-1"]


def test_crash_mid_write_keeps_previous_version(tmp_path, monkeypatch):
    lake = Lake(tmp_path)
    lake.write_partition("hps_scores", "m1", hps_rows("m1", {"sr-1": 1.0}))

    def crash(src, dst):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(lake_mod.os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        lake.write_partition("hps_scores", "m1", hps_rows("m1", {"sr-2": 9.0}))
    monkeypatch.undo()
    assert lake.read("hps_scores").column("mu").to_pylist() == [1.0]
    part = tmp_path / "hps_scores/model_id=m1"
    assert sorted(p.name for p in part.iterdir() if p.name != ".lock") == ["data.parquet"]  # temp removed


def test_leftover_temp_file_is_ignored_by_readers(tmp_path):
    """A hard crash (kill -9) can leave a temp file: no reader, nor the DuckDB views, picks it up."""
    lake = Lake(tmp_path / "lake")
    lake.write_partition("hps_scores", "m1", hps_rows("m1", {"sr-1": 1.0}))
    part = tmp_path / "lake/hps_scores/model_id=m1"
    pq.write_table(hps_rows("m1", {"sr-2": 666.0}), part / ".data.parquet.deadbeef.tmp")
    (part / "half-written.tmp").write_bytes(b"PAR1garbage")
    assert lake.read("hps_scores").column("mu").to_pylist() == [1.0]
    cat = refresh_catalog(tmp_path / "lake", tmp_path / "ib.duckdb", small_suite(), "r1")
    assert query(cat, "SELECT mu FROM hps_scores")[1] == [(1.0,)]


def test_replace_rows_upserts_on_keys(tmp_path):
    lake = Lake(tmp_path)
    lake.replace_rows("hps_scores", "m1", hps_rows("m1", {"sr-1": 1.0, "sr-2": 2.0}), ["prompt_id", "scorer_id"])
    other = hps_rows("m1", {"sr-1": 7.0}, scorer_id="fedcba9876543210")
    lake.replace_rows("hps_scores", "m1", other, ["prompt_id", "scorer_id"])
    lake.replace_rows("hps_scores", "m1", hps_rows("m1", {"sr-2": 20.0, "hr-1": 3.0}), ["prompt_id", "scorer_id"])
    got = sorted(zip(*(lake.read("hps_scores").column(c).to_pylist() for c in ("scorer_id", "prompt_id", "mu"))))
    assert got == [
        ("0123456789abcdef", "hr-1", 3.0),
        ("0123456789abcdef", "sr-1", 1.0),
        ("0123456789abcdef", "sr-2", 20.0),
        ("fedcba9876543210", "sr-1", 7.0),
    ]
    with pytest.raises(ValueError, match="unknown column"):
        lake.replace_rows("hps_scores", "m1", other, ["nope"])


def test_schema_mismatch_errors_name_table_and_column(tmp_path):
    lake = Lake(tmp_path)
    good = hps_rows("m1", {"sr-1": 1.0})
    with pytest.raises(LakeSchemaError, match=r"'hps_scores'.*missing \['sigma'\]"):
        lake.write_partition("hps_scores", "m1", good.drop_columns(["sigma"]))
    with pytest.raises(LakeSchemaError, match=r"unexpected \['extra'\]"):
        lake.write_partition("hps_scores", "m1", good.append_column("extra", pa.array([1])))
    bad_type = good.set_column(good.schema.get_field_index("mu"), "mu", pa.array(["high"]))
    with pytest.raises(LakeSchemaError, match=r"'hps_scores', column 'mu'"):
        lake.write_partition("hps_scores", "m1", bad_type)
    nulls = good.set_column(good.schema.get_field_index("scorer_id"), "scorer_id", pa.array([None], pa.string()))
    with pytest.raises(LakeSchemaError, match=r"column 'scorer_id'.*null"):
        lake.write_partition("hps_scores", "m1", nulls)
    with pytest.raises(LakeSchemaError, match=r"column 'model_id'.*other model"):
        lake.write_partition("hps_scores", "m2", good)
    with pytest.raises(ValueError, match="unknown lake table"):
        lake.write_partition("nope", "m1", good)
    assert lake.models("hps_scores") == []  # nothing was written


def test_compatible_types_are_cast_and_polars_accepted(tmp_path):
    lake = Lake(tmp_path)
    df = pl.from_arrow(hps_rows("m1", {"sr-1": 1.0}))  # large_string columns
    lake.write_partition("hps_scores", "m1", df)
    assert pq.read_schema(tmp_path / "hps_scores/model_id=m1/data.parquet").field("model_id").type == pa.string()


@pytest.mark.parametrize("bad", ["m1\n", "", "../x", "a/b", "..", "a..b", ".hidden", "x" * 129, "model_id=x"])
def test_model_ids_validated(tmp_path, bad):
    with pytest.raises(ValueError, match="invalid model id"):
        validate_model_id(bad)
    with pytest.raises(ValueError, match="invalid model id"):
        Lake(tmp_path).write_partition("hps_scores", bad, hps_rows("m1", {}))


def test_corrupt_parquet_is_reported_not_dropped(tmp_path):
    lake = Lake(tmp_path / "lake")
    lake.write_partition("hps_scores", "m1", hps_rows("m1", {"sr-1": 1.0}))
    path = lake.write_partition("hps_scores", "m2", hps_rows("m2", {"sr-1": 2.0}))
    path.write_bytes(path.read_bytes()[:40])  # truncated
    with pytest.raises(LakeCorrupt, match="model_id=m2/data.parquet"):
        lake.read("hps_scores")
    assert lake.read("hps_scores", ["m1"]).num_rows == 1
    with pytest.raises(LakeCorrupt, match="model_id=m2"):
        lake.replace_rows("hps_scores", "m2", hps_rows("m2", {"sr-2": 1.0}), ["prompt_id"])
    with pytest.raises(LakeCorrupt, match="model_id=m2"):
        refresh_catalog(tmp_path / "lake", tmp_path / "ib.duckdb", small_suite(), "r1")


def test_misplaced_file_is_corrupt(tmp_path):
    lake = Lake(tmp_path)
    src = lake.write_partition("hps_scores", "m1", hps_rows("m1", {"sr-1": 1.0}))
    dst = tmp_path / "hps_scores/model_id=m2/data.parquet"
    dst.parent.mkdir()
    dst.write_bytes(src.read_bytes())
    with pytest.raises(LakeCorrupt, match="another model"):
        lake.read("hps_scores")


# ---------------------------------------------------------------------------------------------
# catalog
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def catalog(tmp_path):
    lake = Lake(tmp_path / "lake")
    lake.write_partition("hps_scores", "m1", hps_rows("m1", {"sr-1": 1.0, "sr-2": 2.0, "hr-1": 3.0}))
    lake.write_partition("hps_scores", "m2", hps_rows("m2", {"sr-1": 2.0, "hr-1": 1.0}))
    ms = pa.Table.from_pylist
    lake.write_partition("model_scores", "m1", ms([
        model_score("m1", 40.0, scored_at=T0, run="old"),
        model_score("m1", 60.0, scored_at=T0 + timedelta(days=1), run="new"),
        model_score("m1", 99.0, ref="other-ref", scored_at=T0 + timedelta(days=2), run="x"),
    ], schema=MODEL_SCORES))
    lake.write_partition("model_scores", "m2", ms([model_score("m2", 55.0, lost=1)], schema=MODEL_SCORES))
    return refresh_catalog(tmp_path / "lake", tmp_path / "home/imagebench.duckdb", small_suite(), "r1")


def test_catalog_views_from_fresh_duckdb_connection(catalog):
    con = duckdb.connect(str(catalog), read_only=True)  # what an analyst does
    try:
        names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        assert {"images", "quarantine", "hps_scores", "model_scores", "prompts", "leaderboard", "catalog_info"} <= names
        assert con.execute("SELECT count(*) FROM hps_scores").fetchall() == [(5,)]
        assert con.execute("SELECT count(*) FROM prompts WHERE eps_eligible").fetchall() == [(3,)]
        rows = con.execute(
            "SELECT p.category, avg(h.mu) FROM hps_scores h JOIN prompts p USING (prompt_id) GROUP BY 1 ORDER BY 1"
        ).fetchall()
        assert rows == [("Human Realism", 2.0), ("Spatial Reasoning", 5.0 / 3)]
        cols = [d[0] for d in con.execute("SELECT * FROM hps_scores LIMIT 0").description]
        assert cols == HPS_SCORES.names
    finally:
        con.close()


def test_leaderboard_latest_row_per_model_for_this_reference(catalog):
    cols, rows = query(catalog, "SELECT * FROM leaderboard")
    for c in ("model_id", "eps", "eps_prompts_scored", "eps_prompts_eligible", "eps_prompts_lost", "complete",
              "uncalibrated", "scorer_name", "reference_version", "scored_at"):
        assert c in cols
    got = [(r[cols.index("rank")], r[cols.index("model_id")], r[cols.index("eps")], r[cols.index("complete")]) for r in rows]
    assert got == [(1, "m1", 60.0, True), (2, "m2", 55.0, False)]


def test_leaderboard_rank_bands_follow_interval_overlap(tmp_path):
    """Arena-style bands: rank = 1 + models whose lower bound is above this upper bound."""
    lake = Lake(tmp_path / "lake")
    rows = {"a": (70.0, 65.0, 75.0), "b": (66.0, 61.0, 71.0), "c": (40.0, 38.0, 42.0)}
    for m, (e, lo, hi) in rows.items():
        r = model_score(m, e)
        r.update(eps_lo=lo, eps_hi=hi)
        lake.write_partition("model_scores", m, pa.Table.from_pylist([r], schema=MODEL_SCORES))
    cat = refresh_catalog(tmp_path / "lake", tmp_path / "ib.duckdb", small_suite("test-v1"), "r1")
    _, got = query(cat, "SELECT model_id, rank, rank_worst FROM leaderboard")
    assert got == [("a", 1, 2), ("b", 1, 2), ("c", 3, 3)]


def test_empty_lake_catalog_views_work_and_pick_up_new_partitions(tmp_path):
    cat = refresh_catalog(tmp_path / "lake", tmp_path / "ib.duckdb", small_suite(), "r1")
    for table, schema in TABLES.items():
        cols, rows = query(cat, f"SELECT * FROM {table}")
        assert cols == schema.names and rows == []
    assert query(cat, "SELECT * FROM leaderboard")[1] == []
    # a partition written after the refresh shows up without rebuilding the catalog
    Lake(tmp_path / "lake").write_partition("hps_scores", "m1", hps_rows("m1", {"sr-1": 4.0}))
    assert query(cat, "SELECT model_id, mu FROM hps_scores")[1] == [("m1", 4.0)]


def test_refresh_is_atomic(tmp_path, monkeypatch):
    cat = refresh_catalog(tmp_path / "lake", tmp_path / "ib.duckdb", small_suite("test-v1"), "r1")
    before = cat.read_bytes()

    def crash(src, dst):
        raise OSError("simulated crash")

    monkeypatch.setattr(lake_mod.os, "replace", crash)
    with pytest.raises(OSError):
        refresh_catalog(tmp_path / "lake", cat, small_suite("test-v2"), "r2")
    monkeypatch.undo()
    assert cat.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ib.duckdb", "lake"]  # no temp left
    assert query(cat, "SELECT suite_version, reference_version FROM catalog_info")[1] == [("test-v1", "r1")]
    refresh_catalog(tmp_path / "lake", cat, small_suite("test-v2"), "r2")
    assert query(cat, "SELECT suite_version, reference_version FROM catalog_info")[1] == [("test-v2", "r2")]


def test_readonly_connection_blocks_writes(catalog, tmp_path):
    outside = tmp_path / "stolen.csv"
    inside = tmp_path / "lake" / "hps_scores" / "x.csv"
    con = connect_readonly(catalog)
    try:
        assert con.execute("SELECT count(*) FROM leaderboard").fetchall() == [(2,)]
        assert con.execute("DESCRIBE hps_scores").fetchall()
        blocked = {
            f"COPY hps_scores TO '{outside}'": "COPY",
            f"COPY (SELECT 1) TO '{inside}'": "COPY",
            "CREATE TABLE t AS SELECT 1": "CREATE",
            "INSERT INTO prompts SELECT * FROM prompts": "INSERT",
            f"ATTACH '{tmp_path / 'other.duckdb'}' AS o": "ATTACH",
            "INSTALL httpfs": "not allowed",
            "LOAD httpfs": "not allowed",
            "SET enable_external_access = true": "SET",
            f"EXPORT DATABASE '{tmp_path / 'exp'}'": "EXPORT",
            "SELECT 1; DROP VIEW leaderboard": "DROP",
        }
        for sql, word in blocked.items():
            with pytest.raises(ReadOnlyViolation, match=f"read-only catalog.*{word}"):
                con.execute(sql)
        # engine-level guard: no file outside the lake can be read, config is locked
        with pytest.raises(duckdb.PermissionException):
            con.execute("SELECT * FROM read_csv('/etc/hostname')").fetchall()
        with pytest.raises(duckdb.Error):
            con._con.execute("SET enable_external_access = true")
        with pytest.raises(duckdb.Error):
            con._con.execute(f"ATTACH '{tmp_path / 'other.duckdb'}' AS o")
        with pytest.raises(duckdb.Error):
            con._con.execute("CREATE TABLE t AS SELECT 1")
        with pytest.raises(duckdb.Error):
            con._con.execute(f"COPY (SELECT 1) TO '{outside}'")
    finally:
        con.close()
    assert not outside.exists() and not inside.exists() and not (tmp_path / "other.duckdb").exists()


def test_query_helper(catalog):
    cols, rows = query(catalog, "SELECT model_id, count(*) AS n FROM hps_scores GROUP BY 1 ORDER BY 1")
    assert cols == ["model_id", "n"] and rows == [("m1", 3), ("m2", 2)]
    with pytest.raises(ReadOnlyViolation):
        query(catalog, "DELETE FROM prompts")
    with pytest.raises(QueryError, match="no_such_table"):
        query(catalog, "SELECT * FROM no_such_table")
    with pytest.raises(QueryError, match="Parser"):
        query(catalog, "SELEC 1")
    with pytest.raises(FileNotFoundError, match="no catalog"):
        query(catalog.parent / "missing.duckdb", "SELECT 1")


def test_import_is_light():
    import subprocess
    import sys

    code = "import sys, tasks.lake.tables; print(sorted(m for m in ('torch', 'prefect', 'great_expectations') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2], env={**os.environ})
    assert out.stdout.strip() == "[]"
