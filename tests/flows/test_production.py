"""The README's production section as written (issue 26 item 6), each command run as a user runs it:
separate processes over 127.0.0.1, a real Prefect server, Prefect's own worker.

- `imagebench serve --local-server --workers` (make serve's server, the work pool and prefect.yaml's
  deployments), its banner's worker commands pasted into a shell: `imagebench backfill --wait`
  completes on the process worker with the tiny model. `imagebench deploy` against the same server
  is idempotent, and refused while a plain `imagebench serve` serves the same names.
- The banner says where the UI's password is, never the password itself.
- No "Prefect collects anonymous usage data" notice on a terminal (DO_NOT_TRACK, flows/env.py).
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.flows.conftest import REPO, eligible_ids, put_model
from tests.flows.test_serve import _wait_for
from tests.terminal import on_a_terminal

BIN = Path(sys.executable).parent
NOTICE = "collects anonymous usage data"
# Prefect reads these to decide it is in CI, where it stays silent: a terminal of a person has none.
CI_VARS = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "JENKINS_URL", "TRAVIS", "CIRCLECI", "BUILDKITE", "TF_BUILD",
           "CODEBUILD_BUILD_ID", "BITBUCKET_COMMIT", "TEAMCITY_VERSION", "DRONE", "SEMAPHORE", "APPVEYOR", "BUDDY",
           "CI_NAME")


def _imagebench(*args: str) -> list[str]:
    return [str(BIN / "imagebench"), *args]


def _user_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A person's shell: no Prefect variables of the test run, no CI markers, no opt-out of ours."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_") and k not in CI_VARS and k not in ("DO_NOT_TRACK", "IMAGEBENCH_API_AUTH_OURS")}
    env.update(HOME=str(tmp_path / "user-home"), PYTHONUNBUFFERED="1", COLUMNS="200", **extra)
    return env


def test_no_telemetry_notice_on_a_terminal(tmp_path):
    """A first command of a workspace on a terminal, as `make demo` runs it: Prefect's "collects
    anonymous usage data" notice is not printed (it is the client's; PREFECT_SERVER_ANALYTICS_ENABLED,
    what the Makefile set, is the server's). The same command with DO_NOT_TRACK=0 exported (a user's
    own value wins) prints it: the command does reach Prefect on a terminal."""
    outputs = {}
    for case, extra in (("default", {}), ("user opts in", {"DO_NOT_TRACK": "0"})):
        home = tmp_path / case.replace(" ", "-")
        env = _user_env(home, IMAGEBENCH_HOME=str(home / "data"), IMAGEBENCH_WARM="off", **extra)
        (home / "user-home").mkdir(parents=True)
        # Prefect is set up (its home made in the workspace), then the run stops: no reference.
        code, out = on_a_terminal(_imagebench("backfill", "--model", "m1", "--local"), env, home)
        assert code == 1 and "reference" in out, out
        assert (home / "data" / "prefect").is_dir(), out
        outputs[case] = out
    assert NOTICE in outputs["user opts in"], outputs["user opts in"]
    assert NOTICE not in outputs["default"], outputs["default"]


# ---- the work pool and its workers, as the README says --------------------------------------

MODEL = "m-worker"
POOL = "imagebench-gpu"


def _client(api_url: str, auth: str | None):
    from contextlib import ExitStack

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    stack = ExitStack()
    stack.enter_context(temporary_settings(updates={PREFECT_API_URL: api_url, PREFECT_API_AUTH_STRING: auth}))
    return stack, stack.enter_context(get_client(sync_client=True))


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group it leads (a worker's flow runs, a server), SIGKILL past 60 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _start(cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _banner_commands(text: str) -> list[str]:
    """The worker's shell lines the banner prints under `runs:`."""
    runs = text[text.index("  runs:"):text.index("  backfill:")]
    return [line.strip() for line in runs.splitlines()[1:] if line.strip()]


