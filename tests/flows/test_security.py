"""Security (issue 4, point 6).

1. Credentials (AWS keys, judge API keys) never appear in logs, run records, errors or the lake:
   real flow runs (S3 store on a real SeaweedFS, HTTP judges on a real loopback server) with
   distinctive secrets, success and failure paths (a judge that answers 401/400/500 and echoes
   the request headers, a judge whose answer text quotes them, a wrong AWS secret, unreachable S3
   and judge endpoints), then every byte they produced is scanned.
2. ``imagebench sql`` (CLI and :func:`tasks.lake.tables.query`) cannot write, attach or read outside the
   lake.
3. User-supplied identifiers that reach a path or a SQL string are validated or parameterised.
4. Checkpoints load with safetensors (or ``weights_only``) only: an AST scan of the sources, and a
   pickle checkpoint that would run code is refused without running it.
"""

from __future__ import annotations

import ast
import base64
import json
import logging
import os
import secrets
import subprocess
import sys
import traceback
from pathlib import Path
from urllib.parse import quote

import duckdb
import pytest

from tests.fake_openai import FakeOpenAI, Reply, free_port
from tests.flows.conftest import REPO, image_bytes, put_model

# --------------------------------------------------------------------------------------------
# Distinctive secrets, fresh per run (so nothing left over from an earlier run can match).
# --------------------------------------------------------------------------------------------
_RUN = secrets.token_hex(4)
AWS_KEY_ID = f"AKIASCAN{_RUN.upper()}KEYID"
AWS_SECRET = f"scanAwsSecret/{_RUN}+AccessKey0123456789zz"
WRONG_AWS_KEY_ID = f"AKIAWRONG{_RUN.upper()}KEYID"
WRONG_AWS_SECRET = f"scanWrongSecret/{_RUN}+NotTheRealKey98765"
JUDGE_KEY = f"sk-scan-{_RUN}-judgeApiKeyNeverLogged"
OTHER_JUDGE_KEY = f"sk-other-{_RUN}-theKeyTheServerWants"
JUDGE_KEY_ENV = "IMAGEBENCH_TEST_JUDGE_KEY"
SECRETS = {
    "AWS_ACCESS_KEY_ID": AWS_KEY_ID,
    "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
    "wrong AWS_ACCESS_KEY_ID": WRONG_AWS_KEY_ID,
    "wrong AWS_SECRET_ACCESS_KEY": WRONG_AWS_SECRET,
    "judge API key": JUDGE_KEY,
    "the judge server's own key": OTHER_JUDGE_KEY,
}


def _b64_cores(data: bytes) -> set[str]:
    """What any base64 text holding ``data`` (at any alignment, followed by anything) contains."""
    out = set()
    for shift in (0, 1, 2):
        enc = base64.b64encode(b"\0" * shift + data).decode()
        core = enc[4 if shift else 0 : len(enc) - 4]
        out |= {core, core.replace("+", "-").replace("/", "_")}
    return {c for c in out if len(c) >= 8}


def needles() -> dict[str, str]:
    """Every form a secret must not take: itself, percent-encoded, JSON-escaped, base64 (also
    inside a longer base64 text: ``Basic`` auth, an encoded header), and an ``Authorization:
    Bearer <key>`` header."""
    out: dict[str, str] = {}
    for name, s in SECRETS.items():
        out[s] = name
        out.setdefault(quote(s, safe=""), f"{name} (percent-encoded)")
        out.setdefault(s.replace("/", "\\/"), f"{name} (JSON-escaped)")
        for core in _b64_cores(s.encode()):
            out.setdefault(core, f"{name} (base64)")
        out[f"Bearer {s}"] = f"Authorization: Bearer <{name}>"
    return out


