"""The judging app over real HTTP (uvicorn on loopback, httpx): blinding of every response of a
whole judge session, durable single answers, refusals, memos, closed studies, 50 judges at once."""

from __future__ import annotations

import re
import threading

import httpx
import pytest

from tasks.panel.blind import metadata_markers_in
from tasks.beauty.store import PanelStore
from tests.panel.conftest import TOOLS, beauty_prompt_ids, open_new_study, serve

from tests.panel.audio import encoded_audio, wav_audio

FAKE_WEBM = b"\x1a\x45\xdf\xa3" + b"\x9f\x42\x86\x81\x01" + bytes(200)  # right first bytes, no audio
WEBM = encoded_audio("webm", 2.0)  # a real 2-second Opus memo in WebM


def _client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, follow_redirects=False, timeout=30)


def _current(page: str) -> tuple[int, str]:
    pos = int(re.search(r'name="position" value="(\d+)"', page).group(1))
    img = re.search(r'name="image_id" value="([^"]+)"', page).group(1)
    return pos, img


def _login(c: httpx.Client, token: str) -> None:
    r = c.get(f"/j/{token}")
    assert r.status_code == 303 and r.headers["location"] == "/judge"


def test_whole_judge_session_betrays_no_tool_and_leaks_no_token(panel_study, panel_server):
    """Every response of a whole session (pages, images, script, css, redirects: bodies, headers
    and URLs) is scanned for each tool name, prompt id and metadata marker; logs hold no token."""
    token = panel_study.tokens["p00"]
    seen: list[tuple[str, bytes]] = []

    def keep(r: httpx.Response) -> httpx.Response:
        head = "\n".join(f"{k}: {v}" for k, v in r.headers.items()).encode()
        seen.append((str(r.url), r.content + b"\n" + head + b"\n" + str(r.url).encode()))
        return r

    with _client(panel_server.url) as c:
        keep(c.get(f"/j/{token}"))
        for c_path in ("/static/judge.js", "/static/panel.css"):
            keep(c.get(c_path))
        answered = []
        while True:
            page = keep(c.get("/judge"))
            assert page.status_code == 200
            if "You have answered every image" in page.text:
                break
            pos, img = _current(page.text)
            image = keep(c.get(f"/img/{img}"))
            assert image.status_code == 200 and image.content[:2] == b"\xff\xd8"
            assert "content-disposition" not in image.headers
            r = keep(c.post("/answer", data={"position": pos, "image_id": img, "answer": "yes" if pos % 3 else "no"}))
            assert r.status_code == 303
            answered.append((pos, img))
    assert [p for p, _ in answered] == list(range(len(TOOLS) * 10))
    names = [t.encode() for t in TOOLS] + [t.split("-")[0].encode() for t in TOOLS]
    names += [pid.encode() for pid in beauty_prompt_ids()]
    for url, blob in seen:
        low = blob.lower()
        assert not [n for n in names if n.lower() in low], url
        assert metadata_markers_in(blob) == [], url
    log = "\n".join(panel_server.log.lines)
    assert "/j/<redacted>" in log and token not in log
    # Durable and exactly one per image, as the admin and the export will read them.
    table = PanelStore.open(panel_study.study_dir).answers_table("salt")
    from schemas.study import salted_judge_id

    mine = [r for r in table.to_pylist() if r["judge_id"] == salted_judge_id("salt", "p00")]
    assert len(mine) == len(answered) and all(r["answered_at"] >= r["shown_at"] for r in mine)
    assert "p00" not in str(table.to_pylist())


