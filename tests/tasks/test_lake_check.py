"""The start-of-run corrupt-file check opens only files changed since a catalog refresh read them
whole (tasks/lake/check.py, docs/LAKE.md "Corrupt files"); a file damaged after that is still caught."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tasks.lake.tables import Lake, LakeCorrupt, refresh_catalog
from tasks.lake.check import check_changed, unverified
from tests.tasks.test_lake import hps_rows, small_suite


def _refresh(tmp_path: Path, full: bool = False) -> Path:
    return refresh_catalog(tmp_path / "lake", tmp_path / "ib.duckdb", small_suite(), "r1", full=full)


def _fill(lake: Lake, models: list[str]) -> None:
    for i, m in enumerate(models):
        lake.write_partition("hps_scores", m, hps_rows(m, {"sr-1": 1.0 + i, "hr-1": -1.0 - i}))


def _damage_footer_keeping_stat(path: Path) -> None:
    """Overwrite the footer's bytes in place with the same number of other bytes and put the
    mtime back: size and mtime as before (bit rot, or a hand edit followed by `touch -d`)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-40:-8] = b"\xff" * 32  # the end of the thrift footer, before its length and magic
    with open(path, "r+b") as fh:  # same inode: only the contents change
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)


def test_only_files_changed_since_the_refresh_are_opened(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake, ["a", "b", "c"])
    first = check_changed(lake)  # never refreshed: every file is checked, as before
    assert (first.files, first.opened, first.corrupt) == (3, 3, [])
    _refresh(tmp_path)
    assert (check_changed(lake).files, check_changed(lake).opened) == (3, 0)
    # written since: checked; garbage written into another since: checked and found
    lake.write_partition("hps_scores", "d", hps_rows("d", {"sr-1": 4.0}))
    victim = lake.partition_path("hps_scores", "b")
    victim.write_bytes(b"PAR1 not a parquet file at all PAR1")
    todo, total = unverified(lake)
    assert total == 4 and sorted((t, m) for t, m, _ in todo) == [("hps_scores", "b"), ("hps_scores", "d")]
    found = check_changed(lake)
    assert [(t, m, p) for t, m, p, _ in found.corrupt] == [("hps_scores", "b", victim)]
    # the same answer as reading every footer, for every file changed since the refresh
    assert [(t, m, p) for t, m, p, _ in lake.find_corrupt()] == [("hps_scores", "b", victim)]


def test_a_file_damaged_in_place_after_the_check_is_caught_when_read(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake, ["a", "b"])
    _refresh(tmp_path)
    victim = lake.partition_path("hps_scores", "a")
    _damage_footer_keeping_stat(victim)
    # Its stat is the verified one: the start check does not open it (that is the point) ...
    assert check_changed(lake).opened == 0
    # ... but it is never read silently: every read names it, every-footer check and a full
    # refresh find it (the nightly falls back to the former when a read fails: flows/pipeline.py).
    with pytest.raises(LakeCorrupt, match="hps_scores/model_id=a/data.parquet"):
        lake.read("hps_scores", ["a"])
    assert [(t, m) for t, m, _, _ in lake.find_corrupt()] == [("hps_scores", "a")]
    with pytest.raises(LakeCorrupt, match="hps_scores/model_id=a/data.parquet"):
        _refresh(tmp_path, full=True)
    assert lake.read("hps_scores", ["b"]).num_rows == 2  # the other model reads as before
