"""A compacted, disposable copy of the lake's per-model tables, for fast catalog queries.

The per-model files (``<lake>/<table>/model_id=<id>/data.parquet``) stay the truth; this module
keeps a DERIVED copy that the catalog views read instead of opening one file per model (see
docs/LAKE.md, "Compacted copy"):

    <lake>/_compact/<table>/b<b>-gen-<G>.parquet         rows of the models hashed to bucket b (sorted by
                                                         model), as rewritten by generation G; immutable
    <lake>/_compact/<table>/_schema.parquet              zero rows: the table's schema
    <lake>/_compact/state.json                           generation, its bucket files, and the (inode,
                                                         mtime, size) of every truth file compacted
    <lake>/_fresh/<table>/gen-<G>/<model>.parquet        partitions published since generation G was built:
                                                         a hard link of the truth file, or a tombstone

The catalog's view of a table for generation G is "compacted rows of the models NOT in the fresh
set, plus the fresh rows": a partition written after the refresh shows at once. A writer links its
new file into every live generation's fresh directory (under a shared lock); a compaction creates
generation G+1's (empty) fresh directory first (exclusive lock), so every write either lands in the
files it reads or in G+1's fresh set. Change detection is by ``stat`` of the truth files against
``state.json``, so a writer that died before linking, or a file changed behind the lake's back, is
still picked up by the next refresh. Only buckets holding changed models are rewritten (to a new
file); the view lists the generation's bucket files by name, so the others are simply listed
again. A bucket that cannot be read is rebuilt from the truth.

Importing this module must stay cheap (no torch, prefect or great_expectations).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import uuid
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.store import lockfile, private
from tasks.store.durable import fsync_dir

logger = logging.getLogger(__name__)

COMPACT_DIR = "_compact"
FRESH_DIR = "_fresh"
STATE_FILE = "state.json"
STATE_FORMAT = 2
# Buckets per table. Each file costs a query ~0.5 ms to open; each bucket holding a changed model
# is rewritten whole. 256 for the tables with ~200 rows a model (at 10,000 models ~40 models, 7,500
# rows a bucket: a nightly of 50 models rewrites ~18% of the table); 16 for those with a few rows
# a model, which are small enough to rewrite whole every night.
BUCKETS = 256
SMALL_TABLE_BUCKETS = {"model_scores": 16, "quarantine": 16, "model_events": 16}
SCHEMA_NAME = "_schema.parquet"  # model ids start with [A-Za-z0-9]: never a model's file
TOMBSTONE = "_tombstone"  # column of a fresh file that says "this model has no rows now"
COMPRESSION = "zstd"
_THREADS = 4

# Test hook: called as hook(step, generation) at "opened" (the new fresh directories exist, the
# truth files are not scanned yet) and "built" (bucket files written, catalog not yet swapped), so
# a test can publish a write "during" a compaction deterministically.
_test_hook: Callable[[str, int], None] | None = None


def buckets_of(table: str) -> int:
    return SMALL_TABLE_BUCKETS.get(table, BUCKETS)


def bucket_of(model_id: str, buckets: int = BUCKETS) -> int:
    """The bucket a model's rows live in: stable across processes and versions (crc32)."""
    return zlib.crc32(model_id.encode()) % buckets


def _gen_name(gen: int) -> str:
    return f"gen-{gen:06d}"


def bucket_file(root: Path, table: str, bucket: int, gen: int) -> Path:
    """A compacted bucket file; immutable once written (a rewrite gets the new generation's name)."""
    return root / COMPACT_DIR / table / f"b{bucket:03d}-{_gen_name(gen)}.parquet"


def schema_file(root: Path, table: str) -> Path:
    return root / COMPACT_DIR / table / SCHEMA_NAME


def fresh_dir(root: Path, table: str, gen: int) -> Path:
    return root / FRESH_DIR / table / _gen_name(gen)


def _gens(parent: Path) -> list[int]:
    if not parent.is_dir():
        return []
    out = []
    for entry in parent.iterdir():
        if entry.name.startswith("gen-") and entry.name[4:].isdigit():
            out.append(int(entry.name[4:]))
    return sorted(out)


def _gens_lock(root: Path, exclusive: bool):
    """Writers hold it shared while linking into the fresh directories; a compaction holds it
    exclusively only while creating or removing generation directories. Private and bounded
    (tasks/store/lockfile.py: ``IMAGEBENCH_LAKE_LOCK_WAIT_S``, then the holder is named)."""
    return lockfile.lake_lock(root / COMPACT_DIR / ".gens.lock", "the lake's generations lock", exclusive)


