"""The results lake: one Parquet file per (table, model), and a DuckDB catalog of views over them.

Layout (see docs/LAKE.md)::

    <lake>/<table>/model_id=<id>/data.parquet     one model's rows (zstd); model_id also inside
    <lake>/<table>/_schema/data.parquet           zero rows, the table's schema: keeps views valid
    <lake>/_compact/  <lake>/_fresh/              derived copy the catalog views read (tasks/lake/compact.py)
    $IMAGEBENCH_HOME/imagebench.duckdb            views over the lake + prompts + leaderboard

Writes are whole-partition and atomic: a temp file in the partition directory (name not ending in
``.parquet``), fsync, ``os.replace``. A re-run replaces a model's partition whole; a crash leaves
the previous version readable. Readers only ever open ``data.parquet``.

Importing this module must stay cheap (the ``sql`` and ``leaderboard`` commands answer in ~1 s):
no torch, prefect or great_expectations here.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas.lake import REGISTRY_TABLES, RUN_TABLES, RUNS, TABLES
from schemas.study import STUDY_TABLES  # partitioned by study_id=<id> (tasks/beauty/tables.py)
from schemas.vab import VAB_TABLES  # partitioned by sets=<S> (tasks/vab/tables.py)
from tasks.store import lockfile, private
from tasks.store.durable import fsync_dir
from tasks.lake import compact
from tasks.lake.catalog_views import CAPABILITY_ITEMS_SQL, LEADERBOARD_COLUMNS, LEADERBOARD_EXPRESSIONS
from tasks.lake.layout import DATA_FILE, PARTITION_PREFIX
from tasks.store.storage import validate_model_id  # one rule for model ids: ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$, no '..'

if TYPE_CHECKING:
    from tasks.scores.suite import Suite

__all__ = [
    "CATALOG_FORMAT",
    "Lake",
    "LakeCorrupt",
    "LakeError",
    "LakeSchemaError",
    "ReadOnlyConnection",
    "QueryError",
    "ReadOnlyViolation",
    "connect_readonly",
    "query",
    "refresh_catalog",
    "validate_model_id",
]

SCHEMA_DIR = "_schema"  # <lake>/<table>/_schema/data.parquet: typed, zero rows
COMPRESSION = "zstd"
CATALOG_FORMAT = "imagebench-catalog/9"  # /2: model_events view; leaderboard honours retirements; /3: study tables; /4: vab tables and views; /5: compacted per-model tables; /6: vab_trials.prompt_type; /7: study_leaderboard with quality control; /8: vab_trials.response, vab_leaderboard NULL where no trial is behind a figure; /9: capability_items, leaderboard judged/decided/prompts/coverage (was judge_coverage)

PROMPTS_SCHEMA = pa.schema(
    [
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("category", pa.string(), nullable=False),
        pa.field("subcategory", pa.string(), nullable=False),
        pa.field("tag", pa.string(), nullable=False),
        pa.field("difficulty", pa.string(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("eps_eligible", pa.bool_(), nullable=False),
        pa.field("suite_version", pa.string(), nullable=False),
    ]
)


class LakeError(RuntimeError):
    """Base class of lake errors."""


class LakeSchemaError(LakeError, ValueError):
    """Data written to a table does not fit the table's schema (the message names the column)."""


class LakeCorrupt(LakeError):
    """A Parquet file of the lake cannot be read (the message names the file)."""


class ReadOnlyViolation(LakeError, PermissionError):
    """A statement other than a query was sent to a read-only catalog connection."""


class QueryError(LakeError):
    """DuckDB rejected a query (syntax, unknown table/column, permission): raised by :func:`query`
    with DuckDB's message, so callers need not know DuckDB's exception classes."""


def _schema_of(table: str) -> pa.Schema:
    try:
        for tables in (TABLES, RUN_TABLES, REGISTRY_TABLES, STUDY_TABLES, VAB_TABLES):
            if table in tables:
                return tables[table]
        raise KeyError(table)
    except KeyError:
        known = sorted(TABLES) + sorted(RUN_TABLES) + sorted(REGISTRY_TABLES) + sorted(STUDY_TABLES) + sorted(VAB_TABLES)
        raise ValueError(f"unknown lake table {table!r}; tables: {known}") from None


RUN_PARTITION_PREFIX = "run_id="
CORRUPT_DIR = "_corrupt"  # <lake>/_corrupt/<table>/model_id=<id>/<stamp>.parquet: moved aside, never deleted
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


