"""The PI stays blind until the close (issue 27 item 5) and the closed page names no study (item 8),
over real HTTP (uvicorn on loopback, httpx) and the real CLI.

During collection the admin page shows progress only: judges finished N of M, each judge's
position, answers, last answer and whether they are stuck; no tool, no prompt, no count of yes,
no % yes. A look at the results before the close needs a typed reason and is recorded as a
deviation from the pre-registration (the store's record, `study status`, the bundle: see
tests/beauty/test_deviations.py). After `study close` the results are on the page."""

from __future__ import annotations

import re

import httpx
import pytest

from tasks.beauty.store import PanelStore
from tests.panel.conftest import TOOLS, beauty_prompt_ids, open_new_study, serve

STUDY = "blind-admin"


def _client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, follow_redirects=False, timeout=30)


def _answer(c: httpx.Client, token: str, n: int | None) -> int:
    """Judge ``token`` answers ``n`` images (None: all). Returns how many."""
    assert c.get(f"/j/{token}").status_code == 303
    done = 0
    while n is None or done < n:
        page = c.get("/judge").text
        if "You have answered every image" in page:
            break
        pos = int(re.search(r'name="position" value="(\d+)"', page).group(1))
        img = re.search(r'name="image_id" value="([^"]+)"', page).group(1)
        assert c.get(f"/img/{img}").status_code == 200
        assert c.post("/answer", data={"position": pos, "image_id": img, "answer": "yes" if pos % 2 else "no"}).status_code == 303
        done += 1
    return done


def _results_shown(page: str) -> list[str]:
    """Everything on an admin page that is a result: tools, prompts, yes counts, % yes."""
    found = [t for t in TOOLS if t in page] + [p for p in beauty_prompt_ids() if p in page]
    found += [x for x in ("% yes", "data-pair", 'class="yes"', "%") if x in page]
    return found


