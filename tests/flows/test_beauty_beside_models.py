"""Issue 26 item 2: a Beauty Index study beside the ImageBench models in one store.

The README put a study's images at `models/<tool>/<prompt_id>.png`, where ImageBench models live:
after a study with tools a,b,c the nightly (and `make demo`) exited 1 with a traceback per tool
("no model 'a': no objects under .../models/a/; did you mean 'a'?"). Each protocol now has its own
place (docs/STORAGE.md), and a nightly that meets a folder under models/ that is not a model of its
suite skips it with one line, counted in the run record.

Everything here runs for real: the `imagebench` command in its own process (its own embedded
Prefect API), the tiny HPSv3 model, a local store laid out as the README says.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.flows.conftest import IMAGEBENCH, REPO, eligible_ids, image_bytes, put_model, runs_of

BEAUTY_SUITE = "suite-beauty-index-v1.jsonl"


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "IMAGEBENCH_DEBUG"}
    env.update(IMAGEBENCH_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", COLUMNS="10000")
    return env


def _run(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*IMAGEBENCH, *args], cwd=REPO, env=_env(home), capture_output=True, text=True, timeout=600)


def readme_beauty_layout() -> str:
    """Where the README's "Running a real Beauty Index study" tells a lab to put a tool's images,
    e.g. ``beauty/beauty-index-v1/<tool>/<prompt_id>.png``: the test puts them exactly there."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Running a real Beauty Index study", 1)[1].split("\n## ", 1)[0]
    (layout,) = set(re.findall(r"`([A-Za-z0-9_./<>-]*<tool>/<prompt_id>\.png)`", section))
    return layout


def pin_beauty_suite(reference_dir: Path) -> list[str]:
    """The workspace's reference dir holds the Beauty suite too (as the repository's reference/ and
    a demo workspace's do); returns its prompt ids."""
    from tasks.beauty.suite import load_beauty_suite
    from tasks.scores.reference import pin_suite

    shutil.copyfile(REPO / "reference" / BEAUTY_SUITE, reference_dir / BEAUTY_SUITE)
    pin_suite(reference_dir, reference_dir / BEAUTY_SUITE)
    return [p.prompt_id for p in load_beauty_suite(reference_dir).prompts]


def put_tool(objects: Path, layout: str, tool: str, prompt_ids: list[str], seed: int) -> dict[str, str]:
    """A tool's images at ``layout``; returns prompt id -> sha256 of the bytes written."""
    shas = {}
    for k, pid in enumerate(prompt_ids):
        path = objects / layout.replace("<tool>", tool).replace("<prompt_id>", pid)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = image_bytes(seed * 100 + k, side=64)
        path.write_bytes(data)
        shas[pid] = hashlib.sha256(data).hexdigest()
    return shas


