"""Headless Chromium through whole judge sessions of the real app (Debian chromium + chromedriver,
selenium): one judge by keyboard who closes the tab half way and resumes from the link, one by
mouse who records a memo with Chromium's fake microphone; then the admin page and the study's
report page show exactly the answers the store holds. One browser for the module."""

from __future__ import annotations


import pytest

from tasks.beauty.store import PanelStore
from tests.tasks.report_helpers.browser import chromium_driver, find_browser

FOUND = find_browser()
pytestmark = pytest.mark.skipif(isinstance(FOUND, str), reason=FOUND if isinstance(FOUND, str) else "")


@pytest.fixture(scope="module")
def browser():
    fake_microphone = ("--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream")
    with chromium_driver(1200, 900, extra_flags=fake_microphone, page_load_timeout_s=30) as drv:
        yield drv


def _position(drv) -> int:
    return int(drv.find_element("css selector", "input[name=position]").get_attribute("value"))


def _wait_moved(drv, old: int, total: int) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    def moved(d):
        if "You have answered every image" in d.page_source:
            return old + 1 == total
        try:
            return _position(d) == old + 1
        except Exception:  # noqa: BLE001 - the page is loading
            return False

    WebDriverWait(drv, 15, poll_frequency=0.05).until(moved)


def _image_loaded(drv) -> bool:
    return drv.execute_script("var i=document.getElementById('stimulus');return i.complete&&(i.naturalWidth===1024||i.naturalHeight===1024);")