_SCHEMA_CHECKED: dict[Path, compact.Stat] = {}  # schema file -> its stat when this process found it right


def _atomic_write_parquet(table: pa.Table, final: Path) -> None:
    """Temp file in the same directory (never named *.parquet), fsync, os.replace, fsync dir."""
    final.parent.mkdir(parents=True, exist_ok=True)
    compact.write_parquet_file(table, final)
    fsync_dir(final.parent)


def conform(table: str, data: Any) -> pa.Table:
    """Cast ``data`` (pyarrow Table, or anything with ``to_arrow()`` such as a polars DataFrame) to
    the schema of ``table``: same column names, castable types, no nulls in required columns.
    Raises :class:`LakeSchemaError` naming the table and the column."""
    schema = _schema_of(table)
    if not isinstance(data, pa.Table):
        if hasattr(data, "to_arrow"):
            data = data.to_arrow()
        else:
            raise TypeError(f"{table}: expected a pyarrow.Table, got {type(data).__name__}")
    names = data.column_names
    missing = [n for n in schema.names if n not in names]
    extra = [n for n in names if n not in schema.names]
    if missing or extra:
        raise LakeSchemaError(
            f"table {table!r}: columns do not match the schema: missing {missing}, unexpected {extra}"
        )
    arrays = []
    for field in schema:
        col = data.column(field.name)
        if col.type != field.type:
            try:
                col = col.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise LakeSchemaError(
                    f"table {table!r}, column {field.name!r}: cannot cast {col.type} to {field.type}: {exc}"
                ) from exc
        if not field.nullable and col.null_count:
            raise LakeSchemaError(
                f"table {table!r}, column {field.name!r}: {col.null_count} null value(s) in a required column"
            )
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=schema)


