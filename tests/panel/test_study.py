"""Study definition, pinned beauty suite, pre-registration, blinding, orders, tokens, the store."""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3

import pytest
from PIL import Image

from tasks.beauty.prereg import commitment, read_order_secret
from tasks.beauty.study import StudyError, judge_order, load_definition, load_study, open_study
from tasks.panel.blind import BLIND_LONG_SIDE, blind_image, metadata_markers_in
from tasks.panel.store import StoreUnavailable
from tasks.beauty.store import PanelStore
from tests.panel.conftest import REPO, TOOLS, beauty_prompt_ids, make_settings, stamped_jpeg, stamped_png, write_study, write_tool_images


def test_beauty_suite_is_pinned_and_published(tmp_path):
    from tasks.beauty.suite import load_beauty_suite, parse_beauty_suite
    from tasks.scores.reference import SuiteTampered
    from tasks.scores.suite import SuiteError

    suite = load_beauty_suite(REPO / "reference")
    assert suite.version == "beauty-index-v1" and len(suite.prompts) == 10
    assert suite.prompts[1].prompt == "Grief, but in color"
    ref = tmp_path / "reference"
    shutil.copytree(REPO / "reference", ref, ignore=shutil.ignore_patterns("golden-v1"))
    path = ref / "suite-beauty-index-v1.jsonl"
    original = path.read_bytes()
    path.write_bytes(original.replace(b'"joy-unposed"', b'"joy-unposed-2"'))
    with pytest.raises(SuiteTampered):
        load_beauty_suite(ref)
    with pytest.raises(SuiteError, match="10 published prompts"):
        parse_beauty_suite(original.replace(b"Joy, unposed", b"Joy, posed"), "beauty-index-v1")


@pytest.mark.parametrize("data", [stamped_png("zebra-gen-9", 3), stamped_jpeg("zebra-gen-9", 4)])
def test_blinding_strips_metadata_and_fixes_the_encoding(data):
    assert metadata_markers_in(data)  # the inputs do carry what generators stamp
    out = blind_image(data)
    assert metadata_markers_in(out.data) == [] and b"zebra" not in out.data.lower()
    with Image.open(io.BytesIO(out.data)) as im:
        assert im.format == "JPEG" and max(im.size) == BLIND_LONG_SIDE and im.mode == "RGB"
        assert "icc_profile" not in im.info and "exif" not in im.info and im.getexif() == {}


def test_study_file_errors_name_the_input(tmp_path):
    bad = tmp_path / "study.yaml"
    bad.write_text("study_id: s1\ntools: [a, b]\njudges: [{label: j1, group: astronauts}]\n")
    with pytest.raises(StudyError, match=r"study.yaml: .*unknown panel group.*astronauts"):
        load_definition(bad)
    bad.write_text("study_id: s1\ntools: [a, b]\nhost_tool: c\njudges: [{label: j1, group: aphantasia}]\n")
    with pytest.raises(StudyError, match=r"host_tool names tool\(s\) \['c'\]"):
        load_definition(bad)


def test_open_refuses_tools_missing_images_naming_them(tmp_path):
    settings = make_settings(tmp_path)
    ids = beauty_prompt_ids()
    write_tool_images(tmp_path / "objects", TOOLS[0], ids)
    write_tool_images(tmp_path / "objects", TOOLS[1], ids, skip={ids[2], ids[5]})
    (tmp_path / "objects" / "models" / TOOLS[0] / f"{ids[0]}.png").write_bytes(b"\x89PNG not an image")
    write_study(settings, "s-missing", [("j1", "photographers")])
    with pytest.raises(StudyError) as info:
        open_study(settings, "s-missing")
    msg = str(info.value)
    a, b = sorted([ids[2], ids[5]])
    assert f"{TOOLS[1]}: {a} (missing), {b} (missing)" in msg and f"{TOOLS[0]}: {ids[0]} (quarantined" in msg
    d = tmp_path / "studies" / "s-missing"
    assert not (d / "preregistration.json").exists() and not (d / "images").exists()
    # Nothing of the study was written: no database, no record of one.
    assert PanelStore.find(d) is None and not (d / "panel.sqlite").exists() and not (d / "panel-store.json").exists()


