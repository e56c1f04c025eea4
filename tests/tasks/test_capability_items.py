"""The catalog view `capability_items` counts what the aggregate step counts (issue 26 item 3), prompt
by prompt, in the cases a real run rarely shows together: a verdict of a replaced image, the newest
of two verdicts, a verdict of a quarantined or missing image, a prompt with no `images` row, an
imported verdict without an image hash, and a reference whose scores were imported (no images of
ours: a prompt is there when it has a score or a verdict). The expected outcomes are those of
`tasks.runs.units_aggregate._prepare_model` on the same rows, and the one line of docs/LAKE.md gives
its Capability, run with a plain duckdb connection."""

from __future__ import annotations

import json
from datetime import timedelta
from types import SimpleNamespace

import duckdb
import pyarrow as pa
import pytest

from schemas.lake import HPS_SCORES, IMAGES, MODEL_SCORES, VERDICTS
from tasks.lake.tables import Lake, refresh_catalog
from tasks.scores.suite import parse_suite
from tests.flows.test_capability_sql import documented_query
from tests.tasks.test_lake import SHA, T0, model_score

PROMPTS = [f"a{i}" for i in range(1, 8)]
ELIGIBLE = {"a1", "a2", "a6", "a7"}


def _suite():
    rows = [{"prompt_id": p, "category": "Spatial Reasoning" if p in ELIGIBLE else "Text Rendering", "subcategory": "s",
             "tag": "t-sr" if p in ELIGIBLE else "t-tr", "difficulty": "easy", "prompt": f"a picture {p}", "question": f"Is {p} shown?",
             "eps_eligible": p in ELIGIBLE} for p in PROMPTS]
    return parse_suite("".join(json.dumps(r) + "\n" for r in rows).encode(), "test-v1", check_shape=False)


def _image(model, prompt, state, sha=None, reason=None):
    return {"model_id": model, "prompt_id": prompt, "suite_version": "test-v1", "state": state, "reason": reason,
            "object_uri": None if state == "missing" else f"file:///o/{model}/{prompt}.png", "image_sha256": sha,
            "image_path": None, "format": "PNG" if state == "ok" else None, "width": 64 if state == "ok" else None,
            "height": 64 if state == "ok" else None, "source_mode": None, "byte_size": None,
            "source_fingerprint": SHA, "ingested_at": T0}


def _verdict(model, prompt, verdict, sha, minutes, source="judged"):
    return {"model_id": model, "prompt_id": prompt, "suite_version": "test-v1", "image_sha256": sha,
            "question_sha256": SHA, "verdict": verdict, "reason": "timeout" if verdict == "ERROR" else None,
            "judge": "j", "judge_model": "jm", "template_sha256": SHA, "sampling": "{}",
            "identity": f"{model}-{prompt}-{minutes}", "rationale": None, "source": source,
            "decided_at": T0 + timedelta(minutes=minutes)}


def _scores(model, scorer_id, mus: dict[str, tuple[float, str | None]], source):
    return pa.Table.from_pylist([
        {"model_id": model, "prompt_id": p, "suite_version": "test-v1", "image_sha256": sha, "scorer_name": "s",
         "scorer_id": scorer_id, "checkpoint_sha256": None, "mu": mu, "sigma": None, "source": source,
         "uncalibrated": False, "scored_at": T0} for p, (mu, sha) in mus.items()], schema=HPS_SCORES)