def test_double_post_records_one_and_refusals(panel_study, panel_server):
    with _client(panel_server.url) as c, _client(panel_server.url) as other:
        _login(c, panel_study.tokens["p01"])
        _login(other, panel_study.tokens["p02"])
        pos, img = _current(c.get("/judge").text)
        # Another judge's session cookie is no use for answering this judge's queue position.
        assert other.post("/answer", data={"position": pos, "image_id": img, "answer": "no"}).status_code in (403, 409)
        body = {"position": pos, "image_id": img, "answer": "yes"}
        assert c.post("/answer", data=body).status_code == 303
        assert c.post("/answer", data={**body, "answer": "no"}).status_code == 303  # retried: no change, no duplicate
        # An image that is not at that place of the judge's queue, skipping ahead, a bad answer.
        queue = PanelStore.open(panel_study.study_dir).queue_of("p01")
        assert c.post("/answer", data={"position": pos + 1, "image_id": queue[pos + 2], "answer": "yes"}).status_code == 403
        assert c.post("/answer", data={"position": pos + 3, "image_id": queue[pos + 3], "answer": "yes"}).status_code == 409
        assert c.post("/answer", data={"position": pos + 1, "image_id": queue[pos + 1], "answer": "maybe"}).status_code == 400
        # Images of no queue at all (forged ids) and forged tokens.
        assert c.get("/img/AAAAAAAAAAAAAAAAAAAAAA").status_code == 404
        assert c.get("/j/" + "x" * 43).status_code == 404
        assert c.get("/admin/" + panel_study.tokens["p01"]).status_code == 404  # a judge token is no admin token
        assert httpx.get(panel_server.url + "/judge").status_code == 401  # no session cookie
    # This judge's rows only: another judge may have the same image at the same place of their own
    # (random) queue.
    from schemas.study import salted_judge_id

    mine = salted_judge_id("s", "p01")
    rows = [r for r in PanelStore.open(panel_study.study_dir).answers_table("s").to_pylist() if r["judge_id"] == mine]
    assert len([r for r in rows if r["position"] == pos and r["image_id"] == img]) == 1
    assert [r["answer"] for r in rows if r["image_id"] == img and r["position"] == pos] == [True]


def test_memo_upload_checks_and_link(panel_study, panel_server):
    from tasks.runs.units_ingest import open_configured_store

    with _client(panel_server.url) as c:
        _login(c, panel_study.tokens["p03"])
        pos, img = _current(c.get("/judge").text)
        up = lambda data, ctype="audio/webm", consent=1: c.post(  # noqa: E731
            f"/memo?position={pos}&consent={consent}", content=data, headers={"Content-Type": ctype})
        assert up(WEBM, consent=0).status_code == 400
        assert up(WEBM, "image/png").status_code == 415
        assert up(b"<html>" + bytes(100)).status_code == 415  # declared audio, is not
        assert up(WEBM + bytes(1_000_001)).status_code == 413
        # Decoded, not sniffed: magic bytes alone, a container of another type, a header whose
        # payload is noise, more than 10 seconds, a position out of range.
        assert up(FAKE_WEBM).status_code == 415
        assert up(WEBM, "audio/ogg").status_code == 415 and up(encoded_audio("ogg", 1.0), "audio/webm").status_code == 415
        assert up(WEBM[:200] + bytes(range(256)) * 40).status_code == 415
        too_long = up(encoded_audio("webm", 11.0))
        assert too_long.status_code == 413 and "longer than 10 seconds" in too_long.json()["error"]
        assert c.post("/memo?position=9223372036854775808&consent=1", content=WEBM,
                      headers={"Content-Type": "audio/webm"}).status_code == 400
        assert up(wav_audio(1.0), "audio/wav").status_code == 200 and up(encoded_audio("ogg", 1.0), "audio/ogg").status_code == 200
        ok = up(WEBM)
        assert ok.status_code == 200
        memo_id = ok.json()["memo_id"]
        assert c.post("/answer", data={"position": pos, "image_id": img, "answer": "yes", "memo_id": memo_id}).status_code == 303
    store = PanelStore.open(panel_study.study_dir)
    (memo,) = [m for m in store.memo_rows() if m["memo_id"] == memo_id]
    assert memo["object_key"] == f"studies/shared/memos/{memo_id}.webm" and memo["consent"]
    objects = open_configured_store(panel_study.settings)
    assert (panel_study.settings.home / "objects" / memo["object_key"]).read_bytes() == WEBM, objects
    from schemas.study import salted_judge_id

    mine = salted_judge_id("s", "p03")  # another judge may have this image at this place of their queue
    row = [r for r in store.answers_table("s").to_pylist()
           if r["judge_id"] == mine and r["image_id"] == img and r["position"] == pos]
    assert len(row) == 1 and row[0]["memo"] is True


