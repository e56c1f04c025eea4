"""The lake tables of a study, partitioned by study: ``<lake>/<table>/study_id=<id>/data.parquet``.

Same write rule as the model tables (tasks/lake/tables.py): the whole partition is replaced atomically
(temp file, fsync, ``os.replace``), under a per-partition lock, and the catalog's views glob
``<table>/*/data.parquet``, so a study's rows appear beside the ImageBench tables without a
refresh. No torch, Prefect or GX here: `study leaderboard` and `sql` read through DuckDB.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from schemas.study import STUDY_ID_RE, STUDY_TABLES
from tasks.store import lockfile
from tasks.lake.tables import DATA_FILE, Lake, LakeSchemaError, _atomic_write_parquet, conform

STUDY_PARTITION_PREFIX = "study_id="


def _check(table: str, study_id: str) -> None:
    if table not in STUDY_TABLES:
        raise ValueError(f"unknown study table {table!r}; tables: {sorted(STUDY_TABLES)}")
    if not STUDY_ID_RE.fullmatch(study_id):
        raise ValueError(f"study id {study_id!r} must match {STUDY_ID_RE.pattern}")


def partition_path(lake: Lake, table: str, study_id: str) -> Path:
    _check(table, study_id)
    return lake.root / table / f"{STUDY_PARTITION_PREFIX}{study_id}" / DATA_FILE


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with lockfile.lake_lock(path.parent / ".lock", f"the lock of lake partition {path.parent.parent.name}/{path.parent.name}"):
        yield


def write_study_partition(lake: Lake, table: str, study_id: str, data: Any) -> Path:
    """Replace the study's partition of ``table`` with ``data`` (conformed to the table's schema;
    every row must carry this study id)."""
    path = partition_path(lake, table, study_id)
    conformed = conform(table, data)
    bad = conformed.filter(pc.not_equal(conformed.column("study_id"), study_id))
    if bad.num_rows:
        raise LakeSchemaError(f"table {table!r}: partition of study {study_id!r} got {bad.num_rows} row(s) of another study")
    lake.ensure_schema_file(table)
    with _locked(path):
        for stale in path.parent.glob(f".{path.name}.*.tmp"):  # a killed writer's temp file
            stale.unlink(missing_ok=True)
        _atomic_write_parquet(conformed, path)
    return path


def read_study_partition(lake: Lake, table: str, study_id: str) -> pa.Table:
    """The study's rows of ``table`` (an empty table with the schema when it has none)."""
    path = partition_path(lake, table, study_id)
    if not path.is_file():
        return STUDY_TABLES[table].empty_table()
    return lake._read_file(table, path)


def studies_in_lake(lake: Lake, table: str = "study_index") -> list[str]:
    """Study ids that have a partition of ``table`` (sorted)."""
    tdir = lake.root / table
    if not tdir.is_dir():
        return []
    return sorted(
        e.name[len(STUDY_PARTITION_PREFIX):] for e in tdir.iterdir()
        if e.name.startswith(STUDY_PARTITION_PREFIX) and (e / DATA_FILE).is_file()
    )
