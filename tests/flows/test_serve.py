"""Production mode end to end: a real Prefect server on loopback, `imagebench serve` serving the
deployments against it, `imagebench backfill --wait` running one model through the served
`score-model/backfill` deployment; `prefect deploy --all` registering prefect.yaml's deployments
for the `imagebench-gpu` work pool, and a process worker of that pool running a backfill from
its own checkout; and `imagebench serve --local-server` stopping its server on SIGTERM.

Everything runs as a user runs it: separate processes talking HTTP over 127.0.0.1.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from tests.flows.conftest import REPO, put_model

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
MODEL = "m-backfill"
NIGHTLY_CRON, NIGHTLY_TZ = "15 4 * * *", "Europe/Paris"


# ---- helpers --------------------------------------------------------------------------------


def _cmd(*args: str) -> list[str]:
    exe = BIN / "imagebench"
    return [str(exe), *args] if exe.exists() else [sys.executable, "-m", "flows.cli", *args]


def _env(tmp_path: Path, api_url: str | None, **extra: str) -> dict[str, str]:
    """The test's environment (IMAGEBENCH_* of the workspace included), pointed at ``api_url``."""
    # Earlier in-process commands of this worker export the workspace's Prefect settings into
    # os.environ (flows/env.py): a spawned command picks its own, as on a terminal.
    leaked = ("PREFECT_HOME", "PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "PREFECT_SERVER_API_AUTH_STRING")
    env = {k: v for k, v in os.environ.items() if k not in leaked}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect-client"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="WARNING",
        PREFECT_RUNNER_POLL_FREQUENCY="1",  # pick a new backfill up within a second (default 10 s)
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def _client(api_url: str, auth: str | None = None):
    """A sync Prefect client on ``api_url`` (with the server's auth string ``auth``), whatever this
    test process was configured with."""
    from contextlib import ExitStack

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    stack = ExitStack()
    stack.enter_context(temporary_settings(updates={PREFECT_API_URL: api_url, PREFECT_API_AUTH_STRING: auth}))
    client = stack.enter_context(get_client(sync_client=True))
    client._imagebench_stack = stack  # closed by _close()
    return client


def _close(client) -> None:
    client._imagebench_stack.close()


def _read_deployment(api_url: str, name: str, auth: str | None = None):
    from prefect.exceptions import ObjectNotFound

    client = _client(api_url, auth)
    try:
        return client.read_deployment_by_name(name)
    except ObjectNotFound:
        return None
    finally:
        _close(client)


def _wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"process exited ({proc.returncode}) while waiting for {what}:\n{_tail(log)}")
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}:\n{_tail(log)}")


def _tail(log: Path | None, n: int = 60) -> str:
    if log is None or not log.exists():
        return ""
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


PREFECT = [str(BIN / "prefect")] if (BIN / "prefect").exists() else [sys.executable, "-m", "prefect"]


