"""Production mode's Prefect server, and the deployments for workers on it (issue 26 item 6).

- :func:`find_server`: the Prefect server a production command talks to: ``PREFECT_API_URL``
  (environment, then the active Prefect profile), else the local server ``imagebench serve
  --local-server`` (``make serve``) runs for this workspace, found through its ``api-url`` file
  and given its secret (flows/server.py, flows/apiauth.py). What ``backfill`` and ``deploy`` use.
- :func:`deploy_for_workers`: what ``imagebench deploy`` and ``imagebench serve --local-server
  --workers`` do on that server: create prefect.yaml's work pool when it is missing (type
  ``process``), then register prefect.yaml's deployments with Prefect's own ``prefect --no-prompt
  deploy --all``, run from the checkout, the ``{{ $VAR }}`` values filled in from this command's
  settings. prefect.yaml stays the one description of the work-pool deployments (its work pool
  name included); flows/deployments.py the one of the served ones (a test keeps the two the same).
- :func:`worker_commands` / :func:`ui_login_line`: what the banner and ``deploy`` print: how to
  start a worker with the environment it needs, and where the UI's password is, never the secret.

Prefect is imported inside the functions (``flows.env`` must set its environment first).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from schemas.settings import Settings

CHECKOUT = Path(__file__).resolve().parents[1]  # prefect.yaml's entrypoints are paths in it
PREFECT_YAML = CHECKOUT / "prefect.yaml"
POOL_TYPE = "process"  # what a pool created here is: the worker runs each flow run as a local process
LOCAL_SERVER_SOURCE = "the local server of `make serve`"  # where find_server found the API
DEPLOY_TIMEOUT_S = 600.0  # `prefect deploy --all`: imports the flows, two API calls each; ~20 s on 2 cores


class ProductionError(RuntimeError):
    """A production command cannot go on: no server, a server that refuses, a deploy that failed."""


@dataclass(frozen=True)
class Server:
    api_url: str
    source: str  # where the URL came from, for the user
    auth_file: Path | None  # the local server's secret file; None for a server of the user's own

    @property
    def is_local(self) -> bool:
        return self.auth_file is not None


def find_server(settings: Settings, say: Callable[[str], None] | None = None) -> Server | None:
    """The Prefect server production commands use; None in embedded mode (none configured).

    In order: PREFECT_API_URL (environment, or the active Prefect profile), then the local server
    that ``imagebench serve --local-server`` runs for this workspace (its port must be held by the
    ``serve`` that wrote ``api-url``: else the file is removed, ``say`` is told in one line, and
    nothing is sent there). For the local server, this process's Prefect client gets its secret.
    """
    from flows.warm import embedded_api_url

    embedded = embedded_api_url()  # a warm command's API is the embedded one, not a server
    url = os.environ.get("PREFECT_API_URL", "").strip()
    if url and url != embedded:
        return Server(url, "PREFECT_API_URL", None)
    from prefect.settings import get_current_settings

    url = (get_current_settings().api.url or "").strip()
    if url and url != embedded:
        return Server(url, "PREFECT_API_URL in the Prefect settings", None)
    from flows.apiauth import AUTH_FILE
    from flows.server import API_URL_FILE, server_home, use_recorded_api

    url = use_recorded_api(settings.home, say=say)
    if url:
        home = server_home(settings.home)
        return Server(url, f"{LOCAL_SERVER_SOURCE}, {home / API_URL_FILE}", (home / AUTH_FILE).resolve())
    return None


# ---- prefect.yaml ---------------------------------------------------------------------------


def prefect_yaml_pool(path: Path = PREFECT_YAML) -> str:
    """The one work pool prefect.yaml's deployments name."""
    if not path.is_file():
        raise ProductionError(f"{path} not found: `imagebench deploy` registers the deployments of the "
                              "repository's prefect.yaml and runs from a checkout of it (`make setup`)")
    doc = yaml.safe_load(path.read_text()) or {}
    pools = {(d.get("work_pool") or {}).get("name") for d in doc.get("deployments") or []}
    if len(pools) != 1 or None in pools:
        raise ProductionError(f"{path}: its deployments must name one work pool, not {sorted(map(str, pools))}")
    return pools.pop()