def write_parquet_file(table: pa.Table, final: Path, fsync: bool = True) -> None:
    """Temp file in the same directory (never named *.parquet), fsync, ``os.replace``: readers
    see the old file or the new one, never a part (the lake's writers use this too)."""
    tmp = final.parent / f".{final.name}.{uuid.uuid4().hex}.tmp"
    try:
        pq.write_table(table, tmp, compression=COMPRESSION)
        private.settle(tmp)  # the lake's share group reads it (IMAGEBENCH_SHARE_GROUP), else private
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard link ``src`` at ``dst`` (same bytes, no copy) via a temp name + os.replace; a copy
    where the file system refuses links."""
    tmp = dst.parent / f".{dst.name}.{uuid.uuid4().hex}.tmp"
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
            private.settle(tmp)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _empty(schema: pa.Schema) -> pa.Table:
    return pa.Table.from_batches([], schema=schema)  # schema.empty_table() imports pandas (~1 s)


def _tombstone_table(model_id: str) -> pa.Table:
    return pa.table({"model_id": pa.array([model_id], pa.string()), TOMBSTONE: pa.array([True])})


# ---------------------------------------------------------------------------------------------
# Writers: publish a partition to the live generations
# ---------------------------------------------------------------------------------------------


def publish(root: Path, table: str, model_id: str, path: Path | None, num_rows: int) -> None:
    """Make a just-replaced partition file visible to every live generation's views: a hard link
    of ``path`` into each ``_fresh/<table>/gen-*/``, or a tombstone when the model has no rows
    (``path`` None: the file was moved aside; or an empty file). Nothing to do before the first
    compaction (no generation exists, and no catalog reads one)."""
    parent = root / FRESH_DIR / table
    if not parent.is_dir():
        return
    try:
        _publish(root, parent, table, model_id, path, num_rows)
    except (OSError, lockfile.LockBusy) as exc:  # the file itself is published; the next refresh finds it by stat
        logger.warning("%s: could not link %s into the catalog's fresh files (%s); it shows after the next "
                       "catalog refresh", table, model_id, exc)


def _publish(root: Path, parent: Path, table: str, model_id: str, path: Path | None, num_rows: int) -> None:
    with _gens_lock(root, exclusive=False):
        gens = _gens(parent)
        if not gens:
            return
        src = path if (path is not None and num_rows > 0) else None
        tomb = None
        try:
            if src is None:
                tomb = parent / f".tomb-{model_id}.{uuid.uuid4().hex}.tmp"
                pq.write_table(_tombstone_table(model_id), tomb)
                private.settle(tomb)
                src = tomb
            for gen in gens:
                _link_or_copy(src, fresh_dir(root, table, gen) / f"{model_id}.parquet")
        finally:
            if tomb is not None:
                with contextlib.suppress(FileNotFoundError):
                    tomb.unlink()


# ---------------------------------------------------------------------------------------------
# Views
# ---------------------------------------------------------------------------------------------


def _sql_str(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def view_sql(root: Path, table: str, schema: pa.Schema, gen: int, files: list[Path]) -> str:
    """The catalog view of a compacted table: compacted rows of the models without a fresh file,
    plus the fresh files' rows. ``files`` are the generation's bucket files (all of the table's
    schema, so no per-file schema merge is needed). The fresh side is read ONCE (a materialised
    CTE), so the set of fresh models and their rows come from the same listing even while a
    writer publishes."""
    cols = ", ".join(_ident(n) for n in schema.names)
    compacted = "[" + ", ".join(_sql_str(str(f)) for f in files) + "]"
    fresh = _sql_str(str(fresh_dir(root, table, gen) / "*.parquet"))
    return (
        f"CREATE VIEW {_ident(table)} AS\n"
        f"WITH _fresh AS MATERIALIZED (SELECT * FROM read_parquet({fresh}, union_by_name = true, hive_partitioning = false))\n"
        f"SELECT {cols} FROM read_parquet({compacted}, hive_partitioning = false)\n"
        f"WHERE model_id NOT IN (SELECT model_id FROM _fresh)\n"
        f"UNION ALL\n"
        f"SELECT {cols} FROM _fresh WHERE {_ident(TOMBSTONE)} IS NOT TRUE"
    )


# ---------------------------------------------------------------------------------------------
# Compaction
# ---------------------------------------------------------------------------------------------

Stat = tuple[int, int, int]  # (inode, mtime_ns, size) of a truth file


def stat_of(path: Path) -> Stat | None:
    """``(inode, mtime_ns, size)`` of ``path``, None when it is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _scan(root: Path, table: str, data_file: str, prefix: str) -> dict[str, Stat]:
    """Every model partition of ``table`` with its truth file's stat (no file is opened)."""
    out: dict[str, Stat] = {}
    try:
        it = os.scandir(root / table)
    except FileNotFoundError:
        return out
    with it:
        for entry in it:
            if not entry.name.startswith(prefix):
                continue
            try:
                st = os.stat(os.path.join(entry.path, data_file))
            except (FileNotFoundError, NotADirectoryError):
                continue
            out[entry.name[len(prefix):]] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