class Scan:
    """Collects texts and files, then reports every secret (form) found, with where."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []
        self.blobs: list[tuple[str, bytes]] = []
        self.needles = needles()

    def text(self, where: str, text: object) -> None:
        self.texts.append((where, text if isinstance(text, str) else repr(text)))

    def exception(self, where: str, exc: BaseException) -> None:
        self.text(f"{where}: str", str(exc))
        self.text(f"{where}: repr", repr(exc))
        self.text(f"{where}: traceback", "".join(traceback.format_exception(exc)))

    def tree(self, where: str, root: Path) -> int:
        """Raw bytes of every file under ``root``, plus Parquet and DuckDB files decoded to text."""
        import pyarrow.parquet as pq

        n = 0
        for path in sorted(p for p in Path(root).rglob("*") if p.is_file() and not p.is_symlink()):
            n += 1
            self.blobs.append((f"{where}: {path}", path.read_bytes()))
            if path.suffix == ".parquet":
                try:
                    table = pq.read_table(path)
                    self.text(f"{where}: {path} (decoded rows)", repr(table.to_pylist()))
                    self.text(f"{where}: {path} (metadata)", repr(pq.read_metadata(path).metadata))
                except Exception as exc:  # a temp/partial file: its raw bytes are scanned above
                    self.text(f"{where}: {path} (unreadable: {exc})", "")
            elif path.suffix == ".duckdb":
                self._duckdb(f"{where}: {path}", path)
        return n

    def _duckdb(self, where: str, path: Path) -> None:
        con = duckdb.connect(str(path), read_only=True)
        try:
            names = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()]
            for name in names:
                try:
                    rows = con.execute(f'SELECT * FROM "{name}"').fetchall()
                except duckdb.Error as exc:
                    rows = [f"unreadable: {exc}"]
                self.text(f"{where} table {name}", repr(rows))
        finally:
            con.close()

    def leaks(self) -> list[str]:
        found = []
        for where, text in self.texts:
            for needle, what in self.needles.items():
                if needle in text:
                    i = text.index(needle)
                    found.append(f"{what} in {where}: ...{text[max(0, i - 80): i + len(needle) + 40]!r}...")
        for where, blob in self.blobs:
            for needle, what in self.needles.items():
                for enc in ("utf-8", "utf-16-le"):
                    if needle.encode(enc) in blob:
                        found.append(f"{what} ({enc} bytes) in {where}")
        return found


def test_scanner_finds_planted_secrets(tmp_path):
    """The scan itself: a secret planted in each kind of output, in each form, is found."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    key = JUDGE_KEY
    plants = {
        "plain": key,
        "header": f"Authorization: Bearer {key}",
        "basic auth": base64.b64encode(f"user:{key}".encode()).decode(),
        "base64 header": base64.b64encode(f"Authorization: Bearer {key}".encode()).decode(),
        "urlsafe base64": base64.urlsafe_b64encode(f"xy{key}".encode()).decode(),
        "percent-encoded": quote(AWS_SECRET, safe=""),
        "json-escaped": json.dumps({"k": AWS_SECRET}).replace("/", "\\/"),
    }
    for what, text in plants.items():
        scan = Scan()
        scan.text(what, f"prefix {text} suffix")
        assert scan.leaks(), what
    root = tmp_path / "planted"
    root.mkdir()
    pq.write_table(pa.table({"raw_text": [f"x {AWS_KEY_ID} y"]}), root / "t.parquet", compression="zstd")
    con = duckdb.connect(str(root / "c.duckdb"))
    con.execute("CREATE TABLE t AS SELECT ? AS v", [f"z{WRONG_AWS_SECRET}z"])
    con.close()
    scan = Scan()
    scan.tree("planted", root)
    found = "\n".join(scan.leaks())
    assert "AWS_ACCESS_KEY_ID in planted" in found and "(decoded rows)" in found
    assert "wrong AWS_SECRET_ACCESS_KEY in planted" in found and "table t" in found
    clean = Scan()
    clean.text("clean", "Authorization: *** and Credential=***/20260101 and sk-scan-***")
    assert clean.leaks() == []


