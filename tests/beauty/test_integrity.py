"""Issue 16 items 3, 6 and 12 through the real commands.

- 3: `study analyze` (the real Prefect flow) finishes on a panel whose judges stopped halfway or
  never started, and on a study of one answer; export then works with the options that keep
  every published judge from being unique (issue 27 item 2), and refuses the study of one judge.
- 6: `study open` is refused on a study that already has answers; answers that predate the
  pre-registration mark the study "not pre-registered" on the leaderboard, the report page and
  the datasheet, and such a bundle cannot be imported as pre-registered.
- 12: `study analyze` ends by printing the hypotheses' verdicts.
"""

from __future__ import annotations

import csv
import json
from datetime import timedelta
from pathlib import Path

from tests.beauty.panel_helpers import JUDGES, TOOLS, cli, open_and_answer, workspace, write_definition


def _answer(label: str, tool: str, prompt: str) -> bool:
    return (len(label) + len(tool) * 3 + len(prompt)) % 3 != 0


def test_partial_panel_and_one_answer_analyse_then_export(prefect_harness, tmp_path, monkeypatch):
    workspace(tmp_path / "home", monkeypatch)
    judges = JUDGES + [("tbi-survivors-01", "tbi-survivors")]
    settings_env = {"photographers-02": 13, "aphantasia-02": 0, "tbi-survivors-01": 2}  # stopped, never started, stopped
    from schemas.settings import load_settings

    settings = load_settings()
    open_and_answer(settings, "partial", _answer, judges=judges, stop_after=settings_env)
    r = cli("study", "analyze", "--study", "partial", "--mixed-resamples", "8")
    assert r.exit_code == 0, r.output
    # item 12: the verdicts come last, after the leaderboard
    out = r.stdout
    assert all(t in out for t in TOOLS) and all(f"H{i}" in out for i in range(1, 6))
    assert out.rindex("H5") > max(out.rindex(t) for t in TOOLS)
    assert any(v in out[out.index("H1"):] for v in ("not tested", "supported"))
    # Issue 27 item 2: as collected, every judge is unique (two by their answer count, two alone in
    # their group); withheld partial judges, merged groups and no times publish the other two.
    r = cli("study", "export", "--study", "partial", "--out", str(tmp_path / "bundle-partial"))
    assert r.exit_code == 1 and "export refused: 4 of 4 judges would be unique" in " ".join(r.output.split()), r.output
    assert not (tmp_path / "bundle-partial").exists()
    r = cli("study", "export", "--study", "partial", "--out", str(tmp_path / "bundle-partial"), "--drop-partial-judges",
            "--merge-groups", "photographers+aphantasia", "--times", "none")
    assert r.exit_code == 0, r.output

    # a study of one answer: every hypothesis says why it was not tested; nothing crashes
    open_and_answer(settings, "one", _answer, stop_after={label: (1 if i == 0 else 0) for i, (label, _) in enumerate(JUDGES)})
    r = cli("study", "analyze", "--study", "one", "--mixed-resamples", "3")
    assert r.exit_code == 0, r.output
    hyps = json.loads(cli("sql", "SELECT hypothesis, verdict, detail FROM study_hypotheses WHERE study_id = 'one' "
                                 "ORDER BY hypothesis", "--format", "json").stdout)
    assert [h["verdict"] for h in hyps] == ["not tested"] * 5 and all(h["detail"] for h in hyps)
    assert "two tools, two prompts and two judges" in hyps[2]["detail"]
    r = cli("study", "export", "--study", "one", "--out", str(tmp_path / "bundle-one"), "--times", "none")
    assert r.exit_code == 1 and "a study of one judge cannot be published anonymously" in " ".join(r.output.split())


def _csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["judge", "group", "tool", "prompt_id", "answer", "shown_at", "answered_at"])
        w.writeheader()
        w.writerows(rows)
    return path


def _early_rows(settings) -> list[dict]:
    from tasks.beauty.suite import load_beauty_suite

    prompts = [p.prompt_id for p in load_beauty_suite(settings.reference_dir).prompts]
    return [{"judge": label, "group": group, "tool": tool, "prompt_id": pid, "answer": "yes" if (j + k + t) % 2 else "no",
             "shown_at": f"2026-03-0{j + 1}T10:{k:02d}:00Z", "answered_at": f"2026-03-0{j + 1}T10:{k:02d}:05Z"}
            for j, (label, group) in enumerate(JUDGES) for t, tool in enumerate(TOOLS) for k, pid in enumerate(prompts)]


