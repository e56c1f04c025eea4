"""Time on screen is time on screen (issue 27 item 4): a judge on a slow link is not a careful
viewer. Headless Chromium against the real app, one judge's connection throttled by Chromium's own
network emulation to about 64 kB/s, so that each blinded image (about 530 kB) takes about 9 s to
arrive; the bounds of the browser's times by the server's, as pure functions."""

from __future__ import annotations

import io

import pytest

from tasks.panel.timing import BrowserTiming, parse_browser_timing, screen_time
from tests.tasks.report_helpers.browser import chromium_driver, find_browser

FOUND = find_browser()
THROUGHPUT = 60_000  # bytes per second: a 64 kB/s line
S = 1_000_000  # µs


def test_browser_times_are_bounded_by_the_servers():
    served, answered = 100 * S, 112 * S  # the server sent the image 12 s before the answer arrived
    # loaded 9 s after asking for it, answered 2 s later
    t = parse_browser_timing({"t_request": "500.0", "t_loaded": "9500.0", "t_answer": "11500.0"})
    assert t == BrowserTiming(500.0, 9500.0, 11500.0)
    assert screen_time(served, answered, t) == screen_time(served, answered, t).__class__(True, 2 * S, 9 * S, "browser")
    # A browser claiming more than the server's window gets the window, never more.
    big = BrowserTiming(0.0, 1000.0, 60_000.0)
    assert screen_time(served, answered, big).on_screen_us == 12 * S
    # No script on the page: the server's window, an upper bound, as before.
    assert screen_time(served, answered, parse_browser_timing({})) == screen_time(served, answered, None)
    assert screen_time(served, answered, None).on_screen_us == 12 * S and screen_time(served, answered, None).source == "server"
    # Answered before the image had loaded (a slow link): not on screen at all.
    early = parse_browser_timing({"t_request": "500", "t_loaded": "", "t_answer": "3000"})
    assert early == BrowserTiming(None, None, 3000.0) and not screen_time(served, answered, early).loaded
    # The server never sent it: not loaded, whatever the page says.
    assert not screen_time(None, answered, t).loaded
    # Times that contradict each other or are not times are no evidence (the server's window stands).
    for bad in ({"t_loaded": "9000", "t_answer": "100"}, {"t_loaded": "nan", "t_answer": "100"},
                {"t_loaded": "x", "t_answer": "100"}, {"t_loaded": "1", "t_answer": "-5"}, {"t_answer": "1e400"}):
        assert parse_browser_timing(bad) is None, bad


def _noise_png(seed: int) -> bytes:
    """An image that stays large once blinded (noise survives JPEG): about 530 kB served."""
    import numpy as np
    from PIL import Image

    a = np.random.default_rng(seed).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(a).save(out, "PNG")
    return out.getvalue()


@pytest.mark.skipif(isinstance(FOUND, str), reason=FOUND if isinstance(FOUND, str) else "")
def test_a_slow_download_is_not_counted_as_viewing(tmp_path, monkeypatch):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tasks.beauty.study import open_study
    from tasks.beauty.store import PanelStore
    from tests.panel.conftest import TOOLS, beauty_prompt_ids, make_settings, serve, write_study

    for t, tool in enumerate(TOOLS):
        folder = tmp_path / "objects" / "models" / tool
        folder.mkdir(parents=True)
        for k, pid in enumerate(beauty_prompt_ids()):
            (folder / f"{pid}.png").write_bytes(_noise_png(100 * t + k))
    settings = make_settings(tmp_path)
    write_study(settings, "slow-link", [("slow", "photographers"), ("fast", "photographers")], memo=False)
    opened = open_study(settings, "slow-link")
    size = max(p.stat().st_size for p in (opened.study_dir / "images").iterdir())
    expected_download_s = size / THROUGHPUT
    assert expected_download_s > 8  # the case: about 9 s per image

    def wait(drv, cond, timeout=120):
        return WebDriverWait(drv, timeout, poll_frequency=0.05).until(cond)

    def position(drv):
        return drv.execute_script("var e=document.querySelector('input[name=position]');return e?+e.value:null;")

    def on_screen(drv):  # the image is shown and the page's script has stamped its load
        return drv.execute_script("var i=document.getElementById('stimulus'), t=document.querySelector('input[name=t_loaded]');"
                                  "return !!i&&i.complete&&i.naturalWidth>0&&!!t&&t.value!=='';")

    looked_s = 1.5
    with serve(settings, "slow-link") as s, chromium_driver(1280, 900, page_load_timeout_s=120) as drv:
        drv.execute_cdp_cmd("Network.enable", {})
        drv.execute_cdp_cmd("Network.emulateNetworkConditions", {
            "offline": False, "latency": 0, "downloadThroughput": THROUGHPUT, "uploadThroughput": -1})
        drv.get(f"{s.url}/j/{opened.judge_tokens['slow']}")
        # Image 1: answered as soon as it is on screen. Image 2: looked at for 1.5 s first.
        for k, pause in enumerate((0.0, looked_s)):
            wait(drv, lambda d, k=k: position(d) == k and on_screen(d))
            if pause:
                drv.execute_script(f"return new Promise(r => setTimeout(r, {int(pause * 1000)}))")
            drv.find_element(By.TAG_NAME, "body").send_keys("n")
            wait(drv, lambda d, k=k: position(d) == k + 1)
        drv.execute_cdp_cmd("Network.emulateNetworkConditions", {
            "offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
        drv.delete_all_cookies()
        drv.get(f"{s.url}/j/{opened.judge_tokens['fast']}")
        wait(drv, lambda d: position(d) == 0 and on_screen(d))
        drv.find_element(By.ID, "yes").click()
        wait(drv, lambda d: position(d) == 1)

        drv.get(f"{s.url}/admin/{opened.admin_token}")
        slow_row = drv.find_element(By.CSS_SELECTOR, 'tr[data-judge="slow"] td.download').text
        fast_row = drv.find_element(By.CSS_SELECTOR, 'tr[data-judge="fast"] td.download').text
        listed = drv.find_element(By.ID, "slow-links").text

    store = PanelStore.open(opened.study_dir)
    rows = {(r["judge_id"], r["position"]): r for r in store.answers_table("salt").to_pylist()}
    progress = {j["label"]: j for j in store.judge_progress()}
    store.dispose()
    from schemas.study import salted_judge_id

    first, second = rows[(salted_judge_id("salt", "slow"), 0)], rows[(salted_judge_id("salt", "slow"), 1)]
    # The download took about 9 s (the throttle cannot make it faster); none of it is time on screen.
    assert progress["slow"]["median_download_s"] >= 0.75 * expected_download_s
    download_s = progress["slow"]["median_download_s"]
    assert first["image_loaded"] and first["seconds_on_screen"] < download_s / 2, (first, download_s)
    # The second image was looked at for at least 1.5 s: that, and not the download, is counted.
    assert second["image_loaded"] and looked_s <= second["seconds_on_screen"] < download_s / 2 + looked_s, (second, download_s)
    # The lab sees who is on a slow link (the admin page); the judge on loopback is not listed.
    assert "slow link" in slow_row and "slow link" not in fast_row and fast_row.endswith(" s"), (slow_row, fast_row)
    assert "slow (" in listed and "fast" not in listed, listed