class Lake:
    """Parquet tables partitioned by model. One table is written by exactly one task."""

    def __init__(self, lake_dir: str | os.PathLike[str]) -> None:
        self.root = Path(lake_dir)

    # paths ---------------------------------------------------------------------------------
    def table_dir(self, table: str) -> Path:
        _schema_of(table)
        return self.root / table

    def partition_path(self, table: str, model_id: str) -> Path:
        validate_model_id(model_id)
        return self.table_dir(table) / f"{PARTITION_PREFIX}{model_id}" / DATA_FILE

    def schema_file(self, table: str) -> Path:
        return self.table_dir(table) / SCHEMA_DIR / DATA_FILE

    @contextlib.contextmanager
    def _locked(self, table: str, model_id: str) -> Iterator[None]:
        """Exclusive lock per partition (threads and processes on this machine): makes
        read-modify-write in :meth:`replace_rows` safe against concurrent writers."""
        part = self.partition_path(table, model_id).parent
        part.mkdir(parents=True, exist_ok=True)
        with lockfile.lake_lock(part / ".lock", f"the lock of lake partition {table}/{model_id}"):
            yield

    # writes --------------------------------------------------------------------------------
    def ensure_schema_file(self, table: str) -> Path:
        """Write ``<lake>/<table>/_schema/data.parquet`` (zero rows, the table's schema) when it is
        missing or stale, so catalog views always have a file to read."""
        path = self.schema_file(table)
        schema = _schema_of(table)
        stat = compact.stat_of(path)
        if stat is not None and _SCHEMA_CHECKED.get(path) == stat:
            return path  # this very file was checked by this process (every write asks: 1,000s per import)
        if stat is not None:
            try:
                if pq.read_schema(path).remove_metadata().equals(schema, check_metadata=False):
                    _SCHEMA_CHECKED[path] = stat
                    return path
            except (pa.ArrowException, OSError):
                pass  # unreadable: rewrite it, it holds no data
        _atomic_write_parquet(schema.empty_table(), path)
        return path

    def _write(self, table: str, model_id: str, data: pa.Table) -> Path:
        bad = data.filter(pc.not_equal(data.column("model_id"), model_id))
        if bad.num_rows:
            others = sorted(set(bad.column("model_id").to_pylist()))
            raise LakeSchemaError(
                f"table {table!r}, column 'model_id': partition {model_id!r} got {bad.num_rows} row(s) "
                f"of other model(s) {others[:5]}"
            )
        path = self.partition_path(table, model_id)
        self.ensure_schema_file(table)
        # Called under the partition lock: a temp file here is a writer's that was killed before
        # its rename (readers never see it); removed so killed runs do not fill the disk.
        for stale in path.parent.glob(f".{path.name}.*.tmp"):
            stale.unlink(missing_ok=True)
        _atomic_write_parquet(data, path)
        # Still under the partition lock, so links of two writes of one model cannot cross: the
        # catalog views (compacted copy + fresh files) show the new rows at once.
        compact.publish(self.root, table, model_id, path, data.num_rows)
        return path

    def write_partition(self, table: str, model_id: str, data: Any) -> Path:
        """Replace the model's partition of ``table`` with ``data`` (atomically, whole)."""
        validate_model_id(model_id)
        conformed = conform(table, data)
        with self._locked(table, model_id):
            return self._write(table, model_id, conformed)

    def replace_rows(self, table: str, model_id: str, new: Any, match_on: Sequence[str]) -> Path:
        """Upsert: drop the partition's rows whose ``match_on`` values equal those of any row of
        ``new`` (nulls compare equal), append ``new``, rewrite the partition atomically."""
        validate_model_id(model_id)
        schema = _schema_of(table)
        keys = list(match_on)
        if not keys:
            raise ValueError("match_on must name at least one column")
        unknown = [k for k in keys if k not in schema.names]
        if unknown:
            raise ValueError(f"table {table!r}: match_on names unknown column(s) {unknown}")
        conformed = conform(table, new)
        with self._locked(table, model_id):
            path = self.partition_path(table, model_id)
            if path.is_file():
                old = self._read_file(table, path)
                new_keys = set(zip(*(conformed.column(k).to_pylist() for k in keys)))
                old_keys = zip(*(old.column(k).to_pylist() for k in keys)) if old.num_rows else iter(())
                keep = pa.array([k not in new_keys for k in old_keys], type=pa.bool_())
                merged = pa.concat_tables([old.filter(keep), conformed]) if old.num_rows else conformed
            else:
                merged = conformed
            return self._write(table, model_id, merged)

    # reads ---------------------------------------------------------------------------------
    def _read_file(self, table: str, path: Path) -> pa.Table:
        try:
            got = pq.read_table(path)
        except (pa.ArrowException, OSError) as exc:
            raise LakeCorrupt(f"{path}: corrupt or unreadable Parquet file: {exc}") from exc
        return self._cast_to_schema(table, got, path)

    @staticmethod
    def _cast_to_schema(table: str, got: pa.Table, path: Path) -> pa.Table:
        schema = _schema_of(table)
        arrays = []
        for field in schema:
            if field.name in got.column_names:
                col = got.column(field.name)
                if col.type != field.type:
                    try:
                        col = col.cast(field.type)
                    except pa.ArrowException as exc:
                        raise LakeCorrupt(f"{path}: column {field.name!r} has type {col.type}, schema says {field.type}") from exc
            elif field.nullable:  # a column added to the schema after this file was written
                col = pa.nulls(got.num_rows, field.type)
            else:
                raise LakeCorrupt(f"{path}: required column {field.name!r} is missing")
            arrays.append(col)
        return pa.Table.from_arrays(arrays, schema=schema)

    def _read_model_file(self, table: str, model_id: str) -> pa.Table:
        """One model's partition (empty when it is gone, e.g. moved aside meanwhile); a corrupt
        file or one holding another model's rows raises :class:`LakeCorrupt` naming the file."""
        path = self.table_dir(table) / f"{PARTITION_PREFIX}{model_id}" / DATA_FILE
        if not path.is_file():
            return pa.Table.from_batches([], schema=_schema_of(table))
        part = self._read_file(table, path)
        if part.num_rows and pc.any(pc.not_equal(part.column("model_id"), model_id)).as_py():
            raise LakeCorrupt(f"{path}: holds rows of another model than {model_id!r}")
        return part

    def models(self, table: str) -> list[str]:
        """Model ids that have a partition in ``table`` (sorted)."""
        tdir = self.table_dir(table)
        if not tdir.is_dir():
            return []
        out = []
        for entry in tdir.iterdir():
            if entry.name.startswith(PARTITION_PREFIX) and (entry / DATA_FILE).is_file():
                out.append(entry.name[len(PARTITION_PREFIX):])
        return sorted(out)

    def read(self, table: str, model_ids: Sequence[str] | None = None) -> pa.Table:
        """Rows of ``table`` (all models, or only ``model_ids``), cast to the table's schema; an
        empty table with the schema when nothing is there. Corrupt files raise :class:`LakeCorrupt`."""
        schema = _schema_of(table)
        if model_ids is None:
            ids = self.models(table)
        else:
            ids = sorted({validate_model_id(m) for m in model_ids})
        parts = []
        for m in ids:
            path = self.partition_path(table, m)
            if not path.is_file():
                continue
            part = self._read_file(table, path)
            if part.num_rows and set(part.column("model_id").to_pylist()) != {m}:
                raise LakeCorrupt(f"{path}: holds rows of another model than {m!r}")
            parts.append(part)
        if not parts:
            return schema.empty_table()
        return pa.concat_tables(parts)

    # run records --------------------------------------------------------------------------
    def write_run(self, row: dict[str, Any]) -> Path:
        """Write one run record (``runs`` table), atomically, under ``run_id=<run_id>/``."""
        run_id = str(row.get("run_id", ""))
        if not _RUN_ID_RE.fullmatch(run_id) or ".." in run_id:
            raise ValueError(f"invalid run id {run_id!r}")
        data = conform("runs", pa.Table.from_pylist([row], schema=RUNS))
        self.ensure_schema_file("runs")
        path = self.table_dir("runs") / f"{RUN_PARTITION_PREFIX}{run_id}" / DATA_FILE
        _atomic_write_parquet(data, path)
        return path

    def read_run(self, run_id: str) -> dict[str, Any] | None:
        """One run's record as a dict, or None when it has none."""
        if not _RUN_ID_RE.fullmatch(str(run_id)) or ".." in str(run_id):
            raise ValueError(f"invalid run id {run_id!r}")
        path = self.table_dir("runs") / f"{RUN_PARTITION_PREFIX}{run_id}" / DATA_FILE
        if not path.is_file():
            return None
        rows = self._read_file("runs", path).to_pylist()
        return rows[0] if rows else None

    def read_runs(self) -> pa.Table:
        tdir = self.table_dir("runs")
        entries = sorted(tdir.iterdir()) if tdir.is_dir() else []
        parts = [
            self._read_file("runs", e / DATA_FILE)
            for e in entries
            if e.name.startswith(RUN_PARTITION_PREFIX) and (e / DATA_FILE).is_file()
        ]
        return pa.concat_tables(parts) if parts else RUNS.empty_table()

    # corruption ---------------------------------------------------------------------------
    def find_corrupt(self, model_ids: Sequence[str] | None = None, full: bool = False) -> list[tuple[str, str, Path, str]]:
        """Partition files that cannot be read: ``(table, model_id, path, error)`` for each.
        Footers only by default (cheap, every night); ``full`` decodes every row too."""
        bad = []
        for table in TABLES:
            for m in self.models(table) if model_ids is None else model_ids:
                path = self.partition_path(table, m)
                if not path.is_file():
                    continue
                try:
                    if full:
                        self._read_file(table, path)
                    else:
                        pq.read_metadata(path)
                except (LakeCorrupt, pa.ArrowException, OSError) as exc:
                    bad.append((table, m, path, str(exc)))
        return bad

    def set_aside(self, table: str, model_id: str, reason: str) -> Path:
        """Move a (corrupt) partition file out of the tables into ``<lake>/_corrupt/``, with a note
        saying why: readers and views no longer see it, and nothing is deleted."""
        src = self.partition_path(table, model_id)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        dest = self.root / CORRUPT_DIR / table / f"{PARTITION_PREFIX}{model_id}" / f"{stamp}.parquet"
        dest.parent.mkdir(parents=True, exist_ok=True)
        with self._locked(table, model_id):
            os.replace(src, dest)
            compact.publish(self.root, table, model_id, None, 0)  # its fresh links go: a tombstone hides its rows
        dest.with_suffix(".reason.txt").write_text(reason + "\n")
        private.settle(dest.with_suffix(".reason.txt"))
        fsync_dir(src.parent)
        return dest

    def check_files(self) -> int:
        """Read the footer of every partition file of every table: raises :class:`LakeCorrupt` on
        the first unreadable one. Returns the number of files checked."""
        n = 0
        for table in TABLES:
            for m in self.models(table):
                path = self.partition_path(table, m)
                try:
                    pq.read_metadata(path)
                except (pa.ArrowException, OSError) as exc:
                    raise LakeCorrupt(f"{path}: corrupt or unreadable Parquet file: {exc}") from exc
                n += 1
        return n


