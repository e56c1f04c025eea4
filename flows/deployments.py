"""Deployments: the nightly schedule and on-request backfills, served by `imagebench serve`.

`serve` runs a long-lived process against the configured Prefect API (the embedded one by
default; set PREFECT_API_URL for a real server). The nightly cron and its time zone come from
IMAGEBENCH_NIGHTLY_CRON / IMAGEBENCH_NIGHTLY_TZ (default 02:00 UTC).
"""

from __future__ import annotations

import os

from prefect import serve
from prefect.schedules import Cron

from flows.pipeline import nightly_flow, score_model_flow

DEFAULT_NIGHTLY_CRON = "0 2 * * *"
DEFAULT_NIGHTLY_TZ = "UTC"


def nightly_schedule() -> Cron:
    return Cron(
        os.environ.get("IMAGEBENCH_NIGHTLY_CRON", DEFAULT_NIGHTLY_CRON),
        timezone=os.environ.get("IMAGEBENCH_NIGHTLY_TZ", DEFAULT_NIGHTLY_TZ),
    )


def build_deployments() -> list:
    return [
        nightly_flow.to_deployment(name="nightly", schedule=nightly_schedule(), tags=["imagebench"]),
        score_model_flow.to_deployment(name="backfill", tags=["imagebench"]),
    ]


def serve_deployments() -> None:
    serve(*build_deployments())
