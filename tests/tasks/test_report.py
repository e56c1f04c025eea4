"""Static leaderboard site (tasks/report): the generated files, and the pages in a real headless
Chromium (Debian's chromium + chromium-driver, driven by Selenium; skipped with the reason when
they are not installed)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest
from PIL import Image

from tasks.report import (
    MARKER,
    GroupScore,
    ImageRow,
    LeaderboardRow,
    ReportData,
    ReportError,
    build_report,
    ci_text,
    page_name,
    rank_text,
)
from tasks.report.model import XSS_RATIONALE
from tests.tasks.report_helpers.browser import chromium_driver, find_browser, serve_dir

EVIL_ID = "evil<b>\"'&model"  # not a valid lake id, but the site must survive anything


# ---------------------------------------------------------------------------------------------
# helpers


class _Tags(HTMLParser):
    """Collects start tags with their attributes, and the text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(path: Path) -> _Tags:
    p = _Tags()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def example_with_evil(image_dir: Path) -> ReportData:
    """The example data plus a model whose id and texts are hostile, and an image path that
    does not exist on disk."""
    data = ReportData.example(image_dir)
    data.rows.append(
        LeaderboardRow(
            model_id=EVIL_ID,
            capability=50.0,
            capability_lo=40.0,
            capability_hi=60.0,
            eps=52.0,
            eps_lo=50.0,
            eps_hi=54.0,
            overall=51.0,
            overall_lo=47.0,
            overall_hi=55.0,
            rank=3,
            rank_best=2,
            rank_worst=5,
            coverage=1.0,
            flags=["<i>odd</i>"],
            eps_prompts_scored=1,
            eps_prompts_eligible=1,
            judged=2,
            total=2,
        )
    )
    data.by_category[EVIL_ID] = {"Truthfulness": GroupScore(50.0, 52.0, 2)}
    data.by_tag[EVIL_ID] = {"Animals": GroupScore(50.0, 52.0, 2)}
    src = next(i for i in data.images if i.model_id == "acme-diffusion-xl" and i.image_path)
    data.images += [
        ImageRow(
            EVIL_ID,
            "animals-01",
            "Truthfulness",
            "Animals",
            "<script>window.__pwned = 3</script>",
            "Is it <b>bold</b>?",
            src.image_path,
            "ok",
            None,
            0.5,
            "PASS",
            "j<1>",
            XSS_RATIONALE,
            True,
        ),
        ImageRow(
            EVIL_ID,
            "animals-02",
            "Truthfulness",
            "Animals",
            "a cat",
            "Is it a cat?",
            "does/not/exist.png",
            "ok",
            None,
            None,
            "FAIL",
            "j",
            "no file",
            True,
        ),
    ]
    return data


def expected_thumbs(data: ReportData) -> dict[str, int]:
    """model -> number of images that must show a thumbnail (ok state and a decodable file)."""
    out: dict[str, int] = {}
    for i in data.images:
        out.setdefault(i.model_id, 0)
        if i.state != "ok" or not i.image_path:
            continue
        p = Path(i.image_path)
        p = p if p.is_absolute() else data.image_root / p
        try:
            with Image.open(p) as im:
                im.load()
        except Exception:
            continue
        out[i.model_id] += 1
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReportData, Path]:
    base = tmp_path_factory.mktemp("report")
    data = example_with_evil(base / "images")
    out = base / "site"
    build_report(data, out)
    return data, out


# ---------------------------------------------------------------------------------------------
# files (no browser)


def test_formatting() -> None:
    assert ci_text(62.345, 58.1, 66.0) == "62.3 [58.1, 66.0]"
    assert ci_text(62.3, None, None) == "62.3"
    assert ci_text(None, 1.0, 2.0) == "–"
    assert ci_text(float("nan"), 1.0, 2.0) == "–"
    assert rank_text(LeaderboardRow("m", rank=2, rank_best=1, rank_worst=3)) == "2 (1–3)"
    assert rank_text(LeaderboardRow("m", rank=2, rank_worst=4)) == "2 (2–4)"
    assert rank_text(LeaderboardRow("m", rank=1)) == "1"
    assert rank_text(LeaderboardRow("m")) == "–"


