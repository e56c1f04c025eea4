"""Deployments: the nightly schedule and on-request backfills.

Two deployments, the same whichever way they are run:

- ``nightly/nightly``: flow ``nightly`` on a cron schedule with an explicit time zone
  (``IMAGEBENCH_NIGHTLY_CRON`` / ``IMAGEBENCH_NIGHTLY_TZ``, default ``0 2 * * *`` in ``UTC``).
- ``score-model/backfill``: flow ``score-model`` (``flows.pipeline:score_model_flow``) with
  parameters ``model_id``, ``rejudge``, ``suite_version``, ``reference_version``,
  ``scorer_name``; started by ``imagebench backfill --model M`` or the UI's "Run" form.

``imagebench serve`` serves them from its own process (``serve_deployments``) against the
configured Prefect API; ``imagebench serve --local-server`` / ``make serve`` first starts a real
local server (flows/server.py). ``prefect.yaml`` at the repository root declares the same two for
the ``imagebench-gpu`` work pool, for workers on GPU machines (docs/OPERATIONS.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from prefect import serve
from prefect.deployments.runner import EntrypointType
from prefect.schedules import Cron

from flows.pipeline import nightly_flow, score_model_flow

DEFAULT_NIGHTLY_CRON = "0 2 * * *"
DEFAULT_NIGHTLY_TZ = "UTC"

NIGHTLY_NAME = "nightly"
BACKFILL_NAME = "backfill"
# "<flow name>/<deployment name>", as `imagebench backfill` and `prefect deployment run` name them.
NIGHTLY_DEPLOYMENT = f"{nightly_flow.name}/{NIGHTLY_NAME}"
BACKFILL_DEPLOYMENT = f"{score_model_flow.name}/{BACKFILL_NAME}"
WORK_POOL = "imagebench-gpu"  # the work pool of prefect.yaml
TAGS = ["imagebench"]

NIGHTLY_DESCRIPTION = (
    "Score every model in the object store that is new, or whose objects changed, since it was "
    "scored against the current suite, reference and scorer; for unchanged models request only "
    "verdicts still missing. Runs on a cron schedule with an explicit time zone."
)
BACKFILL_DESCRIPTION = (
    "Backfill: score one model now (ingest, HPSv3, judges, EPS / Capability / Overall) and "
    "refresh the catalog. Fill in model_id (the folder models/<model_id>/ in the object store); "
    "leave the versions empty to use the ones configured on the machine that runs it. "
    "From a terminal: imagebench backfill --model M [--rejudge] [--wait]."
)

# Shown under each field of the UI's "Run" form (the flow's docstring has no Args section).
PARAMETER_DOCS: dict[str, str] = {
    "model_id": "Model to score: its images are models/<model_id>/<prompt_id>.<ext> in the object store.",
    "rejudge": "Ask the judges again even where a verdict with the same identity is already in the lake.",
    "suite_version": "Prompt suite version (suite-<v>.jsonl); empty: IMAGEBENCH_SUITE_VERSION of the worker.",
    "reference_version": (
        "Frozen EPS reference version (eps-reference-<v>.json); empty: IMAGEBENCH_REFERENCE_VERSION of the worker."
    ),
    "scorer_name": (
        "Empty: run HPSv3. A name: aggregate scores imported under that name (imagebench import-scores) "
        "instead; nothing is ingested or inferred."
    ),
}


def nightly_cron() -> str:
    return os.environ.get("IMAGEBENCH_NIGHTLY_CRON", DEFAULT_NIGHTLY_CRON)


def nightly_timezone() -> str:
    return os.environ.get("IMAGEBENCH_NIGHTLY_TZ", DEFAULT_NIGHTLY_TZ)


def nightly_schedule() -> Cron:
    return Cron(nightly_cron(), timezone=nightly_timezone())


def _document_parameters(deployment) -> None:
    """Add a description to each parameter of the deployment's schema that lacks one."""
    properties = deployment._parameter_openapi_schema.properties
    for name, text in PARAMETER_DOCS.items():
        if name in properties:
            properties[name].setdefault("description", text)


def build_deployments() -> list:
    # Module-path entrypoints (flows.pipeline.<fn>): the package is installed, so a served run
    # imports the flow whatever directory `imagebench serve` was started from.
    nightly = nightly_flow.to_deployment(
        name=NIGHTLY_NAME,
        schedule=nightly_schedule(),
        description=NIGHTLY_DESCRIPTION,
        tags=[*TAGS, "nightly"],
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    backfill = score_model_flow.to_deployment(
        name=BACKFILL_NAME,
        description=BACKFILL_DESCRIPTION,
        tags=[*TAGS, "backfill"],
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    _document_parameters(nightly)
    _document_parameters(backfill)
    return [nightly, backfill]


# A served run is a child process of `imagebench serve`, which keeps Prefect's loggers at WARNING
# (flows/env.py: a quiet terminal); the runs' own loggers still send INFO, what they scored and
# their run record, to the server, whose UI shows it under the run's Logs (issue 15, item 8).
RUN_LOGS_ENV = {
    "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO",
    "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL": "INFO",
    "PREFECT_LOGGING_TO_API_ENABLED": "true",
}


def ship_run_logs() -> None:
    """The environment the served runs inherit: their logs go to the API (a user's own setting wins)."""
    for key, value in RUN_LOGS_ENV.items():
        os.environ.setdefault(key, value)


def take_back_from_work_pools(say: Callable[[str], None]) -> list[str]:
    """Before serving: the deployments of the same names that are on a work pool (registered for
    workers by ``imagebench deploy`` or ``serve --local-server --workers``) are deleted, with one
    line. Registering ours over them is not enough: Prefect keeps a deployment's work pool when a
    new registration names none, and this process's runner and the pool's workers would then race
    for every run. Prefect deletes their scheduled runs with them. The names taken back."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    taken = []
    with get_client(sync_client=True) as client:
        for name in (NIGHTLY_DEPLOYMENT, BACKFILL_DEPLOYMENT):
            try:
                deployment = client.read_deployment_by_name(name)
            except ObjectNotFound:
                continue
            if deployment.work_pool_name:
                client.delete_deployment(deployment.id)
                taken.append(f"{name} (work pool {deployment.work_pool_name!r})")
    if taken:
        say(f"serving from this process: removed the work-pool deployments {', '.join(taken)} and the runs still "
            "scheduled on them (workers of that pool get nothing from now on; `imagebench deploy` registers them again)")
    return taken


def _say_on_stderr(line: str) -> None:
    print(f"imagebench: {line}", file=sys.stderr, flush=True)


def serve_deployments(print_starting_message: bool = True, runner=None,
                      say: Callable[[str], None] = _say_on_stderr) -> None:
    """Serve both deployments from this process until SIGTERM / Ctrl-C (Prefect's Runner).

    ``runner``: a :class:`prefect.runner.Runner` to serve with (the caller keeps a handle on it,
    e.g. to skip pausing the schedules when the server is gone); default: :func:`prefect.serve`.
    Deployments of the same names on a work pool are taken back first (:func:`take_back_from_work_pools`).
    """
    ship_run_logs()
    take_back_from_work_pools(say)
    if runner is None:
        serve(*build_deployments(), print_starting_message=print_starting_message)
        return
    import asyncio

    from prefect.exceptions import TerminationSignal

    for deployment in build_deployments():
        runner.add_deployment(deployment)
    try:
        asyncio.run(runner.start())
    except (KeyboardInterrupt, TerminationSignal):
        pass