def test_open_preregisters_once_orders_per_judge_and_hashes_tokens(tmp_path):
    settings = make_settings(tmp_path)
    for tool in TOOLS:
        write_tool_images(tmp_path / "objects", tool, beauty_prompt_ids())
    write_study(settings, "s1", [("j1", "photographers"), ("j2", "aphantasia"), ("j3", "aphantasia")])
    opened = open_study(settings, "s1")
    d = opened.study_dir
    prereg_path = d / "preregistration.json"
    assert not os.access(prereg_path, os.W_OK) or os.geteuid() == 0
    assert (d / "SHA256SUMS").read_text().endswith("  preregistration.json\n")
    # The orders' secret stays private (0600); the plan publishes only its sha256 (issue 16 item 4).
    plan = json.loads(prereg_path.read_text())
    assert "order_seed" not in plan and plan["order_commitment"] == commitment(read_order_secret(d))
    assert read_order_secret(d) not in prereg_path.read_text() and (d / "order-secret").stat().st_mode & 0o077 == 0
    with pytest.raises(StudyError, match="already open"):
        open_study(settings, "s1")
    # Orders: reproducible from the recorded seed, different per judge, each a permutation.
    store = PanelStore.open(d)
    rows = store.image_rows()
    canonical = [r["image_id"] for r in rows]  # sorted by (tool, prompt)
    queues = {label: store.queue_of(label) for label in ("j1", "j2", "j3")}
    for label, q in queues.items():
        assert q == judge_order(read_order_secret(d), label, canonical)
        assert sorted(q) == sorted(canonical)
    assert len({tuple(q) for q in queues.values()}) == 3
    # Blinded files named by opaque ids only; tokens stored hashed, never in clear.
    assert sorted(p.stem for p in (d / "images").iterdir()) == sorted(canonical)
    db = b"".join(p.read_bytes() for p in d.glob("panel.sqlite*"))
    for token in [opened.admin_token, *opened.judge_tokens.values()]:
        assert token.encode() not in db
    # The plan holds: an edited pre-registration or study.yaml is refused by name.
    (d / "study.yaml").write_text((d / "study.yaml").read_text() + "title: changed\n")
    with pytest.raises(StudyError, match="study.yaml changed after the study was opened"):
        load_study(settings, "s1")
    os.chmod(prereg_path, 0o644)
    prereg_path.write_text(prereg_path.read_text().replace('"H1"', '"H1 "'))
    with pytest.raises(StudyError, match="preregistration.json was modified"):
        load_study(settings, "s1")


def test_locked_database_refuses_cleanly_then_records(panel_study):
    store = PanelStore.open(panel_study.study_dir, busy_timeout_s=0.2)
    item = store.next_item("a00")
    blocker = sqlite3.connect(panel_study.study_dir / "panel.sqlite", timeout=0.1)
    blocker.isolation_level = None
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreUnavailable, match="nothing was saved"):
            store.record_answer("a00", item.position, item.image_id, True)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert store.record_answer("a00", item.position, item.image_id, True) is True
    assert store.progress_of("a00")[0] == 1


