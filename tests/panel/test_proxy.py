"""The reverse-proxy set-up of docs/BEAUTY.md ("Limits and the reverse proxy"), run as written
(issue 24 item 6): Debian's nginx with the documented configuration (the text is read from the
doc; only its ports, address and certificate paths are replaced), TLS with a self-signed
certificate made by openssl, two `imagebench panel serve` processes sharing a real PostgreSQL
store behind it. One panel server is killed (SIGKILL) while judges answer, with one judge's answer
inside it (held there by a row lock on the store): HTTP judges following the real flow (link,
page, image, answer) and one Chromium judge carry on without seeing an error or sending anything
twice, and every answer is recorded exactly once."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tasks.beauty.store import PanelStore
from tests.panel.conftest import REPO, TOOLS, beauty_prompt_ids, write_study, write_tool_images
from tests.panel.servers import free_port, panel_serve_cli
from tests.tasks.report_helpers.browser import chromium_driver, find_browser

DOC = REPO / "docs" / "BEAUTY.md"
MARK = "<!-- nginx-panel-conf"
WAIT_S = 120  # bounded waits, generous for a loaded machine
HTTP_JUDGES = 5
BEFORE_KILL = 8  # answers each judge gives before the kill


def documented_nginx_conf() -> str:
    """The nginx configuration as docs/BEAUTY.md gives it (the ```nginx block after the marker)."""
    text = DOC.read_text(encoding="utf-8")
    m = re.search(re.escape(MARK) + r".*?-->\s*```nginx\n(.*?)```", text, re.S)
    assert m, f"{DOC} has no nginx block after {MARK!r}"
    return m.group(1)


def for_this_test(conf: str, ports: tuple[int, int], listen_port: int, cert: Path, key: Path) -> str:
    """The documented text with only what a test machine must change: the panel servers' ports,
    nginx's address and port, the certificate's paths."""
    for old, new in (("127.0.0.1:8765", f"127.0.0.1:{ports[0]}"), ("127.0.0.1:8766", f"127.0.0.1:{ports[1]}"),
                     ("listen 443 ssl;", f"listen 127.0.0.1:{listen_port} ssl;"),
                     ("/etc/ssl/imagebench/panel.crt", str(cert)), ("/etc/ssl/imagebench/panel.key", str(key))):
        assert conf.count(old) == 1, f"the documented nginx configuration no longer has {old!r} once"
        conf = conf.replace(old, new)
    return conf


def _nginx() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").is_file() else None)
    assert found, "nginx not found: `make system-deps` installs Debian's nginx package (apt-get install nginx)"
    return found


def _self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "panel.crt", folder / "panel.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def _start_nginx(folder: Path, site_conf: str) -> subprocess.Popen:
    """Debian's nginx in the foreground with a main configuration of this test (pid, logs and
    temporary files in ``folder``) that includes the site's text, as Debian's nginx.conf includes
    conf.d/*.conf in its http block."""
    (folder / "imagebench-panel.conf").write_text(site_conf)
    temp = {name: folder / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for p in temp.values():
        p.mkdir()
    import os

    main = f"""daemon off;
{"user root;" if os.geteuid() == 0 else ""}
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log {folder}/access.log;
    client_body_temp_path {temp['body']}; proxy_temp_path {temp['proxy']}; fastcgi_temp_path {temp['fastcgi']};
    uwsgi_temp_path {temp['uwsgi']}; scgi_temp_path {temp['scgi']};
    include {folder}/imagebench-panel.conf;
}}
"""
    (folder / "nginx.conf").write_text(main)
    args = [_nginx(), "-p", str(folder), "-c", str(folder / "nginx.conf"), "-e", str(folder / "error.log")]
    check = subprocess.run([*args, "-t"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def _page_position(text: str) -> tuple[int, str] | None:
    m = re.search(r'name="position" value="(\d+)"', text)
    return (int(m.group(1)), re.search(r'name="image_id" value="([^"]+)"', text).group(1)) if m else None


class HttpJudge(threading.Thread):
    """A judge over HTTPS through nginx, as a browser would go: link, page, image, answer. Anything
    but the expected answer to a request (a status, a failed connection) is written down in
    ``noticed``; such a request is then sent again, as the page would, so the run goes on."""

    def __init__(self, base: str, cert: Path, label: str, token: str, halfway: threading.Barrier, go: threading.Event,
                 answered: list):
        super().__init__(daemon=True)
        self.base, self.cert, self.label, self.token = base, cert, label, token
        self.halfway, self.go, self.answered = halfway, go, answered
        self.noticed: list[str] = []
        self.secure_cookie = False

    def _call(self, c: httpx.Client, method: str, path: str, expect: int, **kw) -> httpx.Response:
        for _ in range(20):
            try:
                r = c.request(method, path, **kw)
                if r.status_code == expect:
                    return r
                self.noticed.append(f"{method} {path} -> {r.status_code}")
            except httpx.TransportError as exc:
                self.noticed.append(f"{method} {path} -> {exc!r}")
            time.sleep(1)
        raise AssertionError(f"{self.label}: {method} {path} never gave {expect}: {self.noticed[-3:]}")

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.base, verify=str(self.cert), timeout=WAIT_S, follow_redirects=False) as c:
                r = self._call(c, "GET", f"/j/{self.token}", 303)
                self.secure_cookie = "secure" in r.headers["set-cookie"].lower()
                done = 0
                while True:
                    if done == BEFORE_KILL:
                        self.halfway.wait(timeout=WAIT_S)
                        self.go.wait(timeout=WAIT_S)
                    page = self._call(c, "GET", "/judge", 200).text
                    cur = _page_position(page)
                    if cur is None:
                        assert "You have answered every image" in page, page[:300]
                        return
                    self._call(c, "GET", f"/img/{cur[1]}", 200)
                    self._call(c, "POST", "/answer", 303,
                               data={"position": cur[0], "image_id": cur[1], "answer": "yes" if cur[0] % 3 else "no"})
                    self.answered.append((self.label, cur[0]))
                    done += 1
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.noticed.append(f"stopped: {exc!r}")


def _chromium_answer(drv, expect_position: int, key: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def position(d):
        m = _page_position(d.page_source)
        return m[0] if m else ("done" if "You have answered every image" in d.page_source else None)

    assert position(drv) == expect_position
    drv.find_element(By.TAG_NAME, "body").send_keys(key)
    WebDriverWait(drv, WAIT_S, poll_frequency=0.1).until(lambda d: position(d) in (expect_position + 1, "done"))


def _server_waiting_on_the_lock(pg_server, database: str, servers) -> object:
    """The panel server whose PostgreSQL connection waits for a row lock (found by the client port
    of the waiting backend among each server process's connections)."""
    import psutil
    import psycopg

    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        with psycopg.connect(host="127.0.0.1", port=pg_server.port, user="postgres", dbname="postgres") as c:
            ports = {r[0] for r in c.execute("SELECT client_port FROM pg_stat_activity WHERE datname = %s "
                                             "AND wait_event_type = 'Lock'", (database,))}
        for server in servers:
            if ports & {conn.laddr.port for conn in psutil.Process(server.proc.pid).net_connections(kind="tcp")}:
                return server
        time.sleep(0.05)
    raise AssertionError("no panel server's answer waited for the row lock")


def test_nginx_as_documented_hides_a_killed_panel_server_from_judges(tmp_path, monkeypatch, pg_server):
    monkeypatch.delenv("IMAGEBENCH_PANEL_DATABASE", raising=False)
    from schemas.settings import load_settings
    from tasks.beauty.study import open_study

    home = tmp_path / "home"
    for tool in TOOLS:
        write_tool_images(home / "objects", tool, beauty_prompt_ids())
    database = pg_server.url(pg_server.new_database())
    settings = load_settings(home=home, reference_dir=REPO / "reference", store=str(home / "objects"), panel_database=database)
    labels = [f"h{i}" for i in range(HTTP_JUDGES)] + ["browser", "inflight"]
    write_study(settings, "proxied", [(label, "photographers") for label in labels], memo=False)
    tokens = open_study(settings, "proxied").judge_tokens
    n_images = len(TOOLS) * len(beauty_prompt_ids())

    nginx_dir = tmp_path / "nginx"
    nginx_dir.mkdir()
    cert, key = _self_signed(nginx_dir)
    ports, listen_port = (free_port(), free_port()), free_port()
    public = f"https://127.0.0.1:{listen_port}"
    logs = tmp_path / "logs"
    logs.mkdir()
    with panel_serve_cli(home, "proxied", logs, port=ports[0], url=public, database=database) as first, \
            panel_serve_cli(home, "proxied", logs, port=ports[1], url=public, database=database) as second:
        nginx = _start_nginx(nginx_dir, for_this_test(documented_nginx_conf(), ports, listen_port, cert, key))
        try:
            _wait_port(listen_port)
            # nginx refuses a body over client_max_body_size itself.
            with httpx.Client(base_url=public, verify=str(cert), timeout=WAIT_S) as c:
                big = c.post("/answer", content=bytes(2_000_000), headers={"Content-Type": "application/x-www-form-urlencoded"})
                assert big.status_code == 413 and "nginx" in big.text

            halfway, go, answered = threading.Barrier(HTTP_JUDGES + 1), threading.Event(), []
            judges = [HttpJudge(public, cert, label, tokens[label], halfway, go, answered) for label in labels[:HTTP_JUDGES]]
            for j in judges:
                j.start()
            with chromium_driver(1200, 900, extra_flags=("--ignore-certificate-errors",), page_load_timeout_s=WAIT_S) as drv:
                drv.get(f"{public}/j/{tokens['browser']}")
                for k in range(BEFORE_KILL):
                    _chromium_answer(drv, k, "y" if k % 2 else "n")
                halfway.wait(timeout=WAIT_S)  # every judge is half way, through both servers
                # One judge's answer held inside a panel server: its page and image loaded, then a
                # row lock on its queue slot, then the POST (it waits for the lock in the server).
                import psycopg

                held = HttpJudge(public, cert, "inflight", tokens["inflight"], halfway, go, answered)
                c = httpx.Client(base_url=public, verify=str(cert), timeout=WAIT_S, follow_redirects=False)
                held._call(c, "GET", f"/j/{tokens['inflight']}", 303)
                pos, image_id = _page_position(held._call(c, "GET", "/judge", 200).text)
                held._call(c, "GET", f"/img/{image_id}", 200)
                lock = psycopg.connect(host="127.0.0.1", port=pg_server.port, user="postgres", dbname=database.rsplit("/", 1)[1])
                lock.execute("SELECT 1 FROM panel_queue WHERE study_id = 'proxied' AND label = 'inflight' AND position = 0 FOR UPDATE")
                post = threading.Thread(target=held._call, args=(c, "POST", "/answer", 303),
                                        kwargs={"data": {"position": pos, "image_id": image_id, "answer": "yes"}})
                post.start()
                killed = _server_waiting_on_the_lock(pg_server, database.rsplit("/", 1)[1], (first, second))
                kept = second if killed is first else first
                go.set()  # the other judges go on: requests in flight through both servers
                killed.proc.send_signal(signal.SIGKILL)
                killed.proc.wait(timeout=WAIT_S)
                lock.rollback()  # the answer, sent again by nginx to the other server, goes through there
                lock.close()
                post.join(timeout=WAIT_S)
                c.close()
                rest = HttpJudge(public, cert, "inflight", tokens["inflight"], threading.Barrier(1), go, answered)
                rest.start()  # the same judge answers the rest of the queue
                judges.append(rest)
                for k in range(BEFORE_KILL, n_images):
                    _chromium_answer(drv, k, "y" if k % 2 else "n")
                assert "You have answered every image" in drv.page_source
            for j in judges:
                j.join(timeout=WAIT_S * 5)
        finally:
            nginx.terminate()
            nginx.wait(timeout=WAIT_S)
        assert killed.proc.returncode == -signal.SIGKILL and kept.proc.poll() is None
        # nginx met the killed server (a request in flight cut off, or a refused connection) and
        # sent the request to the other one.
        met = [line for line in (nginx_dir / "error.log").read_text().splitlines()
               if "upstream" in line and f"127.0.0.1:{killed.port}" in line]
        assert met, "nginx never met the killed server (it should have, and gone on to the other)"
        served = {name: server.log().count("POST /answer 303") for name, server in (("killed", killed), ("kept", kept))}
        assert served["killed"] > 0 and served["kept"] > 0, served  # both took answers

    assert [n for j in [*judges, held] for n in j.noticed] == []  # no judge saw an error or sent anything twice
    assert all(j.secure_cookie for j in judges)
    from schemas.study import salted_judge_id

    store = PanelStore.open(settings.home / "studies" / "proxied", database=database)
    try:
        rows = store.answers_table("s").to_pylist()
        assert sorted(r["position"] for r in rows if r["judge_id"] == salted_judge_id("s", "inflight")) == list(range(n_images))
        assert len(rows) == len(labels) * n_images
        assert len({(r["judge_id"], r["position"]) for r in rows}) == len(rows)
        assert all(p["answered"] == n_images for p in store.judge_progress())
    finally:
        store.dispose()