def test_admin_page_shows_progress_and_no_results_until_the_close(panel_settings, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app
    from tasks.beauty.study import close_study

    judges = [("fast", "photographers"), ("half", "aphantasia"), ("idle", "aphantasia")]
    opened = open_new_study(panel_settings, STUDY, judges, memo=False)
    total = len(TOOLS) * len(beauty_prompt_ids())
    with serve(panel_settings, STUDY) as s:
        with _client(s.url) as fast, _client(s.url) as half:
            assert _answer(fast, opened.tokens["fast"], None) == total
            assert _answer(half, opened.tokens["half"], 5) == 5
        with _client(s.url) as admin:
            assert admin.get(f"/admin/{opened.admin_token}").status_code == 303
            page = admin.get("/admin").text
            assert _results_shown(page) == [], page
            assert 'id="results-hidden"' in page and 'id="peek-form"' in page
            assert re.search(r'id="finished">\s*1 of 3 judges finished', page), page
            rows = dict(re.findall(r'<tr data-judge="(\w+)">(.*?)</tr>', page, re.S))
            assert set(rows) == {"fast", "half", "idle"}
            assert 'class="state">finished<' in rows["fast"] and 'class="state">answering<' in rows["half"]
            assert 'class="state">not started<' in rows["idle"]
            assert f'class="position">image 6 of {total}<' in rows["half"]
            assert re.search(r'class="last">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC<', rows["half"])

            # Two hours later "half" has not come back: the page says who is stuck.
            import tasks.beauty.store as beauty_store

            later = beauty_store.now_us() + 2 * 3600 * 1_000_000
            with monkeypatch.context() as mp:
                mp.setattr(beauty_store, "now_us", lambda: later)
                page = admin.get("/admin").text
            rows = dict(re.findall(r'<tr data-judge="(\w+)">(.*?)</tr>', page, re.S))
            assert re.search(r'class="state">stuck: no answer for 2 h', rows["half"]), rows["half"]
            assert 'class="state">finished<' in rows["fast"] and 'class="state">not started<' in rows["idle"]
            assert _results_shown(page) == []

            # A look before the close needs a reason; without one nothing is shown or recorded.
            store = PanelStore.open(opened.study_dir)
            refused = admin.post("/admin/peek", data={"reason": "just curious"})
            assert refused.status_code == 400 and _results_shown(refused.text) == [] and store.deviations() == []
            reason = "The ethics board asked whether one tool fails to load for judges"
            peek = admin.post("/admin/peek", data={"reason": reason})
            assert peek.status_code == 200 and 'id="pairs"' in peek.text and "% yes" in peek.text
            assert 'id="deviation-recorded"' in peek.text
            (dev,) = store.deviations()
            assert dev["reason"] == reason and dev["answers"] == total + 5 and dev["by"] == "admin page"
            assert _results_shown(admin.get("/admin").text) == []  # one look, not a key to the results
            # Another site's page cannot make the admin's browser peek: the cookie is SameSite=Lax, and
            # a POST without it gets nothing.
            with _client(s.url) as stranger:
                assert stranger.post("/admin/peek", data={"reason": reason}).status_code == 401
            assert len(store.deviations()) == 1

            # The command line's look is recorded the same way, and `study status` lists both.
            for key, value in {"IMAGEBENCH_HOME": str(panel_settings.home), "IMAGEBENCH_STORE": str(panel_settings.store),
                               "IMAGEBENCH_REFERENCE_DIR": str(panel_settings.reference_dir)}.items():
                monkeypatch.setenv(key, value)
            r = CliRunner().invoke(app, ["study", "peek", STUDY])
            assert r.exit_code != 0 and "--reason" in r.output and len(store.deviations()) == 1
            r = CliRunner().invoke(app, ["study", "peek", STUDY, "--reason", "Second look: the board wants the per-tool counts"])
            assert r.exit_code == 0, r.output
            assert all(t in r.stdout for t in TOOLS) and "deviation" in r.output
            assert [d["by"] for d in store.deviations()] == ["admin page", "command line"]
            r = CliRunner().invoke(app, ["study", "status", STUDY])
            assert r.exit_code == 0 and "2 deviations from the pre-registration" in r.output, r.output

            close_study(panel_settings, STUDY)
            page = admin.get("/admin").text
            assert 'id="pairs"' in page and "% yes" in page and 'id="results-hidden"' not in page
            shown = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(
                r'<tr data-pair="([^"]+)">.*?<td class="answers">(\d+)</td><td class="yes">(\d+)</td>', page, re.S)}
            assert shown == {f"{p['tool']}/{p['prompt_id']}": (p["answers"], p["yes"]) for p in store.pair_counts()}
            assert 'id="deviations"' in page and reason in page
            store.dispose()


def test_the_closed_page_says_only_that_the_panel_has_ended(panel_settings):
    """A judge who comes back after `study close` (the page, an answer sent late) is told that the
    panel has ended: no study id on the page, in its title or anywhere in the response."""
    from tasks.beauty.study import close_study

    study_id = "closed-x7q-study"
    opened = open_new_study(panel_settings, study_id, [("j1", "photographers")], memo=False)
    with serve(panel_settings, study_id) as s, _client(s.url) as c:
        c.get(f"/j/{opened.tokens['j1']}")
        page = c.get("/judge").text
        pos = int(re.search(r'name="position" value="(\d+)"', page).group(1))
        img = re.search(r'name="image_id" value="([^"]+)"', page).group(1)
        close_study(panel_settings, study_id)
        for r in (c.get("/judge"), c.post("/answer", data={"position": pos, "image_id": img, "answer": "yes"})):
            text = r.text + "\n".join(f"{k}: {v}" for k, v in r.headers.items())
            assert r.status_code == 409 and study_id not in text and "x7q" not in text, text
            assert "<title>The panel has ended</title>" in r.text
            assert re.search(r'id="message">This panel has ended', r.text)