# model -> (scorer id, scores source, images, verdicts, scores)
HPS, LAB = "hps-model", "lab-model"
CASES = {
    HPS: ("aaaaaaaaaaaaaaaa", "hpsv3",
          [_image(HPS, "a1", "ok", "A1"), _image(HPS, "a2", "ok", "A2-new"), _image(HPS, "a3", "quarantined", "Q3", "too_small"),
           _image(HPS, "a4", "missing"), _image(HPS, "a6", "ok", "A6"), _image(HPS, "a7", "ok", "A7")],  # a5: no row
          [_verdict(HPS, "a1", "PASS", "A1", 0), _verdict(HPS, "a1", "FAIL", "A1", 1),  # the newest counts
           _verdict(HPS, "a2", "ERROR", "A2-new", 0), _verdict(HPS, "a2", "PASS", "A2-old", 2),  # not the replaced image's
           _verdict(HPS, "a3", "PASS", "Q3", 0), _verdict(HPS, "a4", "PASS", None, 0, "import"),  # no image: FAIL
           _verdict(HPS, "a6", "PASS", None, 0, "import")],  # an imported verdict counts for the current image
          {"a1": (0.5, "A1"), "a2": (0.1, "A2-new"), "a6": (0.7, "A6"), "a7": (0.2, "A7")}),
    LAB: ("bbbbbbbbbbbbbbbb", "import",
          [_image(LAB, "a4", "ok", "X4")],  # ignored: an imported reference has no images of ours
          [_verdict(LAB, "a1", "PASS", None, 0, "import"), _verdict(LAB, "a2", "PASS", "X2", 0),  # a hash: not counted
           _verdict(LAB, "a3", "FAIL", None, 0, "import")],  # no score, a verdict: there
          {"a1": (0.5, None), "a2": (0.1, None), "a6": (0.3, None)}),
}
EXPECTED = {  # prompt -> (image_state, outcome, why), as the aggregate counts them
    HPS: {"a1": ("ok", "FAIL", "judge"), "a2": ("ok", "ERROR", "timeout"), "a3": ("quarantined", "FAIL", "quarantined image"),
          "a4": ("missing", "FAIL", "missing image"), "a5": ("missing", "FAIL", "missing image"),
          "a6": ("ok", "PASS", "judge"), "a7": ("ok", "NOT_JUDGED", "no verdict yet")},
    LAB: {"a1": ("ok", "PASS", "judge"), "a2": ("ok", "NOT_JUDGED", "no verdict yet"), "a3": ("ok", "FAIL", "judge"),
          "a4": ("missing", "FAIL", "missing image"), "a5": ("missing", "FAIL", "missing image"),
          "a6": ("ok", "NOT_JUDGED", "no verdict yet"), "a7": ("missing", "FAIL", "missing image")},
}


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    root = tmp_path_factory.mktemp("capability-items")
    lake = Lake(root / "lake")
    for model, (scorer_id, source, images, verdicts, scores) in CASES.items():
        lake.write_partition("images", model, pa.Table.from_pylist(images, schema=IMAGES))
        lake.write_partition("verdicts", model, pa.Table.from_pylist(verdicts, schema=VERDICTS))
        lake.write_partition("hps_scores", model, _scores(model, scorer_id, scores, source))
        lake.write_partition("model_scores", model, pa.Table.from_pylist(
            [{**model_score(model, 50.0), "scorer_id": scorer_id}], schema=MODEL_SCORES))
    return refresh_catalog(root / "lake", root / "imagebench.duckdb", _suite(), "r1"), lake


def _python(lake: Lake, model: str):
    """What the aggregate step computes from the same rows (states, effective verdicts, Capability)."""
    from tasks.runs.units_aggregate import _prepare_model

    scorer_id, source, *_ = CASES[model]
    reference = SimpleNamespace(scorer=SimpleNamespace(source=source, uncalibrated=False), scorer_id=scorer_id, version="r1")
    return _prepare_model(_suite(), reference, {p: 0.0 for p in ELIGIBLE}, model, lake.read("hps_scores", [model]),
                          lake.read("images", [model]), lake.read("verdicts", [model]), None, None)


def test_capability_items_counts_what_the_aggregate_counts(catalog):
    path, lake = catalog
    con = duckdb.connect(str(path), read_only=True)
    try:
        rows = con.execute("SELECT model_id, prompt_id, image_state, outcome, why, decided, judged FROM capability_items").fetchall()
        capability = dict(con.execute(documented_query()).fetchall())
    finally:
        con.close()
    got = {(m, p): (s, o, w) for m, p, s, o, w, _, _ in rows}
    assert got == {(m, p): v for m, by in EXPECTED.items() for p, v in by.items()}
    for m, p, state, outcome, _, decided, judged in rows:
        assert decided == (outcome in ("PASS", "FAIL")) and judged == (decided and state == "ok"), (m, p)
    for model in CASES:
        inputs = _python(lake, model)
        assert [got[(model, p)][0] for p in PROMPTS] == inputs.states, model
        assert [got[(model, p)][1] for p in PROMPTS] == [v or "NOT_JUDGED" for v in inputs.verdicts], model
        assert capability[model] == pytest.approx(inputs.cap.capability), model
        assert sum(got[(model, p)][1:] in (("PASS", "judge"), ("FAIL", "judge")) for p in PROMPTS) == inputs.cap.judged
