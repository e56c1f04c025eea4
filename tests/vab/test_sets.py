"""VAB set collections: manifest import, ingest validation, pinning, bad input named by task, and
`vab import-answers` mapped back and scored like a run (tasks.vab.sets, tasks.vab.imports)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

from schemas.settings import load_settings
from tasks.vab.imports import import_answers
from tasks.vab.metrics import strict_metrics
from tasks.vab.sets import BadSets, image_paths, import_manifest, load_sets
from tasks.lake.tables import Lake
from tasks.vab.tables import read_partition


def _png(path: Path, color: tuple[int, int, int], size=(64, 64)) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path, format="PNG")
    return path.name


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path / "home"))
    return load_settings(home=tmp_path / "home", reference_dir=Path(__file__).resolve().parents[2] / "reference")


@pytest.fixture
def src(tmp_path) -> Path:
    d = tmp_path / "src"
    for i in range(1, 8):
        _png(d / f"img{i}.png", (30 * i, 255 - 30 * i, 7 * i))
    return d


def _manifest(d: Path, tasks: list[dict], name="sets.jsonl") -> Path:
    p = d / name
    p.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return p


GOOD = [
    {"task_id": "p1", "domain": "photography", "images": ["img1.png", "img2.png", "img3.png"], "best": 2, "worst": 3},
    {"task_id": "a1", "domain": "fine_art", "substyle": "oil", "images": ["img4.png", "img5.png"], "best": 1, "worst": None},
]


def test_import_pins_caches_and_loads(settings, src):
    res = import_manifest(settings, _manifest(src, GOOD), "mine")
    assert res.tasks == 2 and not res.already_pinned and not res.rejected
    tasks = load_sets(settings, "mine")
    assert [t.task_id for t in tasks] == ["p1", "a1"] and tasks[0].best == 2 and tasks[1].worst is None
    paths = image_paths(settings, tasks[0])
    assert all(p.is_file() and p.is_relative_to(settings.home / "images") for p in paths)
    assert paths[1].read_bytes() == (src / "img2.png").read_bytes()  # stored order kept
    lake = read_partition(Lake(settings.lake_dir), "vab_tasks", "mine")
    assert lake.column("task_id").to_pylist() == ["p1", "a1"] and lake.column("n_images").to_pylist() == [3, 2]
    # create-once: the same content again is a no-op, other content under the name is refused
    assert import_manifest(settings, _manifest(src, GOOD), "mine").already_pinned
    with pytest.raises(ValueError, match="set collection 'mine' is pinned with other content"):
        import_manifest(settings, _manifest(src, GOOD[:1]), "mine")
    # a changed pinned copy is caught
    (settings.home / "vab/sets/mine/tasks.jsonl").write_text("")
    with pytest.raises(ValueError, match="does not match its pin"):
        load_sets(settings, "mine")
    with pytest.raises(LookupError, match="set collection 'other' not found"):
        load_sets(settings, "other")


BAD = [
    ({"task_id": "one", "domain": "photography", "images": ["img1.png"], "best": 1}, "1 image"),
    ({"task_id": "range", "domain": "photography", "images": ["img1.png", "img2.png", "img3.png"], "best": 4, "worst": 1}, "best=4 is out of range 1..3"),
    ({"task_id": "wrange", "domain": "photography", "images": ["img1.png", "img2.png", "img3.png"], "best": 1, "worst": 0}, "worst=0 is out of range 1..3"),
    ({"task_id": "pairworst", "domain": "illustration", "images": ["img1.png", "img2.png"], "best": 1, "worst": 2}, "2-image task has no worst"),
    ({"task_id": "dupname", "domain": "photography", "images": ["img1.png", "img1.png", "img2.png"], "best": 1, "worst": 2}, "img1.png appears twice"),
    ({"task_id": "dupbytes", "domain": "photography", "images": ["img1.png", "copy.png", "img2.png"], "best": 1, "worst": 3}, "same content"),
    ({"task_id": "twice", "domain": "photography", "images": ["img1.png", "img2.png"], "best": 1}, "task id used 2 times"),
    ({"task_id": "twice", "domain": "photography", "images": ["img3.png", "img2.png"], "best": 1}, "task id used 2 times"),
    ({"task_id": "tiny", "domain": "photography", "images": ["tiny.png", "img2.png"], "best": 1}, "too_small"),
    ({"task_id": "gone", "domain": "photography", "images": ["missing.png", "img2.png"], "best": 1}, "missing.png: cannot read"),
    ({"task_id": "dom", "domain": "sculpture", "images": ["img1.png", "img2.png"], "best": 1}, "domain 'sculpture'"),
]


def test_bad_tasks_named_all_at_once_nothing_written(settings, src):
    (src / "copy.png").write_bytes((src / "img1.png").read_bytes())
    _png(src / "tiny.png", (1, 2, 3), size=(8, 8))
    file = _manifest(src, GOOD + [t for t, _ in BAD])
    with pytest.raises(BadSets) as info:
        import_manifest(settings, file, "bad")
    msg = str(info.value)
    problems = info.value.problems
    for task, why in BAD:
        assert why in problems[repr(task["task_id"])], (task["task_id"], problems.get(repr(task["task_id"])))
    assert "'p1'" not in problems and "'a1'" not in problems and msg.count("task ") >= len(BAD) - 1
    assert not (settings.home / "vab/sets/bad").exists() and not (settings.home / "images").exists()
    # --skip-bad keeps the good tasks, the rejected ones are recorded with the pin
    res = import_manifest(settings, file, "bad", skip_bad=True)
    assert res.tasks == 2 and set(res.rejected) == {repr(t["task_id"]) for t, _ in BAD}
    pin = json.loads((settings.home / "vab/sets/bad/pin.json").read_text())
    assert "'range'" in pin["rejected"] and [t.task_id for t in load_sets(settings, "bad")] == ["p1", "a1"]


def test_manifest_lines_that_are_not_tasks(settings, src):
    p = src / "broken.jsonl"
    p.write_text(json.dumps(GOOD[0]) + "\n{not json\n" + json.dumps({"task_id": "x", "domain": "photography"}) + "\n")
    with pytest.raises(BadSets, match=r"task line 2: not JSON.*task 'x': line 3: missing field\(s\) \['images', 'best'\]"):
        import_manifest(settings, p, "b")
    res = import_manifest(settings, p, "b", skip_bad=True)
    assert res.tasks == 1 and set(res.rejected) == {"line 2", "'x'"}
    with pytest.raises(ValueError, match="set collection name 'no/slash'"):
        import_manifest(settings, _manifest(src, GOOD), "no/slash")


def _csv(path: Path, rows: list[str]) -> Path:
    path.write_text("task_id,trial,order,best,worst\n" + "".join(r + "\n" for r in rows))
    return path


def test_import_answers_mapped_back_and_scored(settings, src, tmp_path):
    import_manifest(settings, _manifest(src, GOOD), "mine")
    # p1: best is stored 2, worst stored 3. Trial 1 shows "3 1 2": best at slot 3, worst at slot 1.
    rows = ["p1,0,1 2 3,2,3", "p1,1,3 1 2,3,1", "p1,2,2 3 1,1,2",
            "a1,0,1 2,1,", "a1,1,2 1,2,", "a1,2,2 1,,"]
    res = import_answers(settings, _csv(tmp_path / "ans.csv", rows), "mine", "ext-judge")
    assert res == {"rows": 6, "tasks": 2, "tasks_in_sets": 2, "short_tasks": 0, "unparsable": 1}
    trials = read_partition(Lake(settings.lake_dir), "vab_trials", "mine")
    got = {(r["task_id"], r["trial"]): (r["best"], r["worst"], r["state"]) for r in trials.to_pylist()}
    assert got[("p1", 1)] == (2, 3, "ok") and got[("p1", 2)] == (2, 3, "ok") and got[("a1", 2)] == (None, None, "unparsable")
    m = strict_metrics(load_sets(settings, "mine"), trials)["ext-judge"]
    assert (m["strict_best"], m["strict_worst"], m["strict_both"]) == (50.0, 100.0, 50.0)
    # a second judge does not replace the first; re-importing a judge replaces only its rows
    import_answers(settings, _csv(tmp_path / "b.csv", ["p1,0,1 2 3,1,3"]), "mine", "other")
    import_answers(settings, _csv(tmp_path / "c.csv", ["a1,0,1 2,1,"]), "mine", "ext-judge")
    trials = pq.read_table(settings.lake_dir / "vab_trials" / "sets=mine" / "data.parquet")
    assert sorted(zip(trials.column("judge").to_pylist(), trials.column("task_id").to_pylist())) == [("ext-judge", "a1"), ("other", "p1")]


def test_import_answers_bad_rows_named_nothing_recorded(settings, src, tmp_path):
    import_manifest(settings, _manifest(src, GOOD), "mine")
    rows = ["p1,0,1 2 3,2,3", "zz,0,1 2,1,", "p1,1,1 1 2,1,2", "p1,2,3 1 2,4,1", "a1,0,1 2,1,2", "p1,0,1 2 3,2,3", "a1,5,1 2,1,"]
    with pytest.raises(ValueError) as info:
        import_answers(settings, _csv(tmp_path / "bad.csv", rows), "mine", "j")
    msg = str(info.value)
    for part in ("line 3, task 'zz': not a task of set collection 'mine'",
                 "line 4, task 'p1': order: 1 1 2 is not a permutation of 1..3",
                 "line 5, task 'p1': best=4 is out of range 1..3",
                 "line 6, task 'a1': a 2-image task has no worst",
                 "line 7, task 'p1': trial 0 already given on line 2",
                 "line 8, task 'a1': trial '5' is not 0..2"):
        assert part in msg, msg
    assert not (settings.lake_dir / "vab_trials").exists()
    with pytest.raises(ValueError, match="the header must be task_id,trial,order,best,worst"):
        (tmp_path / "h.csv").write_text("task,trial\n")
        import_answers(settings, tmp_path / "h.csv", "mine", "j")
    with pytest.raises(ValueError, match="judge name 'bad judge'"):
        import_answers(settings, _csv(tmp_path / "ok.csv", rows[:1]), "mine", "bad judge")


def test_official_parquet_layout(settings, src, tmp_path):
    """The release's columns, images as Hugging Face Image structs {bytes, path}: bytes inline, or a
    path relative to the file when bytes are null; a bad row named by task id."""
    import pyarrow as pa

    from tasks.vab.sets import import_any

    img = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    b = {i: (src / f"img{i}.png").read_bytes() for i in range(1, 6)}
    rel = tmp_path / "rel"
    _png(rel / "side.png", (9, 99, 199))
    rows = {
        "task_id": ["o1", "o2", "o3"],
        "domain": ["illustration", "photograph", "fine-art"],
        "substyle": ["ink", None, None],
        "n_images": [3, 2, 2],
        "images": [[{"bytes": b[1], "path": "x1.png"}, {"bytes": b[2], "path": "x2.png"}, {"bytes": None, "path": "rel/side.png"}],
                   [{"bytes": b[3], "path": None}, {"bytes": b[4], "path": None}],
                   [{"bytes": b[5], "path": "y.png"}, {"bytes": b[1], "path": "z.png"}]],
        "labels": [["A", "B", "C"], ["A", "B"], ["A", "B"]],
        "ground_truth_best": ["C", "B", "E"],
        "ground_truth_worst": ["A", "A", None],
    }
    table = pa.table({k: (pa.array(v, pa.list_(img)) if k == "images" else v) for k, v in rows.items()})
    pq.write_table(table, tmp_path / "release.parquet")
    with pytest.raises(BadSets, match=r"1 bad task\(s\), nothing imported: task 'o3': ground_truth_best 'E' is not one of the labels"):
        import_any(settings, tmp_path / "release.parquet", "official")
    res = import_any(settings, tmp_path / "release.parquet", "official", skip_bad=True)
    tasks = load_sets(settings, "official")
    assert res.tasks == 2 and [t.task_id for t in tasks] == ["o1", "o2"] and tasks[0].substyle == "ink"
    assert (tasks[0].best, tasks[0].worst, tasks[1].best, tasks[1].worst, tasks[1].domain) == (3, 1, 2, None, "photography")
    assert image_paths(settings, tasks[0])[2].read_bytes() == (rel / "side.png").read_bytes()
    pq.write_table(pa.table({"id": ["q"], "domain": ["photography"]}), tmp_path / "nocols.parquet")
    with pytest.raises(ValueError, match="not the VAB release layout: no column"):
        import_any(settings, tmp_path / "nocols.parquet", "x")


def test_sets_built_from_the_lake(settings, src, tmp_path):
    """For one prompt of the suite, the ok images of several models in the lake form a set;
    labels name models; a quarantined image or an unknown prompt is named by task."""
    from datetime import datetime, timezone

    import pyarrow as pa

    from schemas.lake import IMAGES
    from tasks.store.ingest import cache_image
    from tasks.vab.sets import build_from_lake

    p1, p2 = "tr-menus-labels-01", "tr-menus-labels-02"
    lake = Lake(settings.lake_dir)
    colour = iter(range(1, 8))
    for model in ("m-a", "m-b", "m-c"):
        rows = []
        for pid in (p1, p2):
            data = (src / f"img{next(colour)}.png").read_bytes()
            sha = hashlib.sha256(data).hexdigest()
            ok = not (model == "m-c" and pid == p2)
            rows.append({"model_id": model, "prompt_id": pid, "suite_version": settings.suite_version,
                         "state": "ok" if ok else "quarantined", "reason": None if ok else "too_small",
                         "object_uri": f"file:///{model}/{pid}.png", "image_sha256": sha,
                         "image_path": cache_image(settings.home, sha, "PNG", data) if ok else None, "format": "PNG",
                         "width": 64, "height": 64, "source_mode": "RGB", "byte_size": len(data),
                         "source_fingerprint": "f" * 64, "ingested_at": datetime.now(timezone.utc)})
        lake.write_partition("images", model, pa.Table.from_pylist(rows, schema=IMAGES))
    labels = tmp_path / "labels.csv"
    labels.write_text("prompt_id,domain,models,best,worst\n"
                      f"{p1},illustration,m-b m-a m-c,m-a,m-c\n"
                      f"{p2},illustration,m-a m-c,m-a,\n"
                      "nope-01,illustration,m-a m-b,m-a,\n")
    with pytest.raises(BadSets) as info:
        build_from_lake(settings, labels, "ours")
    assert info.value.problems == {
        repr(p2): "line 3: no usable image of m-c (quarantined)",
        "'nope-01'": "line 4: prompt 'nope-01' is not in suite imagebench-v1",
    }
    res = build_from_lake(settings, labels, "ours", skip_bad=True)
    (task,) = load_sets(settings, "ours")
    assert res.tasks == 1 and (task.task_id, task.best, task.worst, task.substyle) == (p1, 2, 3, "Text Rendering")
    b_image = lake.read("images", ["m-b"]).to_pylist()[0]
    assert task.image_sha256[0] == b_image["image_sha256"]


def test_the_vab_tasks_suite_is_a_second_guard_before_anything_is_written():
    """Great Expectations on vab_tasks (expectations/vab_tasks.json), run before a collection is
    pinned: what VabTask already refuses is refused again at the table."""
    import pyarrow as pa

    from schemas.vab import VAB_TASKS
    from tasks.lake.validation import ValidationFailed, require_valid

    def row(task_id, n=3, best=1, worst=2, domain="photography"):
        return {"sets": "s", "task_id": task_id, "domain": domain, "substyle": None, "n_images": n,
                "image_uris": [f"i{k}" for k in range(n)], "image_sha256": [f"{k:064x}" for k in range(n)],
                "best": best, "worst": worst}

    require_valid("vab_tasks", pa.Table.from_pylist([row("a"), row("b", n=2, worst=None)], schema=VAB_TASKS))
    bad = pa.Table.from_pylist([row("a"), row("a"), row("c", n=7, best=7), row("d", domain="sculpture")], schema=VAB_TASKS)
    with pytest.raises(ValidationFailed) as info:
        require_valid("vab_tasks", bad)
    text = str(info.value)
    for what in ("expect_compound_columns_to_be_unique", "n_images", "best", "domain"):
        assert what in text, (what, text)


def test_release_reads_only_its_own_bytes_and_files(settings, src, tmp_path):
    """An image struct with a path and no bytes is read only from inside the release's folder
    (after symlinks): a private file elsewhere, reached by an absolute path, by ``..`` or by a
    symlink inside the folder pointing out, is refused by task and path and never cached
    (issue 24 item 8). Paths inside the folder, symlinks that stay inside included, still load."""
    import os

    import pyarrow as pa
    from typer.testing import CliRunner

    from flows.cli import app
    from tasks.vab.sets import import_any

    private = tmp_path / "private"
    _png(private / "secret.png", (201, 13, 77))
    secret = (private / "secret.png").read_bytes()
    release = tmp_path / "release"
    (release / "data").mkdir(parents=True)
    _png(release / "images" / "inside.png", (10, 120, 240))
    os.symlink(private / "secret.png", release / "data" / "out-link.png")
    os.symlink(release / "images" / "inside.png", release / "data" / "in-link.png")
    b = {i: (src / f"img{i}.png").read_bytes() for i in range(1, 4)}
    img = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    paths = {"absolute": str(private / "secret.png"), "dotdot": "../../private/secret.png", "symlink": "out-link.png",
             "inside": "../images/inside.png", "in-link": "in-link.png"}
    rows = {"task_id": list(paths), "domain": ["photograph"] * len(paths), "substyle": [None] * len(paths),
            "n_images": [2] * len(paths),
            "images": [[{"bytes": b[1 + i % 3], "path": "x.png"}, {"bytes": None, "path": p}] for i, p in enumerate(paths.values())],
            "labels": [["A", "B"]] * len(paths), "ground_truth_best": ["A"] * len(paths), "ground_truth_worst": ["B"] * len(paths)}
    pq.write_table(pa.table({k: (pa.array(v, pa.list_(img)) if k == "images" else v) for k, v in rows.items()}),
                   release / "data" / "test-00000-of-00001.parquet")

    with pytest.raises(BadSets) as info:
        import_any(settings, release, "leaky")
    bad = info.value.problems
    assert set(bad) == {"'absolute'", "'dotdot'", "'symlink'"}, bad
    for task in ("absolute", "dotdot", "symlink"):
        assert paths[task] in bad[f"'{task}'"] and "outside the release folder" in bad[f"'{task}'"], bad

    r = CliRunner().invoke(app, ["vab", "import-sets", str(release), "--name", "leaky", "--skip-bad"])
    assert r.exit_code == 0, r.output
    rejected = [ln for ln in r.output.splitlines() if ln.startswith("rejected task")]
    assert len(rejected) == 3 and all("outside the release folder" in ln for ln in rejected), r.output
    assert [t.task_id for t in load_sets(settings, "leaky")] == ["inside", "in-link"]
    cached = [p for p in settings.home.rglob("*") if p.is_file() and p.stat().st_size == len(secret)]
    assert not any(p.read_bytes() == secret for p in cached)  # the private image never reached the workspace
    inside = (release / "images" / "inside.png").read_bytes()
    assert [p.read_bytes() for t in load_sets(settings, "leaky") for p in image_paths(settings, t)][1::2] == [inside, inside]


def test_a_colleagues_release_cannot_fetch_my_private_image(settings, src, other_user, reachable_tmp):
    """The shared-server form of the attack (issue 24 item 8): a second local account puts a
    release in a shared folder, with a symlink to a private image of mine that it cannot read
    itself; the release's image struct names the link and carries no bytes. Importing the release
    must not copy my image into my workspace (from where a report would publish it)."""
    import os

    import pyarrow as pa

    from tasks.vab.sets import import_any
    from tests.otheruser import umask

    victim = reachable_tmp / "victim"
    with umask(0o022):
        _png(victim / "private" / "secret.png", (3, 141, 59))
    (victim / "private").chmod(0o700)
    (victim / "private" / "secret.png").chmod(0o600)
    assert not other_user.can_read(victim / "private" / "secret.png")
    release = reachable_tmp / "shared-release"
    (release / "data").mkdir(parents=True)
    b = {i: (src / f"img{i}.png").read_bytes() for i in range(1, 3)}
    img = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"task_id": ["t1"], "domain": ["photograph"], "substyle": [None], "n_images": [3],
                      "images": pa.array([[{"bytes": b[1], "path": "a.png"}, {"bytes": b[2], "path": "b.png"},
                                           {"bytes": None, "path": "cover.png"}]], pa.list_(img)),
                      "labels": [["A", "B", "C"]], "ground_truth_best": ["A"], "ground_truth_worst": ["B"]})
    pq.write_table(table, release / "data" / "test-00000-of-00001.parquet")
    for p in (release, release / "data", *(release / "data").iterdir()):
        os.chown(p, other_user.uid, other_user.gid)
    planted = other_user.run("import os, sys\nos.symlink(sys.argv[1], sys.argv[2])\n",
                             str(victim / "private" / "secret.png"), str(release / "data" / "cover.png"))
    assert planted.returncode == 0, planted.stderr
    assert (release / "data" / "cover.png").lstat().st_uid == other_user.uid

    with pytest.raises(BadSets) as info:
        import_any(settings, release, "shared")
    assert list(info.value.problems) == ["'t1'"] and "'cover.png' is outside the release folder" in info.value.problems["'t1'"]
    secret = (victim / "private" / "secret.png").read_bytes()
    assert not [p for p in settings.home.rglob("*") if p.is_file() and p.read_bytes() == secret]