def test_cli_study_init_open_status_close(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app

    for tool in TOOLS:
        write_tool_images(tmp_path / "objects", tool, beauty_prompt_ids())
    monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path))
    monkeypatch.setenv("IMAGEBENCH_REFERENCE_DIR", str(REPO / "reference"))
    monkeypatch.delenv("IMAGEBENCH_STORE", raising=False)
    runner = CliRunner()
    r = runner.invoke(app, ["study", "init", "cli-study", "--host-tool", TOOLS[1]])
    assert r.exit_code == 0, r.output
    # The images come in two aspects: no open without a decision on their shape (issue 27 item 7).
    r = runner.invoke(app, ["study", "open", "cli-study", "--url", "http://panel.example"])
    assert r.exit_code == 1 and "cannot open" in r.output and "blinding:" in r.output, r.output
    path = tmp_path / "studies" / "cli-study" / "study.yaml"
    path.write_text(path.read_text() + 'blinding: {shape: letterbox, aspect: "1:1"}\n')
    r = runner.invoke(app, ["study", "open", "cli-study", "--url", "http://panel.example"])
    assert r.exit_code == 0, r.output
    assert "blinding report" in r.output and "no tool can be told apart" in r.output
    links = [line for line in r.stdout.splitlines() if "http://panel.example/" in line]
    assert len(links) == 21 and links[-1].startswith("admin: http://panel.example/admin/")
    r = runner.invoke(app, ["study", "open", "cli-study"])
    assert r.exit_code == 1 and "already open" in r.output
    r = runner.invoke(app, ["study", "status", "cli-study", "--format", "json"])
    assert r.exit_code == 0 and '"photographers-01"' in r.stdout
    r = runner.invoke(app, ["study", "close", "cli-study"])
    assert r.exit_code == 0 and "cli-study closed" in r.output
    r = runner.invoke(app, ["study", "open", "no-such"])
    assert r.exit_code == 1 and "study file not found" in r.output