def deployed_environment(settings: Settings) -> dict[str, str]:
    """The values prefect.yaml's ``job_variables.env`` takes from the deploying shell
    (``{{ $IMAGEBENCH_HOME }}`` ...), from this command's settings: exported, or the workspace's
    settings file. Paths absolute (a worker resolves a relative one in its own checkout). An unset
    variable would be stored as the literal text ``{{ $VAR }}``: every one is set, empty where it
    means the default (the store: ``$IMAGEBENCH_HOME/objects``; the S3 endpoint: AWS)."""
    store = settings.store or ""
    if store and "://" not in store:  # a plain directory
        store = str(Path(os.path.expanduser(store)).resolve())
    return {"IMAGEBENCH_HOME": str(settings.home.resolve()), "IMAGEBENCH_STORE": store,
            "IMAGEBENCH_S3_ENDPOINT": settings.s3_endpoint or ""}


# ---- on the server --------------------------------------------------------------------------


def _refused(exc: Exception, server: Server) -> ProductionError | None:
    """A 401/403 from the server, said as what to do about it."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status not in (401, 403):
        return None
    how = (f"the secret in {server.auth_file} was refused" if server.is_local else
           "set PREFECT_API_AUTH_STRING to the server's auth string (its PREFECT_SERVER_API_AUTH_STRING)")
    return ProductionError(f"the Prefect server at {server.api_url} (from {server.source}) refused the request "
                           f"({status}): {how}")


SERVED_POLL_WINDOW_S = 30.0  # a runner polls its deployments every 10 s (PREFECT_RUNNER_POLL_FREQUENCY)


def served_by_runner(client, names: list[str]) -> list[str]:
    """Those of ``names`` ("flow/deployment") an ``imagebench serve`` process serves right now: no
    work pool, not paused (a `serve` that stops pauses them), status READY and polled within the
    last :data:`SERVED_POLL_WINDOW_S`. A work-pool deployment of the same name would share its id,
    and that process's runner would race the pool's workers for every run."""
    from datetime import datetime, timedelta, timezone

    from prefect.client.schemas.objects import DeploymentStatus
    from prefect.exceptions import ObjectNotFound

    recent = datetime.now(timezone.utc) - timedelta(seconds=SERVED_POLL_WINDOW_S)
    served = []
    for name in names:
        try:
            deployment = client.read_deployment_by_name(name)
        except ObjectNotFound:
            continue
        if (not deployment.work_pool_name and not deployment.paused and deployment.status == DeploymentStatus.READY
                and deployment.last_polled is not None and deployment.last_polled > recent):
            served.append(name)
    return served


def ensure_pool(client, name: str) -> str:
    """Create the work pool ``name`` (type ``process``, Prefect's default job template for it)
    unless it exists; what was done, in words. A pool that exists is used as it is."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.workers.process import ProcessWorker

    try:
        pool = client.read_work_pool(name)
        return f"work pool {name!r} exists (type {pool.type})"
    except ObjectNotFound:
        pass
    try:
        client.create_work_pool(WorkPoolCreate(name=name, type=POOL_TYPE,
                                               base_job_template=ProcessWorker.get_default_base_job_template()))
    except ObjectAlreadyExists:  # created meanwhile by someone else
        return f"work pool {name!r} exists"
    return f"created the work pool {name!r} (type {POOL_TYPE}: each flow run a process on the worker's machine)"


def prefect_command() -> list[str]:
    """Prefect's command line, from this interpreter's environment."""
    exe = Path(sys.executable).parent / "prefect"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "prefect"]


