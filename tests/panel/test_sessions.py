"""Sessions and links of the judging app over real HTTP (issue 16 items 1 and 10): one cookie per
role, SameSite=Lax, Max-Age from the setting, Secure behind https, one session per link, expiry,
relink, images only while the study is open, out-of-range positions refused with a 4xx.
The browser side of the same points is tests/panel/test_browser_sessions.py."""

from __future__ import annotations

import httpx
import pytest

from tasks.panel.app import COOKIES
from tasks.panel.store import now_us
from tasks.beauty.store import PanelStore
from tests.panel.conftest import REPO, TOOLS, beauty_prompt_ids, open_new_study, serve, write_tool_images


def _client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, follow_redirects=False, timeout=30)


def _set_cookie(r: httpx.Response) -> dict[str, str]:
    """The Set-Cookie header as {attribute (lower case): value}, the cookie itself under 'name'/'value'."""
    (header,) = r.headers.get_list("set-cookie")
    first, *attrs = [p.strip() for p in header.split(";")]
    name, _, value = first.partition("=")
    out = {"name": name, "value": value}
    for a in attrs:
        k, _, v = a.partition("=")
        out[k.lower()] = v or "true"
    return out


@pytest.mark.parametrize("public_url", [None, "https://panel.example.org"])
def test_cookie_per_role_lax_expiring_secure_on_https(panel_settings, panel_study, public_url):
    with serve(panel_settings, panel_study.study_id, public_url=public_url) as s, _client(s.url) as c:
        judge = _set_cookie(c.get(f"/j/{panel_study.tokens['p00']}"))
        admin = _set_cookie(c.get(f"/admin/{panel_study.admin_token}"))
        assert (judge["name"], admin["name"]) == (COOKIES["judge"], COOKIES["admin"]) and judge["name"] != admin["name"]
        for cookie in (judge, admin):
            assert cookie["samesite"].lower() == "lax" and cookie["httponly"] == "true" and cookie["path"] == "/"
            assert int(cookie["max-age"]) == 28 * 86400  # the default panel_session_days
            assert ("secure" in cookie) == (public_url is not None)
        if public_url is None:  # (a client sends a Secure cookie over https only)
            # both roles at once in one cookie jar: the admin link did not end the judge's session
            assert c.get("/judge").status_code == 200 and c.get("/admin").status_code == 200


def test_https_url_given_at_open_makes_the_served_cookies_secure(tmp_path, monkeypatch):
    """`study open --url https://...` is remembered: `panel serve` without --url sets Secure."""
    from typer.testing import CliRunner

    from flows.cli import app
    from tests.panel.conftest import make_settings, write_study

    for tool in TOOLS:
        write_tool_images(tmp_path / "objects", tool, beauty_prompt_ids())
    for key, value in {"IMAGEBENCH_HOME": str(tmp_path), "IMAGEBENCH_REFERENCE_DIR": str(REPO / "reference"),
                       "IMAGEBENCH_STORE": str(tmp_path / "objects")}.items():
        monkeypatch.setenv(key, value)
    settings = make_settings(tmp_path)
    write_study(settings, "tls", [("j1", "photographers")], memo=False)
    r = CliRunner().invoke(app, ["study", "open", "tls", "--url", "https://panel.example.org/"])
    assert r.exit_code == 0, r.output
    token = next(x for x in r.stdout.splitlines() if x.startswith("judge j1: ")).rsplit("/", 1)[1]
    with serve(settings, "tls") as s, _client(s.url) as c:
        assert "secure" in _set_cookie(c.get(f"/j/{token}"))
    r = CliRunner().invoke(app, ["study", "relink", "tls", "--judge", "j1"])
    assert r.exit_code == 0 and "judge j1: https://panel.example.org/j/" in r.stdout


def test_same_link_twice_keeps_one_session_and_sessions_expire(panel_study, panel_server):
    token = panel_study.tokens["a00"]
    with _client(panel_server.url) as first, _client(panel_server.url) as second:
        assert first.get(f"/j/{token}").status_code == 303 and first.get("/judge").status_code == 200
        assert second.get(f"/j/{token}").status_code == 303
        assert second.get("/judge").status_code == 200
        assert first.get("/judge").status_code == 401  # the newer session replaced the older
        secret = second.cookies[COOKIES["judge"]]
    store = PanelStore.open(panel_study.study_dir)
    try:
        from sqlalchemy import func, select

        from tasks.beauty.store import sessions

        with store.engine.connect() as conn:
            n = conn.execute(select(func.count()).select_from(sessions).where(
                sessions.c.study_id == store.study_id, sessions.c.role == "judge", sessions.c.label == "a00")).scalar()
        assert n == 1
        # expiry: valid until max_age after creation, not after (explicit clock: no sleeping)
        assert store.session(secret, max_age_s=60) == ("judge", "a00")
        assert store.session(secret, max_age_s=60, at_us=now_us() + 61_000_000) is None
    finally:
        store.dispose()


