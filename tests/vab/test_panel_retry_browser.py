"""VAB's expert page keeps an answer the server did not take and sends it again by itself, and it
lands exactly once, as the Beauty Index judge's page does (issue 26 item 1; the sender is the
panel shell's, tasks/panel/answer_js.py): headless Chromium through the real page and its script.
Twice a 503 and once a reset connection from a fault proxy in front of the app (tests/faultproxy.py),
then a real 503 of the app itself while a second process holds the SQLite store's write lock past
the busy timeout. A refusal for good (the study closed) shows its page, which says only that the
panel has ended (issue 27 item 8: no study id), and is not sent again.
Modelled on tests/panel/test_browser_retry.py."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from schemas.vab import VabTask
from tests.faultproxy import FaultProxy
from tests.panel.test_browser_retry import WAIT_S, write_lock_held
from tests.tasks.report_helpers.browser import chromium_driver, find_browser

FOUND = find_browser()
pytestmark = pytest.mark.skipif(isinstance(FOUND, str), reason=FOUND if isinstance(FOUND, str) else "")
STUDY = "vab-retry-study"
TASKS = [VabTask(task_id=f"photo-{k}", domain="photography", images=["a.png", "b.png", "c.png"], best=1, worst=3)
         for k in range(3)]


def _png(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), ((seed * 53) % 256, (seed * 97) % 256, (seed * 29) % 256)).save(out, "PNG")
    return out.getvalue()


def _position(drv) -> int | None:
    try:
        return int(drv.find_element("css selector", "input[name=position]").get_attribute("value"))
    except Exception:  # noqa: BLE001 - between two pages
        return None


def _answers(settings) -> list[tuple[int, int, int]]:
    """(position, best shown, worst shown) of every answer the store holds, in position order."""
    from sqlalchemy import select

    from tasks.vab.panel import open_store
    from tasks.vab.store import vanswers

    store = open_store(settings, STUDY)
    try:
        with store.engine.connect() as c:
            return [tuple(r) for r in c.execute(select(vanswers.c.position, vanswers.c.best_shown, vanswers.c.worst_shown)
                                                .order_by(vanswers.c.position))]
    finally:
        store.dispose()


def _pick(drv, best: int, worst: int) -> None:
    drv.find_element("id", f"best-{best}").click()
    drv.find_element("id", f"worst-{worst}").click()
    drv.find_element("id", "submit").click()


def test_the_expert_page_keeps_an_answer_the_server_did_not_take_and_sends_it_once(tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tasks.vab.panel import create_vab_app, open_store, open_vab_study
    from tests.panel.conftest import make_settings, serve

    settings = make_settings(tmp_path / "home")
    opened = open_vab_study(settings, STUDY, "demo-sets", TASKS, ["e1"], protocols=("rank",), seed=7,
                            read_image=lambda t, i: _png(int(t.task_id[-1]) * 3 + i))
    with serve(settings, STUDY, app=create_vab_app(settings, STUDY)) as served, FaultProxy(served.url) as proxy, \
            chromium_driver(1200, 900, page_load_timeout_s=WAIT_S) as drv:
        drv.get(f"{proxy.endpoint_url}/j/{opened.tokens['e1']}")
        assert _position(drv) == 0

        # 1. The proxy answers the first two POSTs 503 and resets the third: nothing reaches the
        #    app until the fourth, which the page sends by itself.
        proxy.error(503, "SlowDown", "busy", method="POST", path="/answer", times=2)
        proxy.reset(method="POST", path="/answer", times=1)
        _pick(drv, 1, 2)
        WebDriverWait(drv, WAIT_S, poll_frequency=0.1).until(lambda d: _position(d) == 1)
        assert proxy.counts["error"] == 2 and proxy.counts["reset"] == 1
        assert _answers(settings) == [(0, 1, 2)]

        # 2. The app's own 503: a second process holds the SQLite write lock past the busy timeout
        #    (10 s). The page says it is trying again; once the lock is let go, the answer lands, once.
        with write_lock_held(opened.study_dir / "panel.sqlite"):
            _pick(drv, 3, 1)
            WebDriverWait(drv, WAIT_S, poll_frequency=0.2).until(
                lambda d: "trying again" in d.find_element(By.ID, "saving").text)
            assert _position(drv) == 1  # still on its set (nothing can be recorded while the lock is held)
            assert any("POST /answer 503" in line for line in served.log.lines)
        WebDriverWait(drv, WAIT_S, poll_frequency=0.1).until(lambda d: _position(d) == 2)
        assert _answers(settings) == [(0, 1, 2), (1, 3, 1)]

        # 3. A refusal for good is not sent again: the study closes, the next answer shows why,
        #    without the study's id (issue 27 item 8).
        store = open_store(settings, STUDY)
        try:
            assert store.close() is True
        finally:
            store.dispose()
        _pick(drv, 2, 3)
        WebDriverWait(drv, WAIT_S, poll_frequency=0.1).until(lambda d: "has ended" in d.find_element(By.TAG_NAME, "body").text)
        assert drv.find_element(By.ID, "message").text.startswith("This panel has ended")
        assert STUDY not in drv.page_source
        assert len(_answers(settings)) == 2 and sum("POST /answer 409" in line for line in served.log.lines) == 1
        # The page a closed study's expert then opens says the same, and no study id either.
        drv.get(f"{proxy.endpoint_url}/expert")
        assert drv.find_element(By.ID, "message").text.startswith("This panel has ended") and STUDY not in drv.page_source
