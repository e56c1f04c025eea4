"""A closed VAB study's pages say only that the panel has ended, as the Beauty Index's do
(issue 27 item 8): an expert is not shown the study's id, neither on the page their link opens
nor when an answer comes back refused. The real app on uvicorn, a real HTTP client (httpx)."""

from __future__ import annotations

import io

import httpx
from PIL import Image

from schemas.vab import VabTask

STUDY = "vab-closed-study"
TASKS = [VabTask(task_id="photo-1", domain="photography", images=["a.png", "b.png", "c.png"], best=1, worst=3)]


def _png(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), ((seed * 53) % 256, (seed * 97) % 256, 40)).save(out, "PNG")
    return out.getvalue()


def test_a_closed_vab_study_says_only_that_the_panel_has_ended(tmp_path):
    from tasks.vab.panel import create_vab_app, open_store, open_vab_study
    from tests.panel.conftest import make_settings, serve

    settings = make_settings(tmp_path / "home")
    opened = open_vab_study(settings, STUDY, "demo-sets", TASKS, ["e1"], protocols=("rank",), seed=3,
                            read_image=lambda t, i: _png(i))
    with serve(settings, STUDY, app=create_vab_app(settings, STUDY)) as served, \
            httpx.Client(base_url=served.url, timeout=60, follow_redirects=False) as c:
        assert c.get(f"/j/{opened.tokens['e1']}").status_code == 303
        page = c.get("/expert")
        assert page.status_code == 200 and 'name="position" value="0"' in page.text
        ids = page.text.split('name="images" value="', 1)[1].split('"', 1)[0]
        store = open_store(settings, STUDY)
        try:
            assert store.close() is True
        finally:
            store.dispose()
        for r in (c.get("/expert"),
                  c.post("/answer", data={"position": "0", "protocol": "rank", "images": ids, "best": "1", "worst": "2"})):
            assert r.status_code == 409, r.text
            assert "This panel has ended" in r.text and STUDY not in r.text, r.text
    store = open_store(settings, STUDY)
    try:
        assert store.answer_rows() == []
    finally:
        store.dispose()
