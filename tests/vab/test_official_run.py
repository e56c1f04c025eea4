"""`vab run --prompt vab-official-v1` through one real `vab-run` Prefect flow (issue 17 item 3): a
fake OpenAI-compatible VLM answers eval.py's three prompts in letters; the requests are eval.py's
(question first, "Image A:" before each image, temperature 1.0), an unreadable answer is asked 3
times then kept as unparsable, 2-image pick_best_and_worst rows are derived, the Great
Expectations suite passes, and `vab summarize` / `vab leaderboard` give the numbers by hand."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from tests.fake_openai import FakeOpenAI, RecordedRequest, Reply

SETS = "demo-official"
UNREADABLE = "demo-coffee-jpeg"  # its pick_best answers never name a letter


def test_official_prompt_run(prefect_harness, tmp_path, monkeypatch) -> None:
    from flows.cli import app
    from flows.vab import vab_run_flow
    from schemas.settings import load_settings
    from tasks.vab.demo_sets import write_demo_sets
    from tasks.vab.sets import import_manifest

    manifest = write_demo_sets(tmp_path / "sets")
    tasks = [json.loads(line) for line in manifest.read_text().splitlines()]

    def sent(path) -> str:  # the image as eval.py sends it: RGB JPEG quality 85 (the toolkit test checks it against eval.py)
        from PIL import Image

        buf = io.BytesIO()
        with Image.open(path) as im:
            im.convert("RGB").save(buf, format="JPEG", quality=85)
        return hashlib.sha256(buf.getvalue()).hexdigest()

    level = {sent(p): int(re.search(r"-L(\d)\.png$", p.name).group(1)) for p in (tmp_path / "sets").glob("*.png")}
    task_of = {sent(manifest.parent / img): t["task_id"] for t in tasks for img in t["images"]}

    def answer(req: RecordedRequest) -> Reply:
        parts = req.body["messages"][-1]["content"]
        shas = [hashlib.sha256(base64.b64decode(p["image_url"]["url"].split(",", 1)[1])).hexdigest()
                for p in parts if p["type"] == "image_url"]
        lv = [level[s] for s in shas]
        best, worst = chr(65 + lv.index(min(lv))), chr(65 + lv.index(max(lv)))
        text = parts[0]["text"]
        if "and which has the worst" in text:
            return Reply(text=f"Reasoning.\nBEST: {best}\nWORST: {worst}")
        if "worst overall" in text:
            return Reply(text=f"WORST: {worst}")
        return Reply(text="I cannot decide." if task_of[shas[0]] == UNREADABLE else f"BEST: {best}")

    server = FakeOpenAI("fake-official", answer)
    server.start()
    try:
        cfg = tmp_path / "judges.yaml"
        cfg.write_text(yaml.safe_dump({"judges": {"official": {"backend": "openai", "model": "fake-official",
                                                               "base_url": server.base_url, "concurrency": 2, "max_retries": 0}}}))
        monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("IMAGEBENCH_JUDGES_CONFIG", str(cfg))
        for key in ("IMAGEBENCH_STORE", "IMAGEBENCH_CONFIG", "IMAGEBENCH_REFERENCE_DIR"):
            monkeypatch.delenv(key, raising=False)
        settings = load_settings()
        import_manifest(settings, manifest, SETS)
        summary = vab_run_flow(SETS, ["official"], batch_size=64, n_resamples=100, prompt_version="vab-official-v1")
        requests = list(server.requests)
    finally:
        server.stop()
    # eval.py's requests: 6 tasks x (pick_best, pick_worst) x 3 + 5 tasks of 3+ images x pbw x 3,
    # and 2 more attempts (2 s, then 5 s later) for each of the 3 unreadable pick_best trials
    assert len(requests) == 6 * 2 * 3 + 5 * 3 + 3 * 2
    first = requests[0].body
    assert first["temperature"] == 1.0 and first["max_tokens"] == 8192 and "seed" not in first
    content = first["messages"][-1]["content"]
    assert content[0]["text"].startswith("You will be shown ") and content[1] == {"type": "text", "text": "\nImage A:"}
    assert content[2]["type"] == "image_url" and content[-2]["text"].startswith("\nImage ")
    m = summary["judges"]["official"]
    assert m["invalid_trials"] == {"unparsable": 3, "error": 0, "tie": 0}
    # ours: strict best loses the unreadable task; both comes from pick_best_and_worst (derived for 2 images)
    assert (m["strict_best"], m["strict_worst"], m["strict_both"]) == (pytest.approx(100 * 5 / 6), 100.0, 100.0)
    r = CliRunner().invoke(app, ["vab", "summarize", "--sets", SETS, "--format", "json"])
    assert r.exit_code == 0, r.output
    off = json.loads(r.stdout)["official"]
    assert off["pick_best"] == {"accuracy": pytest.approx(5 / 6)} and off["pick_worst"] == {"accuracy": 1.0}
    assert off["pick_best_and_worst"] == {"accuracy_best": 1.0, "accuracy_worst": 1.0, "accuracy_both": 1.0}
    assert off["avg_pass_at_1"] == {"pick_best": pytest.approx(5 / 6), "pick_best_and_worst_both": 1.0, "pick_worst": 1.0}
    assert off["by_n_images"]["3"]["pick_best"] == 0.5  # coffee (unreadable) and rocket
    ident = json.loads(r.stdout)  # the identity recorded with the rows says prompt and temperature
    from tasks.lake.tables import Lake
    from tasks.vab.tables import read_partition

    rows = read_partition(Lake(settings.lake_dir), "vab_trials", SETS).to_pylist()
    who = json.loads(rows[0]["judge_identity"])
    assert who["prompt"] == "vab-official-v1" and who["sampling"]["temperature"] == 1.0 and ident
    assert {r["prompt_type"] for r in rows} == {"pick_best", "pick_worst", "pick_best_and_worst"}
    assert sum(r["detail"] == "derived from pick_best" for r in rows) == 3  # demo-camera-blur, 2 images
    # the catalog's views score the official prompt types as tasks.vab.metrics does
    from pathlib import Path

    from tasks.lake.tables import query, refresh_catalog
    from tasks.scores.suite import load_suite

    suite = load_suite(Path(__file__).resolve().parents[2] / "reference" / "suite-imagebench-v1.jsonl")
    catalog = refresh_catalog(settings.lake_dir, settings.catalog_path, suite, "test")
    _, board = query(catalog, f"SELECT strict_both, strict_best, strict_worst, tasks FROM vab_leaderboard WHERE sets = '{SETS}'")
    assert board == [pytest.approx((100.0, 100 * 5 / 6, 100.0, 6))]