def test_a_beauty_study_beside_the_models_opens_from_its_place_and_the_nightly_skips_what_is_no_model(built_reference):
    from schemas.settings import load_settings
    from tasks.beauty.study import open_panel_store

    home, objects, reference = built_reference
    beauty_ids = pin_beauty_suite(reference.parent)
    layout = readme_beauty_layout()
    assert not layout.startswith("models/"), f"the README still puts a study's images among the models: {layout}"
    # The study's three tools where the README says, as a lab following it would.
    placed = {tool: put_tool(objects, layout, tool, beauty_ids, seed=10 + t) for t, tool in enumerate("abc")}
    # A study made before: tool a's images in the old place (other bytes), beauty-index prompt ids.
    put_tool(objects, "models/<tool>/<prompt_id>.png", "a", beauty_ids, seed=90)
    # A stray folder whose objects name no prompt at all.
    (objects / "models" / "notes").mkdir()
    (objects / "models" / "notes" / "readme.txt").write_text("upload instructions\n")
    # And a real model, new since the reference was built.
    put_model(objects, "lab-x", eligible_ids()[:6], seed=41)

    init = _run(home, "study", "init", "s1", "--tools", "a,b,c", "--host-tool", "a")
    assert init.returncode == 0, init.stderr
    opened = _run(home, "study", "open", "s1", "--url", "https://panel.example")
    assert opened.returncode == 0, opened.stderr
    assert "/j/" in opened.stdout
    # The blinded images are the new place's bytes, not the old folder's.
    settings = load_settings()
    store = open_panel_store(settings, "s1")
    try:
        rows = store.image_rows()
    finally:
        store.dispose()
    assert {(r["tool"], r["prompt_id"], r["source_sha256"]) for r in rows} == {
        (tool, pid, sha) for tool, shas in placed.items() for pid, sha in shas.items()}

    nightly = _run(home, "nightly", "--format", "json")
    output = nightly.stdout + nightly.stderr
    assert nightly.returncode == 0, output
    assert "Traceback" not in output and "did you mean" not in output
    # One line per skipped folder, naming it and why.
    about_a = [line for line in output.splitlines() if "models/a/" in line]
    assert len(about_a) == 1, about_a
    assert "beauty-index-v1" in about_a[0] and layout.split("<tool>")[0] + "a/" in about_a[0], about_a
    about_notes = [line for line in output.splitlines() if "models/notes/" in line]
    assert len(about_notes) == 1 and "imagebench-v1" in about_notes[0], about_notes
    rows = json.loads(nightly.stdout)
    assert [r["model_id"] for r in rows] == ["lab-x"] and rows[0]["eps_prompts_scored"] == 6
    record = runs_of(settings)[-1]
    assert (record["flow"], record["status"], record["errors"]) == ("nightly", "completed", [])
    assert record["models_new"] == ["lab-x"] and record["models_invalid"] == ["a", "notes"]
    assert "a" not in {m for d in ("new", "errored", "up_to_date") for m in record[f"models_{d}"]}


def test_a_folder_that_is_no_model_is_refused_by_score_with_why_not_a_spelling_of_itself(built_reference):
    """`score --model a` on a study's tool left under models/: one line saying what the folder is
    (it used to say "no model 'a' ...; did you mean 'a'?"), checked before Prefect starts, and the
    same from inside the flow (the backfill deployment's path)."""
    import pytest

    from flows.pipeline import RunFailed, score_model_flow
    from tasks.runs.models import _suggestion

    home, objects, reference = built_reference
    beauty_ids = pin_beauty_suite(reference.parent)
    put_tool(objects, "models/<tool>/<prompt_id>.png", "a", beauty_ids, seed=90)
    r = _run(home, "score", "--model", "a")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert "models/a/ is not a model of imagebench-v1" in lines[0] and "beauty/beauty-index-v1/a/" in lines[0], lines
    assert "did you mean" not in lines[0] and "Traceback" not in r.stdout + r.stderr
    with pytest.raises(RunFailed, match=r"a: NotAModel: models/a/ is not a model of imagebench-v1: none of its 10 objects"):
        score_model_flow("a")
    assert not (home / "lake" / "images" / "model_id=a").exists()
    # A real spelling mistake is still named, never the id itself.
    assert _suggestion("Base-A", ["Base-A", "base-a"]) == "did you mean 'base-a'?"
    assert "'a'" not in _suggestion("a", ["a", "b"])


def _flat(text: str) -> str:
    return "".join(text.split())  # the terminal may wrap a long line anywhere


def _fresh_workspace(root: Path, monkeypatch):
    from schemas.settings import load_settings

    monkeypatch.setenv("IMAGEBENCH_HOME", str(root / "home"))
    for key in ("IMAGEBENCH_STORE", "IMAGEBENCH_CONFIG", "IMAGEBENCH_PANEL_DATABASE", "IMAGEBENCH_REFERENCE_DIR"):
        monkeypatch.delenv(key, raising=False)
    return load_settings(reference_dir=REPO / "reference")


