"""Which Prefect task runner the flows use, chosen by one setting (IMAGEBENCH_TASK_RUNNER).

- ``threads`` (default): Prefect's ThreadPoolTaskRunner in the flow's own process.
- ``dask``: prefect-dask's DaskTaskRunner, on the scheduler at IMAGEBENCH_DASK_ADDRESS or, without
  one, on a local cluster of IMAGEBENCH_DASK_WORKERS (default 2) worker *processes*, each
  advertising one ``GPU`` resource. HPSv3 tasks are submitted under :func:`gpu_request`, which
  asks Dask for one ``GPU`` worker resource per task, so only workers started with
  ``--resources GPU=1`` run them, one at a time each (see docs/OPERATIONS.md).

The runner is chosen when ``flows.pipeline`` is imported (a deployment's worker process imports
it with its own environment); :func:`task_runner` builds one for explicit ``flow.with_options``.

Everything a submitted task receives is pickled to the Dask worker and its return value pickled
back; the Prefect settings context (``PREFECT_API_URL`` included) travels with every submission,
so task runs on the workers report to the flow's Prefect API. On the embedded API (no
``PREFECT_API_URL``: a temporary server the flow process starts on its loopback) the setting is
empty, and each worker process would start a Prefect server of its own on the same database:
the runner built here names the flow's server in what it sends instead (``DaskRunner``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

THREAD_WORKERS = 8  # HPSv3 tasks waiting for the device hold a thread: leave room for ingest and judges
KINDS = ("threads", "dask")
DEFAULT_DASK_WORKERS = 2
GPU_RESOURCE = "GPU"

ENV_RUNNER = "IMAGEBENCH_TASK_RUNNER"
ENV_DASK_ADDRESS = "IMAGEBENCH_DASK_ADDRESS"
ENV_DASK_WORKERS = "IMAGEBENCH_DASK_WORKERS"


class TaskRunnerConfigError(ValueError):
    """IMAGEBENCH_TASK_RUNNER / IMAGEBENCH_DASK_* hold a value no runner can be built from."""


def _setting(env: str) -> str | None:
    """An IMAGEBENCH_* setting as schemas.settings reads it: the environment first, then the YAML
    file named by IMAGEBENCH_CONFIG (same key, lower case without the prefix). Read here without
    building a whole Settings, since the flows' runner is chosen at import time."""
    if env in os.environ:
        return os.environ[env]
    config = os.environ.get("IMAGEBENCH_CONFIG")
    if config and os.path.isfile(config):
        import yaml

        with open(config, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
        value = data.get(env.removeprefix("IMAGEBENCH_").lower()) if isinstance(data, dict) else None
        return None if value is None else str(value)
    return None


def runner_kind(kind: str | None = None) -> str:
    """``kind``, or the task_runner setting (IMAGEBENCH_TASK_RUNNER, default "threads"),
    checked against :data:`KINDS` exactly as schemas.settings checks it."""
    value = kind if kind is not None else _setting(ENV_RUNNER)
    if value is None:
        return "threads"
    if value not in KINDS:
        where = "task_runner(kind=...)" if kind is not None else ENV_RUNNER
        raise TaskRunnerConfigError(
            f"unknown task runner {value!r} (from {where}): set {ENV_RUNNER} to one of "
            f"{', '.join(repr(k) for k in KINDS)}"
        )
    return value


def _dask_workers(workers: int | None) -> int:
    if workers is None:
        raw = (_setting(ENV_DASK_WORKERS) or "").strip()
        if not raw:
            return DEFAULT_DASK_WORKERS
        try:
            workers = int(raw)
        except ValueError:
            raise TaskRunnerConfigError(f"{ENV_DASK_WORKERS}={raw!r} is not a whole number") from None
    if workers < 1:
        raise TaskRunnerConfigError(f"{ENV_DASK_WORKERS}={workers}: a local Dask cluster needs at least 1 worker")
    return workers


def local_cluster_kwargs(workers: int) -> dict:
    """``distributed.LocalCluster`` arguments: ``workers`` worker processes, each advertising one
    GPU resource (so GPU-annotated tasks can run locally, one at a time per worker) and running
    THREAD_WORKERS tasks side by side (ingest and judge requests are I/O bound)."""
    return {
        "n_workers": workers,
        "processes": True,
        "threads_per_worker": THREAD_WORKERS,
        "resources": {GPU_RESOURCE: 1},
        # Loopback, any free port: the scheduler's HTTP endpoint otherwise takes :8787 on every
        # interface, and several flows (or tests) may run local clusters at once.
        "dashboard_address": "127.0.0.1:0",
    }


def task_runner(kind: str | None = None, address: str | None = None, workers: int | None = None):
    """A fresh task runner of ``kind`` ("threads" | "dask"); defaults from the environment
    (IMAGEBENCH_TASK_RUNNER, IMAGEBENCH_DASK_ADDRESS, IMAGEBENCH_DASK_WORKERS)."""
    kind = runner_kind(kind)
    if kind == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=THREAD_WORKERS)

    try:
        runner_cls = _dask_runner_class()
    except ImportError as exc:  # pragma: no cover - pinned in requirements.lock
        raise TaskRunnerConfigError(f"{ENV_RUNNER}=dask needs prefect-dask installed ({exc})") from exc
    address = address or (_setting(ENV_DASK_ADDRESS) or "").strip() or None
    if address:
        # An existing scheduler: its workers decide where GPU tasks run (`dask worker --resources GPU=1`).
        return runner_cls(address=address)
    # A temporary local cluster, created when the flow submits its first task and torn down
    # with the flow run (DaskTaskRunner.duplicate() keeps these arguments).
    return runner_cls(
        cluster_class="distributed.LocalCluster", cluster_kwargs=local_cluster_kwargs(_dask_workers(workers))
    )


