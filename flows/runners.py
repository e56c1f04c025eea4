"""Which Prefect task runner the flows use, chosen by one setting (IMAGEBENCH_TASK_RUNNER).

- ``threads`` (default): Prefect's ThreadPoolTaskRunner in the flow's own process.
- ``dask``: prefect-dask's DaskTaskRunner, on the scheduler at IMAGEBENCH_DASK_ADDRESS or on a
  local multi-process cluster. HPSv3 tasks are submitted under :func:`gpu_request`, which asks
  Dask for one ``GPU`` worker resource per task, so only workers started with
  ``--resources GPU=1`` run them (see docs/OPERATIONS.md).

The runner is chosen when ``flows.pipeline`` is imported (a deployment's worker process imports
it with its own environment); :func:`task_runner` builds one for explicit ``flow.with_options``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

THREAD_WORKERS = 4


def task_runner(kind: str | None = None, address: str | None = None, workers: int | None = None):
    """A fresh task runner of ``kind`` ("threads" | "dask"); defaults from the environment."""
    kind = kind or os.environ.get("IMAGEBENCH_TASK_RUNNER", "threads")
    if kind == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=THREAD_WORKERS)
    raise ValueError(f"IMAGEBENCH_TASK_RUNNER={kind!r}: expected 'threads' or 'dask'")


@contextlib.contextmanager
def gpu_request() -> Iterator[None]:
    """Context in which HPSv3 tasks are submitted: under Dask, each asks for one GPU resource."""
    yield