def test_expired_session_cookie_is_refused_by_the_app(tmp_path):
    from tests.panel.conftest import make_settings

    settings = make_settings(tmp_path)
    for tool in TOOLS:
        write_tool_images(tmp_path / "objects", tool, beauty_prompt_ids())
    opened = open_new_study(settings, "expiry", [("j1", "photographers")])
    short = settings.model_copy(update={"panel_session_days": 1e-9})  # 86 microseconds
    with serve(short, "expiry") as s, _client(s.url) as c:
        cookie = _set_cookie(c.get(f"/j/{opened.tokens['j1']}"))
        assert int(cookie["max-age"]) == 0
        # a browser would drop it at once; sent anyway, the server refuses it (its own clock)
        r = httpx.get(f"{s.url}/judge", headers={"Cookie": f"{cookie['name']}={cookie['value']}"})
        assert r.status_code == 401 and "Open your link" in r.text


@pytest.mark.parametrize("position", ["9223372036854775808", "2147483648", "-1", "1e3", "", "٣"])
def test_out_of_range_positions_are_4xx(panel_study, panel_server, position):
    with _client(panel_server.url) as c:
        c.get(f"/j/{panel_study.tokens['a01']}")
        r = c.post("/answer", data={"position": position, "image_id": "AAAAAAAAAAAAAAAA", "answer": "yes"})
        assert r.status_code == 400, r.text
        r = c.post(f"/memo?position={position}&consent=1", content=b"x", headers={"Content-Type": "audio/webm"})
        assert r.status_code == 400, r.text


def test_images_are_not_served_after_close(panel_settings):
    import re

    from tasks.beauty.study import close_study

    opened = open_new_study(panel_settings, "img-close", [("j1", "photographers")], memo=False)
    with serve(panel_settings, "img-close") as s, _client(s.url) as c:
        c.get(f"/j/{opened.tokens['j1']}")
        img = re.search(r'src="/img/([^"]+)"', c.get("/judge").text).group(1)
        assert c.get(f"/img/{img}").status_code == 200
        close_study(panel_settings, "img-close")
        assert c.get(f"/img/{img}").status_code == 404


def test_relink_issues_a_new_link_and_the_old_one_dies(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app
    from tests.panel.conftest import make_settings

    for tool in TOOLS:
        write_tool_images(tmp_path / "objects", tool, beauty_prompt_ids())
    monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path))
    monkeypatch.setenv("IMAGEBENCH_REFERENCE_DIR", str(REPO / "reference"))
    monkeypatch.setenv("IMAGEBENCH_STORE", str(tmp_path / "objects"))
    settings = make_settings(tmp_path)
    opened = open_new_study(settings, "relink", [("j1", "photographers"), ("j2", "aphantasia")], memo=False)
    with serve(settings, "relink") as s, _client(s.url) as old:
        assert old.get(f"/j/{opened.tokens['j1']}").status_code == 303 and old.get("/judge").status_code == 200
        r = CliRunner().invoke(app, ["study", "relink", "relink", "--judge", "j1", "--url", s.url])
        assert r.exit_code == 0, r.output
        (line,) = [x for x in r.stdout.splitlines() if x.startswith("judge j1: ")]
        new_link = line.split(": ", 1)[1]
        assert new_link.startswith(f"{s.url}/j/") and opened.tokens["j1"] not in new_link
        assert old.get("/judge").status_code == 401  # the lost link's session ended
        assert old.get(f"/j/{opened.tokens['j1']}").status_code == 404  # the old link died
        with _client(s.url) as fresh:
            assert fresh.get(new_link.removeprefix(s.url)).status_code == 303 and fresh.get("/judge").status_code == 200
            assert fresh.get(f"/j/{opened.tokens['j2']}").status_code == 303  # other judges untouched
    r = CliRunner().invoke(app, ["study", "relink", "relink", "--judge", "nobody"])
    assert r.exit_code == 1 and "has no judge 'nobody'" in r.output