@pytest.mark.parametrize(
    "model_id",
    ["model-a", "Model-A", "a/../../etc", "..", ".hidden", "x" * 300, "über model", EVIL_ID, "CON", "a\\b"],
)
def test_page_names_are_safe(model_id: str) -> None:
    name = page_name(model_id)
    assert re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,99}", name), name
    assert ".." not in name and "/" not in name


def test_page_names_distinct_case_insensitively() -> None:
    ids = ["model-a", "Model-A", "MODEL-A", "model_a", "model.a", "a/b", "a-b"]
    names = [page_name(i).lower() for i in ids]
    assert len(set(names)) == len(ids), names
    assert page_name("model-a") == "model-a"  # plain ids keep readable names


def test_site_files(site: tuple[ReportData, Path]) -> None:
    data, out = site
    assert (out / "index.html").is_file() and (out / MARKER).is_file()
    for name in ("style.css", "report.js", "favicon.svg"):
        assert (out / "static" / name).stat().st_size > 0
    pages = sorted(p.name for p in (out / "models").glob("*.html"))
    assert pages == sorted(f"{page_name(r.model_id)}.html" for r in data.rows)
    lb = json.loads((out / "leaderboard.json").read_text())
    assert [r["model_id"] for r in lb["rows"]][:2] == ["acme-diffusion-xl", "Nimbus.v2_beta"]
    assert all((out / r["page"]).is_file() for r in lb["rows"])
    # thumbnails: small JPEGs, content-addressed, no more than one per distinct source image
    smalls = sorted((out / "thumbs").glob("*-s.jpg"))
    assert smalls
    for f in smalls:
        with Image.open(f) as im:
            assert im.format == "JPEG" and max(im.size) <= 256
    distinct = set()
    for i in data.images:
        p = data.image_root / i.image_path if i.state == "ok" and i.image_path else None
        if p is not None and p.is_file() and p.read_bytes().startswith(b"\x89PNG\r\n\x1a\n\x00"):
            distinct.add(hashlib.sha256(p.read_bytes()).hexdigest())
    assert len(smalls) == len(distinct)  # one per distinct source (the evil model reuses an acme image)


def test_html_has_only_our_script_and_relative_local_images(site: tuple[ReportData, Path]) -> None:
    data, out = site
    for page in [out / "index.html", *(out / "models").glob("*.html")]:
        text = page.read_text(encoding="utf-8")
        parsed = parse(page)
        scripts = [a for t, a in parsed.tags if t == "script"]
        assert len(scripts) == 1 and scripts[0]["src"].endswith("static/report.js"), (page, scripts)
        assert not any(t in ("iframe", "object", "embed", "b", "i") for t, _ in parsed.tags), page
        assert "onerror" not in [k for _, a in parsed.tags for k in a], page
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text, page
        for tag, attrs in parsed.tags:
            for key in ("src", "href"):
                ref = attrs.get(key)
                if not ref or ref.startswith("#") or (tag == "svg"):
                    continue
                assert not urlparse(ref).scheme and not ref.startswith("/"), (page, ref)
                target = (page.parent / unquote(ref.split("#")[0])).resolve()
                assert target.is_file() and out.resolve() in target.parents, (page, ref)
    acme = (out / "models" / "acme-diffusion-xl.html").read_text(encoding="utf-8")
    assert "&lt;script&gt;window.__pwned = 1" in acme
    evil = (out / "models" / f"{page_name(EVIL_ID)}.html").read_text(encoding="utf-8")
    assert "evil&lt;b&gt;&#34;&#39;&amp;model" in evil or "evil&lt;b&gt;&quot;&#x27;&amp;model" in evil