def test_open_is_refused_once_a_study_has_answers(tmp_path, monkeypatch):
    settings = workspace(tmp_path / "home", monkeypatch)
    d = write_definition(settings, "early")
    r = cli("study", "import-answers", str(_csv(tmp_path / "a.csv", _early_rows(settings))), "--study", "early")
    assert r.exit_code == 0, r.output
    r = cli("study", "open", "early")
    assert r.exit_code == 1 and "already has 120 answers" in r.output and "cannot be opened now" in r.output
    assert not (d / "preregistration.json").exists() and not (d / "images").exists() and not (d / "panel.sqlite").exists()


def test_answers_that_predate_the_plan_are_marked_not_preregistered_everywhere(tmp_path, monkeypatch):
    """Opened (pre-registered) today, then answers imported that were given in March: the plan
    postdates the data. Leaderboard, report page and datasheet say "not pre-registered", and
    the bundle cannot pass as a pre-registered study elsewhere."""
    from tasks.report.study import build_study_pages
    from tests.beauty.panel_helpers import analyse

    settings = workspace(tmp_path / "home", monkeypatch)
    open_and_answer(settings, "late-plan", _answer, stop_after={label: 0 for label, _ in JUDGES}, opened_ago=timedelta(hours=1))
    r = cli("study", "import-answers", str(_csv(tmp_path / "a.csv", _early_rows(settings))), "--study", "late-plan")
    assert r.exit_code == 0, r.output
    tables = analyse(settings, "late-plan")
    assert any("120 of 120 answers predate the pre-registration" in n for n in tables.notes)
    table = cli("study", "leaderboard", "--study", "late-plan")
    assert table.exit_code == 0 and "not pre-registered" in table.stdout and "predate the pre-registration" in table.output
    board = json.loads(cli("study", "leaderboard", "--study", "late-plan", "--format", "json").stdout)
    assert board and all(b["preregistered"] is False for b in board)
    (link,) = build_study_pages(settings, tmp_path / "site")
    page = (tmp_path / "site" / link.page).read_text()
    assert "NOT pre-registered" in page and "answers predate the pre-registration" in page
    # Each judge answered on a day of their own: only the times withheld keep them apart (issue 27 item 2).
    r = cli("study", "export", "--study", "late-plan", "--out", str(tmp_path / "bundle"), "--times", "none")
    assert r.exit_code == 0, r.output
    sheet = (tmp_path / "bundle" / "datasheet.md").read_text()
    assert "**Not pre-registered.**" in sheet and "written once at open" not in sheet
    # Another lab cannot import it as a pre-registered study.
    workspace(tmp_path / "other", monkeypatch, tools=())
    r = cli("study", "import-bundle", str(tmp_path / "bundle"))
    assert r.exit_code == 1 and "refused: not pre-registered: 120 of 120 answers predate" in r.output


def test_a_native_pre_registered_study_says_so(tmp_path, monkeypatch):
    from tests.beauty.panel_helpers import analyse

    settings = workspace(tmp_path / "home", monkeypatch)
    open_and_answer(settings, "clean", _answer, stop_after={label: 10 for label, _ in JUDGES})
    tables = analyse(settings, "clean")
    assert not any("pre-registered" in n for n in tables.notes)
    board = json.loads(cli("study", "leaderboard", "--study", "clean", "--format", "json").stdout)
    assert all(b["preregistered"] is True for b in board)


def test_simulated_answers_of_an_opened_study_follow_its_plan(tmp_path, monkeypatch):
    """make demo's path: open, then SIMULATED answers; they start an hour after the plan, so the
    demo study stays pre-registered (only SIMULATED is on its outputs)."""
    import yaml

    from tasks.beauty.simulate import record_simulated_answers
    from tasks.beauty.study import open_study
    from tests.beauty.panel_helpers import analyse

    settings = workspace(tmp_path / "home", monkeypatch)
    d = write_definition(settings, "sim")
    data = yaml.safe_load((d / "study.yaml").read_text())
    (d / "study.yaml").write_text(yaml.safe_dump({**data, "simulated": True}))
    open_study(settings, "sim")
    assert record_simulated_answers(settings, "sim") == len(JUDGES) * len(TOOLS) * 10
    tables = analyse(settings, "sim")
    assert any(n.startswith("SIMULATED") for n in tables.notes)
    assert not any("pre-registered" in n for n in tables.notes)
