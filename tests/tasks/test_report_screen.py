"""What the report's pages show on a screen (issue 26 items 3 and 7), in a real headless Chromium:
the Capability-vs-EPS scatter at 390 px (a phone) showed the left part of a 720 px drawing, where
no model sits, and looked empty; a model page's "All (207)" filter sat over 192 cards (the
no-image cards counted twice). Each screenshot is kept under the test's tmp folder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tasks.report import ImageRow, LeaderboardRow, ReportData, build_report
from tests.tasks.report_helpers.browser import chromium_driver, find_browser, serve_dir

needs_browser = pytest.mark.skipif(isinstance(find_browser(), str), reason=str(find_browser()))

# Eight models as the demo has them: every point at EPS 44-51, Capability 0-100, right of the middle
# of the 720 px drawing (x from about 380 px on).
MODELS = {"demo-pristine": (100.0, 50.2), "demo-baseline-b": (100.0, 50.0), "demo-baseline-a": (98.0, 49.9),
          "demo-jpeg-q10": (93.0, 50.0), "demo-baseline-c": (90.0, 49.8), "demo-noise-s40": (86.7, 50.3),
          "demo-patchy": (44.4, 46.7), "demo-blur-r3": (0.0, 49.4)}


def _phone(driver, width: int = 390, height: int = 844) -> None:
    """A phone's viewport: its width in CSS pixels, as a mobile browser lays the page out."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": True})


@needs_browser
def test_the_scatter_shows_every_point_at_390_px(tmp_path: Path) -> None:
    rows = [LeaderboardRow(m, capability=cap, capability_lo=max(0.0, cap - 15), capability_hi=min(100.0, cap + 10),
                           eps=eps, eps_lo=eps - 1.5, eps_hi=eps + 1.5, overall=(cap + eps) / 2, rank=i + 1)
            for i, (m, (cap, eps)) in enumerate(MODELS.items())]
    build_report(ReportData(rows=rows), tmp_path / "site")
    with serve_dir(tmp_path / "site") as base, chromium_driver() as driver:
        _phone(driver)
        driver.get(base + "index.html")
        driver.execute_script("document.querySelector('#scatter').scrollIntoView()")
        seen = driver.execute_script("""
          const svg = document.querySelector('#scatter svg'), wrap = svg.parentElement;
          const box = wrap.getBoundingClientRect();
          const pts = [...svg.querySelectorAll('g.point')].map(g => {
            const r = g.querySelector('circle').getBoundingClientRect();
            return [g.dataset.model, r.left, r.right, r.width]; });
          return {vw: document.documentElement.clientWidth, page: document.documentElement.scrollWidth,
                  left: box.left, right: box.right, scroll: wrap.scrollWidth, client: wrap.clientWidth,
                  svg: svg.getBoundingClientRect().width, pts: pts};""")
        driver.save_screenshot(str(tmp_path / "scatter-390.png"))
    assert seen["vw"] == 390 and seen["page"] <= 390, seen  # the page itself does not scroll sideways
    assert seen["scroll"] <= seen["client"] + 1, seen  # nothing of the chart hidden behind a scroll
    assert sorted(p[0] for p in seen["pts"]) == sorted(MODELS)
    for model, left, right, width in seen["pts"]:
        assert width > 3 and seen["left"] <= left and right <= min(seen["right"], seen["vw"]), (model, seen)
    # Drawn at the width of its wrapper: smaller, whole.
    assert 300 <= seen["svg"] <= 390, seen


def _images(model: str, n_ok: int, missing: int, quarantined: int) -> list[ImageRow]:
    rows = []
    for i in range(n_ok + missing + quarantined):
        state = "ok" if i < n_ok else "missing" if i < n_ok + missing else "quarantined"
        verdict = ("PASS", "FAIL", "ERROR", None)[i % 4] if state == "ok" else None
        rows.append(ImageRow(model, f"p-{i:03d}", "Text Rendering" if i % 2 else "Spatial Reasoning", "tag",
                             f"prompt {i}", state=state, reason="too_small" if state == "quarantined" else None,
                             verdict=verdict, mu=0.1234 if state == "ok" else None))
    return rows


@needs_browser
def test_every_filter_says_how_many_cards_it_shows(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    images = _images("patchy", 12, 5, 3)  # 20 prompts; 8 of them FAIL by rule (no image)
    row = LeaderboardRow("patchy", capability=30.0, eps=40.0, rank=1, judged=6, decided=14, total=20, coverage=0.7)
    build_report(ReportData(rows=[row], images=images), tmp_path / "site")
    with serve_dir(tmp_path / "site") as base, chromium_driver() as driver:
        driver.get(base + "models/patchy.html")
        labels = {b.get_attribute("data-filter"): b.text for b in driver.find_elements(By.CSS_SELECTOR, "button.filter")}
        assert labels["all"] == f"All ({len(images)})"  # was "All (28)": 20 cards and the 8 no-image ones again
        for key, text in labels.items():
            driver.find_element(By.CSS_SELECTOR, f"button.filter[data-filter='{key}']").click()
            shown = sum(c.is_displayed() for c in driver.find_elements(By.CSS_SELECTOR, "article.card"))
            assert int(re.search(r"\((\d+)", text).group(1)) == shown, (key, text, shown)
        # The model's figures: judged (by a judge) and decided (FAILs by rule included), one word each.
        assert driver.find_element(By.ID, "judged").text == "6/20"
        assert driver.find_element(By.ID, "decided").text == "14/20 (70.0%)"
        assert [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".card .mu")][:1] == ["mu 0.123"]
