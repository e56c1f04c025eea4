"""Security (issue 4, point 6).

1. Credentials (AWS keys, judge API keys) never appear in logs, run records, errors or the lake:
   real flow runs (S3 store on a real SeaweedFS, HTTP judges on a real loopback server) with
   distinctive secrets, success and failure paths (a judge that answers 401/400/500 and echoes
   the request headers, a judge whose answer text quotes them, a wrong AWS secret, unreachable S3
   and judge endpoints), then every byte they produced is scanned.
2-4 (``imagebench sql`` stays inside the lake, hostile identifiers, safe checkpoint loading):
   tests/flows/test_security_inputs.py.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import traceback
from pathlib import Path
from urllib.parse import quote

import duckdb
import pytest

from tests.fake_openai import FakeOpenAI, Reply, free_port
from tests.flows.conftest import cli_process, image_bytes, put_model

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
JUDGE_KEY_ENV = "SCAN_JUDGE_API_KEY"  # a judge key lives in a *_API_KEY variable (issue 24 item 9)
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
            "score": cli_process(["score", "--model", "leaky-cli", "--format", "json"], env),
            "judges check": cli_process(["judges", "check"], env),
            "ingest (wrong secret, IMAGEBENCH_DEBUG=1)": cli_process(
                ["ingest", "--model", "leaky-cli"], {**env, "AWS_SECRET_ACCESS_KEY": WRONG_AWS_SECRET, "IMAGEBENCH_DEBUG": "1"}
            ),
            "ingest (unknown key id)": cli_process(["ingest", "--model", "leaky-cli"], {**env, "AWS_ACCESS_KEY_ID": WRONG_AWS_KEY_ID}),
            "sql": cli_process(["sql", "SELECT * FROM judge_calls", "--format", "json"], env),
            "report": cli_process(["report", "--out", str(workspace / "report")], env),
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
