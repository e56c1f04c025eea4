"""Models a workspace knows (issue 8, items 3, 4, 10, 11): a typo or a wrong store prefix never
reaches the lake; retire/unretire; one definition of `complete`; a catalog from the first command."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.flows.conftest import REPO, eligible_ids, image_bytes, put_model
from tests.flows.test_cli import _lake_snapshot, invoke


def _invoke_keeping_env(*args: str):
    """CLI commands that start Prefect set env defaults (PREFECT_HOME...): undone afterwards, so
    later tests and their subprocesses see the environment they set up."""
    before = dict(os.environ)
    try:
        return invoke(*args)
    finally:
        for key in set(os.environ) - set(before):
            del os.environ[key]
        os.environ.update(before)


def _flat(text: str) -> str:
    return "".join(text.split())


def _setup():
    from schemas.settings import load_settings
    from tasks.runs import pinned, units_aggregate, units_discover, units_ingest

    settings = load_settings()
    suite = pinned.load_pinned_suite(settings)
    return settings, suite, pinned.load_verified_reference(settings, suite, None)


def _leaderboard() -> dict[str, dict]:
    r = invoke("leaderboard", "--format", "json")
    assert r.exit_code == 0, r.output
    return {row["model_id"]: row for row in json.loads(r.stdout)}


def test_typo_and_wrong_prefix_refuse_and_change_nothing(built_reference, tmp_path):
    """Item 3/4: no object at all is an error naming what was searched; a model with ingested
    images is never rewritten to 'missing' by a listing that found nothing."""
    from tasks.runs import pinned, units_aggregate, units_discover, units_ingest
    from tasks.runs.models import ModelNotFound

    home, objects, _ = built_reference
    settings, suite, _ = _setup()
    before = _lake_snapshot(home)

    with pytest.raises(ModelNotFound) as exc:
        units_ingest.ingest_and_publish(settings, suite, "Base-A")
    msg = str(exc.value)
    assert f"{(objects / 'models' / 'Base-A').as_uri()}/" in msg and "did you mean 'base-a'" in msg
    assert "lake holds" not in msg

    # The same store without its prefix: `--source` one folder above (no models/ there).
    wrong = tmp_path / "store-root"
    (wrong / "bench").mkdir(parents=True)
    r = invoke("ingest", "--model", "base-a", "--source", str(wrong))
    assert r.exit_code == 1
    out = _flat(r.output)  # the terminal may wrap a long path anywhere
    assert _flat(f"no objects under {wrong.as_uri()}/models/base-a/") in out and "nothingwaschanged" in out
    # where its images came from (the fixture's lake was ingested from the template's store)
    assert "165ingestedimagesofitfromfile:///" in out and "/objects/models/base-a/;" in out
    assert _lake_snapshot(home) == before
    assert not list(settings.staging_dir.rglob("*.parquet"))

    # Read commands on an unknown model exit non-zero, naming the nearest ids.
    for args in (("breakdown", "--model", "base-c"), ("compare", "base-a", "Base-B")):
        r = invoke(*args)
        assert r.exit_code == 1, args
        assert "didyoumean" in _flat(r.output) and ("'base-a'" in r.output or "'base-b'" in r.output), r.output


def test_score_prints_quarantine_reasons_and_a_typo_adds_no_row(built_reference):
    """Item 3: `score --model <typo>` exits 1 and leaves no leaderboard row. Item 10: `score`
    says why images were quarantined, and the row says complete = false."""
    home, objects, _ = built_reference
    eligible = eligible_ids()
    put_model(objects, "quar", eligible[:6], seed=7)
    (objects / "models" / "quar" / f"{eligible[6]}.png").write_bytes(image_bytes(8, side=32))

    r = _invoke_keeping_env("score", "--model", "quar", "--format", "json")
    assert r.exit_code == 0, r.output
    assert _flat("quar: 1 quarantined (too_small)") in _flat(r.stderr)
    row = json.loads(r.stdout)[0]
    assert row["images_quarantined"] == 1 and row["complete"] is False

    r = _invoke_keeping_env("score", "--model", "Quar")
    assert r.exit_code == 1
    assert _flat("no model 'Quar'") in _flat(r.output) and _flat("did you mean 'quar'") in _flat(r.output)
    assert _flat(r.output).count(_flat("no model 'Quar'")) == 1  # named once, before any flow starts
    settings, _, _ = _setup()
    assert not (settings.lake_dir / "model_scores" / "model_id=Quar").exists()
    assert "Quar" not in _leaderboard() and "quar" in _leaderboard()


def test_retire_hides_from_leaderboard_and_nightly_and_is_reversible(built_reference):
    from tasks.runs import pinned, units_aggregate, units_discover, units_ingest
    from tasks.lake.tables import Lake

    settings, suite, reference = _setup()
    for m in ("base-a", "base-b"):
        units_aggregate.aggregate_model(settings, suite, reference, m, "run-test", None)
    assert {"base-a", "base-b"} <= set(_leaderboard())

    r = invoke("models", "retire", "base-a", "--reason", "withdrawn by the lab", "--by", "alice")
    assert r.exit_code == 0, r.output
    assert "base-a" not in _leaderboard() and "base-b" in _leaderboard()
    listed = {x["model_id"]: x for x in json.loads(invoke("models", "list", "--format", "json").stdout)}
    assert listed["base-a"]["state"] == "retired" and listed["base-a"]["retired_by"] == "alice"
    assert listed["base-a"]["retired_reason"] == "withdrawn by the lab" and listed["base-a"]["scored"] is True
    assert listed["base-b"]["state"] == "scored" and listed["base-b"]["in_store"] is True
    assert listed["base-b"]["images_ok"] == 165 and listed["base-b"]["images_missing"] == 27
    plans = {p.model_id: p.status for p in units_discover.discover_models(settings, suite, reference)}
    assert plans["base-a"] == "retired"  # the nightly skips it
    assert Lake(settings.lake_dir).read("model_scores", ["base-a"]).num_rows == 1  # kept in the lake

    again = invoke("models", "retire", "base-a", "--reason", "twice")
    assert again.exit_code == 1 and "alreadyretired" in _flat(again.output)
    assert invoke("models", "retire", "base-z", "--reason", "typo").exit_code == 1

    r = invoke("models", "unretire", "base-a", "--reason", "re-listed")
    assert r.exit_code == 0, r.output
    assert {"base-a", "base-b"} <= set(_leaderboard())
    events = Lake(settings.lake_dir).read("model_events", ["base-a"]).to_pylist()
    assert [(e["event"], e["reason"]) for e in events] == [("retired", "withdrawn by the lab"), ("unretired", "re-listed")]
    assert invoke("models", "unretire", "base-a", "--reason", "again").exit_code == 1


def test_complete_means_every_suite_prompt_has_an_ok_image(built_reference):
    """Item 10: one definition, the same in the model_scores row and every leaderboard output,
    old rows included (the view recomputes it from the image counts)."""
    import pyarrow as pa

    from schemas.lake import IMAGES, MODEL_SCORES
    from tasks.runs import pinned, units_aggregate, units_discover, units_ingest
    from tasks.lake.tables import Lake

    settings, suite, reference = _setup()
    lake = Lake(settings.lake_dir)
    # base-a has only its 165 eligible images: every mu is there, 27 prompts have no image.
    row = units_aggregate.aggregate_model(settings, suite, reference, "base-a", "run-1", None)
    assert row["eps_prompts_lost"] == 0 and row["images_missing"] == 27 and row["complete"] is False

    images = lake.read("images", ["base-a"]).to_pylist()
    ok = next(r for r in images if r["state"] == "ok")
    filled = [{**r, **{k: ok[k] for k in ("object_uri", "image_sha256", "image_path", "format", "width", "height",
                                              "source_mode", "byte_size")}, "state": "ok", "reason": None}
              if r["state"] == "missing" else r for r in images]
    lake.write_partition("images", "base-a", pa.Table.from_pylist(filled, schema=IMAGES))
    assert units_aggregate.aggregate_model(settings, suite, reference, "base-a", "run-2", None)["complete"] is True

    non_eligible = [p.prompt_id for p in suite.prompts if not p.eps_eligible][:4]
    four = [{**r, "state": "quarantined", "reason": "too_small"} if r["prompt_id"] in non_eligible else r for r in filled]
    lake.write_partition("images", "base-a", pa.Table.from_pylist(four, schema=IMAGES))
    row = units_aggregate.aggregate_model(settings, suite, reference, "base-a", "run-3", None)
    assert row["images_quarantined"] == 4 and row["eps_prompts_lost"] == 0 and row["complete"] is False
    assert _leaderboard()["base-a"]["complete"] is False

    # A row written under the old definition (complete = no eligible prompt lost) reads the same.
    legacy = {**row, "complete": True, "run_id": "run-old", "scored_at": row["scored_at"].replace(year=2100)}
    lake.replace_rows("model_scores", "base-a", pa.Table.from_pylist([legacy], schema=MODEL_SCORES),
                      match_on=["suite_version", "reference_version", "scorer_id"])
    assert _leaderboard()["base-a"]["complete"] is False
    table = invoke("leaderboard")
    assert table.exit_code == 0 and "incomplete" in table.output
    csv_rows = {r["model_id"]: r for r in csv.DictReader(io.StringIO(invoke("leaderboard", "--format", "csv").stdout))}
    assert csv_rows["base-a"]["complete"] == "False"


def test_sql_on_a_fresh_workspace_has_the_suite_and_stays_light(tmp_path):
    """Item 11: nothing scored, no catalog: `sql` on prompts answers (catalog built from the
    pinned suite), an old-format catalog is rebuilt, and no heavy package is imported."""
    import duckdb

    home = tmp_path / "home"
    code = (
        "import sys, json\n"
        "from typer.testing import CliRunner\n"
        "from flows.cli import app\n"
        "r = CliRunner().invoke(app, ['sql', 'SELECT count(*) AS n FROM prompts', '--format', 'json'])\n"
        "heavy = [m for m in ('torch', 'prefect', 'great_expectations', 'transformers') if m in sys.modules]\n"
        "print(json.dumps([r.exit_code, heavy, r.output]))\n"
    )
    env = {"IMAGEBENCH_HOME": str(home), "PATH": "/usr/bin:/bin"}

    def run() -> list:
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.splitlines()[-1])

    code_, heavy, output = run()
    assert (code_, heavy) == (0, []), output
    assert json.loads(output) == [{"n": 192}]

    (home / "imagebench.duckdb").unlink()
    con = duckdb.connect(str(home / "imagebench.duckdb"))  # a catalog of format /1: no model_events view
    con.execute("CREATE TABLE catalog_info AS SELECT 'imagebench-catalog/1' AS format, 'x' AS lake_dir")
    con.close()
    code_, heavy, output = run()
    assert (code_, heavy) == (0, []) and json.loads(output) == [{"n": 192}], output
