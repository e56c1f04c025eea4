"""A study records the panel database it was opened in, and every later command refuses another
one, naming both (without passwords), before reading or writing anything there (issue 16 item 7:
a missing IMAGEBENCH_PANEL_DATABASE made `study status` create an empty panel.sqlite and `study
open` issue new links and replace the blinded images of the PostgreSQL panel). Read-only commands
create no database. Through the real CLI, against SQLite files and a real PostgreSQL server."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tasks.panel.db import StoreMismatch
from tests.panel.conftest import REPO, TOOLS, beauty_prompt_ids, write_study, write_tool_images
from tests.panel.test_postgres import PASSWORD, _cli, _settings

STUDY = "lab-study"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("IMAGEBENCH_PANEL_DATABASE", raising=False)
    for tool in TOOLS:
        write_tool_images(tmp_path / "objects", tool, beauty_prompt_ids())
    write_study(_settings(tmp_path, None), STUDY, [("j1", "photographers"), ("j2", "aphantasia")])
    return tmp_path


def _fingerprint(d: Path) -> dict[str, str]:
    """Every file of the study folder (blinded images, plan, record) by content."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


def _refused(r, *names: str) -> str:
    assert r.exit_code == 1, r.output
    line = " ".join(r.output.split())
    assert "StoreMismatch" in line and all(n in line for n in names), line
    assert PASSWORD not in r.output and "Traceback" not in r.output
    return line


def test_a_missing_setting_cannot_open_a_second_panel_of_a_postgres_study(home, pg_server):
    """The issue's case: a study opened in PostgreSQL, then every command run without (or with a
    mistyped) IMAGEBENCH_PANEL_DATABASE. Each refuses, naming both databases; no panel.sqlite
    appears, the mistyped database stays empty, no link is issued, no file of the study changes."""
    from tasks.beauty.sources import collect_answers, load_study_context
    from tasks.beauty.panel import create_app

    db = pg_server.new_database()
    url = pg_server.url(db, password=PASSWORD)
    r = _cli(home, "study", "open", STUDY, "--url", "http://panel.example", database=url)
    assert r.exit_code == 0, r.output
    d = home / "studies" / STUDY
    record = json.loads((d / "panel-store.json").read_text())
    before = _fingerprint(d)
    answered = _answer_one(home, url)
    theirs = pg_server.url(db)  # as the record names it: no password
    ours = f"sqlite:///{d.resolve() / 'panel.sqlite'}"
    typo = pg_server.new_database("typo")
    missing = pg_server.url("no_such_database", password=PASSWORD)  # a typo naming no database at all
    for database, named in [(None, ours), (pg_server.url(typo, password=PASSWORD), pg_server.url(typo)),
                            (missing, pg_server.url("no_such_database"))]:
        for cmd in (["study", "status", STUDY], ["study", "open", STUDY, "--url", "http://panel.example"],
                    ["study", "relink", STUDY, "--judge", "j1", "--url", "http://panel.example"],
                    ["study", "close", STUDY]):
            r = _cli(home, *cmd, database=database)
            line = _refused(r, theirs, named, record["store_id"])
            assert "/j/" not in r.stdout and "admin:" not in r.stdout, line
        settings = _settings(home, database)
        with pytest.raises(StoreMismatch, match="lives in panel database"):
            create_app(settings, STUDY)  # `panel serve`
        with pytest.raises(StoreMismatch, match="lives in panel database"):  # what analyze, export, simulate read
            collect_answers(settings, load_study_context(settings, STUDY))
    assert not (d / "panel.sqlite").exists() and pg_server.tables(typo) == []
    assert _fingerprint(d) == before  # blinded images, pre-registration, record: untouched
    # Pointed at its own database again, the study is as it was: open, its one answer kept.
    r = _cli(home, "study", "status", STUDY, "--format", "json", database=url)
    assert r.exit_code == 0 and "open" in r.output and f"{answered} of" in r.output, r.output


def _answer_one(home: Path, url: str) -> int:
    from tasks.beauty.store import PanelStore

    store = PanelStore.open(home / "studies" / STUDY, database=url)
    try:
        item = store.next_item("j1")
        assert store.record_answer("j1", item.position, item.image_id, True)
        return store.answer_count()
    finally:
        store.dispose()


