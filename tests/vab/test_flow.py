"""Judges under test through one real `vab-run` Prefect flow (module fixture ``ran``): the demo sets
(graded degradations: known best and worst) imported as a collection, then four judges at once:
the sharpness scorer, and three fake OpenAI-compatible VLMs answering in patterns (always slot 1,
always right, unparsable). The metrics must come out as computed by hand here, position bias
included; the rows must be in the lake and its DuckDB views."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.fake_openai import FakeOpenAI, RecordedRequest, Reply

SETS = "demo-graded"


def _images(req: RecordedRequest) -> list[bytes]:
    parts = req.body["messages"][-1]["content"]
    return [base64.b64decode(p["image_url"]["url"].split(",", 1)[1]) for p in parts if p.get("type") == "image_url"]


def _level(data: bytes, levels: dict[str, int]) -> int:
    return levels[hashlib.sha256(data).hexdigest()]


@pytest.fixture(scope="module")
def ran(prefect_harness, tmp_path_factory):
    from flows.vab import vab_run_flow
    from schemas.settings import load_settings
    from tasks.vab.demo_sets import write_demo_sets
    from tasks.vab.sets import import_manifest, load_sets

    root = tmp_path_factory.mktemp("vab-flow")
    manifest = write_demo_sets(root / "sets")
    # degradation level of every image by content: level 0 is the best, the highest the worst
    levels = {hashlib.sha256(p.read_bytes()).hexdigest(): int(re.search(r"-L(\d)\.png$", p.name).group(1))
              for p in (root / "sets").glob("*.png")}

    def slot1(req: RecordedRequest) -> Reply:
        n = len(_images(req))
        return Reply(text="The first one.\nBEST: 1" + ("\nWORST: 2" if n >= 3 else ""))

    def right(req: RecordedRequest) -> Reply:
        lv = [_level(b, levels) for b in _images(req)]
        best, worst = lv.index(min(lv)) + 1, lv.index(max(lv)) + 1
        return Reply(text=f"**BEST: {best}**" + (f"\nWORST: {worst}" if len(lv) >= 3 else ""))

    servers = {"slot1": FakeOpenAI("fake-slot1", slot1), "right": FakeOpenAI("fake-right", right),
               "mumble": FakeOpenAI("fake-mumble", lambda r: Reply(text="They are all lovely in their own way.")),
               "down": FakeOpenAI("fake-down", lambda r: Reply(status=500, text=None, body=b'{"error": "overloaded"}'))}
    for s in servers.values():
        s.start()
    try:
        cfg = root / "judges.yaml"
        cfg.write_text(yaml.safe_dump({"judges": {name: {"backend": "openai", "model": s.model, "base_url": s.base_url,
                                                         "concurrency": 4, "max_retries": 1 if name == "down" else 0}
                                                  for name, s in servers.items()}}))
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("IMAGEBENCH_HOME", str(root / "home"))
            mp.setenv("IMAGEBENCH_JUDGES_CONFIG", str(cfg))
            for key in ("IMAGEBENCH_STORE", "IMAGEBENCH_CONFIG", "IMAGEBENCH_REFERENCE_DIR"):
                mp.delenv(key, raising=False)
            settings = load_settings()
            import_manifest(settings, manifest, SETS)
            summary = vab_run_flow(SETS, ["sharpness", "slot1", "right", "mumble", "down"], batch_size=5, n_resamples=200)
            yield {"root": root, "settings": settings, "summary": summary, "tasks": load_sets(settings, SETS),
                   "servers": servers, "requests": {k: len(s.requests) for k, s in servers.items()}, "mp": mp}
    finally:
        for s in servers.values():
            s.stop()


def test_sharpness_and_the_right_judge_get_every_graded_set_right(ran) -> None:
    for judge in ("sharpness", "right"):
        m = ran["summary"]["judges"][judge]
        assert (m["strict_best"], m["strict_worst"], m["strict_both"], m["tasks"]) == (100.0, 100.0, 100.0, 6), judge
        assert m["invalid_trials"] == {"unparsable": 0, "error": 0, "tie": 0}


def test_always_slot_one_scores_exactly_as_computed_by_hand(ran) -> None:
    from tasks.vab.trials import permutation

    tasks = ran["tasks"]
    # by hand: in trial t the judge names the image shown first (best) and second (worst)
    best_ok = {t.task_id: [permutation(t.task_id, len(t.images), k)[0] == t.best for k in range(3)] for t in tasks}
    worst_ok = {t.task_id: [permutation(t.task_id, len(t.images), k)[1] == t.worst for k in range(3)]
                for t in tasks if t.worst is not None}
    strict_best = 100.0 * sum(all(v) for v in best_ok.values()) / len(tasks)
    strict_worst = 100.0 * sum(all(v) for v in worst_ok.values()) / len(worst_ok)
    both = [all(best_ok[i]) and all(worst_ok.get(i, [True] * 3)) and all(b and w for b, w in zip(best_ok[i], worst_ok.get(i, [True] * 3)))
            for i in best_ok]
    single_best = 100.0 * sum(sum(v) for v in best_ok.values()) / (3 * len(tasks))
    m = ran["summary"]["judges"]["slot1"]
    assert m["strict_best"] == pytest.approx(strict_best)
    assert m["strict_worst"] == pytest.approx(strict_worst)
    assert m["strict_both"] == pytest.approx(100.0 * sum(both) / len(tasks))
    assert m["single_best"] == pytest.approx(single_best)
    # the same, written out for the demo sets in eval.py's orders (vab-official-v1): slot 1 holds the
    # best in 4 of 18 trials, slot 2 the worst in 2 of the 15 trials of 3+-image tasks; no task is
    # right in all three trials
    assert (m["single_best"], m["single_worst"]) == (pytest.approx(100 * 4 / 18), pytest.approx(100 * 2 / 15))
    assert (m["strict_best"], m["strict_worst"], m["strict_both"]) == (0.0, 0.0, 0.0)
    # position bias: every valid answer is slot 1, against a uniform 1/n per set size
    pb = m["position_bias"]
    sizes = sorted({len(t.images) for t in tasks})
    assert sorted(pb["by_size"]) == sizes
    for n in sizes:
        k = 3 * sum(len(t.images) == n for t in tasks)
        assert pb["by_size"][n]["counts"] == [k] + [0] * (n - 1)
        assert pb["by_size"][n]["rates"][0] == 100.0 and pb["by_size"][n]["uniform"] == pytest.approx(100.0 / n)
    assert pb["pooled"]["counts"][0] == 18 and sum(pb["pooled"]["counts"]) == 18


def test_unparsable_answers_are_retried_then_counted_wrong_and_shown(ran) -> None:
    from tasks.lake.tables import Lake
    from tasks.vab.tables import read_partition

    m = ran["summary"]["judges"]["mumble"]
    assert (m["strict_best"], m["strict_both"], m["single_best"]) == (0.0, 0.0, 0.0)
    assert m["invalid_trials"]["unparsable"] == 18 and m["missing_trials"] == 0
    assert ran["requests"]["mumble"] == 36  # every trial asked twice (1 + unparsable_retries)
    rows = [r for r in read_partition(Lake(ran["settings"].lake_dir), "vab_trials", SETS).to_pylist() if r["judge"] == "mumble"]
    assert len(rows) == 18 and all(r["state"] == "unparsable" and r["best"] is None for r in rows)
    assert all("lovely in their own way" in r["detail"] for r in rows)  # the answer is shown, not dropped


def test_a_judge_that_fails_is_recorded_as_errors_and_asked_again_next_run(ran, tmp_path) -> None:
    from tasks.vab.run import judge_batch, resolve_judges, trial_items
    from tasks.vab.sets import image_paths

    m = ran["summary"]["judges"]["down"]
    assert m["invalid_trials"]["error"] == 18 and m["strict_both"] == 0.0 and m["cache_hits"] == 0
    assert ran["requests"]["down"] == 36  # 1 + max_retries attempts per trial, then state error
    settings, tasks = ran["settings"], ran["tasks"]
    items = trial_items(tasks[:1], [image_paths(settings, tasks[0])])
    rows, hits = judge_batch(SETS, resolve_judges(settings, ["down"])[0], items, Path(settings.home) / "cache" / "vab")
    assert hits == 0 and {r["state"] for r in rows} == {"error"}  # errors are never cached
    assert "HTTP 500" in rows[0]["detail"] and "overloaded" in rows[0]["detail"]


def test_trials_are_in_the_lake_views_mapped_back_to_stored_positions(ran) -> None:
    from tasks.lake.tables import query, refresh_catalog
    from tasks.scores.suite import load_suite

    settings = ran["settings"]
    suite = load_suite(Path(__file__).resolve().parents[2] / "reference" / "suite-imagebench-v1.jsonl")
    catalog = refresh_catalog(settings.lake_dir, settings.catalog_path, suite, "test")
    _, rows = query(catalog, "SELECT judge, count(*), count(DISTINCT task_id), sum(CASE WHEN state = 'ok' THEN 1 ELSE 0 END) "
                             f"FROM vab_trials WHERE sets = '{SETS}' GROUP BY judge ORDER BY judge")
    assert rows == [("down", 18, 6, 0), ("mumble", 18, 6, 0), ("right", 18, 6, 18), ("sharpness", 18, 6, 18), ("slot1", 18, 6, 18)]
    _, ok = query(catalog, f"SELECT t.task_id, t.best, k.best FROM vab_trials t JOIN vab_tasks k USING (sets, task_id) "
                           f"WHERE t.judge = 'right' AND t.sets = '{SETS}'")
    assert len(ok) == 18 and all(a == b for _, a, b in ok)
    # the catalog's views score exactly as tasks.vab.metrics does
    _, board = query(catalog, f"SELECT judge, strict_both, strict_best, strict_worst, tasks FROM vab_leaderboard WHERE sets = '{SETS}'")
    got = {j: m for j, *m in board}
    for judge, m in ran["summary"]["judges"].items():
        assert got[judge] == pytest.approx([m["strict_both"], m["strict_best"], m["strict_worst"], 6]), judge
    ident = json.loads(query(catalog, "SELECT any_value(judge_identity) FROM vab_trials WHERE judge = 'right'")[1][0][0])
    assert ident["model"] == "fake-right" and ident["prompt"] == "vab-best-worst-v2" and "key" not in json.dumps(ident).lower()


def test_a_rerun_is_answered_from_the_cache_by_judge_identity(ran, tmp_path) -> None:
    from tasks.vab.run import judge_batch, resolve_judges, trial_items
    from tasks.vab.sets import image_paths

    settings, tasks = ran["settings"], ran["tasks"]
    items = trial_items(tasks, [image_paths(settings, t) for t in tasks])
    spec = next(s for s in resolve_judges(settings, ["right"]))
    before = len(ran["servers"]["right"].requests)
    cache = Path(settings.home) / "cache" / "vab"
    rows, hits = judge_batch(SETS, spec, items, cache)
    assert hits == 18 and len(ran["servers"]["right"].requests) == before  # nothing sent again
    assert all(r["state"] == "ok" for r in rows)
    rows, hits = judge_batch(SETS, spec, items[:2], tmp_path / "empty-cache")  # another cache: asked again
    assert hits == 0 and len(ran["servers"]["right"].requests) == before + 2


def _cli(*args: str):
    from typer.testing import CliRunner

    from flows.cli import app

    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_audit_per_category_with_intervals_and_the_report_page_links_it(ran) -> None:
    from tasks.report.vab import build_vab_pages
    from tasks.vab.audit import read_audit

    res = _cli("vab", "audit", "--sets", SETS, "--judge", "right", "--judge", "slot1", "--no-rerun", "--format", "json")
    assert res.exit_code == 0, res.output
    rows = read_audit(ran["settings"], SETS)["rows"]
    cats = {(r["judge"], r["category"]): r for r in rows}
    # categories: the demo sets' substyle (graded-<kind>), plus "all"
    assert {c for _, c in cats} == {"all", "graded-blur", "graded-jpeg", "graded-crop", "graded-noise"}
    assert cats[("right", "all")]["strict_both"] == 100.0 and cats[("right", "graded-jpeg")]["tasks"] == 2
    slot1 = cats[("slot1", "all")]
    assert slot1["single_best"] == pytest.approx(100 * 4 / 18) and slot1["strict_both"] == 0.0
    # Wilson at 0 of 6 (honest at the edge: not [0, 0]); the bootstrap beside it is degenerate there
    assert (slot1["strict_both_lo"], slot1["strict_both_hi"]) == (0.0, pytest.approx(39.0334, abs=1e-3))
    assert (slot1["strict_both_boot_lo"], slot1["strict_both_boot_hi"]) == (0.0, 0.0)

    out = ran["root"] / "report"
    links = build_vab_pages(ran["settings"], out)
    assert [link.page for link in links] == [f"vab/{SETS}.html"]
    html = (out / links[0].page).read_text()
    assert 'data-label="published: human experts" data-value="68.9000"' in html
    assert 'data-label="published: best of 26 models" data-value="26.5000"' in html
    assert 'data-label="sharpness" data-value="100.0000"' in html
    assert '<a href="#audit-right">audit</a>' in html and 'id="audit-right"' in html
    assert 'href="#audit-sharpness"' not in html  # not audited: no link
    # The command-line leaderboard links the same judges to the audit file.
    board = _cli("vab", "leaderboard", "--sets", SETS, "--format", "json")
    assert board.exit_code == 0, board.output
    linked = {r["judge"]: r["audit"] for r in json.loads(board.stdout)}
    assert linked["right"] and linked["right"].endswith(f"{SETS}.json") and linked["sharpness"] is None


def test_vab_run_names_a_bad_judge_or_collection_before_any_flow(ran) -> None:
    res = _cli("vab", "run", "--sets", SETS, "--judge", "nobody")
    assert res.exit_code == 1 and "unknown judge 'nobody'" in res.output and "mumble" in res.output
    res = _cli("vab", "run", "--sets", "no-such-sets", "--judge", "sharpness")
    assert res.exit_code == 1 and "set collection 'no-such-sets' not found" in res.output


def test_the_trials_suite_refuses_a_pick_without_a_valid_answer(ran) -> None:
    from tasks.lake.tables import Lake
    from tasks.lake.validation import ValidationFailed, require_valid
    from tasks.vab.run import trials_table
    from tasks.vab.tables import read_partition

    rows = [r for r in read_partition(Lake(ran["settings"].lake_dir), "vab_trials", SETS).to_pylist() if r["judge"] == "right"]
    require_valid("vab_trials", trials_table(rows))
    rows[0] = {**rows[0], "state": "unparsable"}  # a pick recorded for an invalid answer would be scored
    with pytest.raises(ValidationFailed, match=r"expect_column_values_to_be_null\(best\) where state != 'ok'"):
        require_valid("vab_trials", trials_table(rows))
    rows[0] = {**rows[0], "state": "ok", "trial": 1}  # the same trial twice
    with pytest.raises(ValidationFailed, match="expect_compound_columns_to_be_unique"):
        require_valid("vab_trials", trials_table(rows))


def test_uncalibrated_hpsv3_is_flagged_on_run_leaderboard_and_audit(ran, tmp_path, monkeypatch) -> None:
    """HPSv3 on the tiny random demo weights through `vab run`, then `vab leaderboard` and `vab audit`:
    every output says UNCALIBRATED (the table, the JSON, the notes), on its own collection."""
    from tasks.hpsv3.tiny import write_tiny_base_model, write_tiny_checkpoint
    from tasks.vab.sets import import_manifest

    base, ckpt = tmp_path / "base", tmp_path / "HPSv3-tiny.safetensors"
    write_tiny_base_model(base)
    write_tiny_checkpoint(base, ckpt, seed=0)
    monkeypatch.setenv("IMAGEBENCH_HPSV3_BASE_MODEL", str(base))
    monkeypatch.setenv("IMAGEBENCH_HPSV3_CHECKPOINT", str(ckpt))
    monkeypatch.setenv("IMAGEBENCH_DEVICE", "cpu")
    import_manifest(ran["settings"], ran["root"] / "sets" / "manifest.jsonl", "demo-hps")
    run = _cli("vab", "run", "--sets", "demo-hps", "--judge", "hpsv3", "--judge", "sharpness")
    assert run.exit_code == 0, run.output
    flat = " ".join(run.output.split())
    assert "hpsv3: 18 trials" in flat and "UNCALIBRATED demo weights" in flat.split("hpsv3: 18 trials", 1)[1].split("sharpness")[0]
    assert "hpsv3 UNCALIBRATED" in run.output and "sharpness UNCALIBRATED" not in run.output  # the leaderboard it prints
    board = _cli("vab", "leaderboard", "--sets", "demo-hps")
    assert "hpsv3 UNCALIBRATED" in board.output and "judge hpsv3: UNCALIBRATED demo weights" in " ".join(board.output.split())
    js = {r["judge"]: r for r in json.loads(_cli("vab", "leaderboard", "--sets", "demo-hps", "--format", "json").stdout)}
    assert js["hpsv3"]["uncalibrated"] is True and js["sharpness"]["uncalibrated"] is False
    audit = _cli("vab", "audit", "--sets", "demo-hps", "--judge", "hpsv3", "--no-rerun")
    assert audit.exit_code == 0, audit.output
    assert "hpsv3 UNCALIBRATED" in audit.output and "judge hpsv3: UNCALIBRATED demo weights" in " ".join(audit.output.split())
    rows = json.loads(_cli("vab", "audit", "--sets", "demo-hps", "--judge", "hpsv3", "--no-rerun", "--format", "json").stdout)
    assert rows and all(r["uncalibrated"] is True for r in rows)
    from flows.vab import summary_markdown  # the run's Prefect artifact says it too

    assert "| hpsv3 **UNCALIBRATED** demo weights |" in summary_markdown("demo-hps", {"hpsv3": dict(ran["summary"]["judges"]["sharpness"], uncalibrated=True)})
