"""Headless Chromium against the real app (issue 16 items 1, 9, 10 and 12's layout): a judge who
clicks their link on a page of another site gets in; one cookie per role, Lax, expiring; the same
link opened again ends the older session; images stop after `study close`; `study relink` kills
the old link and its session and the new link resumes where the judge was; a scripted judge who
never loads an image is flagged and a judge who looks is not; the memo controls fit a 1280x757
window."""

from __future__ import annotations

import functools
import http.server
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tasks.panel.app import COOKIES
from tests.tasks.report_helpers.browser import chromium_driver, find_browser

FOUND = find_browser()
pytestmark = pytest.mark.skipif(isinstance(FOUND, str), reason=FOUND if isinstance(FOUND, str) else "")


@pytest.fixture(scope="module")
def browser():
    with chromium_driver(1280, 757, page_load_timeout_s=30) as drv:
        yield drv


@contextmanager
def other_site(root: Path, host: str = "127.0.0.2"):
    """A plain static web server on another loopback address: another origin and another site
    (for an IP address the site is the address itself), like a webmail page."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer((host, 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def _wait(drv, cond, timeout=15):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(drv, timeout, poll_frequency=0.05).until(cond)


def _position(drv) -> int | None:
    """The position the page shows (None while loading, or when there is none): read in one script
    call, so a page replaced meanwhile cannot leave a stale element."""
    got = drv.execute_script("var e=document.querySelector('input[name=position]');return e?e.value:null;")
    return int(got) if got is not None else None


def test_link_clicked_on_another_site_gets_the_judge_in(browser, panel_study, panel_server, tmp_path):
    from selenium.webdriver.common.by import By

    drv = browser
    drv.delete_all_cookies()
    link = f"{panel_server.url}/j/{panel_study.tokens['a02']}"
    (tmp_path / "mail.html").write_text(f'<!doctype html><title>Inbox</title><p>Your panel link: '
                                        f'<a id="panel-link" href="{link}">open the study</a></p>')
    with other_site(tmp_path) as mail:
        assert not mail.startswith(panel_server.url.rsplit(":", 1)[0])  # really another host
        drv.get(f"{mail}/mail.html")
        drv.find_element(By.ID, "panel-link").click()  # clicked, not typed: a cross-site navigation
        _wait(drv, lambda d: d.current_url.startswith(panel_server.url) and d.find_elements(By.ID, "progress"))
    assert drv.current_url == f"{panel_server.url}/judge"
    assert drv.find_element(By.ID, "progress").text.startswith("Image 1 of ")
    assert "Open your link" not in drv.page_source
    cookie = drv.get_cookie(COOKIES["judge"])
    assert cookie["sameSite"] == "Lax" and cookie["httpOnly"] and not cookie["secure"]


def test_roles_keep_their_own_cookie_and_the_newer_session_wins(browser, panel_study, panel_server):
    import time

    from selenium.webdriver.common.by import By

    drv, base = browser, panel_server.url
    drv.delete_all_cookies()
    drv.get(f"{base}/j/{panel_study.tokens['a03']}")
    assert drv.find_element(By.ID, "progress").text.startswith("Image 1 of ")
    drv.get(f"{base}/admin/{panel_study.admin_token}")
    assert drv.find_elements(By.ID, "judges")
    drv.get(f"{base}/judge")  # the admin link did not log the judge out ...
    assert drv.find_element(By.ID, "progress").text.startswith("Image 1 of ")
    drv.get(f"{base}/admin")  # ... nor the judge link the admin
    assert drv.find_elements(By.ID, "judges")
    cookies = {c["name"]: c for c in drv.get_cookies()}
    assert set(cookies) == set(COOKIES.values())
    for c in cookies.values():  # expires with the session setting (28 days by default), not with the browser
        assert c["sameSite"] == "Lax" and abs(c["expiry"] - (time.time() + 28 * 86400)) < 3600

    older = cookies[COOKIES["judge"]]
    drv.get(f"{base}/j/{panel_study.tokens['a03']}")  # the same link again (another tab, another day)
    newer = drv.get_cookie(COOKIES["judge"])
    assert newer["value"] != older["value"]
    drv.get(f"{base}/judge")
    assert drv.find_element(By.ID, "progress").text.startswith("Image 1 of ")
    drv.delete_cookie(COOKIES["judge"])  # a second browser still holding the older session
    drv.add_cookie({k: older[k] for k in ("name", "value", "path", "httpOnly", "sameSite")})
    drv.get(f"{base}/judge")
    assert "Open your link" in drv.page_source and not drv.find_elements(By.ID, "progress")


def _image_shown(drv) -> bool:
    return drv.execute_script("var i=document.getElementById('stimulus');return !!i&&i.complete&&i.naturalWidth>0;")


def _cli(monkeypatch, settings, *args: str):
    """`imagebench ARGS` in this process, on the panel's workspace (what a lab types)."""
    from typer.testing import CliRunner

    from flows.cli import app

    for key, value in {"IMAGEBENCH_HOME": str(settings.home), "IMAGEBENCH_STORE": str(settings.store),
                       "IMAGEBENCH_REFERENCE_DIR": str(settings.reference_dir)}.items():
        monkeypatch.setenv(key, value)
    r = CliRunner().invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r


