"""The nightly's corrupt-file check, in time that follows what changed, not the lake's size.

Reading the footer of every per-model file at the start of each run cost one open + footer read
per file (about 60,000 files at 10,000 models). But every catalog refresh already reads WHOLE each
per-model file whose ``(inode, mtime_ns, size)`` changed since the previous refresh (tasks/lake/compact.py),
and records those stats in ``<lake>/_compact/state.json`` only when all of them decoded (a corrupt
one raises :class:`~tasks.lake.tables.LakeCorrupt` and the state is not committed). So a file whose stat
equals the recorded one is the very file a refresh decoded in full; the start check opens only
the others (written since the last refresh, changed behind the lake's back, or never compacted).

What this does not see at the start: a file damaged in place with its size and mtime kept (bit
rot, or a deliberate ``touch -d``). Such a file is still never read silently: every read of it
raises :class:`~tasks.lake.tables.LakeCorrupt` naming it, and the flows then move it aside, record it and
recompute the model (tasks/runs/, flows/pipeline.py ``Run.model_failed``); ``imagebench catalog
--full`` reads every file whole. See docs/LAKE.md, "Corrupt files".

Importing this module must stay cheap (no torch, prefect or great_expectations).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.lake import TABLES
from tasks.lake import compact

_THREADS = 4  # stat and footer reads wait on the file system and release the GIL


@dataclass
class CheckResult:
    """What one start-of-run check found: ``corrupt`` as ``(table, model_id, path, error)``."""

    corrupt: list[tuple[str, str, Path, str]] = field(default_factory=list)
    files: int = 0  # per-model files in the lake
    opened: int = 0  # of which read (footer): not verified by a refresh since they last changed


def unverified(lake, tables: Sequence[str] = tuple(TABLES)) -> tuple[list[tuple[str, str, Path]], int]:
    """``([(table, model_id, path)] of the per-model files whose stat differs from the last
    refresh's record, number of per-model files)``. Only ``stat`` calls: no file is opened."""
    from tasks.lake.layout import DATA_FILE, PARTITION_PREFIX

    state = compact.read_state(lake.root)
    recorded = state["tables"] if state else {}
    with ThreadPoolExecutor(_THREADS) as pool:
        scans = list(pool.map(lambda t: compact._scan(lake.root, t, DATA_FILE, PARTITION_PREFIX), tables))  # noqa: SLF001
    out: list[tuple[str, str, Path]] = []
    total = 0
    for table, now in zip(tables, scans):
        done = (recorded.get(table) or {}).get("models") or {}
        total += len(now)
        for model_id, stat in sorted(now.items()):
            if tuple(done.get(model_id, ())) != stat:
                out.append((table, model_id, lake.root / table / f"{PARTITION_PREFIX}{model_id}" / DATA_FILE))
    return out, total


def _footer_error(path: Path) -> str | None:
    try:
        pq.read_metadata(path)
    except FileNotFoundError:
        return None  # moved aside or replaced meanwhile: nothing to check here now
    except (pa.ArrowException, OSError) as exc:
        return str(exc)
    return None


def check_changed(lake) -> CheckResult:
    """The start-of-run check: the footer of every per-model file not verified by a refresh since
    it last changed (see the module doc). Same findings as reading every footer for any file
    written or modified since the last refresh."""
    todo, total = unverified(lake)
    result = CheckResult(files=total, opened=len(todo))
    with ThreadPoolExecutor(_THREADS) as pool:
        errors = list(pool.map(lambda item: _footer_error(item[2]), todo))
    result.corrupt = [(t, m, p, e) for (t, m, p), e in zip(todo, errors) if e is not None]
    return result