def deploy_for_workers(settings: Settings, server: Server, say: Callable[[str], None], check_served: bool = True) -> str:
    """On ``server``: prefect.yaml's work pool (created when missing), then its deployments
    registered by ``prefect --no-prompt deploy --all``; checked by reading them back. With
    ``check_served``, refused while an ``imagebench serve`` serves the same deployment names there
    (``serve --local-server --workers`` skips it: it has just started that server). Returns the pool name."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.deployments import BACKFILL_DEPLOYMENT, NIGHTLY_DEPLOYMENT

    pool = prefect_yaml_pool()
    names = [NIGHTLY_DEPLOYMENT, BACKFILL_DEPLOYMENT]
    with temporary_settings(updates={PREFECT_API_URL: server.api_url}), get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
        if problem is not None:
            raise ProductionError(f"cannot reach the Prefect API at {server.api_url} (from {server.source}): {problem}")
        try:
            served = served_by_runner(client, names) if check_served else []
            if served:
                raise ProductionError(
                    f"{' and '.join(served)} {'is' if len(served) == 1 else 'are'} served by a running `imagebench serve` "
                    f"on {server.api_url} (polled within the last {SERVED_POLL_WINDOW_S:.0f} s): its runner would race "
                    f"the workers of {pool!r} for every run. Stop it, then "
                    "start the server with `imagebench serve --local-server --workers` (it deploys by itself), "
                    "or run `imagebench deploy` against a server nobody serves them on")
            say(ensure_pool(client, pool))
        except ProductionError:
            raise
        except Exception as exc:  # noqa: BLE001 - an HTTP refusal is the user's to fix: said in one line
            refused = _refused(exc, server)
            if refused is None:
                raise
            raise refused from None
    env = {**os.environ, "PREFECT_API_URL": server.api_url, **deployed_environment(settings)}
    env.pop("PREFECT_SERVER_API_AUTH_STRING", None)  # a client here; the server's own setting is not ours to pass
    say(f"registering prefect.yaml's deployments for {pool!r}: prefect --no-prompt deploy --all (in {CHECKOUT}) ...")
    try:
        done = subprocess.run([*prefect_command(), "--no-prompt", "deploy", "--all"], cwd=CHECKOUT, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=DEPLOY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ProductionError(f"`prefect deploy --all` did not finish within {DEPLOY_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise ProductionError(f"`prefect --no-prompt deploy --all` failed (exit {done.returncode}):\n{tail}")
    with temporary_settings(updates={PREFECT_API_URL: server.api_url}), get_client(sync_client=True) as client:
        for name in names:
            deployment = client.read_deployment_by_name(name)
            if deployment.work_pool_name != pool:
                raise ProductionError(f"{name} on {server.api_url} is on work pool {deployment.work_pool_name!r} "
                                      f"after `prefect deploy --all`, not {pool!r}")
    say(f"deployed {' and '.join(names)} on the work pool {pool!r} (Prefect server {server.api_url})")
    return pool


# ---- what to tell the user ------------------------------------------------------------------


def secret_export_line(server: Server) -> str:
    """How a worker's shell gets the server's secret: a command that reads it, never the value."""
    if server.auth_file is not None:
        return f'export PREFECT_API_AUTH_STRING="$(cat {shlex.quote(str(server.auth_file))})"'
    if os.environ.get("PREFECT_API_AUTH_STRING"):
        return "export PREFECT_API_AUTH_STRING=...   # the server's auth string, as for this command"
    return ""


def worker_commands(server: Server, pool: str) -> list[str]:
    """The shell lines that start a worker of ``pool`` on this machine's checkout."""
    prefect = Path(sys.executable).parent / "prefect"
    lines = [f"export PREFECT_API_URL={shlex.quote(server.api_url)} IMAGEBENCH_CHECKOUT={shlex.quote(str(CHECKOUT))}"]
    secret = secret_export_line(server)
    if secret:
        lines.append(secret)
    lines.append(f"umask 077; {shlex.quote(str(prefect))} worker start --pool {shlex.quote(pool)}")
    return lines


def ui_login_line(auth_file: Path) -> str:
    """Where the UI's password is: the path of the secret and a command printing it (not the value)."""
    return (f"the password Prefect's login page asks for is the secret in {auth_file} "
            f"(`cat {shlex.quote(str(auth_file))}` prints it)")