def test_images_stop_after_study_close(browser, panel_settings, monkeypatch):
    """A judge mid-study sees the images; after `imagebench study close` a reload shows no image
    and the page says the study is closed, and the image the judge was shown gets a 404 (in
    this study of its own: closing the shared one would end every other test's judges)."""
    from selenium.webdriver.common.by import By

    from tests.panel.conftest import open_new_study, serve

    opened = open_new_study(panel_settings, "browser-close", [("j1", "photographers")], memo=False)
    drv = browser
    with serve(panel_settings, opened.study_id) as s:
        drv.delete_all_cookies()
        drv.get(f"{s.url}/j/{opened.tokens['j1']}")
        _wait(drv, _image_shown)
        drv.find_element(By.TAG_NAME, "body").send_keys("y")  # mid-study: one answered, the next shown
        _wait(drv, lambda d: _position(d) == 1)
        _wait(drv, _image_shown)
        src = drv.find_element(By.ID, "stimulus").get_attribute("src")
        assert src.startswith(f"{s.url}/img/")

        r = _cli(monkeypatch, panel_settings, "study", "close", opened.study_id)
        assert f"study {opened.study_id} closed" in r.output

        drv.refresh()
        assert not drv.find_elements(By.ID, "stimulus") and _position(drv) is None
        assert drv.find_element(By.ID, "message").text.startswith("This panel has ended")  # no study id (issue 27 item 8)
        assert opened.study_id not in drv.page_source
        # the same image asked for again by this browser, with the judge's live cookie
        assert drv.get_cookie(COOKIES["judge"]) is not None
        status = drv.execute_async_script(
            "var done=arguments[arguments.length-1];"
            "fetch(arguments[0],{credentials:'same-origin',cache:'no-store'}).then(r=>done(r.status),e=>done(String(e)));", src)
        assert status == 404
        loaded = drv.execute_async_script(
            "var done=arguments[arguments.length-1], i=new Image();"
            "i.onload=function(){done(i.naturalWidth)}; i.onerror=function(){done(0)}; i.src=arguments[0];", src)
        assert loaded == 0


def test_relink_kills_the_old_link_and_session_and_the_new_link_resumes(browser, panel_settings, monkeypatch):
    """`imagebench study relink STUDY --judge LABEL`: in Chromium, the session the old link opened
    ends at once (the cookie is still in the browser, refused), the old link no longer gets in,
    and the new link resumes at the judge's place: the same image at the same position."""
    from selenium.webdriver.common.by import By

    from tests.panel.conftest import open_new_study, serve

    opened = open_new_study(panel_settings, "browser-relink", [("j1", "photographers"), ("j2", "aphantasia")], memo=False)
    drv = browser
    answered = 2
    with serve(panel_settings, opened.study_id) as s:
        drv.delete_all_cookies()
        drv.get(f"{s.url}/j/{opened.tokens['j1']}")
        for k in range(answered):
            _wait(drv, lambda d, k=k: _position(d) == k)
            drv.find_element(By.ID, "yes" if k % 2 else "no").click()
        _wait(drv, lambda d: _position(d) == answered)
        at = (drv.find_element(By.ID, "progress").text,
              drv.find_element(By.CSS_SELECTOR, "input[name=image_id]").get_attribute("value"))
        old_cookie = drv.get_cookie(COOKIES["judge"])

        r = _cli(monkeypatch, panel_settings, "study", "relink", opened.study_id, "--judge", "j1", "--url", s.url)
        (line,) = [x for x in r.stdout.splitlines() if x.startswith("judge j1: ")]
        new_link = line.split(": ", 1)[1]
        assert new_link.startswith(f"{s.url}/j/") and opened.tokens["j1"] not in new_link

        # the old session: its cookie is still in this browser, and the server refuses it
        assert drv.get_cookie(COOKIES["judge"])["value"] == old_cookie["value"]
        drv.get(f"{s.url}/judge")
        assert "Open your link" in drv.page_source and _position(drv) is None
        # the old link: no longer gets in, and sets no session
        drv.delete_all_cookies()
        drv.get(f"{s.url}/j/{opened.tokens['j1']}")
        assert "Link not valid" in drv.page_source and _position(drv) is None
        assert drv.get_cookie(COOKIES["judge"]) is None
        # the new link: in, at the place the judge had reached (not back at the start)
        drv.get(new_link)
        assert drv.current_url == f"{s.url}/judge" and _position(drv) == answered
        assert (drv.find_element(By.ID, "progress").text,
                drv.find_element(By.CSS_SELECTOR, "input[name=image_id]").get_attribute("value")) == at
        assert at[0] == f"Image {answered + 1} of {at[0].rsplit(' ', 1)[1]}"
        _wait(drv, _image_shown)
        drv.find_element(By.TAG_NAME, "body").send_keys("n")  # and answers on from there
        _wait(drv, lambda d: _position(d) == answered + 1)
        # the other judge's link was not touched
        drv.delete_all_cookies()
        drv.get(f"{s.url}/j/{opened.tokens['j2']}")
        assert _position(drv) == 0