def test_redact_masks_secrets_in_every_form_and_in_log_records():
    """tasks/store/redact.py, quickly (the flow test below is the real proof)."""
    import io

    from tasks.store.redact import install_log_redaction, redact, register_secret

    key = f"sk-unit-{_RUN}-redactMe0123"
    register_secret(key)
    for text in (
        key,
        f"Authorization: Bearer {key}",
        base64.b64encode(f"Bearer {key}".encode()).decode(),
        base64.b64encode(f"user:{key}".encode()).decode(),
        quote(key, safe=""),
        f"https://u:{key}@host/x",
    ):
        masked = redact(f"<<{text}>>")
        assert key not in masked and "***" in masked, masked
        assert not any(core in masked for core in _b64_cores(key.encode())), masked
    # credentials nobody registered, by their shape
    assert redact("'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIAXYZ/2026/us-east-1/s3/aws4_request, x'") == (
        "'Authorization': b'***'"
    )
    assert redact("GET /x?X-Amz-Credential=AKIAXYZ%2F2026&X-Amz-Signature=abc&y=1") == (
        "GET /x?X-Amz-Credential=***&X-Amz-Signature=***&y=1"
    )
    assert redact("token: Bearer abc.def-123456") == "token: Bearer ***"
    # ordinary text is left alone
    for text in ("The flag bearer holds a basic sign.", "VERDICT: PASS", "check the key in OPENROUTER_API_KEY", None, ""):
        assert redact(text) == text
    # every log record, whatever logger, is scrubbed before any handler sees it
    install_log_redaction()
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    log = logging.getLogger("imagebench.test.redact")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        log.debug("sending %s", {"Authorization": f"Bearer {key}"})
        try:
            raise RuntimeError(f"server said: bad key {key}")
        except RuntimeError:
            log.exception("request failed for %s", key)
    finally:
        log.removeHandler(handler)
    assert key not in buf.getvalue() and buf.getvalue().count("***") >= 3, buf.getvalue()


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secret_s3():
    """A SeaweedFS server of its own whose only identity is the distinctive key pair."""
    from tests.s3server import S3ServerError, find_weed, start_seaweedfs

    if find_weed() is None:
        pytest.skip("SeaweedFS `weed` binary missing: a credential scan needs a server that checks signatures")
    try:
        server = start_seaweedfs(access_key=AWS_KEY_ID, secret_key=AWS_SECRET)
    except S3ServerError as exc:
        pytest.skip(f"SeaweedFS did not start: {exc}")
    try:
        yield server
    finally:
        server.stop()


def _judge_reply(req) -> Reply:
    """Deterministic per generation prompt: normal answers, and every way a server can hand the
    request's headers (the key) back."""
    prompt = req.generation_prompt
    mode = sum(prompt.encode()) % 7
    verdict = "\nVERDICT: " + ("PASS" if len(prompt) % 2 == 0 else "FAIL")
    auth = req.headers.get("Authorization", "")
    if mode == 0:  # 200 whose answer text starts with the request headers
        return Reply(text="Looked at it." + verdict, echo_headers=True)
    if mode == 1:  # 500 echoing the headers: retried, then the fallback judge
        return Reply(status=500, echo_headers=True)
    if mode == 2:  # 400 echoing the headers: an input error, recorded with the body
        return Reply(status=400, echo_headers=True)
    if mode == 3:  # a (prompt-injected) model that quotes the key, plain and base64-encoded
        b64 = base64.b64encode(auth.encode()).decode()
        return Reply(text=f"Your header was {auth!r} ({b64}); key={auth.removeprefix('Bearer ')}" + verdict)
    if mode == 4:  # answers as "another model" named after the key (mismatch error text)
        return Reply(text="ok" + verdict, model=auth)
    if mode == 5:  # malformed body quoting the key
        return Reply(body=f"<html>bad gateway for {auth}</html>".encode())
    return Reply(text="Looked at it." + verdict)


