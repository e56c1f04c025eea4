"""Headless Chromium drives two experts through both VAB protocols of the real panel app
(uvicorn on loopback): pick best/worst with the rubric shown, then 0-10 scores; one expert closes
the tab half way and resumes from the link. Then the store holds exactly what was clicked (mapped
back through each expert's permutation), the pages never named a task, the answers reach the
lake's vab_trials as human judges, and the analysis gives the hand-known numbers."""

from __future__ import annotations

import io
import socket
import threading
import time

import pytest
from PIL import Image

from schemas.vab import VabTask
from tests.tasks.report_helpers.browser import chromium_driver, find_browser

FOUND = find_browser()
pytestmark = pytest.mark.skipif(isinstance(FOUND, str), reason=FOUND if isinstance(FOUND, str) else "")

TASKS = [VabTask(task_id="photo-017", domain="photography", images=["a.png", "b.png", "c.png"], best=1, worst=3),
         VabTask(task_id="art-003", domain="fine_art", images=["d.png", "e.png"], best=2),
         VabTask(task_id="illu-042", domain="illustration", images=["f.png", "g.png", "h.png", "i.png"], best=4, worst=1)]
N = {t.task_id: len(t.images) for t in TASKS}
# What each expert means to answer, in *stored* positions (the test finds the shown slot itself).
RANK = {"e1": {"photo-017": (1, 3), "art-003": (2, None), "illu-042": (4, 1)},
        "e2": {"photo-017": (2, 3), "art-003": (2, None), "illu-042": (4, 2)}}
SCORES = {"e1": {"photo-017": [9.5, 5.0, 1.0], "art-003": [3.0, 8.2], "illu-042": [0.5, 4.0, 6.0, 9.9]},
          "e2": {"photo-017": [7.0, 6.0, 2.5], "art-003": [5.0, 5.0], "illu-042": [1.0, 1.5, 7.0, 8.0]}}


def _png(seed: int) -> bytes:
    im = Image.new("RGB", (160, 120), ((seed * 53) % 256, (seed * 97) % 256, (seed * 29) % 256))
    im.paste((255, 255, 255), (10, 10, 30 + seed * 5, 40))
    out = io.BytesIO()
    im.save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def browser():
    with chromium_driver(1400, 1000, extra_flags=(), page_load_timeout_s=30) as drv:
        yield drv


@pytest.fixture(scope="module")
def vab_study(tmp_path_factory):
    from tasks.vab.panel import open_vab_study
    from tests.panel.conftest import make_settings

    settings = make_settings(tmp_path_factory.mktemp("vab-people"))
    seeds = {(t.task_id, i): 1 + k * 7 + i for k, t in enumerate(TASKS) for i in range(len(t.images))}
    # A fixed order seed: with a random one the two experts could, rarely, draw the same orders.
    opened = open_vab_study(settings, "vab-panel-1", "demo-sets", TASKS, ["e1", "e2"],
                            read_image=lambda t, i: _png(seeds[(t.task_id, i)]), seed=20261126)
    return settings, opened


def _serve(settings, study_id):
    from tasks.panel.app import make_server
    from tasks.vab.panel import create_vab_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = make_server(create_vab_app(settings, study_id), "127.0.0.1", sock.getsockname()[1], configure_logging=False)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "VAB panel server did not start"
        time.sleep(0.02)
    return server, thread, sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


def _slots(drv, where: dict[str, tuple[str, int]]) -> tuple[str, list[int]]:
    """(task, stored positions in the shown order), read from the page's image ids."""
    srcs = [i.get_attribute("src").rsplit("/", 1)[1] for i in drv.find_elements("css selector", ".cand img")]
    tasks = {where[s][0] for s in srcs}
    assert len(tasks) == 1
    return tasks.pop(), [where[s][1] for s in srcs]


def _wait_next(drv, old_pos: int) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    def moved(d):
        if "You have answered every set" in d.page_source:
            return True
        try:
            return int(d.find_element("css selector", "input[name=position]").get_attribute("value")) == old_pos + 1
        except Exception:  # noqa: BLE001 - the page is loading
            return False

    WebDriverWait(drv, 15, poll_frequency=0.05).until(moved)