def test_memo_controls_fit_a_1280x757_window(browser, panel_study, panel_server, tmp_path):
    from selenium.webdriver.common.by import By

    drv = browser
    drv.set_window_size(1280, 757)
    drv.delete_all_cookies()
    drv.get(f"{panel_server.url}/j/{panel_study.tokens['a01']}")
    _wait(drv, lambda d: d.execute_script("var i=document.getElementById('stimulus');return i.complete&&i.naturalWidth>0;"))
    view = drv.execute_script("return [window.innerWidth, window.innerHeight, document.documentElement.scrollHeight];")
    drv.save_screenshot(str(tmp_path / "judge-1280x757.png"))
    assert view[0] <= 1280 and view[1] <= 757
    for element_id in ("stimulus", "yes", "no", "consent", "publish-consent", "rec"):  # both consents (issue 27 item 1)
        rect = drv.find_element(By.ID, element_id).rect
        assert rect["height"] > 0 and rect["y"] >= 0 and rect["y"] + rect["height"] <= view[1], (element_id, rect, view)
    assert view[2] <= view[1]  # nothing below the fold: no scrolling at all


def test_scripted_judge_that_never_loads_images_is_flagged_and_a_looking_judge_is_not(browser, panel_settings):
    """Judge 'bot' answers by keyboard with image loading blocked (as the scripted judge of the
    issue did); judge 'eye' waits until the image is shown and looks at it for longer than the
    study's threshold. The server's own evidence flags every answer of the first, none of the second."""
    from selenium.webdriver.common.by import By

    from tasks.beauty.quality import NOT_LOADED, flag_answers
    from tasks.beauty.study import open_study, study_dir
    from tasks.beauty.store import PanelStore
    from tests.panel.conftest import serve, write_study

    threshold = 1.0
    write_study(panel_settings, "qc", [("bot", "photographers"), ("eye", "photographers")], memo=False)
    path = study_dir(panel_settings, "qc") / "study.yaml"
    data = yaml.safe_load(path.read_text())
    data["quality"] = {"min_seconds_on_screen": threshold}
    path.write_text(yaml.safe_dump(data))
    tokens = open_study(panel_settings, "qc").judge_tokens
    drv = browser
    answers = 3
    with serve(panel_settings, "qc") as s:
        drv.delete_all_cookies()
        drv.execute_cdp_cmd("Network.enable", {})
        drv.execute_cdp_cmd("Network.setBlockedURLs", {"urls": [f"{s.url}/img/*"]})
        try:
            drv.get(f"{s.url}/j/{tokens['bot']}")
            for k in range(answers):
                assert _position(drv) == k
                drv.find_element(By.TAG_NAME, "body").send_keys("y")
                _wait(drv, lambda d, k=k: _position(d) == k + 1)
        finally:
            drv.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
        drv.delete_all_cookies()
        drv.get(f"{s.url}/j/{tokens['eye']}")
        for k in range(answers):
            assert _position(drv) == k
            _wait(drv, lambda d: d.execute_script("var i=document.getElementById('stimulus');return i.complete&&i.naturalWidth>0;"))
            # looked at for longer than the threshold (the server measures from sending the bytes)
            drv.execute_script(f"return new Promise(r => setTimeout(r, {int(threshold * 1000) + 300}))")
            drv.find_element(By.ID, "no").click()
            _wait(drv, lambda d, k=k: _position(d) == k + 1)
    store = PanelStore.open(study_dir(panel_settings, "qc"))
    table = flag_answers(store.answers_table("s"), threshold)
    store.dispose()
    from schemas.study import salted_judge_id

    by_judge = {label: [r for r in table.to_pylist() if r["judge_id"] == salted_judge_id("s", label)] for label in ("bot", "eye")}
    assert [(r["image_loaded"], r["qc_flag"]) for r in by_judge["bot"]] == [(False, NOT_LOADED)] * answers
    assert all(r["image_loaded"] and r["seconds_on_screen"] >= threshold and r["qc_flag"] is None for r in by_judge["eye"])
