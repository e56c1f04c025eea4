"""`imagebench vab panel open|status|export|analyze|close` on an imported set collection (in-process
CLI), with the experts' answers POSTed to the real app (in-process ASGI client): what the server
refuses, what a double POST records, and that a closed study takes nothing more."""

from __future__ import annotations

import json
import re

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from flows.cli import app
from tests.vab.test_sets import GOOD, _manifest, _png


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("IMAGEBENCH_HOME", str(h))
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    return h


def _invoke(*args):
    return CliRunner().invoke(app, list(args))


def _names(page: str, word: str) -> bool:
    """Whether `word` stands on its own in the page: not inside a random base64url token (an image
    id or the form's nonce), where two letters like "a1" turn up by chance."""
    return re.search(rf"(?<![A-Za-z0-9_-]){re.escape(word)}(?![A-Za-z0-9_-])", page) is not None


def _form(page: str) -> dict:
    return {k: re.search(rf'name="{k}" value="([^"]*)"', page).group(1) for k in ("position", "protocol", "images")}


def test_open_answer_refusals_export_analyze_close(home, tmp_path):
    from schemas.settings import load_settings
    from tasks.vab.panel import create_vab_app

    src = tmp_path / "src"
    for i in range(1, 6):
        _png(src / f"img{i}.png", (40 * i, 200 - 30 * i, 9 * i))
    assert _invoke("vab", "import-sets", str(_manifest(src, GOOD)), "--name", "mine").exit_code == 0
    r = _invoke("vab", "panel", "open", "st1", "--sets", "mine", "--experts", "x01,x02", "--url", "https://panel.example/")
    assert r.exit_code == 0, r.output
    links = dict(line.split("\t") for line in r.stdout.strip().splitlines())
    assert set(links) == {"x01", "x02", "admin"} and all(v.startswith("https://panel.example/") for v in links.values())
    again = _invoke("vab", "panel", "open", "st1", "--sets", "mine", "--experts", "x03")
    assert again.exit_code != 0 and "already open" in again.output
    bad = _invoke("vab", "panel", "open", "st2", "--sets", "nope", "--experts", "x01")
    assert bad.exit_code != 0 and "nope" in bad.output

    settings = load_settings(home=home)
    client = TestClient(create_vab_app(settings, "st1"))
    for label in ("x01", "x02"):
        client.cookies.clear()
        landing = client.get("/j/" + links[label].rsplit("/", 1)[1], follow_redirects=False)
        assert "samesite=lax" in landing.headers["set-cookie"].lower()  # a link clicked in webmail gets in
        page = client.get(landing.headers["location"]).text
        for k in range(4):
            f = _form(page)
            assert int(f["position"]) == k and not _names(page, "p1") and not _names(page, "a1")  # blind
            n = len(f["images"].split())
            if f["protocol"] == "rank" and n == 3 and label == "x01":
                same = client.post("/answer", data={**f, "best": "1", "worst": "1"})
                assert same.status_code == 400 and "different from the best" in same.text
                ahead = client.post("/answer", data={**f, "position": str(k + 1), "best": "1", "worst": "2"})
                assert ahead.status_code == 403  # not the images of that item
            if f["protocol"] == "score" and label == "x01":
                wrong = client.post("/answer", data={**f, **{f"s{i}": "7.55" for i in range(1, n + 1)}})
                assert wrong.status_code == 400 and "at most one decimal" in wrong.text
            # x01 always names shown slot 1 best / slot n worst, x02 slot 2 / slot 1; scores 1..n
            if f["protocol"] == "rank":
                b, w = ("1", str(n)) if label == "x01" else ("2", "1")
                ans = {"best": b} | ({"worst": w} if n >= 3 else {})
            else:
                ans = {f"s{i}": f"{i}.5" for i in range(1, n + 1)}
            resp = client.post("/answer", data={**f, **ans})
            assert resp.status_code == 200  # followed the redirect to the next item
            assert client.post("/answer", data={**f, **ans}, follow_redirects=False).status_code == 303  # retry: no 2nd row
            page = resp.text
        assert "You have answered every set" in page

    r = _invoke("vab", "panel", "status", "st1")
    assert r.exit_code == 0 and r.stdout.splitlines() == ["x01\t4/4", "x02\t4/4", "state\topen"]
    r = _invoke("vab", "panel", "export", "st1")
    assert r.exit_code == 0 and "4 rows of 2 experts" in r.output
    r = _invoke("sql", "SELECT judge_kind, count(*) AS n FROM vab_trials GROUP BY judge_kind", "--format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout) == [{"judge_kind": "human", "n": 4}]
    r = _invoke("vab", "leaderboard", "--sets", "mine", "--format", "json")  # scored like any judge
    assert r.exit_code == 0, r.output
    board = json.loads(r.stdout)
    assert len(board) == 2 and all(b["judge"].startswith("expert-") and b["tasks"] == 2 for b in board)
    r = _invoke("vab", "panel", "analyze", "st1")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["experts"] == 2 and rep["tasks"] == 2 and rep["scores_vs_ranking"]["pairs"] == 4
    # scores rise with the shown slot, so the top score is the image last shown in the score block; the
    # named best is rank-block slot 1 (x01) or 2 (x02): mapped back through each block's own permutation
    from tasks.vab.panel import expert_queue, open_store

    store = open_store(settings, "st1")
    seed = store.study_row()["order_seed"]
    store.dispose()
    consistent = 0
    for label, slot in (("x01", 1), ("x02", 2)):
        q = {(i["protocol"], i["task_id"]): i["shown_order"] for i in expert_queue(seed, label, [("p1", 3), ("a1", 2)])}
        consistent += sum(q[("rank", t)][slot - 1] == q[("score", t)][-1] for t in ("p1", "a1"))
    assert rep["scores_vs_ranking"]["top1_consistency"] == 100.0 * consistent / 4
    assert set(rep["agreement_best"]) >= {"fleiss_kappa", "krippendorff_alpha"}
    # a store edited by hand to hold best = worst is not exported (the page and the server refuse it)
    from sqlalchemy import update

    from tasks.vab.store import vanswers

    store = open_store(settings, "st1")
    with store._tx() as c:
        c.execute(update(vanswers).where((vanswers.c.label == "x01") & (vanswers.c.task_id == "p1") & (vanswers.c.protocol == "rank"))
                  .values(worst_shown=vanswers.c.best_shown))
    store.dispose()
    r = _invoke("vab", "panel", "export", "st1")
    assert r.exit_code == 1 and "1 answer(s) name the same image best and worst" in r.output, r.output

    assert _invoke("vab", "panel", "close", "st1").exit_code == 0
    client.cookies.clear()
    page = client.get("/j/" + links["x01"].rsplit("/", 1)[1])
    assert page.status_code == 409 and "has ended" in page.text and "st1" not in page.text  # the study id is not the judge's to see