def _judges_yaml(path: Path, qwen_url: str, gemma_url: str) -> Path:
    cfg = {
        "judges": {
            "qwen3-vl": {"backend": "openai", "base_url": qwen_url, "model": "fake-qwen", "api_key_env": JUDGE_KEY_ENV,
                         "concurrency": 2, "max_retries": 1, "timeout_s": 10},
            "gemma": {"backend": "openai", "base_url": gemma_url, "model": "fake-gemma", "api_key_env": JUDGE_KEY_ENV,
                      "concurrency": 2, "max_retries": 1, "timeout_s": 10},
        }
    }
    path.write_text(json.dumps(cfg))
    return path


def _cli(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m flows.cli ARGS` in its own process; wide columns so that Rich never folds a
    line (a folded secret would slip past a substring scan)."""
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], cwd=REPO, env={**env, "COLUMNS": "10000"},
        capture_output=True, text=True, timeout=timeout,
    )


def _prefect_records(scan: Scan) -> None:
    """Everything the Prefect API kept: flow runs (parameters, states), task runs, logs,
    artifacts, and the raw bytes of its database (events included)."""
    from prefect.client.orchestration import get_client
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL

    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        for fr in client.read_flow_runs(limit=200):
            scan.text(f"prefect flow run {fr.name}", fr.model_dump_json())
        offset = 0
        while True:
            batch = client.read_task_runs(limit=200, offset=offset)
            for tr in batch:
                scan.text(f"prefect task run {tr.name}", tr.model_dump_json())
            if len(batch) < 200:
                break
            offset += 200
        offset, n_logs = 0, 0
        while True:
            logs = client.read_logs(limit=200, offset=offset)
            for log in logs:
                scan.text(f"prefect log ({log.name})", log.model_dump_json())
            n_logs += len(logs)
            if len(logs) < 200:
                break
            offset += 200
        for art in client.read_artifacts():
            scan.text(f"prefect artifact {art.key}", art.model_dump_json())
    db_url = PREFECT_SERVER_DATABASE_CONNECTION_URL.value()
    if db_url and db_url.startswith("sqlite"):
        db = Path(db_url.split("///", 1)[1])
        scan.tree("prefect database dir", db.parent)
    assert n_logs > 0, "no Prefect logs read back: the scan would prove nothing"


# --------------------------------------------------------------------------------------------
# 1. Credentials never leak
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_credentials_never_leak(prefect_harness, workspace, secret_s3, monkeypatch, tmp_path, caplog):
    from flows.pipeline import reference_build_flow, score_model_flow
    from prefect.settings import PREFECT_API_URL
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.store.storage import open_store
    from tasks.scores.suite import load_suite
    from tests.conftest import isolate_aws_env

    # Importing the flows runs Prefect's setup_logging (dictConfig), which replaces the root
    # logger's handlers, pytest's capture handler included: put it back, at DEBUG.
    root = logging.getLogger()
    if caplog.handler not in root.handlers:
        root.addHandler(caplog.handler)
    # Prefect's console handlers may hold a stream pytest closed after an earlier test; at DEBUG
    # their write errors recurse through log_prints' patched print(). caplog and the API handler
    # see every record; the CLI subprocesses below are scanned with their consoles on.
    from prefect.logging.handlers import PrefectConsoleHandler

    for logger in [root, *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, PrefectConsoleHandler):
                monkeypatch.setattr(handler, "emit", lambda record: None)
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="prefect")
    scan = Scan()
    s = load_settings()
    suite = load_suite(s.suite_path)
    reference_ids = list(suite.eligible_ids)
    put_model(workspace / "objects", "base-a", reference_ids, seed=1)
    reference_build_flow("t1", ["base-a"])  # local store: the reference the scored models need

    # The distinctive credentials, and nothing else of the AWS chain.
    isolate_aws_env(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("IMAGEBENCH_S3_ENDPOINT", secret_s3.endpoint_url)
    monkeypatch.setenv(JUDGE_KEY_ENV, JUDGE_KEY)
    # Test scaffolding: the server's own boto3 client (not imagebench's S3Store, which installs
    # the redaction) creates the bucket, before imagebench has seen any credential.
    with caplog.at_level(logging.WARNING):
        bucket = secret_s3.create_bucket("sec")
    monkeypatch.setenv("IMAGEBENCH_STORE", f"s3://{bucket}/bench")
    store = open_store(f"s3://{bucket}/bench", endpoint=secret_s3.endpoint_url)
    # Every category: OCR (Text Rendering) and both HTTP judges get work.
    by_cat: dict[str, list[str]] = {}
    for p in suite.prompts:
        by_cat.setdefault(p.category, []).append(p.prompt_id)
    ids = [pid for cat in sorted(by_cat) for pid in by_cat[cat][:6]]
    for model in ("leaky", "leaky-cli"):
        for i, pid in enumerate(ids):
            store.write(f"models/{model}/{pid}.png", image_bytes(70_000 + i))

    with FakeOpenAI(model="fake-qwen", responder=_judge_reply, api_key=JUDGE_KEY) as qwen, FakeOpenAI(
        model="fake-gemma", api_key=OTHER_JUDGE_KEY, echo_headers_on_auth_failure=True
    ) as gemma:
        monkeypatch.setenv("IMAGEBENCH_JUDGES_CONFIG", str(_judges_yaml(tmp_path / "judges.yaml", qwen.base_url, gemma.base_url)))

        # (a) a full run: S3 with the right keys; qwen answers, echoes, fails; gemma refuses the key (401 + echo)
        row = score_model_flow("leaky")
        assert row["eps_prompts_scored"] > 0
        calls = Lake(s.lake_dir).read("judge_calls", ["leaky"]).to_pylist()
        # the servers did hand the key back (masked on the way in: "***"), in answers and errors
        assert any("***" in (c["raw_text"] or "") for c in calls), "no echoed answer reached the lake"
        assert any("***" in (c["error"] or "") for c in calls), "no echoed error reached the lake"
        assert gemma.requests, "the fallback judge was never asked"
        assert qwen.requests and all(r.headers.get("Authorization") == f"Bearer {JUDGE_KEY}" for r in qwen.requests)

        # (b) wrong AWS secret: access denied
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", WRONG_AWS_SECRET)
        # (the flow raises the StoreError, or a run failure quoting it)
        with pytest.raises(Exception, match="access denied") as denied:
            score_model_flow("leaky", rejudge=True)
        scan.exception("wrong AWS secret", denied.value)
        # (c) unknown access key id
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", WRONG_AWS_KEY_ID)
        with pytest.raises(Exception, match="access denied") as unknown:
            score_model_flow("leaky")
        scan.exception("unknown AWS key id", unknown.value)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_KEY_ID)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
        # (d) unreachable S3 endpoint
        monkeypatch.setenv("IMAGEBENCH_S3_ENDPOINT", f"http://127.0.0.1:{free_port()}")
        with pytest.raises(Exception, match="cannot reach") as unreachable:
            score_model_flow("leaky")
        scan.exception("unreachable S3", unreachable.value)
        monkeypatch.setenv("IMAGEBENCH_S3_ENDPOINT", secret_s3.endpoint_url)

        # (e) unreachable judge endpoints: nothing judged, the run still completes
        dead = f"http://127.0.0.1:{free_port()}/v1"
        monkeypatch.setenv("IMAGEBENCH_JUDGES_CONFIG", str(_judges_yaml(tmp_path / "dead.yaml", dead, dead)))
        row = score_model_flow("leaky", rejudge=True)
        assert row["provisional"]

        # (f) the CLI as a user runs it, with the secrets in its environment and every log on
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env.update({
            "IMAGEBENCH_JUDGES_CONFIG": str(tmp_path / "judges.yaml"),
            "PREFECT_API_URL": PREFECT_API_URL.value(),
            "PREFECT_LOGGING_LEVEL": "DEBUG",
            "PREFECT_LOGGING_ROOT_LEVEL": "DEBUG",
        })
        outputs = {
            "score": _cli(["score", "--model", "leaky-cli", "--format", "json"], env),
            "judges check": _cli(["judges", "check"], env),
            "ingest (wrong secret, IMAGEBENCH_DEBUG=1)": _cli(
                ["ingest", "--model", "leaky-cli"], {**env, "AWS_SECRET_ACCESS_KEY": WRONG_AWS_SECRET, "IMAGEBENCH_DEBUG": "1"}
            ),
            "ingest (unknown key id)": _cli(["ingest", "--model", "leaky-cli"], {**env, "AWS_ACCESS_KEY_ID": WRONG_AWS_KEY_ID}),
            "sql": _cli(["sql", "SELECT * FROM judge_calls", "--format", "json"], env),
            "report": _cli(["report", "--out", str(workspace / "report")], env),
        }
    assert outputs["score"].returncode == 0, outputs["score"].stderr[-3000:]
    assert outputs["ingest (wrong secret, IMAGEBENCH_DEBUG=1)"].returncode != 0
    assert "Traceback" in outputs["ingest (wrong secret, IMAGEBENCH_DEBUG=1)"].stderr
    assert outputs["ingest (unknown key id)"].returncode == 1
    assert outputs["sql"].returncode == 0 and outputs["report"].returncode == 0, outputs["report"].stderr[-2000:]
    for name, out in outputs.items():
        for stream, text in (("stdout", out.stdout), ("stderr", out.stderr)):
            scan.text(f"CLI {name}: {stream}", text)
            scan.text(f"CLI {name}: {stream} (lines joined)", text.replace("\n", ""))

    # What the servers were sent is not ours to scan; everything we produced is.
    # botocore's DEBUG request dumps (which carry the key id) were captured, masked
    assert "Sending http request" in caplog.text and "'Authorization': b'***'" in caplog.text, (
        "botocore's DEBUG request dumps were not captured: the log scan would prove little"
    )
    scan.text("caplog", caplog.text)
    for rec in caplog.records:
        scan.text(f"caplog record {rec.name}", rec.getMessage())
        if rec.exc_info and rec.exc_info[1] is not None:
            scan.exception(f"caplog record {rec.name} exception", rec.exc_info[1])
    _prefect_records(scan)
    n_files = scan.tree("workspace", tmp_path)  # the CLI's log file (tracebacks of the failed ingests) too
    assert n_files > 20 and (workspace / "imagebench.duckdb").is_file()
    assert "Traceback" in (workspace / "logs" / "imagebench.log").read_text(), "the log file the scan covers"
    assert list((workspace / "lake" / "judge_calls").rglob("data.parquet"))
    leaks = scan.leaks()
    assert not leaks, "credentials leaked:\n" + "\n".join(leaks[:40])


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
    ok = _cli(["sql", "SELECT count(*) AS n FROM hps_scores", "--format", "csv"], env, timeout=120)
    assert ok.returncode == 0 and ok.stdout.split() == ["n", "2"], ok.stderr
    bad = _cli(["sql", f"SELECT 1; COPY (SELECT 1) TO '{outside / 'cli.csv'}'"], env, timeout=120)
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
        r = _cli(["hpsv3", "--pairs", str(pairs)], env, timeout=300)
        assert r.returncode == 1, r.stdout + r.stderr
        assert str(ckpt.name) in r.stderr and "safetensors is required" in r.stderr, r.stderr
        assert not marker.exists(), f"the pickle in {ckpt} was executed"
    pinned.scorer_identity.cache_clear()