def _fingerprint(schema: pa.Schema) -> str:
    return str(schema.remove_metadata())


def read_state(root: Path) -> dict | None:
    path = root / COMPACT_DIR / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (FileNotFoundError, ValueError, OSError):
        return None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        return None
    return state


class Compaction:
    """One compaction to a new generation. Use :func:`compacted`."""

    def __init__(self, lake, tables: dict[str, pa.Schema], full: bool) -> None:
        from tasks.lake.layout import DATA_FILE, PARTITION_PREFIX

        self.lake = lake
        self.root: Path = lake.root
        self.tables = tables
        self.data_file = DATA_FILE
        self.prefix = PARTITION_PREFIX
        self.previous = read_state(self.root)  # what the current catalog reads (kept for its readers)
        self.state = None if full else self.previous
        existing = {self.previous["generation"]} if self.previous else set()
        for table in tables:
            existing.update(_gens(self.root / FRESH_DIR / table))
        self.gen = max(existing, default=0) + 1
        self.new_tables: dict[str, dict] = {}
        self.rewritten: dict[str, list[int]] = {}  # buckets written by this compaction, per table

    def files(self, table: str) -> list[Path]:
        """The bucket files of ``table`` in this generation (its schema file first)."""
        files = self.new_tables[table]["files"]
        return [schema_file(self.root, table)] + [
            bucket_file(self.root, table, int(b), g) for b, g in sorted(files.items(), key=lambda kv: int(kv[0]))
        ]

    # -- steps ----------------------------------------------------------------------------------
    def open_generation(self) -> None:
        """Create the new generation's fresh directories; from here on every write links into it."""
        with _gens_lock(self.root, exclusive=True):
            for table, schema in self.tables.items():
                fdir = fresh_dir(self.root, table, self.gen)
                fdir.mkdir(parents=True, exist_ok=True)
                write_parquet_file(_empty(schema.append(pa.field(TOMBSTONE, pa.bool_()))), fdir / SCHEMA_NAME, fsync=False)

    def build(self) -> None:
        if _test_hook is not None:
            _test_hook("opened", self.gen)
        with ThreadPoolExecutor(_THREADS) as pool:  # stat calls release the GIL
            scans = dict(zip(self.tables, pool.map(
                lambda t: _scan(self.root, t, self.data_file, self.prefix), self.tables)))
        for table, schema in self.tables.items():
            self._build_table(table, schema, scans[table])
        if _test_hook is not None:
            _test_hook("built", self.gen)

    def _build_table(self, table: str, schema: pa.Schema, now: dict[str, Stat]) -> None:
        fp = _fingerprint(schema)
        tdir = self.root / COMPACT_DIR / table
        tdir.mkdir(parents=True, exist_ok=True)
        sfile = schema_file(self.root, table)
        try:
            ok = pq.read_schema(sfile).remove_metadata().equals(schema.remove_metadata())
        except (pa.ArrowException, OSError):
            ok = False
        if not ok:
            write_parquet_file(_empty(schema), sfile)
        nb = buckets_of(table)
        tstate = self.state["tables"].get(table) if self.state else None
        if tstate is not None and (tstate.get("schema") != fp or tstate.get("buckets") != nb):
            tstate = None  # the table's schema or bucket count changed: rebuild it from the truth files
        old: dict[str, Stat] = {m: tuple(s) for m, s in tstate["models"].items()} if tstate else {}
        old_files: dict[int, int] = {int(b): g for b, g in tstate["files"].items()} if tstate else {}
        changed = {m for m, st in now.items() if old.get(m) != st}
        dropped = (old.keys() - now.keys()) | changed
        by_bucket: dict[int, list[str]] = {}
        for m in now:
            by_bucket.setdefault(bucket_of(m, nb), []).append(m)
        dirty = {bucket_of(m, nb) for m in dropped} if tstate is not None else set(range(nb))

        def unreadable(b: int) -> bool:
            try:
                pq.read_metadata(bucket_file(self.root, table, b, old_files[b]))
                return False
            except (pa.ArrowException, OSError):
                return True

        kept_buckets = sorted(b for b in old_files if b not in dirty)
        with ThreadPoolExecutor(_THREADS) as pool:  # a bucket listed again must be readable; else rebuilt
            dirty |= {b for b, bad in zip(kept_buckets, pool.map(unreadable, kept_buckets)) if bad}
        drop = pa.array(sorted(dropped), pa.string())
        new_files: dict[int, int] = {b: g for b, g in old_files.items() if b not in dirty}  # listed again, untouched

        def one(b: int) -> None:
            new_files.pop(b, None)
            models = by_bucket.get(b, [])
            parts: list[pa.Table] = []
            to_read = models
            if b in old_files:
                old_file = bucket_file(self.root, table, b, old_files[b])
                try:
                    kept = self.lake._cast_to_schema(table, pq.read_table(old_file), old_file)
                    parts.append(kept.filter(pc.invert(pc.is_in(kept.column("model_id"), value_set=drop))))
                    to_read = [m for m in models if m in changed]
                except Exception:  # noqa: BLE001 - derived data: rebuild this bucket from the truth
                    parts = []
            for m in sorted(to_read):
                parts.append(self.lake._read_model_file(table, m))
            parts = [p for p in parts if p.num_rows]
            if not parts:
                return
            write_parquet_file(pa.concat_tables(parts).sort_by("model_id"), bucket_file(self.root, table, b, self.gen))
            new_files[b] = self.gen

        with ThreadPoolExecutor(_THREADS) as pool:
            list(pool.map(one, sorted(dirty)))
        if dirty:
            fsync_dir(tdir)
        self.new_tables[table] = {"schema": fp, "buckets": nb, "files": {str(b): g for b, g in sorted(new_files.items())},
                                  "models": now}
        self.rewritten[table] = sorted(b for b, g in new_files.items() if g == self.gen)

    def commit_state(self) -> None:
        state = {"format": STATE_FORMAT, "generation": self.gen, "tables": self.new_tables}
        path = self.root / COMPACT_DIR / STATE_FILE
        tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
        tmp.write_text(json.dumps(state, separators=(",", ":")))
        private.settle(tmp)
        os.replace(tmp, path)

    def remove_old(self) -> None:
        """Keep what this generation and the previous one read (readers of the previous catalog);
        remove the rest, and whatever an interrupted compaction left."""
        prev_gen = self.previous["generation"] if self.previous else None
        with _gens_lock(self.root, exclusive=True):
            for table in self.tables:
                keep = {p.name for p in self.files(table)}
                if self.previous and table in self.previous["tables"]:
                    keep |= {bucket_file(self.root, table, int(b), g).name
                             for b, g in self.previous["tables"][table]["files"].items()}
                tdir = self.root / COMPACT_DIR / table
                for f in tdir.iterdir():
                    if f.name not in keep and (f.name.endswith(".tmp") or f.name.startswith("b")):
                        f.unlink(missing_ok=True)
                parent = self.root / FRESH_DIR / table
                for g in _gens(parent):
                    if g not in (self.gen, prev_gen):
                        shutil.rmtree(parent / _gen_name(g), ignore_errors=True)

    def abort(self) -> None:
        with _gens_lock(self.root, exclusive=True):
            for table in self.tables:
                shutil.rmtree(fresh_dir(self.root, table, self.gen), ignore_errors=True)
                for b in range(buckets_of(table)):
                    bucket_file(self.root, table, b, self.gen).unlink(missing_ok=True)


@contextlib.contextmanager
def compacted(lake, tables: dict[str, pa.Schema], full: bool = False) -> Iterator[Compaction]:
    """Compact ``tables`` into a new generation and yield it; the caller publishes a catalog that
    reads it (``view_sql`` with ``c.gen`` and ``c.files(table)``). On success the state is
    committed and what neither this nor the previous generation reads is removed; on error the
    new generation is removed and the previous catalog stays valid. Compactions of one lake are
    serialised by a lock."""
    with lockfile.lake_lock(lake.root / COMPACT_DIR / ".refresh.lock", "the lake's compaction lock"):
        c = Compaction(lake, tables, full)
        try:
            c.open_generation()
            c.build()
            yield c
        except BaseException:
            c.abort()
            raise
        c.commit_state()
        c.remove_old()