def test_a_sqlite_study_refuses_a_postgres_setting_and_creates_nothing_there(home, pg_server):
    """The other way round: opened in its own panel.sqlite, then run with a PostgreSQL URL set."""
    r = _cli(home, "study", "open", STUDY)
    assert r.exit_code == 0, r.output
    d = home / "studies" / STUDY
    before = _fingerprint(d)
    other = pg_server.new_database()
    for cmd in (["study", "status", STUDY], ["study", "open", STUDY], ["study", "close", STUDY]):
        _refused(_cli(home, *cmd, database=pg_server.url(other, password=PASSWORD)),
                 f"sqlite:///{d.resolve() / 'panel.sqlite'}", pg_server.url(other), "no panel store there")
    assert pg_server.tables(other) == [] and _fingerprint(d) == before


def test_a_moved_workspace_keeps_its_study(home, tmp_path_factory):
    """The record names the database by its id: the same panel.sqlite under another path is still
    the study's (a workspace moved or restored elsewhere); a copy of another study's is not."""
    assert _cli(home, "study", "open", STUDY).exit_code == 0
    moved = tmp_path_factory.mktemp("moved") / "ws"
    os.rename(home, moved)
    r = _cli(moved, "study", "status", STUDY, "--format", "json")
    assert r.exit_code == 0 and '"j2"' in r.stdout, r.output
    # Another study's database put in its place: refused.
    write_study(_settings(moved, None), "other", [("k1", "photographers")])
    assert _cli(moved, "study", "open", "other").exit_code == 0
    d = moved / "studies" / STUDY
    os.replace(moved / "studies" / "other" / "panel.sqlite", d / "panel.sqlite")
    _refused(_cli(moved, "study", "status", STUDY), "store id")


def test_read_only_commands_create_no_database(home, pg_server):
    """A study never opened: `study status` reports it defined and creates nothing, neither a
    panel.sqlite nor tables in a PostgreSQL database it is pointed at."""
    d = home / "studies" / STUDY
    r = _cli(home, "study", "status", STUDY)
    assert r.exit_code == 0 and "defined" in r.output, r.output
    empty = pg_server.new_database()
    r = _cli(home, "study", "status", STUDY, database=pg_server.url(empty))
    assert r.exit_code == 0 and "defined" in r.output, r.output
    r = _cli(home, "study", "close", STUDY)
    assert r.exit_code == 1 and "never opened" in r.output
    assert sorted(p.name for p in d.iterdir()) == ["study.yaml"] and pg_server.tables(empty) == []


def test_open_never_overwrites_a_study_opened_elsewhere_without_a_record(home):
    """A study opened by an imagebench that kept no record (its database now out of reach): `open`
    refuses rather than blind again and issue new links; nothing of the folder changes."""
    assert _cli(home, "study", "open", STUDY).exit_code == 0
    d = home / "studies" / STUDY
    os.remove(d / "panel-store.json")
    os.replace(d / "panel.sqlite", home / "elsewhere.sqlite")
    for p in d.glob("panel.sqlite-*"):
        p.unlink()
    before = _fingerprint(d)
    r = _cli(home, "study", "open", STUDY)
    assert r.exit_code == 1 and "no record of the panel database" in r.output and "/j/" not in r.stdout, r.output
    r = _cli(home, "study", "status", STUDY)  # not shown as an empty "defined" study
    assert r.exit_code == 1 and "was opened" in r.output and "does not hold it" in r.output, r.output
    assert _fingerprint(d) == before and not (d / "panel.sqlite").exists()


def test_a_vab_study_refuses_another_database(home, pg_server):
    """The VAB expert panel keeps the same rule (same engine, same record)."""
    import io

    from PIL import Image

    from schemas.vab import VabTask
    from tasks.vab.panel import open_store, open_vab_study

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, "PNG")
    tasks = [VabTask(task_id="t1", domain="photography", images=["a", "b"], best=1)]
    db = pg_server.new_database()
    settings = _settings(home, pg_server.url(db, password=PASSWORD))
    open_vab_study(settings, "v1", "sets", tasks, ["x1"], read_image=lambda t, i: buf.getvalue())
    with pytest.raises(StoreMismatch) as info:
        open_store(_settings(home, None), "v1")
    msg = str(info.value)
    assert pg_server.url(db) in msg and "vab_studies/v1/panel.sqlite" in msg and PASSWORD not in msg
    with pytest.raises(StoreMismatch):
        open_vab_study(_settings(home, None), "v1", "sets", tasks, ["x1"], read_image=lambda t, i: buf.getvalue())
    assert not (home / "vab_studies" / "v1" / "panel.sqlite").exists()
    store = open_store(settings, "v1")
    assert store.exists() and store.progress()[0]["total"] == 2  # rank + score of its one task
    store.dispose()
