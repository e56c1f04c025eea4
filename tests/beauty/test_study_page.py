"""A study's report page with answers flagged by quality control (issue 16 item 9: "the analysis
reports how many were flagged and runs with and without them"): the page shows, beside each tool's
Beauty Index, how many of its answers were flagged and the index without them, read from the
lake's ``study_index`` (``beauty_index_unflagged[_lo|_hi]``); a study with nothing flagged shows
neither. At 1280 px the table with the extra columns fits without scrolling sideways."""

from __future__ import annotations

import datetime as dt
import re
import shutil
from html import unescape
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml

TOOLS = ("tool-alpha", "tool-beta", "tool-gamma")
GROUPS = ("photographers", "aphantasia", "art-therapists")
STUDY = "qc-page"
MIN_SECONDS = 2.0
T0 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=dt.timezone.utc)


def _answers(prompt_ids: list[str]) -> pa.Table:
    """6 judges x 3 tools x every prompt. Judge j0 answered tool-alpha too fast (0.3 s < 2 s) and
    said yes to all of it; judge j1 never loaded tool-alpha's first image. Everything else was
    looked at for 4 s."""
    from schemas.study import STUDY_ANSWERS

    share = {"tool-alpha": 0.4, "tool-beta": 0.5, "tool-gamma": 0.2}
    rows = []
    for j in range(6):
        for tool in TOOLS:
            for k, pid in enumerate(prompt_ids):
                fast = j == 0 and tool == "tool-alpha"
                unseen = j == 1 and tool == "tool-alpha" and k == 0
                rows.append({"study_id": STUDY, "judge_id": f"{j:016x}", "panel_group": GROUPS[j % 3], "tool": tool,
                             "prompt_id": pid, "image_id": None, "position": None,
                             "answer": fast or (j + k) % 10 < 10 * share[tool],
                             "shown_at": T0, "answered_at": T0 + dt.timedelta(seconds=4), "memo": False, "source": "panel",
                             "image_loaded": not unseen, "seconds_on_screen": None if unseen else (0.3 if fast else 4.0),
                             "qc_flag": None})
    return pa.Table.from_pylist(rows, schema=STUDY_ANSWERS)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The study analysed by the flow's units (analyze, validate, write) and its page built."""
    from schemas.settings import load_settings
    from tasks.beauty import analysis, publish
    from tasks.beauty.sources import load_study_context
    from tasks.beauty.study import init_study
    from tasks.report.study import build_study_pages

    root = tmp_path_factory.mktemp("study-page")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMAGEBENCH_HOME", str(root / "home"))
        for key in ("IMAGEBENCH_STORE", "IMAGEBENCH_CONFIG", "IMAGEBENCH_PANEL_DATABASE", "IMAGEBENCH_REFERENCE_DIR"):
            mp.delenv(key, raising=False)
        settings = load_settings()
        path = init_study(settings, STUDY, list(TOOLS), host_tool=TOOLS[-1])
        data = yaml.safe_load(path.read_text())
        data["analysis"] = {"bootstrap_resamples": 100, "permutations": 100}
        data["quality"] = {"min_seconds_on_screen": MIN_SECONDS}
        path.write_text(yaml.safe_dump(data))
        ctx = load_study_context(settings, STUDY)
        tables = publish.analyze(settings, ctx, _answers(list(ctx.prompt_ids)), mixed_resamples=2)
        publish.validate(tables)
        publish.write(settings, tables)
        (link,) = build_study_pages(settings, root / "report")
        answers = tables.tables["study_answers"]
        plan = publish.plan_of(ctx)
        kept = analysis.beauty_index(answers.filter(pc.is_null(answers.column("qc_flag"))),
                                     plan.analysis.bootstrap_resamples, plan.analysis.seed, False)
        yield {"root": root, "settings": settings, "path": root / "report" / link.page, "tables": tables,
               "prompts": len(ctx.prompt_ids), "kept": {r["tool"]: r for r in kept.to_pylist() if r["panel_group"] == "all"}}


def _study_table(html: str) -> dict[str, dict[str, str]]:
    """#study-table as {tool: {header: cell text}}."""
    table = html.split('id="study-table"', 1)[1].split("</table>", 1)[0]
    head = [unescape(h) for h in re.findall(r"<th(?:\s[^>]*)?>(.*?)</th>", table.split("</thead>", 1)[0])]
    out = {}
    for tool, cells in re.findall(r'<tr data-tool="([^"]+)">(.*?)</tr>', table, re.S):
        out[tool] = dict(zip(head, [unescape(c) for c in re.findall(r"<td(?:\s[^>]*)?>(.*?)</td>", cells)]))
    return out