# ------------------------------------------------------------------------------------------
# DuckDB catalog
# ------------------------------------------------------------------------------------------


def _sql_str(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _table_view_sql(lake_root: Path, table: str) -> str:
    cols = ", ".join(_ident(n) for n in _schema_of(table).names)
    pattern = str(lake_root / table / "*" / DATA_FILE)
    return (
        f"CREATE VIEW {_ident(table)} AS SELECT {cols} FROM read_parquet({_sql_str(pattern)}, "
        "union_by_name = true, hive_partitioning = false)"
    )


# Models whose latest model_events row is a retirement (imagebench models retire): who, when, why.
RETIRED_MODELS_SQL = """
CREATE VIEW retired_models AS
SELECT model_id, reason, actor, "at" AS retired_at FROM model_events
QUALIFY row_number() OVER (PARTITION BY model_id ORDER BY "at" DESC, event DESC) = 1 AND event = 'retired'
"""


# VAB (docs/VAB.md): a task is strict right for a judge when all 3 trials (0, 1, 2) are "ok" and
# right; a missing or invalid trial is wrong. strict_worst is NULL for 2-image tasks, so its mean is
# over the tasks with a worst label. Same rules as tasks.vab.metrics (tests/vab/test_flow.py): our
# combined prompt (prompt_type best_worst, or NULL in older rows) answers all three; the official
# prompt types answer one each (both = pick_best_and_worst). A figure with no trial behind it (a
# prompt type the judge was never asked) is NULL, never 0 (issue 25 item 6).
VAB_VIEWS_SQL = (
    """
CREATE VIEW vab_task_results AS
SELECT k.sets, j.judge, k.task_id, k.domain, k.n_images,
    count(DISTINCT CASE WHEN r.state = 'ok' AND r.best = k.best
                             AND coalesce(r.prompt_type, 'best_worst') IN ('best_worst', 'pick_best') THEN r.trial END) = 3 AS strict_best,
    CASE WHEN k.worst IS NULL THEN NULL
         ELSE count(DISTINCT CASE WHEN r.state = 'ok' AND r.worst = k.worst
                                       AND coalesce(r.prompt_type, 'best_worst') IN ('best_worst', 'pick_worst') THEN r.trial END) = 3
    END AS strict_worst,
    count(DISTINCT CASE WHEN r.state = 'ok' AND r.best = k.best AND (k.worst IS NULL OR r.worst = k.worst)
                             AND coalesce(r.prompt_type, 'best_worst') IN ('best_worst', 'pick_best_and_worst')
                        THEN r.trial END) = 3 AS strict_both,
    count(r.trial) AS trials,
    count(r.trial) FILTER (WHERE coalesce(r.prompt_type, 'best_worst') IN ('best_worst', 'pick_best')) AS best_trials,
    count(r.trial) FILTER (WHERE coalesce(r.prompt_type, 'best_worst') IN ('best_worst', 'pick_worst')
                           AND k.worst IS NOT NULL) AS worst_trials,
    count(r.trial) FILTER (WHERE coalesce(r.prompt_type, 'best_worst') IN ('best_worst', 'pick_best_and_worst')) AS both_trials
FROM vab_tasks k
JOIN (SELECT DISTINCT sets, judge FROM vab_trials) j ON j.sets = k.sets
LEFT JOIN vab_trials r ON r.sets = k.sets AND r.judge = j.judge AND r.task_id = k.task_id
GROUP BY k.sets, j.judge, k.task_id, k.domain, k.n_images, k.best, k.worst
""",
    """
CREATE VIEW vab_leaderboard AS
SELECT sets, judge,
    CASE WHEN sum(both_trials) > 0 THEN 100.0 * avg(CAST(strict_both AS INTEGER)) END AS strict_both,
    CASE WHEN sum(best_trials) > 0 THEN 100.0 * avg(CAST(strict_best AS INTEGER)) END AS strict_best,
    CASE WHEN sum(worst_trials) > 0 THEN 100.0 * avg(CAST(strict_worst AS INTEGER)) END AS strict_worst,
    count(*) AS tasks
FROM vab_task_results
GROUP BY sets, judge
ORDER BY sets, strict_both DESC, judge
""",
)

# Beauty Index studies (docs/BEAUTY.md): one row per (study, tool), the whole panel, best first.
STUDY_LEADERBOARD_SQL = """
CREATE VIEW study_leaderboard AS
SELECT study_id, "rank", tool, beauty_index, beauty_index_lo, beauty_index_hi, answers, simulated,
       flagged_answers, beauty_index_unflagged, beauty_index_unflagged_lo, beauty_index_unflagged_hi
FROM study_index WHERE panel_group = 'all'
ORDER BY study_id, beauty_index DESC NULLS LAST, tool
"""


def _leaderboard_sql(suite_version: str, reference_version: str) -> str:
    """Latest model_scores row per model, with arena-style rank bands on Overall (EPS when no
    model has a Capability yet): rank = 1 + models whose lower bound is above this upper bound;
    rank_worst = models whose upper bound reaches this lower bound (the model itself included).
    A model without EPS (no eligible prompt scored) has no Overall either: no band (null), listed
    last, and neither counted in the others' bands nor deciding which axis they are ranked on."""
    # Some columns are computed (`complete`, `judged`, ...: LEADERBOARD_EXPRESSIONS); retired models are left out.
    cols = ", ".join(f"{LEADERBOARD_EXPRESSIONS[c]} AS {_ident(c)}" if c in LEADERBOARD_EXPRESSIONS else f"l.{_ident(c)}"
                     for c in LEADERBOARD_COLUMNS)
    return f"""
CREATE VIEW leaderboard AS
WITH latest AS MATERIALIZED (
    SELECT * FROM model_scores
    WHERE suite_version = {_sql_str(suite_version)} AND reference_version = {_sql_str(reference_version)}
      AND model_id NOT IN (SELECT model_id FROM retired_models)
    QUALIFY row_number() OVER (PARTITION BY model_id ORDER BY scored_at DESC, run_id DESC) = 1
),
axis AS (SELECT bool_and(overall IS NOT NULL) FILTER (WHERE eps IS NOT NULL) AS use_overall FROM latest),
banded AS MATERIALIZED (
    SELECT l.*,
        CASE WHEN a.use_overall THEN l.overall ELSE l.eps END AS rank_score,
        CASE WHEN a.use_overall THEN coalesce(l.overall_lo, l.overall) ELSE coalesce(l.eps_lo, l.eps) END AS rank_lo,
        CASE WHEN a.use_overall THEN coalesce(l.overall_hi, l.overall) ELSE coalesce(l.eps_hi, l.eps) END AS rank_hi
    FROM latest l CROSS JOIN axis a
),
ranked AS (SELECT * FROM banded WHERE rank_score IS NOT NULL),
-- Counting by sorting instead of a pairwise self-join (10,000 models = 10^8 pairs): sort the
-- bounds from the top; a model's "above" is the number of lower bounds before its upper bound
-- (ties: the model's row first, so only strictly greater bounds count), its "reach" the number
-- of upper bounds before its lower bound (ties: the bounds first, so >= counts). Both are the
-- row's position overall minus its position among the models' own rows.
above AS (
    SELECT model_id, row_number() OVER (ORDER BY v DESC, kind DESC, model_id)
                     - row_number() OVER (PARTITION BY kind ORDER BY v DESC, model_id) AS n
    FROM (SELECT rank_lo AS v, 0 AS kind, model_id FROM ranked UNION ALL SELECT rank_hi, 1, model_id FROM ranked)
    QUALIFY kind = 1
),
reach AS (
    SELECT model_id, row_number() OVER (ORDER BY v DESC, kind ASC, model_id)
                     - row_number() OVER (PARTITION BY kind ORDER BY v DESC, model_id) AS n
    FROM (SELECT rank_hi AS v, 0 AS kind, model_id FROM ranked UNION ALL SELECT rank_lo, 1, model_id FROM ranked)
    QUALIFY kind = 1
)
SELECT
    1 + above.n AS "rank",
    reach.n AS rank_worst,
    {cols}
FROM banded l LEFT JOIN above USING (model_id) LEFT JOIN reach USING (model_id)
ORDER BY l.rank_score DESC NULLS LAST, l.model_id
"""


def refresh_catalog(
    lake_dir: str | os.PathLike[str],
    catalog_path: str | os.PathLike[str],
    suite: Suite,
    reference_version: str,
    full: bool = False,
) -> Path:
    """(Re)build the DuckDB catalog file atomically (temp file next to it, then ``os.replace``).

    The per-model tables are first compacted (``tasks.lake.compact``): only the buckets holding models
    whose file changed since the last refresh are rewritten (``full``: all, from the per-model
    files). Their views read the compacted copy plus the partitions
    published since (new partitions show up without a refresh); the other tables' views glob
    ``<lake>/<table>/*/data.parquet``. Also a ``prompts`` table from the suite, a ``leaderboard``
    view (latest ``model_scores`` row per model for this suite and reference version) and a
    one-row ``catalog_info`` table. A corrupt per-model file raises :class:`LakeCorrupt` naming
    it, and the previous catalog stays in place (and readable).
    """
    lake = Lake(Path(lake_dir).resolve())
    catalog = Path(catalog_path).resolve()
    catalog.parent.mkdir(parents=True, exist_ok=True)
    lake.root.mkdir(parents=True, exist_ok=True)
    for table in (*TABLES, *RUN_TABLES, *REGISTRY_TABLES, *STUDY_TABLES, *VAB_TABLES):
        lake.ensure_schema_file(table)
    with compact.compacted(lake, COMPACTED_TABLES, full=full) as c:
        _write_catalog(lake, catalog, suite, reference_version, c)
    return catalog


# The per-model tables the catalog reads through the compacted copy (tasks/lake/compact.py).
COMPACTED_TABLES: dict[str, pa.Schema] = {**TABLES, **REGISTRY_TABLES}


def _write_catalog(lake: Lake, catalog: Path, suite: Suite, reference_version: str, c: compact.Compaction) -> None:
    tmp = catalog.parent / f".{catalog.name}.{uuid.uuid4().hex}.tmp"
    tmp_wal = Path(str(tmp) + ".wal")
    try:
        con = duckdb.connect(str(tmp))
        try:
            for table in (*TABLES, *RUN_TABLES, *REGISTRY_TABLES, *STUDY_TABLES, *VAB_TABLES):
                if table in COMPACTED_TABLES:
                    con.execute(compact.view_sql(lake.root, table, COMPACTED_TABLES[table], c.gen, c.files(table)))
                else:
                    con.execute(_table_view_sql(lake.root, table))
            con.execute(STUDY_LEADERBOARD_SQL)
            for sql in VAB_VIEWS_SQL:  # strict results per task and judge, and their leaderboard (docs/VAB.md)
                con.execute(sql)
            rows = suite.rows()
            prompts = pa.Table.from_pylist(
                [{k: r[k] for k in PROMPTS_SCHEMA.names} for r in rows], schema=PROMPTS_SCHEMA
            )
            con.register("_prompts_src", prompts)
            con.execute("CREATE TABLE prompts AS SELECT * FROM _prompts_src ORDER BY prompt_id")
            con.unregister("_prompts_src")
            info = pa.table(
                {
                    "format": [CATALOG_FORMAT],
                    "lake_dir": [str(lake.root)],
                    "suite_version": [suite.version],
                    "suite_sha256": [suite.sha256],
                    "reference_version": [reference_version],
                    "built_at": [datetime.now(timezone.utc)],
                    "generation": [c.gen],
                }
            )
            con.register("_info_src", info)
            con.execute("CREATE TABLE catalog_info AS SELECT * FROM _info_src")
            con.unregister("_info_src")
            con.execute(RETIRED_MODELS_SQL)
            con.execute(_leaderboard_sql(suite.version, reference_version))
            con.execute(CAPABILITY_ITEMS_SQL)  # every published Capability in one line of SQL (docs/LAKE.md)
            con.execute("CHECKPOINT")
        finally:
            con.close()
        with contextlib.suppress(FileNotFoundError):
            tmp_wal.unlink()
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        # A WAL left by someone who opened the old catalog writable must not be replayed
        # against the new file.
        with contextlib.suppress(FileNotFoundError):
            Path(str(catalog) + ".wal").unlink()
        private.settle_like(tmp, lake.root)  # the lake's share group reads the catalog too (IMAGEBENCH_SHARE_GROUP)
        os.replace(tmp, catalog)
    except BaseException:
        for p in (tmp, tmp_wal):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        raise
    fsync_dir(catalog.parent)


# Statement types a read-only connection runs. Everything else (COPY, EXPORT, ATTACH, CREATE,
# INSERT, SET, INSTALL/LOAD, ...) is refused before DuckDB sees it.
_READ_STATEMENTS = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})