def test_placeholders_for_images_without_a_file(site: tuple[ReportData, Path]) -> None:
    data, out = site
    counts = expected_thumbs(data)
    for r in data.rows:
        parsed = parse(out / "models" / f"{page_name(r.model_id)}.html")
        imgs = [a for t, a in parsed.tags if t == "img"]
        placeholders = [a for t, a in parsed.tags if "placeholder" in (a.get("class") or "")]
        n = sum(1 for i in data.images if i.model_id == r.model_id)
        assert len(imgs) == counts[r.model_id], r.model_id
        assert len(imgs) + len(placeholders) == n, r.model_id
    tiny = " ".join(parse(out / "models" / "tiny-gan-0.1.html").text)
    assert "MISSING" in tiny and "QUARANTINED" in tiny and "quarantined: not_decodable" in tiny
    pix = " ".join(parse(out / "models" / "pixelforge-3.html").text)
    assert "image cannot be decoded" in pix
    evil = " ".join(parse(out / "models" / f"{page_name(EVIL_ID)}.html").text)
    assert "image file not found" in evil


def test_index_contents(site: tuple[ReportData, Path]) -> None:
    data, out = site
    html = (out / "index.html").read_text(encoding="utf-8")
    text = " ".join(parse(out / "index.html").text)
    assert "UNCALIBRATED DEMO WEIGHTS" in text
    assert "71.0 [62.0, 80.0]" in text and "1 (1–2)" in text and "18/24" in text  # judged by a judge, of the prompts
    assert "provisional" in text and "incomplete" in text
    assert 'id="cap-by-category"' in html and 'id="eps-by-category"' in html and 'id="cap-by-tag"' in html
    # every heatmap cell has a tooltip with its value
    cells = re.findall(r'<g class="cell"[^>]*data-value="([^"]*)"><title>([^<]*)</title>', html)
    assert len(cells) >= 6 * len(data.rows)
    for value, title in cells:
        if value:
            assert f"{float(value):.1f}" in title
    # scatter: one point per model with both scores, each linking to its page
    points = re.findall(r'<g class="point" data-model="[^"]*">\s*<title>[^<]*</title>\s*<a href="([^"]+)"', html)
    assert len(points) == sum(1 for r in data.rows if r.capability is not None and r.eps is not None)
    assert "unjudged-model" in re.search(r'<p class="hint" id="not-plotted">.*?</p>', html, re.S).group(0)


def test_no_uncalibrated_banner_when_calibrated(tmp_path: Path) -> None:
    data = ReportData.example(tmp_path / "img")
    for r in data.rows:
        r.uncalibrated = False
    index = build_report(data, tmp_path / "site")
    assert "UNCALIBRATED" not in index.read_text(encoding="utf-8")
    assert "UNCALIBRATED" not in (tmp_path / "site" / "models" / "acme-diffusion-xl.html").read_text(encoding="utf-8")


def test_rebuild_is_deterministic_reuses_thumbs_and_prunes(tmp_path: Path) -> None:
    data = ReportData.example(tmp_path / "img")
    a, b = tmp_path / "a", tmp_path / "b"
    build_report(data, a)
    build_report(data, b)
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files_a == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for rel in files_a:
        if rel.suffix in (".html", ".json", ".css", ".js", ".svg"):
            assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    mtimes = {p: p.stat().st_mtime_ns for p in (a / "thumbs").iterdir()}
    time.sleep(0.01)
    # drop a model: its page and its (unshared) thumbnails go, the others are reused untouched
    smaller = dataclasses.replace(
        data,
        rows=[r for r in data.rows if r.model_id != "tiny-gan-0.1"],
        images=[i for i in data.images if i.model_id != "tiny-gan-0.1"],
    )
    build_report(smaller, a)
    assert not (a / "models" / "tiny-gan-0.1.html").exists()
    left = {p: p.stat().st_mtime_ns for p in (a / "thumbs").iterdir()}
    assert 0 < len(left) < len(mtimes)
    assert all(mtimes[p] == t for p, t in left.items())
    assert "tiny-gan-0.1" not in (a / "index.html").read_text(encoding="utf-8")