def test_closed_study_accepts_nothing(panel_settings):
    from tasks.beauty.study import close_study

    opened = open_new_study(panel_settings, "closing", [("j1", "photographers")])
    with serve(panel_settings, "closing") as s, _client(s.url) as c:
        _login(c, opened.tokens["j1"])
        pos, img = _current(c.get("/judge").text)
        assert close_study(panel_settings, "closing") is True
        assert c.post("/answer", data={"position": pos, "image_id": img, "answer": "yes"}).status_code == 409
        assert c.post(f"/memo?position={pos}&consent=1", content=WEBM, headers={"Content-Type": "audio/webm"}).status_code == 409
        memo = c.post(f"/memo?position={pos}&consent=1", content=WEBM, headers={"Content-Type": "audio/webm"})
        assert "closing" not in memo.text and memo.json()["error"].startswith("This panel has ended")  # issue 27 item 8
        assert "has ended" in c.get("/judge").text
    assert PanelStore.open(opened.study_dir).answer_count() == 0


def test_fifty_judges_at_once_lose_nothing_and_duplicate_nothing(panel_settings):
    """50 judges answer concurrently, each POST sent twice at once (a double click): every answer
    is recorded exactly once. Bounded: 4 answers per judge."""
    labels = [f"load{i:02d}" for i in range(50)]
    opened = open_new_study(panel_settings, "load", [(label, "photographers") for label in labels], memo=False)
    per_judge = 4
    errors: list[str] = []
    with serve(panel_settings, "load") as s:
        def judge(label: str) -> None:
            try:
                with _client(s.url) as c:
                    _login(c, opened.tokens[label])
                    for _ in range(per_judge):
                        pos, img = _current(c.get("/judge").text)
                        body = {"position": pos, "image_id": img, "answer": "yes" if pos % 2 else "no"}
                        twice = [threading.Thread(target=lambda: c.post("/answer", data=body)) for _ in range(2)]
                        for t in twice:
                            t.start()
                        for t in twice:
                            t.join()
            except Exception as exc:  # noqa: BLE001 - reported below with the judge
                errors.append(f"{label}: {exc!r}")

        threads = [threading.Thread(target=judge, args=(label,)) for label in labels]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert errors == []
    store = PanelStore.open(opened.study_dir)
    rows = store.answers_table("s").to_pylist()
    assert len(rows) == 50 * per_judge
    assert len({(r["judge_id"], r["position"]) for r in rows}) == len(rows)
    assert sorted({r["position"] for r in rows}) == list(range(per_judge))
    assert all(p["answered"] == per_judge for p in store.judge_progress())


@pytest.mark.parametrize("role", ["judge", "admin"])
def test_admin_page_needs_its_own_token(panel_study, panel_server, role):
    with _client(panel_server.url) as c:
        if role == "judge":
            _login(c, panel_study.tokens["b00"])
            assert c.get("/admin").status_code == 401
        else:
            r = c.get(f"/admin/{panel_study.admin_token}")
            assert r.status_code == 303
            page = c.get("/admin")
            # progress while the study runs, no tool or result (issue 27 item 5: tests/panel/test_admin_blind.py)
            assert page.status_code == 200 and 'id="judges"' in page.text and TOOLS[0] not in page.text
            assert panel_study.admin_token not in "\n".join(panel_server.log.lines)
