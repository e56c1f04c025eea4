"""Environment defaults that must be in place before Prefect is imported."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path


class WorkspaceError(OSError):
    """The workspace (or Prefect's home inside it) cannot be created."""


# Defaults only (a value the user exported wins). PREFECT_SERVER_ANALYTICS_ENABLED: without it
# the ephemeral server prints a "database is locked" telemetry traceback. DO_NOT_TRACK: Prefect's
# client telemetry, opted out by that variable alone; without it, the first command of a workspace
# on a terminal printed "Prefect collects anonymous usage data" (issue 26 item 6). Every Prefect
# process imagebench starts (ephemeral, warm and local servers, flow runs, `prefect deploy`)
# inherits these.
DEFAULTS = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "PREFECT_LOGGING_LEVEL": "WARNING",
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90", "GX_ANALYTICS_ENABLED": "false",
            "TOKENIZERS_PARALLELISM": "false"}


def set_defaults() -> None:
    """Before Prefect is imported (it sets its logging up on import: the warm server does the same)."""
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)


def prepare_prefect_env(home: Path) -> None:
    """Keep Prefect's state inside the workspace and quiet on the embedded (ephemeral) API.

    Only defaults: a user pointing PREFECT_API_URL at a real server keeps it.
    """
    os.environ.setdefault("PREFECT_HOME", str((home / "prefect").resolve()))
    # A new workspace: Prefect creates its home without parents, and its ephemeral server then
    # fails to open its database (a 90 s wait and pages of tracebacks). Create both here.
    for path, what in ((Path(home), "workspace (IMAGEBENCH_HOME)"), (Path(os.environ["PREFECT_HOME"]), "PREFECT_HOME")):
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WorkspaceError(f"cannot create the {what} {path}: {exc.strerror or exc}") from None
    set_defaults()
    from flows import warm

    if not os.environ.get("PREFECT_API_URL"):
        # Embedded mode: the API this command starts (or its warm server keeps) on this home
        # requires the home's secret (flows/apiauth.py); a configured API is the user's business.
        from flows.apiauth import ApiAuthError, protect

        try:
            protect(Path(os.environ["PREFECT_HOME"]))
        except ApiAuthError as exc:
            raise WorkspaceError(str(exc)) from None
    if "prefect.context" in sys.modules:
        # Prefect read its settings when it was imported, before these defaults (a warm server's
        # child, flows/warm.py, or a library caller): read them again, as a cold command would.
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()
    if warm.use_warm_prefect_api():  # a warm server's child: the API it keeps for this home
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()
    elif not os.environ.get("PREFECT_API_URL"):
        # Embedded mode: the ephemeral API server this process may start must not outlive it.
        from flows.ephemeral import guard_ephemeral_server

        guard_ephemeral_server()


def share_embedded_api() -> str | None:
    """Start this process's embedded API now and name it, for the processes this one starts, in
    ``PREFECT_API_URL`` (marked as the embedded API: flows/warm.py ``embedded_api_url``). What
    `serve` on the embedded API needs: each flow run its runner starts is a new process that,
    finding no API URL, started an API of its own on the same database, outside
    flows/ephemeral.py (its port announced before it was bound, another local user free to take
    it and receive the workspace's secret; left running after a kill). This process's own
    settings are not re-read: it still treats its API as the one it started. None when a Prefect
    API is configured, or the start failed (then Prefect's own start on the first call reports it)."""
    thread = start_embedded_api()
    if thread is None:
        return None
    thread.join()
    from prefect.server.api.server import SubprocessASGIServer

    from flows.warm import API_MARK

    server = SubprocessASGIServer._instances.get(None)
    if server is None or not server.running:
        return None
    os.environ["PREFECT_API_URL"] = os.environ[API_MARK] = server.api_url
    return server.api_url


def start_embedded_api() -> threading.Thread | None:
    """The embedded (ephemeral) Prefect API this command's first flow would start, started now.

    Prefect starts it on the first API call: a ``uvicorn`` subprocess, then 4-10 s of polling its
    ``/health`` while the command waits. Started here from a thread (which only polls: the server
    is its own process), the command meanwhile imports what its flows need (Great Expectations,
    torch: ``flows.cli.common.prepare_prefect``), so those seconds overlap instead of adding up
    (issue 18, item 9). The caller must ``join()`` the thread before any Prefect call: until the
    health check passes, Prefect's own ``start()`` would return before the server is up.

    None when a Prefect API is configured (a real server, or the warm server's API). A failed
    start is left to Prefect's own start on the first call, which raises it with its message.
    """
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    from prefect.server.api.server import SubprocessASGIServer  # imported here, not in the thread

    server = SubprocessASGIServer()

    def start() -> None:
        try:
            server.start()
        except Exception:  # noqa: BLE001 - Prefect's start on the first call reports it
            pass

    thread = threading.Thread(target=start, name="imagebench-api-start", daemon=True)
    thread.start()
    return thread
