"""A look at the results before the close is a deviation from the pre-registration, and the
bundle says so (issue 27 item 5): the panel store's record of each look (its reason, time and the
answers recorded then) reaches the open-data bundle as deviations.json and a section of the
datasheet, pinned in SHA256SUMS; a bundle of a study nobody peeked at says that none was recorded.
The page side (the admin page, `study peek`) is tests/panel/test_admin_blind.py."""

from __future__ import annotations

import hashlib
import json

from tests.beauty.panel_helpers import analyse, cli, open_and_answer, workspace

REASON = "Board asked mid-study whether any tool was failing: we looked at the % yes"


def _bundle(tmp_path, settings, study_id: str):
    from tasks.beauty.study import close_study

    close_study(settings, study_id)
    analyse(settings, study_id)
    out = tmp_path / f"bundle-{study_id}"
    r = cli("study", "export", "--study", study_id, "--out", str(out), "--times", "none")
    assert r.exit_code == 0, r.output
    sums = dict(reversed(line.split("  ", 1)) for line in (out / "SHA256SUMS").read_text().splitlines())
    return out, sums


def test_a_peek_reaches_the_bundle_as_a_deviation(tmp_path, monkeypatch):
    from tasks.beauty.study import peek_results

    settings = workspace(tmp_path / "home", monkeypatch)
    open_and_answer(settings, "peeked", lambda label, tool, prompt: tool == "tool-beta")
    dev, pairs = peek_results(settings, "peeked", REASON)
    assert dev["answers"] == 4 * 30 and sum(p["answers"] for p in pairs) == 120
    out, sums = _bundle(tmp_path, settings, "peeked")

    doc = json.loads((out / "deviations.json").read_text())
    prereg_sha = hashlib.sha256((out / "preregistration.json").read_bytes()).hexdigest()
    assert doc["format"] == "imagebench-deviations/1" and doc["preregistration_sha256"] == prereg_sha
    (d,) = doc["deviations"]
    assert (d["kind"], d["reason"], d["answers_recorded"], d["by"]) == (
        "results viewed before the close", REASON, 120, "command line")
    assert sums["deviations.json"] == hashlib.sha256((out / "deviations.json").read_bytes()).hexdigest()
    sheet = (out / "datasheet.md").read_text()
    section = sheet.split("### Deviations from the pre-registration", 1)[1].split("\n## ", 1)[0]
    assert "looked at before the panel closed, 1 time(s)" in section
    assert "results viewed before the close (command line, 120 answers recorded then)" in section
    assert "reason: Board asked mid-study whether any tool was failing: we looked at the % yes" in section

    # The study's report page carries it as a banner, with the shape decision on the plan's line.
    from tasks.report.study import build_study_pages

    build_study_pages(settings, tmp_path / "site")
    page = (tmp_path / "site" / "studies" / "peeked.html").read_text()
    assert "deviation from the pre-registration: the results were looked at 1 time(s) before the panel closed" in page
    assert "images letterbox to 1:1: the picture&#39;s shape alone tells apart 0 of 3 tools" in page


def test_a_bundle_without_a_peek_says_none_was_recorded(tmp_path, monkeypatch):
    settings = workspace(tmp_path / "home", monkeypatch)
    open_and_answer(settings, "blind", lambda label, tool, prompt: prompt < "m")
    out, sums = _bundle(tmp_path, settings, "blind")
    assert json.loads((out / "deviations.json").read_text())["deviations"] == [] and "deviations.json" in sums
    assert "None recorded: no one looked at the results before the panel closed" in (out / "datasheet.md").read_text()
    from tasks.report.study import build_study_pages

    build_study_pages(settings, tmp_path / "site")
    assert "deviation from the pre-registration" not in (tmp_path / "site" / "studies" / "blind.html").read_text()


def _resign(bundle) -> None:
    """SHA256SUMS written again over the bundle's files (a lab that edits its bundle and re-signs it)."""
    files = sorted(p for p in bundle.rglob("*") if p.is_file() and p.name != "SHA256SUMS")
    (bundle / "SHA256SUMS").write_text("".join(
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(bundle).as_posix()}\n" for p in files))


def test_an_imported_study_keeps_its_deviations_and_exports_them_again(tmp_path, monkeypatch):
    """Issue 27 item 5, carried through `study import-bundle`: the importing lab's study keeps the
    bundle's deviations, and its own export of that study writes them (deviations.json, the
    datasheet, the report's banner), not "none recorded"."""
    from tasks.beauty.study import peek_results

    settings = workspace(tmp_path / "home", monkeypatch)
    open_and_answer(settings, "peeked", lambda label, tool, prompt: tool == "tool-beta")
    peek_results(settings, "peeked", REASON)
    out, _ = _bundle(tmp_path, settings, "peeked")
    first = json.loads((out / "deviations.json").read_text())

    other = workspace(tmp_path / "other", monkeypatch, tools=())
    r = cli("study", "import-bundle", str(out))
    assert r.exit_code == 0, r.output
    analyse(other, "peeked")
    again = tmp_path / "again"
    r = cli("study", "export", "--study", "peeked", "--out", str(again), "--times", "none")
    assert r.exit_code == 0, r.output
    doc = json.loads((again / "deviations.json").read_text())
    assert doc == first  # the same record, tied to the same pre-registration
    assert doc["preregistration_sha256"] == hashlib.sha256((again / "preregistration.json").read_bytes()).hexdigest()
    sheet = (again / "datasheet.md").read_text()
    assert "looked at before the panel closed, 1 time(s)" in sheet and REASON in sheet
    from tasks.report.study import build_study_pages

    build_study_pages(other, tmp_path / "site")
    page = (tmp_path / "site" / "studies" / "peeked.html").read_text()
    assert "deviation from the pre-registration: the results were looked at 1 time(s) before the panel closed" in page


def test_a_bundle_with_a_damaged_deviations_file_is_refused_by_name(tmp_path, monkeypatch):
    """deviations.json is checked like the rest of the bundle before anything is written: a record
    of another pre-registration, or one that is not a deviations record, is one line naming it."""
    from tasks.beauty.study import peek_results

    settings = workspace(tmp_path / "home", monkeypatch)
    open_and_answer(settings, "peeked", lambda label, tool, prompt: tool == "tool-beta")
    peek_results(settings, "peeked", REASON)
    out, _ = _bundle(tmp_path, settings, "peeked")
    doc = json.loads((out / "deviations.json").read_text())
    workspace(tmp_path / "other", monkeypatch, tools=())
    for damage, message in (({"preregistration_sha256": "0" * 64}, "deviations.json: of another pre-registration"),
                            ({"deviations": [{"kind": "x"}]}, "deviations.json: deviation 1")):
        (out / "deviations.json").write_text(json.dumps({**doc, **damage}))
        _resign(out)
        r = cli("study", "import-bundle", str(out))
        assert r.exit_code == 1 and message in r.output, r.output
        assert len([ln for ln in r.output.splitlines() if ln.strip()]) == 1, r.output
        assert not (tmp_path / "other" / "studies" / "peeked").exists()