@pytest.mark.slow
def test_workers_run_a_backfill_as_the_readme_says(workspace, tmp_path):
    """README, production mode, workers: `imagebench serve --local-server --workers` (a fresh
    workspace, no PREFECT_* exported) starts the server, creates the work pool `imagebench-gpu`
    (type process) and registers prefect.yaml's deployments on it; the banner says where the UI's
    password is and how to start a worker; those lines, pasted into a shell, start Prefect's
    worker, and `imagebench backfill --model M --wait` completes on it with the tiny model, into
    the workspace's lake. `imagebench deploy` on the same server finds the pool there and deploys
    again; while a plain `imagebench serve` serves the same names, it is refused (the two would
    race for every run)."""
    from flows.server import free_port
    from schemas.settings import load_settings
    from tasks.lake.tables import Lake
    from tests.flows.test_serve import _synthetic_reference

    (tmp_path / "user-home").mkdir()
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    secret_file = workspace / "prefect-server" / "api-auth"
    env = _user_env(tmp_path, IMAGEBENCH_PREFECT_PORT=str(port), IMAGEBENCH_WARM="off")
    serve_log = tmp_path / "serve.log"
    serve = _start(_imagebench("serve", "--local-server", "--workers"), env, tmp_path, serve_log)
    worker = None
    try:
        _synthetic_reference("t1")  # while the server starts
        put_model(workspace / "objects", MODEL, eligible_ids()[:5], seed=7)
        banner = _wait_for(lambda: (lambda t: t if "  stop:" in t else None)(serve_log.read_text(errors="replace")),
                           300, "the banner of `serve --local-server --workers`", serve, serve_log)
        secret = secret_file.read_text().strip()
        assert secret and secret not in banner
        # How to log in to the UI: where the password is and a command that prints it.
        login = next(line for line in banner.splitlines() if "UI login:" in line)
        assert str(secret_file.resolve()) in login and f"cat {secret_file.resolve()}" in login, banner
        assert f"created the work pool '{POOL}' (type process" in banner, banner

        # Through the API, with the secret: the pool and both deployments on it.
        stack, client = _client(api, secret)
        try:
            pool = client.read_work_pool(POOL)
            assert pool.type == "process"
            for name in ("nightly/nightly", "score-model/backfill"):
                d = client.read_deployment_by_name(name)
                assert d.work_pool_name == POOL and d.entrypoint.startswith("flows/pipeline.py:")
                # prefect.yaml's {{ $VAR }} filled in from the workspace's settings, never left literal.
                assert d.job_variables["env"] == {"IMAGEBENCH_HOME": str(workspace.resolve()), "IMAGEBENCH_STORE": "",
                                                  "IMAGEBENCH_S3_ENDPOINT": ""}, d.job_variables
            nightly = client.read_deployment_by_name("nightly/nightly")
            (schedule,) = nightly.schedules
            assert schedule.active and not nightly.paused
        finally:
            stack.close()
        import httpx

        no_secret = httpx.post(f"{api}/work_pools/filter", json={}, timeout=30)
        assert no_secret.status_code == 401

        # `imagebench deploy` finds the running server (its api-url file) and deploys again.
        again = subprocess.run(_imagebench("deploy"), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        said = " ".join((again.stdout + again.stderr).split())
        assert again.returncode == 0, said
        assert f"work pool '{POOL}' exists (type process)" in said and f"on the work pool '{POOL}'" in said, said
        assert f'export PREFECT_API_AUTH_STRING="$(cat {secret_file.resolve()})"' in said and secret not in said

        # The banner's worker lines, as a user pastes them (outside the checkout; the worker's own
        # IMAGEBENCH_HOME elsewhere: the deployment's wins).
        lines = _banner_commands(banner)
        assert lines[-1].endswith(f"prefect worker start --pool {POOL}") and lines[-1].startswith("umask 077;"), lines
        worker_env = {**env, "IMAGEBENCH_HOME": str(tmp_path / "worker-own-home"), "PREFECT_WORKER_QUERY_SECONDS": "2"}
        worker_log = tmp_path / "worker.log"
        worker = _start(["bash", "-c", "\n".join(lines)], worker_env, tmp_path, worker_log)
        t0 = time.monotonic()
        done = subprocess.run(_imagebench("backfill", "--model", MODEL, "--wait", "--format", "json"), cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=600)
        print(f"[prefect] backfill on the worker took {time.monotonic() - t0:.1f}s")
        assert done.returncode == 0, done.stdout + done.stderr + worker_log.read_text(errors="replace")
        assert f"production mode: Prefect server at {api} (from the local server of `make serve`" in done.stderr
        flow_run_id = re.search(r"flow run \S+ \(([0-9a-f-]{36})\)", done.stderr).group(1)
        (row,) = json.loads(done.stdout[done.stdout.index("["):])
        assert row["model_id"] == MODEL and row["eps_prompts_scored"] == 5
        (scores,) = [r for r in Lake(load_settings().lake_dir).read("model_scores", [MODEL]).to_pylist()
                     if r["run_id"] == flow_run_id]
        assert scores["reference_version"] == "t1"
        assert "worker" in worker_log.read_text(errors="replace").lower()
        assert not (tmp_path / "worker-own-home").exists()
    finally:
        if worker is not None:
            _stop(worker)
        _stop(serve)
    assert serve.returncode == 0, serve_log.read_text(errors="replace")
    assert "Prefect server stopped" in serve_log.read_text()

    # A plain `imagebench serve` (make serve) serves the same names from its own process: deploying
    # them for workers now would make its runner race the workers. Refused, saying what to do.
    plain_log = tmp_path / "serve-plain.log"
    plain = _start(_imagebench("serve", "--local-server"), env, tmp_path, plain_log)
    try:
        from datetime import datetime, timezone

        started = datetime.now(timezone.utc)

        def served():
            try:
                stack, client = _client(api, secret_file.read_text().strip())
            except Exception:  # noqa: BLE001 - not up yet
                return False
            try:
                d = client.read_deployment_by_name("score-model/backfill")
                return d.work_pool_name is None and d.last_polled is not None and d.last_polled > started
            except Exception:  # noqa: BLE001
                return False
            finally:
                stack.close()

        _wait_for(served, 300, "the plain serve's deployments", plain, plain_log)
        refused = subprocess.run(_imagebench("deploy"), cwd=tmp_path, env=env, capture_output=True, text=True,
                                 timeout=300)
        said = " ".join(refused.stderr.split())
        assert refused.returncode == 1 and "served by a running `imagebench serve`" in said, said
        assert "--workers" in said
        # The plain serve took the deployments back from the pool, saying so (no race the other way either).
        assert "removed the work-pool deployments nightly/nightly" in " ".join(plain_log.read_text().split())
    finally:
        _stop(plain)


def test_deploy_without_a_server_says_how_to_start_one(tmp_path):
    """Embedded mode (no PREFECT_API_URL, no `make serve` running): one line, exit 1, nothing made."""
    env = _user_env(tmp_path, IMAGEBENCH_HOME=str(tmp_path / "data"), IMAGEBENCH_WARM="off")
    (tmp_path / "user-home").mkdir()
    done = subprocess.run(_imagebench("deploy"), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    said = " ".join(done.stderr.split())
    assert done.returncode == 1 and "no Prefect server to deploy to" in said, said
    assert "imagebench serve --local-server --workers" in said and "PREFECT_API_URL" in said
    assert not (tmp_path / "data" / "prefect-server").exists()
    wrong = subprocess.run(_imagebench("serve", "--workers"), cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=240)
    assert wrong.returncode == 1 and "--workers goes with --local-server" in " ".join(wrong.stderr.split()), wrong.stderr


@pytest.mark.slow
def test_the_ui_logs_in_with_the_secret_in_api_auth(tmp_path):
    """What docs/OPERATIONS.md says of the UI of `make serve` ("Logging in to the UI"), in Chromium:
    the first visit lands on Prefect's login page with "Authentication failed." (and its Prefect
    Cloud advert); a wrong password stays there; the content of `<home>/api-auth`, typed as the
    password, opens the dashboard."""
    from tests.tasks.report_helpers.browser import chromium_driver, find_browser

    if isinstance(find_browser(), str):
        pytest.skip(find_browser())
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from flows.server import LocalServer, free_port

    server = LocalServer(host="127.0.0.1", port=free_port(), home=tmp_path / "prefect-server")
    server.start()
    try:
        secret = (server.home / "api-auth").read_text().strip()
        with chromium_driver() as driver:
            wait = WebDriverWait(driver, 60)

            def log_in(password: str) -> None:
                field = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "input[type=password]")))
                field.clear()
                field.send_keys(password)
                driver.find_element(By.XPATH, "//button[normalize-space()='Login']").click()

            driver.get(f"{server.ui_url}/dashboard")
            wait.until(lambda d: "/login" in d.current_url and "Authentication failed." in d.page_source)
            assert "Prefect Cloud" in driver.find_element(By.TAG_NAME, "body").text  # Prefect's own page
            refused = driver.page_source.count("Authentication failed.")
            log_in("admin:pass")  # the field's placeholder, not our secret: refused once more
            wait.until(lambda d: d.page_source.count("Authentication failed.") > refused)
            assert "/login" in driver.current_url
            log_in(secret)
            wait.until(lambda d: "/login" not in d.current_url)
            wait.until(lambda d: "Work Pools" in d.find_element(By.TAG_NAME, "body").text)
            assert driver.current_url.endswith("/dashboard")
    finally:
        server.stop()