def _explained(sql: str) -> str:
    """The statement after ``EXPLAIN [ANALYZE] [(options)]``; parentheses are counted on operator
    tokens only (never inside strings or comments)."""
    toks = duckdb.tokenize(sql)
    op = duckdb.token_type.operator
    i = 1  # toks[0] is EXPLAIN
    if i < len(toks) and sql[toks[i][0]:].upper().startswith(("ANALYZE", "ANALYSE")):
        i += 1
    if i < len(toks) and toks[i][1] == op and sql[toks[i][0]] == "(":
        depth = 0
        while i < len(toks):
            if toks[i][1] == op:
                depth += {"(": 1, ")": -1}.get(sql[toks[i][0]], 0)
            i += 1
            if depth == 0:
                break
    return sql[toks[i][0]:] if i < len(toks) else ""


class ReadOnlyConnection:
    """A DuckDB connection to the catalog that only runs queries.

    Two layers: (1) DuckDB itself: the file is opened ``read_only``, extensions cannot be
    installed or auto-loaded, external access is off except reads under the lake directory
    (``allowed_directories``), and the configuration is locked; (2) every statement is parsed
    first and only SELECT/EXPLAIN statements (including DESCRIBE, SHOW, SUMMARIZE, which DuckDB
    parses as SELECT) are run: layer (1) alone would still let ``COPY ... TO`` write inside the
    lake directory. This guards against mistakes; it is not a sandbox for hostile SQL (DuckDB's
    own advice: run untrusted SQL in an OS-level sandbox).
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, catalog_path: Path, lake_dir: Path) -> None:
        self._con = con
        self.catalog_path = catalog_path
        self.lake_dir = lake_dir

    def check(self, sql: str) -> None:
        # Parse on this connection (no file access): DuckDB's parser expands IMPORT DATABASE by
        # reading <dir>/schema.sql, which the default connection would do anywhere on disk.
        try:
            statements = self._con.extract_statements(sql)
        except duckdb.Error as exc:
            raise duckdb.ParserException(str(exc)) from exc
        if not statements:
            raise ValueError("empty SQL")
        for st in statements:
            if st.type not in _READ_STATEMENTS:
                kind = str(st.type).rsplit(".", 1)[-1]
                raise ReadOnlyViolation(
                    f"read-only catalog: {kind} statements are not allowed, only queries "
                    f"(SELECT, WITH, FROM, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN): {st.query.strip()[:80]!r}"
                )
            if st.type == duckdb.StatementType.EXPLAIN:
                # EXPLAIN ANALYZE runs the statement it explains: it must be a query too.
                inner = _explained(st.query)
                if not inner.strip():
                    raise ReadOnlyViolation(f"read-only catalog: cannot tell what {st.query.strip()[:80]!r} explains")
                self.check(inner)

    def execute(self, sql: str, parameters: Sequence[Any] | dict[str, Any] | None = None) -> duckdb.DuckDBPyConnection:
        """Run a query; returns DuckDB's cursor (``fetchall()``, ``description``, ``pl()``,
        ``arrow()``, ``df()``)."""
        self.check(sql)
        if parameters is None:
            return self._con.execute(sql)
        return self._con.execute(sql, parameters)

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> ReadOnlyConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_readonly(catalog_path: str | os.PathLike[str]) -> ReadOnlyConnection:
    """Open the catalog for queries only (see :class:`ReadOnlyConnection`)."""
    path = Path(catalog_path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no catalog yet (it is built by the scoring flow, or `imagebench catalog refresh`)"
        )
    con = duckdb.connect(
        str(path),
        read_only=True,
        config={
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "allow_community_extensions": False,
            "allow_unsigned_extensions": False,
        },
    )
    try:
        row = con.execute("SELECT lake_dir FROM catalog_info").fetchall()
        if len(row) != 1:
            raise LakeError(f"{path}: catalog_info must have exactly one row")
        lake_dir = Path(row[0][0])
        con.execute(f"SET allowed_directories = [{_sql_str(str(lake_dir) + os.sep)}]")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return ReadOnlyConnection(con, path, lake_dir)


def query(catalog_path: str | os.PathLike[str], sql: str) -> tuple[list[str], list[tuple]]:
    """Run one read-only query against the catalog: ``(column names, rows)``. With several
    statements, the result is the last one's. DuckDB errors become :class:`QueryError`; writes are
    :class:`ReadOnlyViolation`."""
    with connect_readonly(catalog_path) as con:
        try:
            cur = con.execute(sql)
            columns = [d[0] for d in (cur.description or [])]
            rows = cur.fetchall() if cur.description else []
        except duckdb.Error as exc:
            raise QueryError(f"{type(exc).__name__}: {exc}") from exc
        return columns, rows
