"""Compare two lakes row by row: what "the same lake" means in the resume and scale-out tests.

Columns that record *when* or *which run* (timestamps, run ids, call latencies) are left out;
everything else (every row, every score, every hash) must be equal. Absolute paths of two
different workspaces are made relative to their workspace first.
"""

from __future__ import annotations

import math
from pathlib import Path

# Columns that legitimately differ between two runs producing the same results.
VOLATILE_COLUMNS = frozenset(
    {"ingested_at", "quarantined_at", "scored_at", "decided_at", "requested_at", "run_id", "latency_s",
     "started_at", "finished_at"}
)


def _normalise(value, roots: list[str]):
    if isinstance(value, str):
        for root in roots:
            value = value.replace(root, "<workspace>")
        return value
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def lake_snapshot(lake_dir: Path, workspace_roots: list[Path] = (), tables=None, models=None) -> dict[str, list[tuple]]:
    """Every model-partitioned table of the lake as a sorted list of row tuples (volatile columns dropped)."""
    from schemas.lake import TABLES
    from tasks.lake.tables import Lake

    lake = Lake(lake_dir)
    roots = sorted({str(Path(r).resolve()) for r in workspace_roots} | {str(Path(r)) for r in workspace_roots}, key=len, reverse=True)
    out = {}
    for table in tables or TABLES:
        data = lake.read(table, models)
        cols = [c for c in data.column_names if c not in VOLATILE_COLUMNS]
        rows = [tuple(_normalise(r[c], roots) for c in cols) for r in data.select(cols).to_pylist()]
        out[table] = sorted(rows, key=repr)
    return out


def assert_same_lake(a: Path, b: Path, roots_a: list[Path] = (), roots_b: list[Path] = (), tables=None, models=None) -> None:
    snap_a, snap_b = lake_snapshot(a, roots_a, tables, models), lake_snapshot(b, roots_b, tables, models)
    for table in snap_a:
        rows_a, rows_b = snap_a[table], snap_b[table]
        if rows_a != rows_b:
            only_a = [r for r in rows_a if r not in rows_b][:3]
            only_b = [r for r in rows_b if r not in rows_a][:3]
            raise AssertionError(
                f"table {table}: {len(rows_a)} vs {len(rows_b)} rows differ; only in first: {only_a}; only in second: {only_b}"
            )
