"""The VAB lake tables, partitioned by set collection: ``<lake>/<table>/sets=<S>/data.parquet``.

Same write rule as the other lake tables (tasks/lake/tables.py): a partition is replaced whole and
atomically under a per-partition lock; the catalog views (``vab_tasks``, ``vab_trials``) glob
``<table>/*/data.parquet``. Light: pyarrow only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from schemas.vab import SET_NAME_RE, VAB_TABLES, check_judge_name
from tasks.store import lockfile
from tasks.lake.tables import DATA_FILE, Lake, LakeSchemaError, _atomic_write_parquet, conform

SETS_PARTITION_PREFIX = "sets="


def check_set_name(name: str) -> str:
    if not isinstance(name, str) or not SET_NAME_RE.fullmatch(name):
        raise ValueError(f"set collection name {name!r} must match {SET_NAME_RE.pattern}")
    return name


def partition_path(lake: Lake, table: str, sets: str) -> Path:
    if table not in VAB_TABLES:
        raise ValueError(f"unknown VAB table {table!r}; tables: {sorted(VAB_TABLES)}")
    return lake.root / table / f"{SETS_PARTITION_PREFIX}{check_set_name(sets)}" / DATA_FILE


@contextlib.contextmanager
def locked(lake: Lake, table: str, sets: str) -> Iterator[Path]:
    """Exclusive lock on the partition (threads and processes): for read-modify-write."""
    path = partition_path(lake, table, sets)
    path.parent.mkdir(parents=True, exist_ok=True)
    with lockfile.lake_lock(path.parent / ".lock", f"the lock of lake partition {table}/{path.parent.name}"):
        yield path


def _write_locked(lake: Lake, table: str, sets: str, path: Path, data: Any) -> Path:
    conformed = conform(table, data)
    bad = conformed.filter(pc.not_equal(conformed.column("sets"), sets))
    if bad.num_rows:
        raise LakeSchemaError(f"table {table!r}: partition of set collection {sets!r} got {bad.num_rows} row(s) of another")
    lake.ensure_schema_file(table)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # a killed writer's temp file
        stale.unlink(missing_ok=True)
    _atomic_write_parquet(conformed, path)
    return path


def write_partition(lake: Lake, table: str, sets: str, data: Any) -> Path:
    """Replace the collection's partition of ``table`` with ``data`` (whole, atomically)."""
    with locked(lake, table, sets) as path:
        return _write_locked(lake, table, sets, path, data)


def read_partition(lake: Lake, table: str, sets: str) -> pa.Table:
    """The collection's rows of ``table`` (an empty table with the schema when it has none)."""
    path = partition_path(lake, table, sets)
    if not path.is_file():
        return VAB_TABLES[table].empty_table()
    return lake._read_file(table, path)


def replace_judge_trials(lake: Lake, sets: str, judge: str, data: Any) -> Path:
    """Replace ``judge``'s rows of ``vab_trials`` in the collection (other judges' rows kept):
    a re-import or re-run of one judge never touches another's answers. Every writer of judge rows
    (runs, imports, experts) comes through here: the one judge-name rule is checked here."""
    check_judge_name(judge)
    new = conform("vab_trials", data)
    if new.num_rows and set(new.column("judge").to_pylist()) != {judge}:
        raise LakeSchemaError(f"vab_trials: rows of judge {judge!r} expected, got {sorted(set(new.column('judge').to_pylist()))}")
    with locked(lake, "vab_trials", sets) as path:
        old = read_partition(lake, "vab_trials", sets)
        kept = old.filter(pc.not_equal(old.column("judge"), judge)) if old.num_rows else old
        return _write_locked(lake, "vab_trials", sets, path, pa.concat_tables([kept, new]))


def remove_judge(lake: Lake, sets: str, judge: str) -> int:
    """Remove every row of ``judge`` from the collection's ``vab_trials`` (any name, also one made
    before the name rule); returns how many. LookupError naming the judges when it has none."""
    with locked(lake, "vab_trials", sets) as path:
        old = read_partition(lake, "vab_trials", sets)
        names = sorted(set(old.column("judge").to_pylist())) if old.num_rows else []
        if judge not in names:
            raise LookupError(f"judge {judge!r} has no answers in set collection {sets!r}; judges: {names or 'none'}")
        kept = old.filter(pc.not_equal(old.column("judge"), judge))
        _write_locked(lake, "vab_trials", sets, path, kept)
        return old.num_rows - kept.num_rows


def collections_in_lake(lake: Lake, table: str = "vab_tasks") -> list[str]:
    """Set collection names with a partition of ``table`` (sorted)."""
    tdir = lake.root / table
    if not tdir.is_dir():
        return []
    return sorted(e.name[len(SETS_PARTITION_PREFIX):] for e in tdir.iterdir()
                  if e.name.startswith(SETS_PARTITION_PREFIX) and (e / DATA_FILE).is_file())


def read_csv_with_header(file: Path, columns: tuple[str, ...]):
    """Rows of a CSV file whose header must be exactly ``columns`` (a BOM is allowed); an
    unreadable file or another header is a ValueError naming the file."""
    import csv

    file = Path(file)
    try:
        text = file.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file}: cannot read: {exc}") from None
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    if header != list(columns):
        raise ValueError(f"{file}: the header must be {','.join(columns)}, got {','.join(header) or '(empty file)'}")
    return reader