def test_page_shows_the_index_without_the_flagged_answers_beside_it(page):
    from tasks.beauty.publish import index_text

    html = page["path"].read_text()
    flagged = page["prompts"] + 1  # j0's tool-alpha answers (too fast), j1's unloaded first image
    answers = page["tables"].tables["study_answers"]
    assert sum(f is not None for f in answers.column("qc_flag").to_pylist()) == flagged
    index = {r["tool"]: r for r in page["tables"].tables["study_index"].to_pylist() if r["panel_group"] == "all"}
    shown = _study_table(html)
    assert set(shown) == set(TOOLS)
    for tool in TOOLS:
        row, cells = index[tool], shown[tool]
        assert cells["Beauty Index"] == index_text(row)
        assert cells["Flagged"] == str(flagged if tool == "tool-alpha" else 0)
        # the lake's index without them, which is the index of the kept answers ...
        assert row["beauty_index_unflagged"] == pytest.approx(page["kept"][tool]["beauty_index"])
        # ... is what the page shows beside the index, with its interval
        assert cells["Without flagged"] == index_text({"beauty_index": row["beauty_index_unflagged"],
                                                       "beauty_index_lo": row["beauty_index_unflagged_lo"],
                                                       "beauty_index_hi": row["beauty_index_unflagged_hi"]})
    # j0 said yes to all of tool-alpha in a hurry: without those answers its index is lower
    assert index["tool-alpha"]["beauty_index_unflagged"] < index["tool-alpha"]["beauty_index"]
    assert shown["tool-alpha"]["Without flagged"] != shown["tool-alpha"]["Beauty Index"]
    assert shown["tool-beta"]["Without flagged"] == shown["tool-beta"]["Beauty Index"]  # none of its answers flagged
    note = unescape(re.search(r'<p class="hint" id="qc-note">(.*?)</p>', html, re.S).group(1))
    assert f"Without the {flagged} flagged answers (of {answers.num_rows}" in " ".join(note.split())
    assert f"quality control: {flagged} of {answers.num_rows} answers flagged" in html


def test_nothing_flagged_shows_no_without_column(page):
    """The same study with no answer flagged: the page has the index alone (nothing to compare)."""
    from tasks.report.build import CSP, _env
    from tasks.report.study import study_page_context

    tables = dict(page["tables"].tables)
    index = tables["study_index"]
    tables["study_index"] = index.set_column(index.schema.get_field_index("flagged_answers"), "flagged_answers",
                                             pa.array([0] * index.num_rows, pa.int32()))
    ctx = study_page_context(STUDY, tables, STUDY, "q?", {}, [], "none")
    assert ctx["n_flagged"] == 0
    html = _env().get_template("study.html").render(title="t", meta={}, generated_at=None, csp=CSP, root="../", **ctx)
    assert "Without flagged" not in html and 'id="qc-note"' not in html
    assert set(next(iter(_study_table(html).values()))) == {"Rank", "Tool", "Beauty Index", "Answers"}


def test_study_table_with_the_without_column_fits_1280px(page):
    from tests.tasks.report_helpers.browser import chromium_driver, find_browser

    if isinstance(find_browser(), str):
        pytest.skip(find_browser())
    from tasks.report.build import STATIC

    out: Path = page["path"].parent.parent
    shutil.copytree(STATIC, out / "static", dirs_exist_ok=True)
    with chromium_driver(1280, 900, page_load_timeout_s=30) as drv:
        drv.get(page["path"].as_uri())
        geometry = drv.execute_script("""
          var wrap = document.querySelector('#beauty-index .table-wrap'), box = wrap.getBoundingClientRect();
          var cells = Array.from(document.querySelectorAll('#study-table .bi-unflagged')).map(function (c) {
            var r = c.getBoundingClientRect(); return [r.left, r.right, r.width]; });
          return {inner: window.innerWidth, page: document.documentElement.scrollWidth, right: box.right,
                  scroll: wrap.scrollWidth, client: wrap.clientWidth, cells: cells};""")
    assert geometry["inner"] <= 1280 and geometry["page"] <= geometry["inner"], geometry
    assert len(geometry["cells"]) == 1 + len(TOOLS), geometry  # the header and one per tool
    assert all(w > 0 and hi <= min(geometry["right"], geometry["inner"]) for _, hi, w in geometry["cells"]), geometry
    assert geometry["scroll"] <= geometry["client"], geometry