def _deploy_prefect_yaml(api_url: str, tmp_path: Path, **deploy_env: str) -> None:
    """What prefect.yaml's header says to run: the `imagebench-gpu` process pool (unless there),
    then `prefect --no-prompt deploy --all` from the checkout with ``deploy_env`` exported."""
    env = _env(tmp_path, api_url, **deploy_env)
    exists = subprocess.run([*PREFECT, "work-pool", "inspect", "imagebench-gpu"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    if exists.returncode != 0:
        pool = subprocess.run([*PREFECT, "work-pool", "create", "imagebench-gpu", "--type", "process"], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=120)
        assert pool.returncode == 0, pool.stdout + pool.stderr
    dep = subprocess.run([*PREFECT, "--no-prompt", "deploy", "--all"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=180)
    assert dep.returncode == 0, dep.stdout + dep.stderr


def _synthetic_reference(version: str) -> None:
    """Reference ``version`` built by the tiny HPSv3 scorer's identity from a synthetic baseline
    (mu = 0 on every EPS-eligible prompt): what the pipeline checks, without scoring a field."""
    from schemas.settings import load_settings
    from tasks.runs import pinned, run_ids
    from tasks.scores.reference import build_reference
    from tasks.scores.suite import load_suite

    settings = load_settings()
    suite = load_suite(settings.suite_path)
    identity = pinned.scorer_identity(pinned.ScorerSpec.from_settings(settings))
    rows = [{"model_id": "synthetic-base", "prompt_id": p, "mu": 0.0, "scorer_id": identity.scorer_id}
            for p in suite.eligible_ids]
    # The golden set's mu from the tiny scorer in this runtime: the served runs' canary passes.
    golden = pinned.golden_for_reference(settings, pinned.ScorerSpec.from_settings(settings))
    build_reference(version=version, baseline_models=["synthetic-base"], scores=rows, suite=suite,
                    scorer=identity, reference_dir=settings.reference_dir, created_at=run_ids.utcnow().isoformat(),
                    golden=golden)


def _flow_run_ids(api_url: str) -> set:
    """Flow runs that ran or were asked for: not the nightly's future runs, which Prefect's scheduler
    creates on its own at any moment while `serve` runs."""
    client = _client(api_url)
    try:
        return {r.id for r in client.read_flow_runs() if not r.auto_scheduled}
    finally:
        _close(client)


def _run_logs(api_url: str, flow_run_id: str) -> list:
    """What the API's logs endpoint (the UI's Logs tab) holds for the flow run."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    client = _client(api_url)
    try:
        return client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    finally:
        _close(client)


def _error_line(stderr: str) -> str:
    """The one `error:` line of a command's stderr, joined across terminal wraps, without the log hint."""
    text = " ".join(stderr.split())
    return text[text.index("error:"):].split(" (traceback in ")[0]


def _flow_signature_names(entrypoint: str) -> set[str]:
    from prefect.flows import load_flow_from_entrypoint

    flow = load_flow_from_entrypoint(str(REPO / entrypoint))
    return set(inspect.signature(flow.fn).parameters)


# ---- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def prefect_server(tmp_path_factory):
    """One real Prefect server (flows/server.py: Prefect's server app, as `prefect server start` runs
    it, on a socket bound first) on a free loopback port for this module.

    Started without waiting, at the module's first test: its database migrations (~20 s on a
    fresh home) overlap the tests that do not need it; `_ready` waits for `/api/health`.
    """
    from flows.server import LocalServer, free_port

    # A stand-in for a server the user runs and configures with PREFECT_API_URL: its auth is theirs.
    server = LocalServer(host="127.0.0.1", port=free_port(), home=tmp_path_factory.mktemp("prefect-server-home"),
                         auth=False)
    server.start(wait=False)
    try:
        yield server
    finally:
        server.stop()
    assert not server.running()


def _ready(server):
    if server.started_in_s is None:
        server.wait_healthy()
        print(f"\n[prefect] server {server.url} ready in {server.started_in_s:.1f}s")
    return server


def test_the_ui_calls_the_api_of_its_own_port(prefect_server):
    """The UI asks /ui-settings where its API is: the server's own address, not 4200 (a server on
    another port, as IMAGEBENCH_PREFECT_PORT gives, sent its UI's calls to whoever held 4200:
    issue 24 item 5). The module's server listens on a free port, never 4200."""
    import httpx

    server = _ready(prefect_server)
    assert server.port != 4200
    settings = httpx.get(f"{server.url}/ui-settings", timeout=30)
    assert settings.status_code == 200 and settings.json()["api_url"] == server.api_url, settings.text


# ---- prefect.yaml, statically -----------------------------------------------------------------


def test_prefect_yaml_matches_the_flows_and_deployments_py():
    from flows import deployments

    doc = yaml.safe_load((REPO / "prefect.yaml").read_text())
    assert not doc.get("build") and not doc.get("push")
    # No pull step that downloads: workers run their own checkout.
    assert [list(step) for step in doc["pull"]] == [["prefect.deployments.steps.set_working_directory"]]
    by_name = {d["name"]: d for d in doc["deployments"]}
    assert set(by_name) == {"nightly", "backfill"}
    expected = {"nightly": "flows/pipeline.py:nightly_flow", "backfill": "flows/pipeline.py:score_model_flow"}
    for name, d in by_name.items():
        assert d["entrypoint"] == expected[name]
        assert d["work_pool"]["name"] == deployments.WORK_POOL == "imagebench-gpu"
        # The device is the worker machine's (its environment; `auto`: its GPU when it has one).
        assert set(d["work_pool"]["job_variables"]["env"]) == {"IMAGEBENCH_HOME", "IMAGEBENCH_STORE",
                                                              "IMAGEBENCH_S3_ENDPOINT"}
        assert "imagebench" in d["tags"]
        names = _flow_signature_names(d["entrypoint"])
        assert set(d.get("parameters") or {}) <= names, (name, d.get("parameters"), names)
    assert {"model_id", "rejudge", "suite_version", "reference_version", "scorer_name"} <= _flow_signature_names(
        by_name["backfill"]["entrypoint"])
    assert set(deployments.PARAMETER_DOCS) <= _flow_signature_names(by_name["backfill"]["entrypoint"])
    (sched,) = by_name["nightly"]["schedules"]
    assert sched["cron"] == deployments.DEFAULT_NIGHTLY_CRON and sched["timezone"] == deployments.DEFAULT_NIGHTLY_TZ
    assert not by_name["backfill"]["schedules"]
    # The names `imagebench backfill` asks the server for are the ones deployed.
    from flows.cli.scoring import BACKFILL_DEPLOYMENT

    assert BACKFILL_DEPLOYMENT == deployments.BACKFILL_DEPLOYMENT == "score-model/backfill"
    assert deployments.NIGHTLY_DEPLOYMENT == "nightly/nightly"


def test_backfill_validates_before_anything(workspace, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # never contacted
    for args in (["--model", "../etc"], ["--model", "ok", "--reference-version", "../x"]):
        r = CliRunner().invoke(app, ["backfill", *args], catch_exceptions=False)
        assert r.exit_code == 1, r.output
        assert ("../etc" if "../etc" in args else "../x") in r.output
        assert "127.0.0.1:9" not in r.output


# ---- the real server --------------------------------------------------------------------------


def test_backfill_through_served_deployment(prefect_server, workspace, tmp_path, monkeypatch):
    """`imagebench serve` against a real server; `imagebench backfill --wait` scores a model there."""
    from typer.testing import CliRunner

    from flows.cli import app
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.scores.suite import load_suite

    api = _ready(prefect_server).api_url
    monkeypatch.setenv("IMAGEBENCH_BOOTSTRAP_RESAMPLES", "200")

    # Before anything is served: a clear error, pointing at `make serve`.
    monkeypatch.setenv("PREFECT_API_URL", api)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-client"))
    r = CliRunner().invoke(app, ["backfill", "--model", MODEL], catch_exceptions=False)
    said = " ".join(r.output.split())
    assert r.exit_code == 1 and "no deployment 'score-model/backfill'" in said and "`make serve`" in said, r.output

    log = tmp_path / "serve.log"
    env = _env(tmp_path, api, IMAGEBENCH_NIGHTLY_CRON=NIGHTLY_CRON, IMAGEBENCH_NIGHTLY_TZ=NIGHTLY_TZ)
    # As after `make demo`: the reference and scorer are in the workspace's settings file, not
    # exported; `serve`, its flow runs and `backfill` find them from IMAGEBENCH_HOME alone.
    from flows.demo import DEMO_SETTING_KEYS, write_workspace_settings

    write_workspace_settings(load_settings())
    for key in DEMO_SETTING_KEYS:
        env.pop(f"IMAGEBENCH_{key.upper()}")
    with open(log, "wb") as out:
        serve = subprocess.Popen(_cmd("serve"), cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        # While `serve` starts: the frozen reference t1 and the model's images.
        _synthetic_reference("t1")
        settings = load_settings()
        eligible = list(load_suite(settings.suite_path).eligible_ids)
        put_model(workspace / "objects", MODEL, eligible[:6], seed=3)
        _wait_for(lambda: _read_deployment(api, "score-model/backfill"), 120, "the served deployments", serve, log)
        # A typo: refused before any flow run exists, with the in-process path's message (issue 15 item 8).
        runs_before = _flow_run_ids(api)
        typo = subprocess.run(_cmd("backfill", "--model", MODEL[:-1]), cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=240)
        local = subprocess.run(_cmd("backfill", "--model", MODEL[:-1], "--local"), cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=240)
        said = " ".join(typo.stderr.split())
        assert typo.returncode == 1 and f"no model '{MODEL[:-1]}'" in said and f"'{MODEL}'" in said, typo.stderr
        assert _error_line(typo.stderr) == _error_line(local.stderr) and local.returncode == 1, local.stderr
        assert "flow run" not in said and _flow_run_ids(api) == runs_before
        t0 = time.monotonic()
        done = subprocess.run(_cmd("backfill", "--model", MODEL, "--wait", "--format", "json"), cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=240)
        print(f"[prefect] backfill --wait took {time.monotonic() - t0:.1f}s\n{done.stderr}")
        assert done.returncode == 0, done.stdout + done.stderr + _tail(log)
        assert f"production mode: Prefect server at {api}" in done.stderr
        flow_run_id = re.search(r"flow run \S+ \(([0-9a-f-]{36})\)", done.stderr).group(1)
        assert "Completed" in done.stderr
        (row,) = json.loads(done.stdout[done.stdout.index("["):])
        assert row["model_id"] == MODEL and row["eps_prompts_scored"] == 6

        # The lake has the model's scores, written by that flow run.
        (scores,) = [r for r in Lake(settings.lake_dir).read("model_scores", [MODEL]).to_pylist()
                     if r["run_id"] == flow_run_id]
        assert scores["eps"] == pytest.approx(row["eps"]) and scores["reference_version"] == "t1"
        client = _client(api)
        try:
            flow_run = client.read_flow_run(flow_run_id)
            assert flow_run.state.is_completed()
            print(f"[prefect] run created -> started {(flow_run.start_time - flow_run.created).total_seconds():.1f}s, "
                  f"ran {flow_run.total_run_time.total_seconds():.1f}s")
            assert flow_run.parameters == {"model_id": MODEL, "rejudge": False}
        finally:
            _close(client)
        # The run's logs are on the server (the UI's Logs tab), INFO included: what the run did.
        logs = _wait_for(lambda: (lambda got: got if any("run " + flow_run_id in x.message for x in got) else None)(
            _run_logs(api, flow_run_id)), 60, "the backfill run's logs on the server", serve, log)
        assert any(x.level == 20 and "Finished in state Completed" in x.message for x in logs), [
            (x.level, x.message) for x in logs]

        # The nightly deployment: a cron schedule with its explicit time zone.
        nightly = _read_deployment(api, "nightly/nightly")
        (schedule,) = nightly.schedules
        assert schedule.schedule.cron == NIGHTLY_CRON and schedule.schedule.timezone == NIGHTLY_TZ
        backfill = _read_deployment(api, "score-model/backfill")
        assert not backfill.schedules
        props = backfill.parameter_openapi_schema["properties"]
        assert backfill.parameter_openapi_schema["required"] == ["model_id"]
        assert all(props[p].get("description") for p in ("model_id", "rejudge", "suite_version", "reference_version"))
        assert "model_id" in (backfill.description or "")
    finally:
        _stop(serve)
    assert serve.returncode == 0, _tail(log)


def test_imagebench_deploy_on_a_server_of_ones_own(prefect_server, workspace, tmp_path):
    """README, workers on a server of one's own: `imagebench deploy` with PREFECT_API_URL set (the
    module's server, no auth: a user's own server) creates the pool `imagebench-gpu` (type process)
    if missing and registers prefect.yaml's deployments, prefect.yaml's `{{ $VAR }}` filled in from
    the workspace's settings. Right after the `serve` of the test above stopped (its deployments
    paused), nothing serves them: not refused. The worker lines name no secret file."""
    api = _ready(prefect_server).api_url
    store = tmp_path / "objects-elsewhere"
    env = _env(tmp_path, api, IMAGEBENCH_STORE=str(store), IMAGEBENCH_S3_ENDPOINT="")
    done = subprocess.run(_cmd("deploy"), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    said = " ".join(done.stderr.split())
    assert done.returncode == 0, said
    assert f"Prefect server at {api} (from PREFECT_API_URL)" in said
    assert ("created the work pool 'imagebench-gpu' (type process" in said
            or "work pool 'imagebench-gpu' exists (type process)" in said), said
    assert f"export PREFECT_API_URL={api} IMAGEBENCH_CHECKOUT={REPO}" in said and "PREFECT_API_AUTH_STRING" not in said
    assert "prefect worker start --pool imagebench-gpu" in said
    client = _client(api)
    try:
        assert client.read_work_pool("imagebench-gpu").type == "process"
    finally:
        _close(client)
    for name in ("nightly/nightly", "score-model/backfill"):
        d = _read_deployment(api, name)
        assert d.work_pool_name == "imagebench-gpu" and d.entrypoint.startswith("flows/pipeline.py:")
        assert d.job_variables["env"] == {"IMAGEBENCH_HOME": str(workspace.resolve()), "IMAGEBENCH_STORE": str(store),
                                          "IMAGEBENCH_S3_ENDPOINT": ""}


def test_prefect_yaml_deploys_to_the_work_pool(prefect_server, tmp_path):
    """`prefect --no-prompt deploy --all` registers both deployments of prefect.yaml, offline."""
    from flows.deployments import DEFAULT_NIGHTLY_CRON, DEFAULT_NIGHTLY_TZ

    api = _ready(prefect_server).api_url
    before = (REPO / "prefect.yaml").read_bytes()
    _deploy_prefect_yaml(api, tmp_path, IMAGEBENCH_HOME="/srv/imagebench/data", IMAGEBENCH_STORE="s3://bench/images",
                         IMAGEBENCH_S3_ENDPOINT="")
    assert (REPO / "prefect.yaml").read_bytes() == before  # deploy does not rewrite the file

    nightly = _read_deployment(api, "nightly/nightly")
    backfill = _read_deployment(api, "score-model/backfill")
    for d in (nightly, backfill):
        assert d.work_pool_name == "imagebench-gpu"
        assert d.pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $IMAGEBENCH_CHECKOUT }}"}}
        ]
        assert d.job_variables["env"] == {
            "IMAGEBENCH_HOME": "/srv/imagebench/data", "IMAGEBENCH_STORE": "s3://bench/images",
            "IMAGEBENCH_S3_ENDPOINT": "",
        }
        assert "imagebench" in d.tags and d.enforce_parameter_schema
    assert nightly.entrypoint == "flows/pipeline.py:nightly_flow"
    assert backfill.entrypoint == "flows/pipeline.py:score_model_flow"
    (schedule,) = nightly.schedules
    assert schedule.schedule.cron == DEFAULT_NIGHTLY_CRON and schedule.schedule.timezone == DEFAULT_NIGHTLY_TZ
    assert schedule.active
    assert not backfill.schedules
    assert backfill.parameter_openapi_schema["required"] == ["model_id"]
    assert set(backfill.parameter_openapi_schema["properties"]) == {
        "model_id", "rejudge", "suite_version", "reference_version", "scorer_name"}


def test_prefect_yaml_backfill_runs_on_a_process_worker(prefect_server, workspace, tmp_path):
    """What a GPU machine does in production: `prefect worker start --pool imagebench-gpu` picks a
    backfill run of prefect.yaml's deployment, its pull step changes into IMAGEBENCH_CHECKOUT, and
    the flow scores the model into the lake named by the run's environment.

    The deployment's `env` (filled in at deploy time) wins over the worker's environment, and the
    run adds one key to it the way the UI's custom run does (IMAGEBENCH_DEVICE=cpu): merged key by
    key, the deployed IMAGEBENCH_HOME stays."""
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tasks.scores.suite import load_suite

    api = _ready(prefect_server).api_url
    deployed = {"IMAGEBENCH_HOME": str(workspace), "IMAGEBENCH_STORE": str(workspace / "objects"),
                "IMAGEBENCH_S3_ENDPOINT": ""}  # exported before `prefect deploy`, as prefect.yaml says
    _deploy_prefect_yaml(api, tmp_path, **deployed)
    _synthetic_reference("t1")
    settings = load_settings()
    put_model(workspace / "objects", MODEL, list(load_suite(settings.suite_path).eligible_ids)[:5], seed=4)

    # A run's `env` job variables are merged key by key into the deployment's.
    run_env = {"IMAGEBENCH_DEVICE": "cpu"}
    client = _client(api)
    try:
        deployment = client.read_deployment_by_name("score-model/backfill")
        flow_run = client.create_flow_run_from_deployment(
            deployment.id, parameters={"model_id": MODEL}, job_variables={"env": run_env})
    finally:
        _close(client)

    log = tmp_path / "worker.log"
    # The worker's own IMAGEBENCH_HOME is elsewhere: the deployment's job variables must win.
    env = _env(tmp_path, api, IMAGEBENCH_CHECKOUT=str(REPO), PREFECT_WORKER_QUERY_SECONDS="1",
               IMAGEBENCH_HOME=str(tmp_path / "not-the-deployed-home"))
    with open(log, "wb") as out:  # cwd is not the checkout: the pull step must change into it
        worker = subprocess.Popen([*PREFECT, "worker", "start", "--pool", "imagebench-gpu", "--install-policy",
                                   "never"], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)

    def finished():
        c = _client(api)
        try:
            state = c.read_flow_run(flow_run.id).state
        finally:
            _close(c)
        return state if state is not None and state.is_final() else None

    try:
        state = _wait_for(finished, 300, "the backfill run on the process worker", worker, log)
    finally:
        _stop(worker)
    assert state.is_completed(), f"{state.type}: {state.message}\n{_tail(log)}"
    (scores,) = [r for r in Lake(settings.lake_dir).read("model_scores", [MODEL]).to_pylist()
                 if r["run_id"] == str(flow_run.id)]
    assert scores["eps_prompts_scored"] == 5 and scores["reference_version"] == "t1"
    assert not (tmp_path / "not-the-deployed-home").exists()


def test_local_server_stops_on_sigterm(prefect_server, workspace, tmp_path):
    """`imagebench serve --local-server` (what `make serve` runs): its own server in the workspace,
    the deployments served on it, and SIGTERM stops both, leaving no server behind."""
    import psutil

    from flows.server import API_URL_FILE, api_healthy, free_port, recorded_api_url

    _ready(prefect_server)
    port = free_port()
    home = workspace / "prefect-server"
    home.mkdir(parents=True)
    # Test speed only: start from a consistent copy of the module server's database, whose
    # migrations are done (a fresh database spends ~15 s migrating on a 2-core machine).
    with sqlite3.connect(prefect_server.home / "prefect.db") as src, sqlite3.connect(home / "prefect.db") as dst:
        src.backup(dst)
    # PREFECT_API_URL already set: --local-server says so and uses its own server.
    env = _env(tmp_path, "http://127.0.0.1:9/api", IMAGEBENCH_PREFECT_PORT=str(port))
    log = tmp_path / "serve-local.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(_cmd("serve", "--local-server"), cwd=tmp_path, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    started = datetime.now(timezone.utc)
    try:
        api = f"http://127.0.0.1:{port}/api"

        def secret() -> str:  # made by the server's start: flows/apiauth.py
            return (home / "api-auth").read_text().strip()

        def served():  # registered by this `serve` (module entrypoint) and polled by its runner
            d = _read_deployment(api, "score-model/backfill", secret()) if api_healthy(api) else None
            return (d is not None and d.entrypoint == "flows.pipeline.score_model_flow"
                    and d.last_polled is not None and d.last_polled > started)

        _wait_for(served, 120, "the local server and the served deployments", proc, log)
        assert recorded_api_url(workspace) == api  # how `imagebench backfill` finds it
        # Its API requires the secret in its home (0600): refused without it, or with another.
        import base64

        import httpx

        assert (home / "api-auth").stat().st_mode & 0o777 == 0o600
        for headers in ({}, {"Authorization": "Basic " + base64.b64encode(b"guess").decode()}):
            assert httpx.post(f"{api}/deployments/filter", json={}, headers=headers).status_code == 401
            assert httpx.post(f"{api}/flows/", json={"name": "intruder"}, headers=headers).status_code == 401
        # IMAGEBENCH_PREFECT_PORT's server tells its UI to call itself (issue 24 item 5)
        assert httpx.get(f"http://127.0.0.1:{port}/ui-settings", timeout=30).json()["api_url"] == api
        text = log.read_text()
        assert "PREFECT_API_URL=http://127.0.0.1:9/api is set, but --local-server" in text
        assert f"UI:        http://127.0.0.1:{port}" in text and "imagebench backfill --model M" in text
        # How to log in to the UI: the secret's file and a command that prints it, never the secret (issue 26 item 6).
        assert f"UI login:  the password Prefect's login page asks for is the secret in {home.resolve() / 'api-auth'}" in text
        assert f"`cat {home.resolve() / 'api-auth'}` prints it" in text and secret() not in text
        servers = [p for p in psutil.Process(proc.pid).children(recursive=True)
                   if "prefect.server.api.server:create_app" in p.cmdline()]
        assert len(servers) == 1, [p.cmdline() for p in psutil.Process(proc.pid).children(recursive=True)]
        assert str(home.resolve()) == servers[0].environ()["PREFECT_HOME"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, _tail(log)
    finally:
        _stop(proc)
    assert not api_healthy(api)
    assert not servers[0].is_running() or servers[0].status() == psutil.STATUS_ZOMBIE
    assert not (home / API_URL_FILE).exists()
    assert "Prefect server stopped" in log.read_text()
