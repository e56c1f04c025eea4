"""Whole-table questions answered from one column of each per-model file, on threads.

``reference build`` asks which models a scorer has scored: reading every ``hps_scores`` partition
whole, one after the other, cost seconds per thousand models. One column, on threads (Parquet
decoding releases the GIL), gives the same answer; an unreadable file raises
:class:`~tasks.lake.tables.LakeCorrupt` naming it, as every lake read does.

Importing this module must stay cheap (no torch, prefect or great_expectations).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

_THREADS = 8


def models_with(lake_dir, table: str, column: str, value: object) -> list[str]:
    """Models (sorted) whose partition of ``table`` has at least one row with ``column == value``."""
    from tasks.lake.tables import Lake, LakeCorrupt

    lake = Lake(lake_dir)
    models = lake.models(table)

    def has(model_id: str) -> bool:
        path = lake.partition_path(table, model_id)
        try:
            col = pq.read_table(path, columns=[column]).column(column)
        except FileNotFoundError:
            return False  # moved aside meanwhile
        except (pa.ArrowException, OSError, KeyError) as exc:
            raise LakeCorrupt(f"{path}: corrupt or unreadable Parquet file: {exc}") from exc
        return bool(pc.any(pc.equal(col, value)).as_py())

    with ThreadPoolExecutor(_THREADS, thread_name_prefix="lake-scan") as pool:
        found = list(pool.map(has, models))
    return [m for m, yes in zip(models, found) if yes]
