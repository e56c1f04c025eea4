"""Publishing a Beauty Index study: import-answers, the `study-analyze` flow into the lake and the
DuckDB views, `study leaderboard`, the export bundle and the report page.

One real Prefect flow run (module fixture ``published``, answers imported from a CSV) serves the
lake/leaderboard/export/report tests; the panel-store path (answers, tokens and a consented memo
recorded through tasks/beauty/store.py) runs the same units without a second flow run.
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from schemas.study import PUBLISHED_GROUPS

TOOLS = ("tool-alpha", "tool-beta", "tool-gamma")
YES_SHARE = {"tool-alpha": 0.8, "tool-beta": 0.5, "tool-gamma": 0.2}
GROUPS = ("photographers", "aphantasia", "art-therapists")
LABELS = [f"Zorro-Label-{i:02d}" for i in range(6)]  # distinctive: the bundle is scanned for them
STUDY = "lab-x"
# Study text that Markdown would turn into a live link, an image or HTML (issue 24 item 7): the
# datasheet must show it as text.
HOSTILE_TITLE = 'Lab X [open me](http://evil.example/?t) <a href="http://evil.example/?a">here</a> | ![i](http://evil.example/i.png)'
HOSTILE_CRITERIA = "picked *by hand* [see](http://evil.example/?c) <img src=http://evil.example/x.png> | two"
FORMULA = '=HYPERLINK("http://evil.example/?x","open me")'


def _cli(*args: str):
    from flows.cli import app

    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def _settings(home: Path, mp: pytest.MonkeyPatch):
    from schemas.settings import load_settings

    mp.setenv("IMAGEBENCH_HOME", str(home))
    for key in ("IMAGEBENCH_STORE", "IMAGEBENCH_CONFIG", "IMAGEBENCH_PANEL_DATABASE", "IMAGEBENCH_REFERENCE_DIR"):
        mp.delenv(key, raising=False)
    return load_settings()


def _init(settings, study_id: str = STUDY, tools=TOOLS) -> Path:
    """A study.yaml for the tools, with the smallest allowed resampling (the numbers are not the test)."""
    from tasks.beauty.study import init_study

    path = init_study(settings, study_id, list(tools), host_tool=tools[-1])
    data = yaml.safe_load(path.read_text())
    data["analysis"] = {"bootstrap_resamples": 100, "permutations": 100}
    path.write_text(yaml.safe_dump(data))
    return path


def _prompt_ids() -> list[str]:
    from schemas.settings import load_settings
    from tasks.beauty.suite import load_beauty_suite

    return [p.prompt_id for p in load_beauty_suite(load_settings().reference_dir).prompts]


def _answer_rows() -> list[dict]:
    """Judge j says yes to (tool, prompt k) when (j + k) mod 10 < 10 * share: known % yes per pair."""
    rows = []
    for j, label in enumerate(LABELS):
        for tool in TOOLS:
            for k, pid in enumerate(_prompt_ids()):
                yes = (j + k) % 10 < 10 * YES_SHARE[tool]
                rows.append({"judge": label, "group": GROUPS[j % 3], "tool": tool, "prompt_id": pid,
                             "answer": "yes" if yes else "no", "shown_at": f"2026-03-0{j + 1}T10:{k:02d}:00Z",
                             "answered_at": f"2026-03-0{j + 1}T10:{k:02d}:04+00:00"})
    return rows


def _write_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def _expected_index(rows: list[dict]) -> dict[str, float]:
    """Beauty Index by hand: mean over prompts of the (tool, prompt) % yes."""
    out = {}
    for tool in TOOLS:
        rates = []
        for pid in _prompt_ids():
            pair = [r for r in rows if r["tool"] == tool and r["prompt_id"] == pid]
            rates.append(100 * sum(r["answer"] == "yes" for r in pair) / len(pair))
        out[tool] = sum(rates) / len(rates)
    return out


@pytest.fixture(scope="module")
def published(prefect_harness, tmp_path_factory):
    """A study run elsewhere: answers imported from a CSV, analysed by one real `study-analyze`
    flow run, exported, and its report page written."""
    from flows.beauty import study_analyze_flow
    from tasks.report.study import build_study_pages

    root = tmp_path_factory.mktemp("published")
    with pytest.MonkeyPatch.context() as mp:
        settings = _settings(root / "home", mp)
        path = _init(settings)
        data = yaml.safe_load(path.read_text())
        data["title"] = HOSTILE_TITLE
        data["groups"] = [{"name": g, "description": d, **({"selection_criteria": HOSTILE_CRITERIA} if g == "aphantasia" else {})}
                          for g, d in PUBLISHED_GROUPS.items()]
        path.write_text(yaml.safe_dump(data))
        rows = _answer_rows()
        imported = _cli("study", "import-answers", str(_write_csv(root / "answers.csv", rows)), "--study", STUDY)
        summary = study_analyze_flow(STUDY, mixed_resamples=3)
        # each judge answered on a day of their own: no times, or every judge would be unique (issue 27)
        exported = _cli("study", "export", "--study", STUDY, "--out", str(root / "bundle"), "--times", "none")
        links = build_study_pages(settings, root / "report")
        board = _cli("study", "leaderboard", "--study", STUDY, "--format", "json")
        sql = _cli("sql", f"SELECT source, count(*) AS n FROM study_answers WHERE study_id = '{STUDY}' GROUP BY source",
                   "--format", "json")
        yield {"root": root, "settings": settings, "rows": rows, "imported": imported, "summary": summary,
               "exported": exported, "links": links, "board": board, "sql": sql}


def test_import_refuses_bad_rows_naming_the_line_and_records_nothing(tmp_path, monkeypatch):
    from tasks.beauty.tables import partition_path
    from tasks.lake.tables import Lake

    settings = _settings(tmp_path / "home", monkeypatch)
    _init(settings)
    good = _answer_rows()[:4]
    cases = {
        "group": ({"group": "astronauts"}, "group 'astronauts' is not a panel group"),
        "tool": ({"tool": "tool-omega"}, "tool 'tool-omega' is not a tool of study"),
        "prompt_id": ({"prompt_id": "not-a-prompt"}, "prompt_id 'not-a-prompt' is not in suite beauty-index-v1"),
        "answer": ({"answer": "maybe"}, "answer 'maybe' must be yes or no"),
        "shown_at": ({"shown_at": "2026-03-01 10:00:00"}, "has no UTC offset"),
        "answered_at": ({"answered_at": "2026-03-01T09:00:00Z"}, "is before shown_at"),
        "judge": ({"judge": "../etc"}, "judge label '../etc' must match"),
    }
    for name, (change, message) in cases.items():
        rows = [dict(r) for r in good]
        rows[2].update(change)  # line 4 of the file (header is line 1)
        r = _cli("study", "import-answers", str(_write_csv(tmp_path / f"{name}.csv", rows)), "--study", STUDY)
        assert r.exit_code == 1, name
        assert f"{name}.csv:4:" in r.output and message in r.output, (name, r.output)
    dup = good + [dict(good[1])]
    r = _cli("study", "import-answers", str(_write_csv(tmp_path / "dup.csv", dup)), "--study", STUDY)
    assert r.exit_code == 1 and "dup.csv:6:" in r.output and "already answered" in r.output and "line 3" in r.output
    assert not partition_path(Lake(settings.lake_dir), "study_answers", STUDY).exists()


def test_flow_writes_lake_tables_and_views(published):
    assert published["imported"].exit_code == 0, published["imported"].output
    rows, summary = published["rows"], published["summary"]
    assert summary["answers"] == len(rows) and summary["judges"] == len(LABELS) and summary["source"] == "import"
    assert any("not pre-registered" in n for n in summary["notes"])  # imported: never opened
    from tasks.beauty.tables import read_study_partition
    from tasks.lake.tables import Lake

    lake = Lake(published["settings"].lake_dir)
    index = {r["tool"]: r for r in read_study_partition(lake, "study_index", STUDY).to_pylist() if r["panel_group"] == "all"}
    for tool, expected in _expected_index(rows).items():
        assert index[tool]["beauty_index"] == pytest.approx(expected)
        assert index[tool]["beauty_index_lo"] <= expected <= index[tool]["beauty_index_hi"]
    assert read_study_partition(lake, "study_rates", STUDY).num_rows == len(TOOLS) * 10
    hyps = read_study_partition(lake, "study_hypotheses", STUDY).to_pylist()
    assert [h["hypothesis"] for h in hyps] == ["H1", "H2", "H3", "H4", "H5"]
    # The DuckDB view beside the ImageBench ones answers through `imagebench sql`.
    assert published["sql"].exit_code == 0, published["sql"].output
    assert json.loads(published["sql"].output) == [{"source": "import", "n": len(rows)}]


def test_study_leaderboard_json(published):
    r = published["board"]
    assert r.exit_code == 0, r.output
    board = json.loads(r.stdout)
    expected = _expected_index(published["rows"])
    assert [b["tool"] for b in board] == sorted(TOOLS, key=lambda t: -expected[t])
    table = _cli("study", "leaderboard", "--study", STUDY).stdout
    for b in board:
        assert {"tool", "beauty_index", "beauty_index_lo", "beauty_index_hi", "answers"} <= set(b)
        assert b["beauty_index"] == round(expected[b["tool"]], 1) and b["answers"] == len(LABELS) * 10
        # issue 16 item 12: JSON rounds as the table prints (one decimal), never 39.937500000000114
        for key in ("beauty_index", "beauty_index_lo", "beauty_index_hi"):
            assert b[key] == round(b[key], 1) and len(repr(b[key]).split(".")[-1]) == 1
        assert f"{b['beauty_index']:.1f} [{b['beauty_index_lo']:.1f}, {b['beauty_index_hi']:.1f}]" in table
        assert b["preregistered"] is False  # imported: never opened (issue 16 item 6)
    assert "not pre-registered" in table
    assert "SIMULATED" not in r.output


def _assert_bundle_clean(bundle: Path, secrets: list[str]) -> None:
    sums = (bundle / "SHA256SUMS").read_text().splitlines()
    files = sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file() and p.name != "SHA256SUMS")
    assert sorted(line.split("  ", 1)[1] for line in sums) == files
    for line in sums:
        digest, name = line.split("  ", 1)
        data = (bundle / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, name
        for secret in secrets:
            assert secret.encode() not in data, (name, secret)


def test_export_bundle_is_anonymous_and_complete(published):
    assert published["exported"].exit_code == 0, published["exported"].output
    bundle = published["root"] / "bundle"
    salt = (published["settings"].home / "studies" / STUDY / "judge-salt").read_text().strip()
    _assert_bundle_clean(bundle, [*LABELS, salt, "127.0.0.1", str(published["settings"].home)])
    answers = pq.read_table(bundle / "answers.parquet")
    assert answers.num_rows == len(published["rows"])
    assert set(answers.column_names) >= {"judge_id", "panel_group", "prompt_id", "tool", "answer", "shown_at", "answered_at"}
    with open(bundle / "answers.csv", newline="") as fh:
        assert sum(1 for _ in csv.DictReader(fh)) == len(published["rows"])
    sheet = (bundle / "datasheet.md").read_text()
    assert "CC-BY-4.0" in sheet and "not pre-registered" in sheet and "| photographers |" in sheet
    assert "judges" not in json.loads((bundle / "study.json").read_text())  # labels are identities in the making


def test_report_page(published):
    (link,) = published["links"]
    page = (published["root"] / "report" / link.page).read_text()
    for needle in ('id="hm-yes"', 'id="hm-groups"', 'id="bi-bars"', 'id="hypotheses-table"', "not pre-registered",
                   *TOOLS, *(f'data-hypothesis="H{i}"' for i in range(1, 6))):
        assert needle in page, needle
    assert "Zorro-Label" not in page


def test_panel_answers_flow_to_tables_and_export_without_tokens(tmp_path, monkeypatch):
    """Answers recorded through the panel store (with a memo kept with consent) are what the
    analysis reads; the bundle carries no token, label, IP, nor the memo (not consented for
    publication)."""
    from tasks.beauty import publish
    from tasks.beauty.sources import collect_answers, load_study_context
    from tasks.beauty.study import memo_key, open_study
    from tasks.beauty.store import PanelStore
    from tasks.runs.units_ingest import open_configured_store
    from tests.flows.conftest import image_bytes

    settings = _settings(tmp_path / "home", monkeypatch)
    tools = ("tool-alpha", "tool-beta")
    store = open_configured_store(settings)
    for t, tool in enumerate(tools):
        for k, pid in enumerate(_prompt_ids()):
            store.write(f"models/{tool}/{pid}.png", image_bytes(100 * t + k, side=64))
    path = _init(settings, tools=tools)
    data = yaml.safe_load(path.read_text())
    data["judges"] = [{"label": "Zorro-Label-A", "group": "photographers"}, {"label": "Zorro-Label-B", "group": "aphantasia"}]
    path.write_text(yaml.safe_dump(data))
    opened = open_study(settings, STUDY)
    panel = PanelStore.open(opened.study_dir, study_id=STUDY)
    try:
        for j, label in enumerate(("Zorro-Label-A", "Zorro-Label-B")):
            while (item := panel.next_item(label)) is not None:
                memo_id = None
                if j == 0 and item.position == 0:
                    memo_id, key = "m" * 32, memo_key(STUDY, "m" * 32, "webm")
                    store.write(key, b"\x1aE\xdf\xa3 webm memo bytes")
                    panel.record_memo(label, 0, memo_id, key, "audio/webm", 22)
                panel.record_answer(label, item.position, item.image_id, (item.position + j) % 3 == 0, memo_id)
    finally:
        panel.dispose()
    ctx = load_study_context(settings, STUDY)
    answers = collect_answers(settings, ctx)
    assert answers.num_rows == 2 * len(tools) * 10 and set(answers.column("source").to_pylist()) == {"panel"}
    tables = publish.analyze(settings, ctx, answers, mixed_resamples=2)
    publish.validate(tables)
    publish.write(settings, tables)
    # one study, one source: an import into a study whose panel has answers is refused
    r = _cli("study", "import-answers", str(_write_csv(tmp_path / "a.csv", _answer_rows()[:2])), "--study", STUDY)
    assert r.exit_code == 1 and "already has 40 answers from its panel app" in r.output
    # two judges in two groups, each alone in theirs: published as one group (issue 27 item 2)
    r = _cli("study", "export", "--study", STUDY, "--out", str(tmp_path / "bundle"), "--times", "none",
             "--merge-groups", "photographers+aphantasia")
    assert r.exit_code == 0, r.output
    bundle = tmp_path / "bundle"
    # the memo was kept with the judge's consent, not consented for publication: it stays here (issue 27 item 1)
    assert not (bundle / "memos").exists()
    assert "1 memo(s) were kept by the lab with the judge's consent" in (bundle / "datasheet.md").read_text()
    exported = pq.read_table(bundle / "answers.parquet").to_pylist()
    assert "memo_file" not in exported[0] and "memo" not in exported[0]
    assert "image_id" not in exported[0]  # opaque ids stay with the panel
    secrets = ["Zorro-Label", opened.admin_token, *opened.judge_tokens.values(), "127.0.0.1",
               (opened.study_dir / "judge-salt").read_text().strip(), str(settings.home)]
    _assert_bundle_clean(bundle, secrets)


def test_simulated_answers_are_labelled_and_kept_apart():
    from schemas.study import StudyDefinition
    from tasks.beauty.demo_study import demo_definition
    from tasks.beauty.publish import check_answers
    from tasks.beauty.simulate import simulate_answers
    from tasks.beauty.sources import StudyContext

    d = demo_definition()
    prompts = _prompt_ids()
    sim = simulate_answers(d, prompts, "s" * 64)
    assert sim.num_rows == len(d.judges) * len(d.tools) * len(prompts)
    assert set(sim.column("source").to_pylist()) == {"simulated"}
    assert sim.equals(simulate_answers(d, prompts, "s" * 64))  # deterministic
    real = StudyDefinition.model_validate({**d.model_dump(), "simulated": False})
    ctx = StudyContext(real, None, Path("."), prompts, {p: p for p in prompts}, "0" * 64)
    with pytest.raises(Exception, match="simulated=False"):
        check_answers(ctx, sim)  # simulated answers never score a real study
    with pytest.raises(ValueError, match="simulated: true"):
        simulate_answers(real, prompts, "s" * 64)


def test_bars_svg_escapes_tool_names():
    from tasks.report.svg import beauty_index_bars

    svg = beauty_index_bars([{"tool": "<script>x</script>", "beauty_index": 40.0, "beauty_index_lo": 30.0,
                             "beauty_index_hi": 50.0, "answers": 3}])
    assert "<script>" not in svg and "&lt;script&gt;" in svg and 'data-value="40.0000"' in svg


# ---- issue 24 item 7: exports that open in a spreadsheet, or render as Markdown -----------------

@pytest.mark.parametrize("where", ["title", "group name", "group description", "selection criteria", "question", "tool"])
def test_study_text_that_a_spreadsheet_would_run_is_refused_at_the_door(tmp_path, monkeypatch, where):
    """A name or text of study.yaml beginning like a formula (=, +, -, @, tab, CR) is refused when
    the study is loaded, in one line naming the file and the field: it would be published in
    answers.csv, beauty_index.csv, study.json and datasheet.md."""
    settings = _settings(tmp_path / "home", monkeypatch)
    path = _init(settings)
    data = yaml.safe_load(path.read_text())
    groups = [{"name": g, "description": d} for g, d in PUBLISHED_GROUPS.items()]
    if where == "title":
        data["title"] = FORMULA
    elif where == "question":
        data["question"] = "@SUM(1+1)*cmd|' /C calc'!A0"
    elif where == "group name":
        groups[0]["name"] = FORMULA
        data["judges"] = [dict(j, group=FORMULA) if j["group"] == "photographers" else j for j in data["judges"]]
    elif where == "group description":
        groups[1]["description"] = "+" + FORMULA[1:]
    elif where == "selection criteria":
        groups[2]["selection_criteria"] = "\t=1+2"
    else:
        data["tools"] = [*data["tools"], "-2+3+cmd"]
    data["groups"] = groups
    path.write_text(yaml.safe_dump(data))
    rows = _answer_rows()
    r = _cli("study", "import-answers", str(_write_csv(tmp_path / "answers.csv", rows)), "--study", STUDY)
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.output.splitlines() if str(path) in ln]
    assert len(lines) == 1 and ("formula" in lines[0] or "must match" in lines[0]), r.output
    assert not (settings.lake_dir / "study_answers").exists()  # nothing recorded


def test_datasheet_shows_study_text_as_text(published):
    """The datasheet is Markdown that Zenodo or GitHub renders: the study's own text (title, group
    texts) is escaped so that no link, image or HTML of it comes alive; the words stay visible."""
    from markdown_it import MarkdownIt

    sheet = (published["root"] / "bundle" / "datasheet.md").read_text()
    html = MarkdownIt("commonmark").enable("table").render(sheet)
    assert "evil.example" in html  # the text is there, as text
    assert "<a " not in html and "<img" not in html, html
    assert "open me" in html and "*by hand*" in html
    table = [ln for ln in sheet.splitlines() if ln.startswith("| aphantasia |")]
    assert len(table) == 1 and table[0].count(" | ") == 3  # a | in the text does not add a column
    study = json.loads((published["root"] / "bundle" / "study.json").read_text())
    assert study["title"] == HOSTILE_TITLE  # JSON keeps the text as written (no spreadsheet runs JSON)


def test_bundle_tables_run_nothing_in_a_spreadsheet(tmp_path):
    """The bundle's CSV writer (answers.csv, beauty_index.csv ... : tasks.beauty.export._csv) on
    text a spreadsheet would run (a prompt of a lab's own suite can begin with anything), opened in
    LibreOffice Calc: no formula, the text behind a quote, numbers (a negative one too) as numbers,
    absent as an empty cell."""
    import pyarrow as pa

    from tasks.beauty.export import _csv
    from tests.libreoffice import open_csv

    table = pa.table({"prompt": [FORMULA, "@SUM(1+1)", "a still life"], "tool": ["tool-alpha", "tool-beta", "tool-gamma"],
                      "effect": [-0.5, 12.25, None], "answer": [True, False, None]})
    path = tmp_path / "t.csv"
    path.write_text(_csv(table), encoding="utf-8")
    header, *rows = open_csv(path)
    assert [c.text for c in header] == ["prompt", "tool", "effect", "answer"]
    assert not [c for row in rows for c in row if c.formula]
    assert [r[0].text for r in rows] == ["'" + FORMULA, "'@SUM(1+1)", "a still life"]
    assert [(r[2].value_type, r[2].value) for r in rows[:2]] == [("float", "-0.5"), ("float", "12.25")]
    assert [r[3].text for r in rows[:2]] == ["yes", "no"] and len(rows[2]) == 2  # absent: empty cells
