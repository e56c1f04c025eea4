"""Headless Chromium (Debian's chromium + chromium-driver, driven by Selenium) and a loopback
static file server, for the report tests and screenshots. No browser download, no network."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMEDRIVER_CANDIDATES = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--no-default-browser-check",
    "--hide-scrollbars",
)


def find_browser() -> tuple[str, str] | str:
    """(chromium, chromedriver) paths, or a string saying what is missing. ``IMAGEBENCH_CHROMIUM``
    and ``IMAGEBENCH_CHROMEDRIVER`` override the Debian paths (e.g. another Chromium build)."""
    env_browser, env_driver = os.environ.get("IMAGEBENCH_CHROMIUM"), os.environ.get("IMAGEBENCH_CHROMEDRIVER")
    if env_browser:
        chromium = env_browser if Path(env_browser).is_file() else None
    else:
        chromium = next((p for p in CHROMIUM_CANDIDATES if Path(p).exists()), None) or shutil.which("chromium")
    if env_driver:
        driver = env_driver if Path(env_driver).is_file() else None
    else:
        driver = next((p for p in CHROMEDRIVER_CANDIDATES if Path(p).exists()), None) or shutil.which("chromedriver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium==4.51.0)"
    if not chromium or not driver:
        return (
            "headless Chromium not found (need /usr/bin/chromium and /usr/bin/chromedriver: "
            "apt-get install -y chromium chromium-driver, or set IMAGEBENCH_CHROMIUM/IMAGEBENCH_CHROMEDRIVER)"
        )
    return chromium, driver


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextmanager
def serve_dir(root: Path) -> Iterator[str]:
    """Serve ``root`` on 127.0.0.1:<free port> in a thread; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@contextmanager
def chromium_driver(width: int = 1400, height: int = 1000, extra_flags: tuple[str, ...] = (),
                    page_load_timeout_s: float = 20) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager download anything
    found = find_browser()
    if isinstance(found, str):
        raise RuntimeError(found)
    chromium, driver_path = found
    profile = tempfile.mkdtemp(prefix="imagebench-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, *extra_flags):
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.add_argument(f"--window-size={width},{height}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    try:
        driver.set_page_load_timeout(page_load_timeout_s)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def full_page_screenshot(driver: object, path: Path, width: int = 1400, max_height: int = 4000) -> None:
    """Resize the window to the page height (capped) and save a PNG."""
    h = driver.execute_script("return Math.ceil(document.documentElement.scrollHeight)")
    driver.set_window_size(width, min(max(h + 140, 600), max_height))
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