def test_refuses_a_directory_that_is_not_a_report(tmp_path: Path) -> None:
    out = tmp_path / "docs"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ReportError, match="not empty"):
        build_report(ReportData.example(), out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    with pytest.raises(ReportError, match="twice"):
        data = ReportData.example()
        data.rows.append(data.rows[0])
        build_report(data, tmp_path / "dup")


def test_works_without_breakdowns_or_images(tmp_path: Path) -> None:
    data = ReportData(rows=[LeaderboardRow("only-eps", eps=50.0, rank=1)])
    index = build_report(data, tmp_path / "site")
    html = index.read_text(encoding="utf-8")
    assert "only-eps" in html and "no model has both scores yet" in html
    assert "No images recorded" in (tmp_path / "site" / "models" / "only-eps.html").read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# in the browser

_found = find_browser()
needs_browser = pytest.mark.skipif(isinstance(_found, str), reason=str(_found))


@pytest.fixture(scope="module")
def _browser(site: tuple[ReportData, Path]):
    data, out = site
    with serve_dir(out) as base_url, chromium_driver() as driver:
        yield driver, base_url


@pytest.fixture
def browser(_browser):
    """The module's browser, with the console log of earlier tests drained."""
    driver, _ = _browser
    driver.get("about:blank")
    driver.get_log("browser")
    return _browser


def console_errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def load(driver, url: str) -> None:
    driver.get(url)
    for _ in range(100):  # wait for every image to settle (they are all eager)
        if driver.execute_script(
            "return document.readyState === 'complete' && [...document.images].every(i => i.complete)"
        ):
            return
        time.sleep(0.05)
    raise AssertionError(f"{url}: images did not finish loading")


def model_urls(driver, base_url: str) -> list[str]:
    load(driver, base_url + "index.html")
    hrefs = driver.execute_script(
        "return [...document.querySelectorAll('#leaderboard-table td.model a')].map(a => a.getAttribute('href'))"
    )
    return [urljoin(base_url, h) for h in hrefs]


@needs_browser
def test_console_error_detection_works(tmp_path: Path) -> None:
    """The harness itself: a page that throws and logs an error is caught."""
    (tmp_path / "bad.html").write_text("<script>console.error('bad'); throw new Error('boom')</script>")
    with serve_dir(tmp_path) as base, chromium_driver() as driver:
        driver.get(base + "bad.html")
        msgs = " ".join(e["message"] for e in console_errors(driver))
    assert "boom" in msgs and "bad" in msgs


@needs_browser
def test_pages_load_without_console_errors_and_all_images_resolve(browser, site) -> None:
    driver, base = browser
    data, _ = site
    counts = expected_thumbs(data)
    urls = [base + "index.html", *model_urls(driver, base)]
    assert len(urls) == 1 + len(data.rows)
    for url in urls:
        load(driver, url)
        broken = driver.execute_script(
            "return [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)"
        )
        assert broken == [], (url, broken)
        n = driver.execute_script("return document.images.length")
        if "/models/" in url:
            model = driver.find_element("css selector", "h1.model-title").text
            assert n == counts[model], (url, n)
            # every large copy a thumbnail links to loads too
            for href in driver.execute_script("return [...document.querySelectorAll('a.thumb')].map(a => a.href)"):
                assert urlparse(href).netloc == urlparse(base).netloc
        assert console_errors(driver) == [], url


@needs_browser
def test_sorting_by_every_column(browser) -> None:
    from selenium.webdriver.common.by import By

    driver, base = browser
    load(driver, base + "index.html")
    initial = driver.execute_script(
        "return [...document.querySelectorAll('#leaderboard-table tbody tr')].map(r => r.dataset.model)"
    )
    headers = driver.find_elements(By.CSS_SELECTOR, "#leaderboard-table th button.sort")
    assert [h.get_attribute("data-key") for h in headers] == [
        "rank",
        "model",
        "overall",
        "capability",
        "eps",
        "judged",
        "eps_scored",
        "flags",
    ]
    changed = False
    for col, key in enumerate(h.get_attribute("data-key") for h in headers):
        th_type = driver.execute_script(
            f"return document.querySelectorAll('#leaderboard-table th')[{col}].dataset.type"
        )
        for direction in ("ascending", "descending"):
            driver.find_element(By.CSS_SELECTOR, f"#leaderboard-table th button.sort[data-key='{key}']").click()
            state = driver.execute_script(
                f"return document.querySelectorAll('#leaderboard-table th')[{col}].getAttribute('aria-sort')"
            )
            assert state == direction, (key, state)
            raw = driver.execute_script(
                f"return [...document.querySelectorAll('#leaderboard-table tbody tr')].map(r => r.cells[{col}].dataset.v)"
            )
            order = driver.execute_script(
                "return [...document.querySelectorAll('#leaderboard-table tbody tr')].map(r => r.dataset.model)"
            )
            changed |= order != initial
            present = [v for v in raw if v != ""]
            assert raw[: len(present)] == present, f"{key}: empty values must sort last: {raw}"
            values = [float(v) for v in present] if th_type == "num" else [v.lower() for v in present]
            assert values == sorted(values, reverse=direction == "descending"), (key, direction, raw)
    assert changed
    # the visible model column follows the sort
    driver.find_element(By.CSS_SELECTOR, "#leaderboard-table th button.sort[data-key='model']").click()
    names = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#leaderboard-table td.model a")]
    assert names == sorted(names, key=str.lower)
    assert console_errors(driver) == []


@needs_browser
def test_model_links(browser, site) -> None:
    from selenium.webdriver.common.by import By

    driver, base = browser
    data, _ = site
    ids = [r.model_id for r in data.rows]
    for model_id in ids:
        load(driver, base + "index.html")
        links = driver.find_elements(By.CSS_SELECTOR, "#leaderboard-table td.model a")
        [link] = [a for a in links if a.text == model_id]
        link.click()
        assert driver.find_element(By.CSS_SELECTOR, "h1.model-title").text == model_id
        assert driver.current_url.endswith(f"/models/{page_name(model_id)}.html")
        driver.find_element(By.CSS_SELECTOR, "p.back a").click()
        assert driver.find_element(By.CSS_SELECTOR, "#leaderboard-table")
    # scatter points and heatmap labels link to the same pages
    load(driver, base + "index.html")
    hrefs = driver.execute_script(
        "return [...document.querySelectorAll('svg.chart a')].map(a => a.getAttribute('href'))"
    )
    assert hrefs and set(hrefs) <= {f"models/{page_name(m)}.html" for m in ids}
    driver.execute_script("document.querySelector('g.point a').dispatchEvent(new MouseEvent('click', {bubbles: true}))")
    for _ in range(50):
        if "/models/" in driver.current_url:
            break
        time.sleep(0.05)
    assert driver.find_element(By.CSS_SELECTOR, "h1.model-title").text in ids
    assert console_errors(driver) == []


@needs_browser
def test_injected_script_is_text_not_code(browser) -> None:
    from selenium.webdriver.common.by import By

    driver, base = browser
    for page, needle in (
        ("acme-diffusion-xl", XSS_RATIONALE),
        (page_name(EVIL_ID), "<script>window.__pwned = 3</script>"),
    ):
        load(driver, f"{base}models/{page}.html")
        assert driver.execute_script("return window.__pwned") is None
        assert "pwned" not in driver.title
        assert driver.execute_script("return document.scripts.length") == 1
        texts = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".rationale, .prompt")]
        assert any(needle in t for t in texts), (page, texts[:3])
    assert driver.find_element(By.CSS_SELECTOR, "h1.model-title").text == EVIL_ID
    load(driver, base + "index.html")
    assert EVIL_ID in [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#leaderboard-table td.model a")]
    assert driver.execute_script("return window.__pwned") is None
    assert console_errors(driver) == []


@needs_browser
def test_verdict_filter(browser) -> None:
    from selenium.webdriver.common.by import By

    driver, base = browser
    load(driver, base + "models/tiny-gan-0.1.html")
    total = len(driver.find_elements(By.CSS_SELECTOR, "article.card"))
    driver.find_element(By.CSS_SELECTOR, "button.filter[data-filter='noimage']").click()
    shown = [c for c in driver.find_elements(By.CSS_SELECTOR, "article.card") if c.is_displayed()]
    assert len(shown) == 2 and all(c.get_attribute("data-filter") == "noimage" for c in shown)
    assert all(c.find_elements(By.CSS_SELECTOR, ".placeholder") for c in shown)
    driver.find_element(By.CSS_SELECTOR, "button.filter[data-filter='all']").click()
    assert len([c for c in driver.find_elements(By.CSS_SELECTOR, "article.card") if c.is_displayed()]) == total
    assert console_errors(driver) == []


@needs_browser
def test_opened_as_a_file(site) -> None:
    """``open DIR/index.html`` without a server: the script still runs (CSP 'self' on file:)."""
    from selenium.webdriver.common.by import By

    _, out = site
    with chromium_driver() as driver:
        driver.get((out / "index.html").as_uri())
        driver.find_element(By.CSS_SELECTOR, "#leaderboard-table th button.sort[data-key='eps']").click()
        eps = driver.execute_script(
            "return [...document.querySelectorAll('#leaderboard-table tbody tr')].map(r => parseFloat(r.cells[4].dataset.v))"
        )
        assert eps == sorted(eps)
        driver.get((out / "models" / "acme-diffusion-xl.html").as_uri())
        assert driver.execute_script("return [...document.images].every(i => i.complete && i.naturalWidth > 0)")
        assert driver.execute_script("return document.images.length") > 0
        assert console_errors(driver) == []


def test_capability_cells_carry_counts_and_not_judged(tmp_path: Path) -> None:
    """Issue 8 item 9, as issue 15 item 6 revised it: every Capability cell carries its PASS /
    FAIL counts and decided/total. A category whose only decided items are missing images shows
    their FAILs as a figure (0.0: the headline counts them, so must the breakdown); only a model
    no judge decided anything for is drawn as not judged (no value, grey), and says so."""
    data = ReportData(
        rows=[LeaderboardRow("unjudged", capability=None, eps=50.0, rank=None),
              LeaderboardRow("patchy", capability=45.0, eps=40.0, rank=1)],
        by_category={
            "unjudged": {"Text": GroupScore(capability=None, eps=50.0, n=15, decided=2, judged=0, passed=0, failed=2,
                                            no_image=2, undecided=13),
                         "Spatial": GroupScore(capability=None, eps=50.0, n=57, decided=0, judged=0, passed=0,
                                               failed=0, no_image=0, undecided=57)},
            "patchy": {"Text": GroupScore(capability=60.0, eps=40.0, n=15, decided=15, judged=15, passed=9, failed=6,
                                          no_image=0, undecided=0),
                       "Spatial": GroupScore(capability=0.0, eps=40.0, n=57, decided=5, judged=0, passed=0, failed=5,
                                             no_image=5, undecided=52)},
        },
        categories=["Text", "Spatial"],
    )
    out = tmp_path / "site"
    html = build_report(data, out).read_text(encoding="utf-8")
    cell = re.search(r'<g class="cell" data-row="unjudged" data-col="Text" data-value="">'
                     r"<title>([^<]*)</title>", html)
    assert cell, "unjudged × Text must be drawn without a value"
    assert "Capability not judged (2/15 decided, 2 missing/quarantined FAIL" in cell.group(1)
    assert "patchy × Spatial: Capability 0.0 (0 PASS, 5 FAIL (5 without an image); 5/57 decided, 0 by a judge)" in html
    assert "patchy × Text: Capability 60.0 (9 PASS, 6 FAIL; 15/15 decided, 15 by a judge)" in html
    # The model page's category table ends with the total: PASS 9 of 20 decided = 45.0, the headline.
    page = (out / "models" / "patchy.html").read_text(encoding="utf-8")
    foot = re.search(r'<tfoot><tr class="total"><th scope="row">All categories</th>(.*?)</tr></tfoot>', page, re.S)
    assert foot, page
    assert re.findall(r'<td class="num">([^<]*)</td>', foot.group(1))[:5] == ["45.0", "9", "11", "5", "52"]


def _label_boxes(svg: str) -> list[tuple[str, tuple[float, float, float, float]]]:
    from tasks.report.svg import CHAR_W

    boxes = []
    for x, y, anchor, text in re.findall(
        r'<text x="([\d.-]+)" y="([\d.-]+)" text-anchor="(start|end)" fill="#222" paint-order[^>]*>([^<]+)</text>', svg
    ):
        w, left = len(text) * CHAR_W, float(x) - (len(text) * CHAR_W if anchor == "end" else 0)
        boxes.append((text, (left, float(y) - 10, left + w, float(y) + 3)))
    return boxes


def test_scatter_labels_of_a_cluster_do_not_overlap() -> None:
    """Issue 8 item 12: the demo's models sit close together; their labels must stay readable."""
    from tasks.report.svg import ScatterPoint, scatter

    names = ["demo-baseline-a", "demo-baseline-b", "demo-baseline-c", "demo-pristine", "demo-jpeg-q10",
             "demo-blur-r3", "demo-noise-s40", "demo-patchy"]
    pts = [ScatterPoint(n, None, 50 + 0.3 * i, None, None, 40 + 0.4 * (i % 3), None, None) for i, n in enumerate(names)]
    boxes = _label_boxes(scatter([*pts, ScatterPoint("far", None, 10, None, None, 90, None, None)],
                                 x_label="EPS", y_label="Capability", title="t"))
    assert sorted(t for t, _ in boxes) == sorted([*names, "far"])
    for i, (ta, a) in enumerate(boxes):
        for tb, b in boxes[i + 1:]:
            assert not (a[0] < b[2] and a[2] > b[0] and a[1] < b[3] and a[3] > b[1]), (ta, tb)


def test_leaderboard_rows_follow_the_headline_with_the_band_beside_it(tmp_path: Path) -> None:
    """Issue 26 item 5: rows in Overall order (EPS for a model without Overall, last), the table
    sorted by Overall on arrival; a wide interval's best place (band 1-4) does not lift a model."""
    data = ReportData(rows=[
        LeaderboardRow("noise", capability=67.0, eps=70.0, overall=68.5, rank=1, rank_best=1, rank_worst=4),
        LeaderboardRow("top", capability=90.0, eps=90.0, overall=90.0, rank=1, rank_best=1, rank_worst=2),
        LeaderboardRow("unjudged", capability=None, eps=95.0, overall=None, rank=None),
        LeaderboardRow("jpeg", capability=70.0, eps=80.0, overall=75.0, rank=3, rank_best=3, rank_worst=4),
    ])
    html = build_report(data, tmp_path / "site").read_text(encoding="utf-8")
    assert re.findall(r'<tr data-model="([^"]+)"', html) == ["top", "jpeg", "noise", "unjudged"]
    assert re.search(r'<th aria-sort="descending"[^>]*><button[^>]*data-key="overall"', html)
    assert re.search(r'<th aria-sort="none"[^>]*><button[^>]*data-key="rank"', html)
    noise_row = html[html.index('<tr data-model="noise"'):]
    assert noise_row.index("1 (1–4)") < noise_row.index("68.5")  # the band beside the figure
