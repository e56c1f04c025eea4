"""A judge's answer that the server does not take at once is kept by the page and sent again by
itself, and lands exactly once (issue 26 item 1): headless Chromium through the real page and its
script. Twice a 503 and once a reset connection from a fault proxy in front of the app
(tests/faultproxy.py), then a real 503 of the app itself while a second process holds the SQLite
store's write lock past the busy timeout. A refusal for good (a closed study) shows its page and
is not sent again."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from tasks.beauty.store import PanelStore
from tests.faultproxy import FaultProxy
from tests.panel.conftest import open_new_study, serve
from tests.tasks.report_helpers.browser import chromium_driver, find_browser

FOUND = find_browser()
pytestmark = pytest.mark.skipif(isinstance(FOUND, str), reason=FOUND if isinstance(FOUND, str) else "")
WAIT_S = 90  # bounded waits, generous for a loaded machine

# A second process holds the store's write lock (BEGIN IMMEDIATE) until its stdin closes.
HOLD_LOCK = """
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
c.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
c.execute("ROLLBACK")
"""


@contextmanager
def write_lock_held(db: Path):
    """The SQLite store ``db``'s write lock, held by a second process for the ``with`` block."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=WAIT_S)


def _position(drv) -> int | None:
    try:
        return int(drv.find_element("css selector", "input[name=position]").get_attribute("value"))
    except Exception:  # noqa: BLE001 - between two pages
        return None


def _answers(opened, label: str) -> list[dict]:
    from schemas.study import salted_judge_id

    store = PanelStore.open(opened.study_dir)
    try:
        return [r for r in store.answers_table("s").to_pylist() if r["judge_id"] == salted_judge_id("s", label)]
    finally:
        store.dispose()


def test_the_page_keeps_an_answer_the_server_did_not_take_and_sends_it_once(panel_settings):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    opened = open_new_study(panel_settings, "retry", [("r1", "photographers")], memo=False)
    with serve(panel_settings, "retry") as served, FaultProxy(served.url) as proxy, \
            chromium_driver(1200, 900, page_load_timeout_s=WAIT_S) as drv:
        drv.get(f"{proxy.endpoint_url}/j/{opened.tokens['r1']}")
        assert _position(drv) == 0

        # 1. The proxy answers the first two POSTs 503 and resets the third: nothing reaches the
        #    app until the fourth, which the page sends by itself.
        proxy.error(503, "SlowDown", "busy", method="POST", path="/answer", times=2)
        proxy.reset(method="POST", path="/answer", times=1)
        drv.find_element(By.ID, "yes").click()
        WebDriverWait(drv, WAIT_S, poll_frequency=0.1).until(lambda d: _position(d) == 1)
        assert proxy.counts["error"] == 2 and proxy.counts["reset"] == 1
        got = _answers(opened, "r1")
        assert [(r["position"], r["answer"]) for r in got] == [(0, True)]

        # 2. The app's own 503: a second process holds the SQLite write lock past the busy
        #    timeout (10 s). The page says it is saving and trying again; once the lock is let go,
        #    the answer lands, once.
        with write_lock_held(opened.study_dir / "panel.sqlite"):
            drv.find_element("tag name", "body").send_keys("n")
            WebDriverWait(drv, WAIT_S, poll_frequency=0.2).until(
                lambda d: "trying again" in d.find_element(By.ID, "saving").text)
            assert _position(drv) == 1  # still on its image (nothing can be recorded while the lock is held)
            assert any("POST /answer 503" in line for line in served.log.lines)
        WebDriverWait(drv, WAIT_S, poll_frequency=0.1).until(lambda d: _position(d) == 2)
        got = _answers(opened, "r1")
        assert [(r["position"], r["answer"]) for r in sorted(got, key=lambda r: r["position"])] == [(0, True), (1, False)]

        # 3. A refusal for good is not sent again: the study closes, the next answer shows why.
        from tasks.beauty.study import close_study

        assert close_study(panel_settings, "retry") is True
        drv.find_element(By.ID, "yes").click()
        WebDriverWait(drv, WAIT_S, poll_frequency=0.1).until(lambda d: "has ended" in d.find_element(By.TAG_NAME, "body").text)
        assert drv.find_element(By.ID, "message").text.startswith("This panel has ended")  # no study id (issue 27 item 8)
        assert len(_answers(opened, "r1")) == 2 and sum("POST /answer 409" in line for line in served.log.lines) == 1
