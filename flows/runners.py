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
from collections.abc import Iterator

THREAD_WORKERS = 8  # HPSv3 tasks waiting for the device hold a thread: leave room for ingest and judges
KINDS = ("threads", "dask")  # schemas.settings.RunnerSettings.task_runner
GPU_RESOURCE = "GPU"
ENV_RUNNER = "IMAGEBENCH_TASK_RUNNER"


class TaskRunnerConfigError(ValueError):
    """IMAGEBENCH_TASK_RUNNER / IMAGEBENCH_DASK_* hold a value no runner can be built from."""


def runner_settings():
    """task_runner, dask_address, dask_workers as schemas.settings reads every setting (the
    environment, then the IMAGEBENCH_CONFIG YAML); an invalid one is a TaskRunnerConfigError."""
    from pydantic import ValidationError

    from schemas.settings import RunnerSettings, describe_invalid

    try:
        return RunnerSettings()
    except ValidationError as exc:
        raise TaskRunnerConfigError(describe_invalid(exc)) from None


def runner_kind(kind: str | None = None) -> str:
    """``kind``, or the task_runner setting (default "threads")."""
    if kind is None:
        return runner_settings().task_runner
    if kind not in KINDS:
        raise TaskRunnerConfigError(
            f"unknown task runner {kind!r} (from task_runner(kind=...)): one of {', '.join(repr(k) for k in KINDS)}, "
            f"as {ENV_RUNNER} takes"
        )
    return kind


def _dask_workers(workers: int | None) -> int:
    if workers is None:
        return runner_settings().dask_workers
    if workers < 1:
        raise TaskRunnerConfigError(f"dask workers={workers}: a local Dask cluster needs at least 1 worker")
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
    address = address or (runner_settings().dask_address or "").strip() or None
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


def on_prefect_server() -> bool:
    """Whether this process reports to a Prefect server (not the embedded API: Prefect's
    ephemeral one, or the warm server's, which counts as embedded)."""
    from prefect.settings import get_current_settings

    from flows.warm import embedded_api_url

    url = get_current_settings().api.url
    return bool(url) and url != embedded_api_url()


def judge_limit_scope(settings):
    """Who shares each judge endpoint's limits in this flow run (tasks/judges/limits.py, the
    ``judge_limits`` setting, docs/JUDGES.md):

    - on a Prefect server (``auto``) or ``prefect``: the server's global concurrency and rate
      limits, which every worker of every flow run reaching it shares;
    - else (the embedded API, whose slots a killed command would leak: it reclaims no lease) or
      ``local``: lock files in this user's private runtime folder, shared by every process of this
      machine (the thread runner's, a local Dask cluster's workers, other commands at once); a
      killed process's locks go with it.
    """
    from tasks.judges.limits import LimitScope

    mode = settings.judge_limits
    if mode == "prefect" or (mode == "auto" and on_prefect_server()):
        return LimitScope("prefect")
    from flows.warm import WarmUnavailable, runtime_dir

    try:
        return LimitScope("files", str(runtime_dir()))
    except WarmUnavailable as exc:
        if _flow_uses_dask():
            raise TaskRunnerConfigError(f"judge limits across the Dask workers need the private runtime folder: {exc}") from None
        import logging

        logging.getLogger("imagebench.judges").warning("judge limits held in this process only: %s", exc)
        return LimitScope("process")