@contextlib.contextmanager
def _api_url_for_workers() -> Iterator[None]:
    """While a task is submitted: PREFECT_API_URL = the API this flow run talks to, when the
    setting is empty because that API is the embedded one (a temporary server on this machine's
    loopback, started by the flow process's first client). The serialized settings context then
    sends worker processes to it rather than each starting its own server. A configured
    PREFECT_API_URL is left as it is."""
    from prefect.context import FlowRunContext
    from prefect.settings import PREFECT_API_URL, temporary_settings

    ctx = FlowRunContext.get()
    client = getattr(ctx, "client", None) if ctx else None
    url = str(getattr(client, "api_url", "") or "")
    if PREFECT_API_URL.value() or not url.startswith(("http://127.0.0.1", "http://localhost")):
        yield
        return
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


def _dask_runner_class():
    """:class:`DaskRunner`: prefect-dask's DaskTaskRunner, submitting under
    :func:`_api_url_for_workers`. Defined on first use (prefect_dask imports distributed, which
    the thread runner never needs) and then bound as ``flows.runners.DaskRunner``."""
    cls = globals().get("DaskRunner")
    if cls is None:
        from prefect_dask import DaskTaskRunner

        class DaskRunner(DaskTaskRunner):
            """DaskTaskRunner whose submissions name the flow's Prefect API (see the module doc)."""

            def submit(self, task, parameters, wait_for=None, dependencies=None):
                with _api_url_for_workers():
                    return super().submit(task, parameters, wait_for=wait_for, dependencies=dependencies)

        DaskRunner.__module__ = __name__
        globals()["DaskRunner"] = cls = DaskRunner
    return cls


def _flow_uses_dask() -> bool:
    """Whether the running flow's task runner is a DaskTaskRunner (whatever chose it: the
    environment at import time or ``flow.with_options``); outside a flow run, the environment."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = getattr(ctx, "task_runner", None) if ctx else None
    if runner is None:
        return runner_kind() == "dask"
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:  # pragma: no cover
        return False
    return isinstance(runner, DaskTaskRunner)


@contextlib.contextmanager
def gpu_request() -> Iterator[None]:
    """Context in which HPSv3 tasks are submitted: under Dask, each asks for one GPU resource.

    prefect-dask submits each task run through ``distributed.Client.submit``, which merges the
    current ``dask.annotate`` annotations (a context variable, read at submit time in the
    submitting thread: Prefect calls the runner's ``submit`` synchronously from ``Task.submit``)
    into the task's scheduler annotations. The scheduler then gives the task only to a worker
    with a free ``GPU`` resource; with none connected it waits, it never falls back to a CPU
    worker. Under the thread runner this is a no-op.
    """
    if not _flow_uses_dask():
        yield
        return
    import dask

    with dask.annotate(resources={GPU_RESOURCE: 1}):
        yield
