"""The `imagebench` command line, as a user types it."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.flows.conftest import REPO, image_bytes, put_model

runner = CliRunner()


def invoke(*args: str):
    from flows.cli import app

    return runner.invoke(app, list(args), catch_exceptions=False)


def _lake_snapshot(home: Path) -> dict:
    lake = home / "lake"
    return {p: p.read_bytes() for p in sorted(lake.rglob("*.parquet"))} if lake.exists() else {}


def test_light_commands_import_no_heavy_packages(tmp_path):
    """`sql`, `leaderboard`, `runs` and `study leaderboard` must not import torch, Prefect or Great Expectations."""
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from flows.cli import app\n"
        "r = CliRunner().invoke(app, ['sql', 'SELECT 42 AS answer', '--format', 'json'])\n"
        "r2 = CliRunner().invoke(app, ['leaderboard', '--format', 'json'])\n"
        "r3 = CliRunner().invoke(app, ['runs', '--format', 'json'])\n"
        "r4 = CliRunner().invoke(app, ['study', 'leaderboard', '--study', 'none-yet', '--format', 'json'])\n"
        "assert r4.exit_code == 1 and 'has no Beauty Index yet' in r4.output, r4.output\n"
        "heavy = [m for m in ('torch', 'prefect', 'great_expectations', 'transformers') if m in sys.modules]\n"
        "print(r.exit_code, r2.exit_code + r3.exit_code, heavy)\n"
        "print(r.output)\n"
    )
    # A catalog with nothing in it yet: build it with the library (not timed, not the CLI).
    home = tmp_path / "home"
    env = {"IMAGEBENCH_HOME": str(home), "PATH": "/usr/bin:/bin"}
    subprocess.run(
        [sys.executable, "-c",
         "from schemas.settings import load_settings; from tasks.scores.suite import load_suite; "
         "from tasks.lake.tables import refresh_catalog; s=load_settings(); "
         "refresh_catalog(s.lake_dir, s.catalog_path, load_suite(s.suite_path), s.reference_version)"],
        cwd=REPO, env=env, check=True,
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    first = out.stdout.splitlines()[0]
    assert first == "0 0 []", out.stdout + out.stderr
    assert json.loads("\n".join(out.stdout.splitlines()[1:])) == [{"answer": 42}]


def test_sql_is_read_only(workspace):
    from schemas.settings import load_settings
    from tasks.lake.tables import refresh_catalog
    from tasks.scores.suite import load_suite

    s = load_settings()
    refresh_catalog(s.lake_dir, s.catalog_path, load_suite(s.suite_path), s.reference_version)
    ok = invoke("sql", "SELECT count(*) AS n FROM prompts WHERE eps_eligible", "--format", "csv")
    assert ok.exit_code == 0 and ok.output.strip().splitlines() == ["n", "165"]
    for bad in ("CREATE TABLE x AS SELECT 1", "ATTACH 'evil.db'", f"COPY prompts TO '{workspace}/x.csv'"):
        r = invoke("sql", bad)
        assert r.exit_code == 1, bad
        assert "error" in r.output.lower()
    assert not (workspace / "x.csv").exists()


def test_model_id_path_tricks_rejected(workspace):
    before = _lake_snapshot(workspace)
    for bad in ("../etc", "a/b", "..", ".hidden"):
        r = invoke("ingest", "--model", bad)
        assert r.exit_code == 1
        assert bad in r.output
    assert _lake_snapshot(workspace) == before


def test_unreachable_s3_endpoint_is_a_clear_error(workspace, monkeypatch):
    monkeypatch.setenv("IMAGEBENCH_STORE", "s3://bucket/prefix")
    monkeypatch.setenv("IMAGEBENCH_S3_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    r = invoke("ingest", "--model", "m1")
    assert r.exit_code == 1
    assert "127.0.0.1:9" in r.output
    assert not (workspace / "lake" / "images").exists()


def _scores_csv(path: Path, rows: list[dict], columns=("model_id", "prompt_id", "mu")) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(columns))
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in columns})
    return path


def test_import_scores_bad_files_change_nothing(workspace, tmp_path):
    from tests.flows.conftest import PROMPT_IDS

    before = _lake_snapshot(workspace)
    p0, p1 = PROMPT_IDS[30], PROMPT_IDS[31]
    cases = {
        "missing column": (_scores_csv(tmp_path / "a.csv", [{"model_id": "m", "prompt_id": p0}], ("model_id", "prompt_id")), "mu"),
        "nan": (_scores_csv(tmp_path / "b.csv", [{"model_id": "m", "prompt_id": p0, "mu": "nan"}]), "not finite"),
        "duplicate": (_scores_csv(tmp_path / "c.csv", [{"model_id": "m", "prompt_id": p0, "mu": "1"}] * 2), "duplicate"),
        "unknown prompt": (_scores_csv(tmp_path / "d.csv", [{"model_id": "m", "prompt_id": "nope-01", "mu": "1"}]), "nope-01"),
        "bad model": (_scores_csv(tmp_path / "e.csv", [{"model_id": "../x", "prompt_id": p1, "mu": "1"}]), "../x"),
    }
    for name, (path, needle) in cases.items():
        r = invoke("import-scores", str(path), "--scorer", "lab-x")
        assert r.exit_code == 1, name
        assert needle in r.output, (name, r.output)
        assert str(path) in r.output.replace("\n", ""), name
    assert _lake_snapshot(workspace) == before


def test_import_scores_reference_and_eps(prefect_harness, workspace, tmp_path, monkeypatch):
    """A reference built from imported scores; models imported under the same name get EPS."""
    from schemas.settings import load_settings
    from tasks.scores.suite import load_suite

    eligible = list(load_suite(load_settings().suite_path).eligible_ids)
    rows = []
    for i, m in enumerate(("base-1", "base-2", "base-3")):
        rows += [{"model_id": m, "prompt_id": p, "mu": str(float(i))} for p in eligible]
    r = invoke("import-scores", str(_scores_csv(tmp_path / "base.csv", rows)), "--scorer", "lab-x")
    assert r.exit_code == 0, r.output
    baseline = tmp_path / "baseline.txt"
    baseline.write_text("base-1\nbase-2\nbase-3\n")
    monkeypatch.setenv("IMAGEBENCH_REFERENCE_VERSION", "lab-x-1")
    r = invoke("reference", "build", "--version", "lab-x-1", "--baseline", str(baseline), "--scorer", "lab-x")
    assert r.exit_code == 0, r.output
    ref = json.loads((load_settings().reference_path).read_text())
    assert {p["mu_ref"] for p in ref["prompts"]} == {1.0}
    # A contender: mu = mu_ref + 0 on half the prompts, nothing for the rest (losses).
    half = eligible[: len(eligible) // 2]
    r = invoke("import-scores", str(_scores_csv(tmp_path / "c.csv", [{"model_id": "cand", "prompt_id": p, "mu": "1.0"} for p in half])), "--scorer", "lab-x")
    assert r.exit_code == 0, r.output
    # Models imported before the reference existed are scored on request.
    r = invoke("score", "--model", "base-2", "--scorer", "lab-x")
    assert r.exit_code == 0, r.output
    lb = invoke("leaderboard", "--format", "json")
    data = {row["model_id"]: row for row in json.loads(lb.output)}
    assert data["cand"]["eps"] == pytest.approx(100 * 0.5 * len(half) / len(eligible))
    assert data["cand"]["complete"] is False
    assert data["base-2"]["eps"] == pytest.approx(50.0)
    # Rebuilding the same version is refused and leaves the bytes alone.
    before = load_settings().reference_path.read_bytes()
    r = invoke("reference", "build", "--version", "lab-x-1", "--baseline", str(baseline), "--scorer", "lab-x")
    assert r.exit_code == 1 and "lab-x-1" in r.output
    assert load_settings().reference_path.read_bytes() == before
    assert invoke("reference", "verify").exit_code == 0
    # Scores under another scorer name: recorded, no EPS, one sentence after another (issue 15 item 10).
    other = _scores_csv(tmp_path / "z.csv", [{"model_id": "other", "prompt_id": p, "mu": "1.0"} for p in half[:3]])
    r = invoke("import-scores", str(other), "--scorer", "lab-z")
    said = " ".join(r.output.split())
    assert r.exit_code == 0 and "not comparable with this reference. Build a reference" in said and ".." not in said, said

    # Verdicts produced elsewhere: Capability follows; missing images count as FAIL.
    vfile = tmp_path / "verdicts.csv"
    vrows = [{"model_id": "cand", "prompt_id": p, "verdict": "PASS" if i < 10 else "FAIL", "judge": "lab-judge"}
             for i, p in enumerate(half[:20])]
    _scores_csv(vfile, vrows, ("model_id", "prompt_id", "verdict", "judge"))
    r = invoke("import-verdicts", str(vfile))
    assert r.exit_code == 0, r.output
    data = {row["model_id"]: row for row in json.loads(invoke("leaderboard", "--format", "json").output)}
    n_missing = 192 - len(half)
    assert data["cand"]["capability"] == pytest.approx(100 * 10 / (20 + n_missing))
    assert data["cand"]["overall"] == pytest.approx(0.5 * data["cand"]["capability"] + 0.5 * data["cand"]["eps"])
    assert data["cand"]["provisional"] is True
    bad = tmp_path / "bad-verdicts.csv"
    _scores_csv(bad, [{"model_id": "cand", "prompt_id": half[0], "verdict": "MAYBE", "judge": "x"}],
                ("model_id", "prompt_id", "verdict", "judge"))
    before_lake = _lake_snapshot(workspace)
    r = invoke("import-verdicts", str(bad))
    assert r.exit_code == 1 and "MAYBE" in r.output
    assert _lake_snapshot(workspace) == before_lake

    # compare: paired difference with its interval; identical inputs give 0 and p = 0.5.
    r = invoke("compare", "cand", "base-2", "--axis", "eps", "--format", "json")
    assert r.exit_code == 0, r.output
    (cmp,) = json.loads(r.output[r.output.index("["):])
    assert cmp["difference"] == pytest.approx(data["cand"]["eps"] - data["base-2"]["eps"])
    assert cmp["ci_lo"] <= cmp["difference"] <= cmp["ci_hi"]
    same = json.loads(invoke("compare", "base-2", "base-2", "--format", "json").output)[0]
    assert same["difference"] == 0 and same["p_a_beats_b"] == 0.5

    # A VAB collection with a judge's answers: `report` writes its page too (not only `imagebench demo`).
    from tests.vab.test_sets import GOOD, _csv, _manifest, _png

    for i in range(1, 6):
        _png(tmp_path / "vab" / f"img{i}.png", (40 * i, 200 - 30 * i, 9 * i))
    assert invoke("vab", "import-sets", str(_manifest(tmp_path / "vab", GOOD)), "--name", "mine").exit_code == 0
    right = ["p1,0,1 2 3,2,3", "p1,1,3 1 2,3,1", "p1,2,2 3 1,1,2", "a1,0,1 2,1,", "a1,1,2 1,2,", "a1,2,2 1,2,"]
    r = invoke("vab", "import-answers", str(_csv(tmp_path / "right.csv", right)), "--sets", "mine", "--judge", "right")
    assert r.exit_code == 0, r.output

    # The static site builds from the lake.
    out = tmp_path / "site"
    r = invoke("report", "--out", str(out))
    assert r.exit_code == 0, r.output
    html = (out / "index.html").read_text()
    assert "cand" in html and (out / "models").is_dir()
    assert 'href="vab/mine.html"' in html and 'data-judge="right"' in (out / "vab" / "mine.html").read_text()


def test_judges_check(workspace, tmp_path, monkeypatch):
    from tests.fake_openai import FakeOpenAI

    with FakeOpenAI(model="fake-qwen") as srv:
        cfg = tmp_path / "judges.yaml"
        cfg.write_text(json.dumps({"judges": {
            "qwen3-vl": {"backend": "openai", "base_url": srv.base_url, "model": "fake-qwen"},
            "gemma": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "gemma3", "max_retries": 0, "timeout_s": 2},
        }}))
        monkeypatch.setenv("IMAGEBENCH_JUDGES_CONFIG", str(cfg))
        r = invoke("judges", "check", "--format", "json")
    assert r.exit_code == 1  # gemma does not answer
    rows = {x["judge"]: x for x in json.loads(r.output[r.output.index("["):r.output.rindex("]") + 1])}
    assert rows["qwen3-vl"]["ok"] is True and rows["qwen3-vl"]["reported_model"] == "fake-qwen"
    assert rows["gemma"]["ok"] is False
    # A routing naming a judge the endpoints file lacks is an error naming it.
    cfg.write_text(json.dumps({"judges": {"qwen3-vl": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}}}))
    r = invoke("judges", "check")
    assert r.exit_code == 1 and "gemma" in r.output


def test_hpsv3_adhoc_prints_rows_in_input_order(tmp_path, tiny_model):
    base, ckpt = tiny_model
    names = []
    for i in range(5):
        (tmp_path / f"img{i}.png").write_bytes(image_bytes(100 + i))
        names.append(f"img{i}.png")
    pairs = tmp_path / "pairs.csv"
    with open(pairs, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["image", "prompt"])
        for i, n in enumerate(names):
            w.writerow([n, f"a photo number {i}"])
    args = ["hpsv3", "--pairs", str(pairs), "--base-model", str(base), "--checkpoint", str(ckpt), "--device", "cpu"]
    r = invoke(*args, "--format", "json", "--batch-size", "2")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output[r.output.index("[") : r.output.rindex("]") + 1])
    assert [Path(x["image"]).name for x in rows] == names
    r1 = invoke(*args, "--format", "json", "--batch-size", "1")
    rows1 = json.loads(r1.output[r1.output.index("[") : r1.output.rindex("]") + 1])
    assert [x["mu"] for x in rows] == pytest.approx([x["mu"] for x in rows1], abs=1e-5)
    # A pairs file naming a missing image fails naming the file and line.
    pairs.write_text("image,prompt\nnope.png,hello\n")
    bad = invoke(*args)
    assert bad.exit_code == 1 and "nope.png" in bad.output and "pairs.csv:2" in bad.output


def test_breakdown_by_difficulty(prefect_harness, workspace, tmp_path, monkeypatch):
    """Capability per difficulty from imported scores and verdicts (missing images are FAIL)."""
    from schemas.settings import load_settings
    from tasks.scores.suite import load_suite

    suite = load_suite(load_settings().suite_path)
    eligible = list(suite.eligible_ids)
    rows = [{"model_id": m, "prompt_id": p, "mu": "0.5"} for m in ("b1", "b2") for p in eligible]
    assert invoke("import-scores", str(_scores_csv(tmp_path / "s.csv", rows)), "--scorer", "lab-y").exit_code == 0
    (tmp_path / "base.txt").write_text("b1\nb2\n")
    monkeypatch.setenv("IMAGEBENCH_REFERENCE_VERSION", "lab-y-1")
    assert invoke("reference", "build", "--version", "lab-y-1", "--baseline", str(tmp_path / "base.txt"), "--scorer", "lab-y").exit_code == 0
    easy = [p.prompt_id for p in suite.prompts if p.difficulty == "easy"]
    vrows = [{"model_id": "b1", "prompt_id": p, "verdict": "PASS", "judge": "j"} for p in easy]
    assert invoke("import-verdicts", str(_scores_csv(tmp_path / "v.csv", vrows, ("model_id", "prompt_id", "verdict", "judge")))).exit_code == 0
    assert invoke("score", "--model", "b1", "--scorer", "lab-y").exit_code == 0
    r = invoke("breakdown", "--model", "b1", "--by", "difficulty", "--format", "json")
    assert r.exit_code == 0, r.output
    got = {x["difficulty"]: x for x in json.loads(r.output[r.output.index("["):])}
    # Imported models: a prompt with a score or a verdict has an image; the rest are missing
    # (FAIL). Every easy prompt has a PASS; hard prompts have mu but no verdict (undecided),
    # except non-eligible hard prompts, which have neither (missing -> FAIL).
    n_hard_missing = sum(1 for p in suite.prompts if p.difficulty == "hard" and not p.eps_eligible)
    assert got["easy"]["pass"] == len(easy) and got["easy"]["fail"] == 0
    assert got["hard"]["pass"] == 0 and got["hard"]["fail"] == n_hard_missing
    assert got["hard"]["undecided"] == 64 - n_hard_missing
    assert got["easy"]["eps"] == pytest.approx(50.0)
