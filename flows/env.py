"""Environment defaults that must be in place before Prefect is imported."""

from __future__ import annotations

import os
from pathlib import Path


def prepare_prefect_env(home: Path) -> None:
    """Keep Prefect's state inside the workspace and quiet on the embedded (ephemeral) API.

    Only defaults: a user pointing PREFECT_API_URL at a real server keeps it.
    """
    os.environ.setdefault("PREFECT_HOME", str((home / "prefect").resolve()))
    # Without this the ephemeral server prints a "database is locked" telemetry traceback.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