def test_two_experts_rank_then_score_resume_export_and_analysis(browser, vab_study):
    from selenium.webdriver.common.by import By
    from sqlalchemy import select

    from tasks.vab.panel import analyze_vab_study, export_trials, open_store
    from tasks.vab.store import vimages
    from tasks.vab import people

    settings, opened = vab_study
    store = open_store(settings, opened.study_id)
    with store.engine.connect() as c:
        where = {r.image_id: (r.task_id, r.stored_position) for r in c.execute(select(vimages))}
    server, thread, sock, base = _serve(settings, opened.study_id)
    drv = browser
    shown_orders: dict[str, list[list[int]]] = {"e1": [], "e2": []}
    try:
        for expert in ("e1", "e2"):
            drv.delete_all_cookies()
            drv.get(f"{base}/j/{opened.tokens[expert]}")
            for k in range(6):
                if expert == "e1" and k == 2:  # close the tab mid-study, open the link again
                    old = drv.current_window_handle
                    drv.switch_to.new_window("tab")
                    new = drv.current_window_handle
                    drv.switch_to.window(old)
                    drv.close()
                    drv.switch_to.window(new)
                    drv.get(f"{base}/j/{opened.tokens[expert]}")
                page = drv.page_source
                assert not any(t.task_id in page for t in TASKS) and ".png" not in page  # blind
                assert drv.find_element(By.ID, "progress").text == f"Set {k + 1} of 6"
                protocol = drv.find_element(By.ID, "progress").get_attribute("data-protocol")
                assert protocol == ("rank" if k < 3 else "score")
                task, order = _slots(drv, where)
                shown_orders[expert].append(order)
                rubric = drv.find_element(By.ID, "rubric").text
                assert ("Light" in rubric) == (task == "photo-017") and "personal taste" in rubric
                assert drv.execute_script("return Array.from(document.querySelectorAll('.cand img'))"
                                          ".every(i => i.complete && i.naturalWidth === 1024);")
                if protocol == "rank":
                    best, worst = RANK[expert][task]
                    if worst is not None and k == 0:  # the page refuses best == worst before sending
                        drv.find_element(By.ID, f"best-{order.index(best) + 1}").click()
                        drv.find_element(By.ID, f"worst-{order.index(best) + 1}").click()
                        drv.find_element(By.ID, "submit").click()
                        assert drv.find_element(By.ID, "check").text.startswith("The best and the worst")
                    drv.find_element(By.ID, f"best-{order.index(best) + 1}").click()
                    if worst is not None:
                        drv.find_element(By.ID, f"worst-{order.index(worst) + 1}").click()
                    else:
                        assert not drv.find_elements(By.CSS_SELECTOR, "input[name=worst]")
                else:
                    for slot, pos in enumerate(order, start=1):
                        box = drv.find_element(By.ID, f"score-{slot}")
                        box.clear()
                        box.send_keys(f"{SCORES[expert][task][pos - 1]:g}")
                drv.find_element(By.ID, "submit").click()
                _wait_next(drv, k)
            assert "You have answered every set" in drv.page_source

        drv.delete_all_cookies()
        drv.get(f"{base}/admin/{opened.admin_token}")
        assert [e.text for e in drv.find_elements(By.CSS_SELECTOR, "tr[data-expert] td.answered")] == ["6", "6"]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()

    # Each expert saw their own permutations; the store maps every answer back to stored positions.
    assert shown_orders["e1"] != shown_orders["e2"]
    rows = store.answer_rows()
    ids = {e: store.expert_id(e) for e in ("e1", "e2")}
    store.dispose()
    assert len(rows) == 12 and all(r["shown_at"] <= r["answered_at"] for r in rows)
    for e, eid in ids.items():
        got_rank = {r["task_id"]: (r["best"], r["worst"]) for r in rows if r["expert"] == eid and r["protocol"] == "rank"}
        got_scores = {r["task_id"]: r["scores"] for r in rows if r["expert"] == eid and r["protocol"] == "score"}
        assert got_rank == RANK[e] and got_scores == SCORES[e]

    # Into the lake as human judges, scored like any other judge's trials.
    assert export_trials(settings, opened.study_id) == {ids["e1"]: 3, ids["e2"]: 3}
    from tasks.lake.tables import Lake
    from tasks.vab.tables import read_partition

    trials = read_partition(Lake(settings.lake_dir), "vab_trials", "demo-sets").to_pylist()
    assert {(t["judge"], t["task_id"], t["best"], t["worst"], t["judge_kind"], t["trial"]) for t in trials} == {
        (ids[e], tid, b, w, "human", 0) for e in RANK for tid, (b, w) in RANK[e].items()}
    assert all(t["order"][t["best_shown"] - 1] == t["best"] for t in trials)

    # The analysis of what was clicked equals the pure functions on the intended answers.
    report = analyze_vab_study(settings, opened.study_id)
    rank = [{"expert": ids[e], "task_id": tid, "best": b, "worst": w} for e in RANK for tid, (b, w) in RANK[e].items()]
    score = [{"expert": ids[e], "task_id": tid, "scores": s} for e in SCORES for tid, s in SCORES[e].items()]
    assert report["leave_one_expert_out"] == people.leave_one_expert_out(rank, N)
    assert report["scores_vs_ranking"] == people.scores_vs_ranking(rank, score, N)
    e1 = next(x for x in report["scores_vs_ranking"]["experts"] if x["expert"] == ids["e1"])
    assert e1["top1_consistency"] == 100.0 and e1["mean_tau"] > 0.8
    # e2: photo top score 1 vs best 2 (no); art tied 5/5 (a tie is no choice: no); illu 4 vs 4 (yes)
    e2 = next(x for x in report["scores_vs_ranking"]["experts"] if x["expert"] == ids["e2"])
    assert e2["top1_consistency"] == pytest.approx(100 / 3, abs=1e-3)