def test_two_judges_keyboard_resume_mouse_memo_then_admin(browser, panel_study, panel_server, prefect_harness, monkeypatch):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    drv, base = browser, panel_server.url
    total = 20
    expect: dict[str, dict[int, bool]] = {"b00": {}, "b01": {}}

    # Judge b00: Y/N keys; closes the tab after 8 answers and opens the link again in a new one.
    drv.get(f"{base}/j/{panel_study.tokens['b00']}")
    for k in range(total):
        if k == 8:
            old = drv.current_window_handle
            drv.switch_to.new_window("tab")
            new = drv.current_window_handle
            drv.switch_to.window(old)
            drv.close()
            drv.switch_to.window(new)
            drv.get(f"{base}/j/{panel_study.tokens['b00']}")
        pos = _position(drv)
        assert pos == k and drv.find_element(By.ID, "progress").text == f"Image {k + 1} of {total}"
        assert _image_loaded(drv)
        yes = k % 3 == 0
        drv.find_element(By.TAG_NAME, "body").send_keys("y" if yes else "n")
        expect["b00"][pos] = yes
        _wait_moved(drv, pos, total)
    assert "You have answered every image" in drv.page_source

    # Judge b01: mouse; a memo on the first image (fake microphone, consent ticked), stopped by hand.
    drv.delete_all_cookies()
    drv.get(f"{base}/j/{panel_study.tokens['b01']}")
    for k in range(total):
        pos = _position(drv)
        assert pos == k
        if k == 0:
            drv.find_element(By.ID, "consent").click()
            drv.find_element(By.ID, "rec").click()
            WebDriverWait(drv, 10).until(lambda d: d.find_element(By.ID, "rec").text == "Stop")
            drv.execute_script("return new Promise(r => setTimeout(r, 1200))")
            drv.find_element(By.ID, "rec").click()
            WebDriverWait(drv, 15).until(lambda d: d.find_element(By.ID, "memo-state").text == "Memo saved.")
        yes = k % 4 != 1
        drv.find_element(By.ID, "yes" if yes else "no").click()
        expect["b01"][pos] = yes
        _wait_moved(drv, pos, total)

    store = PanelStore.open(panel_study.study_dir)
    for label, answers in expect.items():
        queue = store.queue_of(label)
        got = {r.position: r for r in _rows(store, label)}
        assert {p: got[p]["answer"] for p in got} == answers
        assert all(got[p]["image_id"] == queue[p] for p in got)
    memos = [m for m in store.memo_rows() if m["label"] == "b01"]
    assert len(memos) == 1 and memos[0]["position"] == 0 and memos[0]["media_type"] in ("audio/webm", "audio/ogg")
    memo_bytes = (panel_study.settings.home / "objects" / memos[0]["object_key"]).read_bytes()
    assert 500 < len(memo_bytes) < 1_000_000

    # The admin page shows each judge's progress as the store holds it, and no result while the
    # study runs (issue 27 item 5; the results after the close: tests/panel/test_admin_blind.py).
    drv.delete_all_cookies()
    drv.get(f"{base}/admin/{panel_study.admin_token}")
    for label in expect:
        assert drv.find_element(By.CSS_SELECTOR, f'tr[data-judge="{label}"] td.answered').text == str(total)
        assert drv.find_element(By.CSS_SELECTOR, f'tr[data-judge="{label}"] td.state').text == "finished"
    assert not drv.find_elements(By.CSS_SELECTOR, "tr[data-pair]") and drv.find_elements(By.ID, "results-hidden")

    # ... and so does the report: the study is analysed by its real flow and its page read back.
    from flows.beauty import study_analyze_flow
    from tasks.report.study import build_study_pages

    settings = panel_study.settings
    for key, value in {"IMAGEBENCH_HOME": str(settings.home), "IMAGEBENCH_STORE": str(settings.store),
                       "IMAGEBENCH_REFERENCE_DIR": str(settings.reference_dir)}.items():
        monkeypatch.setenv(key, value)
    study_analyze_flow(panel_study.study_id, mixed_resamples=2)
    out = settings.home / "report-check"
    build_study_pages(settings, out)
    drv.get((out / "studies" / f"{panel_study.study_id}.html").as_uri())
    cells = drv.find_elements(By.CSS_SELECTOR, "#heatmap g.cell[data-value]")  # % yes per (tool, prompt)
    rates = sorted((c.get_attribute("data-row"), c.get_attribute("data-value"))
                   for c in cells if c.get_attribute("data-value") not in ("", "nan", None))
    expected = sorted((p["tool"], f"{100.0 * p['yes'] / p['answers']:.4f}") for p in store.pair_counts() if p["answers"])
    assert rates == expected

    # `study leaderboard` shows the index without the flagged answers beside it, as the page does
    # (issue 16 item 9): the lake's values, rounded as the table prints them.
    import json

    from typer.testing import CliRunner

    from flows.cli import app
    from tasks.beauty.tables import read_study_partition
    from tasks.lake.tables import Lake

    lake = {r["tool"]: r for r in read_study_partition(Lake(settings.lake_dir), "study_index", panel_study.study_id).to_pylist()
            if r["panel_group"] == "all"}
    board = CliRunner().invoke(app, ["study", "leaderboard", "--study", panel_study.study_id, "--format", "json"])
    assert board.exit_code == 0, board.output
    rows = json.loads(board.stdout)
    assert sum(r["flagged_answers"] for r in rows) > 0  # this study's answers are mostly flagged
    for r in rows:
        mine = lake[r["tool"]]
        assert r["flagged_answers"] == mine["flagged_answers"]
        for key in ("beauty_index_unflagged", "beauty_index_unflagged_lo", "beauty_index_unflagged_hi"):
            assert r[key] == (None if mine[key] is None else round(mine[key], 1)), (key, r, mine)
    table = CliRunner().invoke(app, ["study", "leaderboard", "--study", panel_study.study_id]).stdout
    assert "without_flagged" in table and "flagged" in table, table

    # At 1280 px, with the report's stylesheet, every hypothesis's verdict is in view without
    # scrolling sideways (issue 16 item 12).
    import shutil

    from tasks.report.build import STATIC

    shutil.copytree(STATIC, out / "static", dirs_exist_ok=True)
    drv.set_window_size(1280, 900)
    drv.get((out / "studies" / f"{panel_study.study_id}.html").as_uri())
    drv.execute_script("document.getElementById('hypotheses').scrollIntoView()")
    drv.save_screenshot(str(settings.home / "report-hypotheses-1280.png"))
    geometry = drv.execute_script("""
      var wrap = document.querySelector('#hypotheses .table-wrap');
      var box = wrap.getBoundingClientRect();
      var cells = Array.from(document.querySelectorAll('#hypotheses-table .hyp-verdict')).map(function (c) {
        var r = c.getBoundingClientRect(); return [r.left, r.right, c.textContent.trim()]; });
      return {inner: window.innerWidth, page: document.documentElement.scrollWidth, left: box.left,
              right: box.right, scroll: wrap.scrollWidth, client: wrap.clientWidth, cells: cells};""")
    assert geometry["inner"] <= 1280 and geometry["page"] <= geometry["inner"], geometry
    assert len(geometry["cells"]) == 6 and all(text for _, _, text in geometry["cells"]), geometry  # header + H1-H5
    assert all(geometry["left"] <= lo and hi <= min(geometry["right"], geometry["inner"]) for lo, hi, _ in geometry["cells"]), geometry
    assert geometry["scroll"] <= geometry["client"], geometry  # the whole table fits: no sideways scroll at all


def _rows(store: PanelStore, label: str):
    from sqlalchemy import select

    from tasks.beauty.store import answers

    with store.engine.connect() as c:
        return [r._mapping for r in c.execute(select(answers).where(answers.c.study_id == store.study_id,
                                                                    answers.c.label == label))]