def test_study_init_and_open_read_the_beauty_place_and_a_study_defined_before_reads_the_old_one(tmp_path, monkeypatch):
    from tests.flows.test_cli import invoke

    settings = _fresh_workspace(tmp_path, monkeypatch)
    monkeypatch.setenv("IMAGEBENCH_REFERENCE_DIR", str(REPO / "reference"))
    objects = settings.home / "objects"
    from tasks.beauty.suite import load_beauty_suite

    beauty_ids = [p.prompt_id for p in load_beauty_suite(REPO / "reference").prompts]
    layout = readme_beauty_layout()
    placed = {tool: put_tool(objects, layout, tool, beauty_ids, seed=20 + t) for t, tool in enumerate(("tool-a", "tool-b"))}
    put_model(objects, "some-model", eligible_ids()[:3], seed=3)  # an ImageBench model: no tool of a study

    # init's default tools: the Beauty place's, not every model of the store.
    r = invoke("study", "init", "s-new")
    assert r.exit_code == 0, r.output
    text = (settings.home / "studies" / "s-new" / "study.yaml").read_text()
    assert "- tool-a\n- tool-b\n" in text and "some-model" not in text and "beauty/beauty-index-v1/<tool>/" in text
    r = invoke("study", "open", "s-new")
    assert r.exit_code == 0, r.output
    assert f"images of tool-a, tool-b: {objects.as_uri()}/beauty/beauty-index-v1/<tool>/" in r.stderr, r.stderr
    assert "old place" not in r.stderr

    # A study written before the change, its tools under models/ as the README said then: it
    # opens from there, and says where the images belong now.
    old = {tool: put_tool(objects, "models/<tool>/<prompt_id>.png", tool, beauty_ids, seed=40 + t)
           for t, tool in enumerate(("old-a", "old-b"))}
    assert invoke("study", "init", "s-old", "--tools", "old-a,old-b").exit_code == 0
    r = invoke("study", "open", "s-old")
    assert r.exit_code == 0, r.output
    for tool in old:
        line = next(ln for ln in r.stderr.splitlines() if ln.startswith(f"images of {tool}:"))
        assert f"{objects.as_uri()}/models/{tool}/, the old place; move them to {objects.as_uri()}/beauty/beauty-index-v1/{tool}/" in line
    from tasks.beauty.study import open_panel_store

    for study, shas in (("s-new", placed), ("s-old", old)):
        store = open_panel_store(settings, study)
        try:
            got = {(r["tool"], r["prompt_id"], r["source_sha256"]) for r in store.image_rows()}
        finally:
            store.dispose()
        assert got == {(t, p, sha) for t, by in shas.items() for p, sha in by.items()}

    # A tool with no images anywhere: refused, naming where they were looked for.
    assert invoke("study", "init", "s-none", "--tools", "tool-a,ghost").exit_code == 0
    r = invoke("study", "open", "s-none")
    assert r.exit_code == 1 and _flat("ghost: finally-understood (missing)") in _flat(r.output)
    assert _flat("kitchen-sunday-morning (missing),") in _flat(r.output)
    assert _flat("stranger-like-home (missing) (under beauty/beauty-index-v1/ghost/)") in _flat(r.output)
    assert "tool-a:" not in _flat(r.output)
    # init without tools in a store whose Beauty place is empty says where to put them.
    empty = _fresh_workspace(tmp_path / "empty", monkeypatch)
    r = invoke("study", "init", "s-x")
    assert r.exit_code == 1 and _flat(f"no tools in {(empty.home / 'objects').as_uri()}/beauty/beauty-index-v1/") in _flat(r.output)