def test_an_expert_views_one_image_full_screen_and_comes_back(browser, vab_study):
    """Thumbnails are at most 320 px; a click (or the image's number key) shows that image at its
    full size, as large as the screen allows, arrow keys step through the set, Esc/click return to
    the page with the choices made so far intact; typing a score never opens the viewer."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    from tasks.vab.panel import open_vab_study

    settings, _ = vab_study
    seeds = {(t.task_id, i): 50 + k * 7 + i for k, t in enumerate(TASKS) for i in range(len(t.images))}
    opened = open_vab_study(settings, "vab-panel-view", "demo-sets", TASKS[2:], ["v1"], protocols=("rank", "score"),
                            read_image=lambda t, i: _png(seeds[(t.task_id, i)]), seed=7)
    server, thread, sock, base = _serve(settings, opened.study_id)
    drv = browser
    state = ("return (() => { const v = document.getElementById('viewer'), i = document.getElementById('viewer-img');"
             " const r = i.getBoundingClientRect(); return {open: !v.hidden && getComputedStyle(v).display !== 'none',"
             " src: i.getAttribute('src'), w: r.width, h: r.height, left: r.left, top: r.top, right: r.right, bottom: r.bottom,"
             " vw: innerWidth, vh: innerHeight, nw: i.naturalWidth, nh: i.naturalHeight}; })()")

    def viewer(want_open: bool) -> dict:
        def ready(d) -> bool:
            st = d.execute_script(state)
            return st["open"] == want_open and (not want_open or st["nw"] > 0)

        WebDriverWait(drv, 10, poll_frequency=0.05).until(ready)
        return drv.execute_script(state)

    try:
        drv.delete_all_cookies()
        drv.get(f"{base}/j/{opened.tokens['v1']}")
        thumbs = drv.find_elements(By.CSS_SELECTOR, ".cand img")
        assert len(thumbs) == 4 and all(t.size["width"] <= 320 for t in thumbs)
        srcs = [t.get_attribute("src").rsplit("/", 1)[1] for t in thumbs]
        drv.find_element(By.ID, "best-2").click()
        drv.find_element(By.ID, "zoom-3").click()  # click: image 3 full screen
        v = viewer(True)
        assert v["src"].endswith(srcs[2]) and v["nw"] == 1024
        # as large as it is (1024 px) or as the screen allows at its aspect, far beyond the 320 px thumbnail
        fit = min(v["nw"], v["vw"], v["vh"] * v["nw"] / v["nh"])
        assert 0.9 * fit <= v["w"] <= fit + 0.5 and v["w"] > 320 and 0 <= v["left"] and v["right"] <= v["vw"] + 0.5
        assert 0 <= v["top"] and v["bottom"] <= v["vh"] + 0.5
        body = drv.find_element(By.TAG_NAME, "body")
        body.send_keys(Keys.ARROW_RIGHT)
        assert viewer(True)["src"].endswith(srcs[3])
        body.send_keys(Keys.ARROW_RIGHT)
        assert viewer(True)["src"].endswith(srcs[0])  # wraps round
        body.send_keys(Keys.ESCAPE)
        viewer(False)
        assert drv.find_element(By.ID, "best-2").is_selected()  # back on the page as it was
        assert drv.switch_to.active_element.get_attribute("id") == "zoom-1"  # focus returns to the image shown last
        body.send_keys("4")  # its number key
        assert viewer(True)["src"].endswith(srcs[3])
        drv.find_element(By.ID, "viewer").click()  # a click anywhere goes back
        viewer(False)
        drv.find_element(By.ID, "worst-1").click()
        drv.find_element(By.ID, "submit").click()
        # read in one script: the old page may be replaced between a find and a read
        WebDriverWait(drv, 15, poll_frequency=0.05).until(lambda d: d.execute_script(
            "const p = document.getElementById('progress'); return p && p.dataset.protocol;") == "score")
        box = drv.find_element(By.ID, "score-1")
        box.send_keys("2")  # typing a score is not a request to view image 2
        assert not drv.execute_script(state)["open"] and box.get_attribute("value") == "2"
        drv.find_element(By.ID, "zoom-2").send_keys(Keys.ENTER)  # keyboard on the focused image opens it too
        assert viewer(True)["src"].endswith(drv.find_elements(By.CSS_SELECTOR, ".cand img")[1].get_attribute("src").rsplit("/", 1)[1])
        drv.find_element(By.TAG_NAME, "body").send_keys(Keys.ENTER)  # a new page: a new body
        viewer(False)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