def _png(size, mode="RGB", color=(30, 140, 200)) -> bytes:
    im = Image.new(mode, size, color if mode == "RGB" else (*color, 90))
    im.paste((250, 250, 250) if mode == "RGB" else (250, 250, 250, 255), (5, 5, size[0] // 2, size[1] // 3))
    out = io.BytesIO()
    im.save(out, "PNG")
    return out.getvalue()


def test_blinding_puts_every_tool_on_one_canvas_and_reports_before_and_after():
    """Three tools as the issue found them (1024x1024, 1024x768 with alpha, 585x1024): after
    blinding every file is the same square JPEG of the same byte size; the report says so."""
    from tasks.panel.blind import BACKGROUND, blind_study, image_facts

    sources = ([("square", _png((1024, 1024), color=(10 * i, 90, 60))) for i in range(3)]
               + [("wide", _png((1024, 768), "RGBA", (200, 20 * i, 10))) for i in range(3)]
               + [("tall", _png((585, 1024), color=(40, 40, 30 * i))) for i in range(3)])
    served, report = blind_study(sources)
    facts = [image_facts(tool, data) for (tool, _), data in zip(sources, served)]
    assert {(f.width, f.height, f.alpha, f.format) for f in facts} == {(BLIND_LONG_SIDE, BLIND_LONG_SIDE, False, "JPEG")}
    assert len({len(d) for d in served}) == 1 and report.leaks == []
    with Image.open(io.BytesIO(served[3])) as im:  # the wide one: letterbox bands of the neutral grey
        top = im.convert("RGB").getpixel((BLIND_LONG_SIDE // 2, 3))
        assert all(abs(a - b) <= 3 for a, b in zip(top, BACKGROUND))
    text = "\n".join(report.lines)
    assert "wide: before: sizes 1024x768 x3; aspect 4:3 x3; alpha 3/3" in text
    assert "tall: after:  sizes 1024x1024 x3; aspect 1:1 x3; alpha 0/3" in text
    assert "no tool can be told apart" in text
    assert any("letterbox bands show the source aspect" in w for w in report.warnings)


def test_blinding_report_names_a_tool_still_told_apart():
    from tasks.panel.blind import ImageFacts, blinding_report

    def f(tool, w=1024, h=1024, alpha=False, n=5000):
        return ImageFacts(tool, w, h, alpha, n, "JPEG")

    same = [f("a"), f("a"), f("b"), f("b")]
    assert blinding_report(same, same, []).leaks == []
    sized = [f("a"), f("a", 1024, 768), f("b"), f("b")]
    assert blinding_report(sized, sized, []).leaks == ["a by size (1024x768 only in its images)", "a by aspect ratio (4:3 only in its images)"]
    heavy = [f("a", n=5000), f("a", n=5100), f("b", n=9000), f("b", n=9100)]
    assert blinding_report(heavy, heavy, []).leaks == ["a and b by bytes (5000-5100 vs 9000-9100)"]
    overlapping = [f("a", n=5000), f("a", n=9500), f("b", n=9000), f("b", n=9100)]
    assert blinding_report(overlapping, overlapping, []).leaks == []
    alpha = [f("a", alpha=True), f("b")]
    assert "a by alpha (alpha only in its images)" in blinding_report(alpha, alpha, []).leaks


def test_open_refuses_when_blinding_leaves_a_tool_recognisable(tmp_path, monkeypatch):
    """The open itself refuses, before any pre-registration or link exists, when the served files
    still tell a tool apart (here: a blinder that keeps one tool's size)."""
    import tasks.panel.blind as blind

    settings = make_settings(tmp_path)
    for tool in TOOLS:
        write_tool_images(tmp_path / "objects", tool, beauty_prompt_ids())
    write_study(settings, "leaky", [("j1", "photographers")])
    real = blind.blind_image
    calls = {"n": 0}

    def leaky(data, long_side=BLIND_LONG_SIDE, **shape):
        calls["n"] += 1  # the second tool's images come out at another size
        return real(data, long_side if calls["n"] <= 10 else 512, **shape)

    monkeypatch.setattr(blind, "blind_image", leaky)
    with pytest.raises(StudyError, match=r"cannot open: blinding leaves a tool recognisable: .*quokka-diffusion by size \(512x512 only in its images\)"):
        open_study(settings, "leaky")
    d = tmp_path / "studies" / "leaky"
    assert not (d / "preregistration.json").exists() and not (d / "images").exists()
    assert PanelStore.find(d) is None and not (d / "panel.sqlite").exists()


def test_a_panel_database_from_before_the_qc_columns_is_upgraded_in_place(tmp_path):
    """A study opened by an earlier version (no image_served_at columns) keeps working: the
    columns are added, its earlier answers read as 'no QC evidence'."""
    db = tmp_path / "old" / "panel.sqlite"
    db.parent.mkdir()
    con = sqlite3.connect(db)
    con.executescript("""
      CREATE TABLE panel_queue (study_id VARCHAR(64) NOT NULL, label VARCHAR(64) NOT NULL, position INTEGER NOT NULL,
        image_id VARCHAR(64) NOT NULL, shown_at BIGINT, PRIMARY KEY (study_id, label, position));
      CREATE TABLE panel_answers (study_id VARCHAR(64) NOT NULL, label VARCHAR(64) NOT NULL, position INTEGER NOT NULL,
        image_id VARCHAR(64) NOT NULL, answer BOOLEAN NOT NULL, shown_at BIGINT NOT NULL, answered_at BIGINT NOT NULL,
        memo_id VARCHAR(64), PRIMARY KEY (study_id, label, position));
      INSERT INTO panel_answers VALUES ('old', 'j1', 0, 'img0000000', 1, 1, 2, NULL);""")
    con.commit()
    con.close()
    store = PanelStore.open(db.parent)
    try:
        cols = {r[1] for r in sqlite3.connect(db).execute("PRAGMA table_info(panel_answers)")}
        assert "image_served_at" in cols
        assert "image_served_at" in {r[1] for r in sqlite3.connect(db).execute("PRAGMA table_info(panel_queue)")}
        from tasks.panel.store import add_missing_columns
        from tasks.beauty.store import metadata

        assert add_missing_columns(store.engine, metadata) == []  # once is enough
    finally:
        store.dispose()
