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