def test_the_demo_study_puts_its_images_at_the_beauty_place_of_the_demo_store(tmp_path, monkeypatch):
    """`make demo`'s study, in the demo's own store beside its models: the nightly's models/ gets
    nothing of it, and the study opens from where the demo put the images."""
    from rich.console import Console

    from tasks.beauty.demo_study import DEMO_STUDY_ID, DEMO_STUDY_TOOLS, fill_demo_study
    from tasks.beauty.study import open_panel_store
    from tasks.runs.units_ingest import open_configured_store

    monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path / "home"))
    for key in ("IMAGEBENCH_STORE", "IMAGEBENCH_CONFIG", "IMAGEBENCH_PANEL_DATABASE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("IMAGEBENCH_REFERENCE_DIR", str(tmp_path / "reference"))
    (tmp_path / "reference").mkdir()
    from schemas.settings import load_settings

    settings = load_settings()
    assert fill_demo_study(settings, Console(file=open(os.devnull, "w")))
    store = open_configured_store(settings)
    assert store.list_models() == []  # nothing for the nightly
    assert store.list_models("beauty/beauty-index-v1/") == sorted(DEMO_STUDY_TOOLS)
    assert not (settings.home / "study-objects").exists()
    panel = open_panel_store(settings, DEMO_STUDY_ID)
    try:
        rows = panel.image_rows()
    finally:
        panel.dispose()
    assert len(rows) == 40 and {r["tool"] for r in rows} == set(DEMO_STUDY_TOOLS)


def test_the_run_record_counts_a_skipped_folder_and_its_artifact_says_why():
    from tasks.runs.record import RunRecord

    record = RunRecord(run_id="r1", flow="nightly", suite_version="imagebench-v1", reference_version="t1")
    record.mark("lab-x", "new")
    record.skip("a", "models/a/ is not a model of imagebench-v1: none of its 10 objects ...")
    row = record.row("completed")
    assert row["models_invalid"] == ["a"] and row["models_new"] == ["lab-x"] and row["errors"] == []
    assert row["models_discovered"] == 2 and not record.failed
    page = record.markdown(row)
    assert "| invalid | 1 | a |" in page
    assert "## Skipped folders (no model of the suite)\n\n- `a`: models/a/ is not a model of imagebench-v1" in page


def test_models_list_shows_a_folder_the_nightly_skips_as_no_model_with_the_nightlys_reason(built_reference):
    """`imagebench models list` used to show a study's tool left under models/ (and a stray folder)
    as state "new", as if the nightly would score it. It shows what the nightly does with each
    folder: "not a model" with the very line the nightly skips it with; a real new model stays
    "new"; a model ever ingested stays one whatever its folder holds now."""
    from schemas.settings import load_settings
    from tasks.runs import pinned, units_discover
    from tests.flows.test_cli import invoke

    home, objects, reference = built_reference
    beauty_ids = pin_beauty_suite(reference.parent)
    put_tool(objects, "models/<tool>/<prompt_id>.png", "a", beauty_ids, seed=90)
    (objects / "models" / "notes").mkdir()
    (objects / "models" / "notes" / "readme.txt").write_text("upload instructions\n")
    (objects / "models" / "hollow").mkdir()  # an empty folder, never ingested
    put_model(objects, "lab-x", eligible_ids()[:6], seed=41)

    r = invoke("models", "list", "--format", "json")
    assert r.exit_code == 0, r.output
    listed = {x["model_id"]: x for x in json.loads(r.stdout)}
    settings = load_settings()
    suite = pinned.load_pinned_suite(settings)
    plans = {p.model_id: p for p in units_discover.discover_models(
        settings, suite, pinned.load_verified_reference(settings, suite, None))}
    skipped = {m for m, p in plans.items() if p.status == "invalid"}
    assert skipped == {"a", "notes", "hollow"}, plans
    for m in skipped:
        assert listed[m]["state"] == "not a model", listed[m]
        assert listed[m]["skipped_reason"] == plans[m].detail  # the nightly's own line, word for word
    assert "beauty/beauty-index-v1/a/" in listed["a"]["skipped_reason"]
    assert listed["lab-x"]["state"] == "new" and listed["lab-x"]["skipped_reason"] is None
    assert listed["base-a"]["state"] in ("scored", "ingested") and listed["base-a"]["skipped_reason"] is None

    table = invoke("models", "list")
    assert table.exit_code == 0, table.output
    assert "notamodel" in _flat(table.stdout), table.stdout
    assert _flat("skipped by the nightly: models/a/ is not a model of imagebench-v1") in _flat(table.stdout), table.stdout
