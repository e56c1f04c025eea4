"""`imagebench backfill|serve`: production mode (ARCHITECTURE.md section 7), registered on the app
by flows/cli/__init__.py. `serve` serves the nightly deployment and backfills on a Prefect API (or a
local Prefect server it starts); `backfill` is a run of the `score-model/backfill` deployment on a
Prefect server (PREFECT_API_URL, or the local server of `make serve`), else runs in this process.

A model id the store has no objects for is refused before any flow run exists, with the message
the in-process path gives (issue 15, item 8): a typo never becomes a run that fails on the server
20 s later.
"""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from flows.cli.common import (
    CliError, OutputFormat, cli_settings, err, precheck, prepare_prefect, print_quarantine, print_rows, progress,
    user_errors, warn_uncalibrated,
)
from schemas.settings import Settings


def backfill(
    model: Annotated[str, typer.Option("--model", "-m", help="model id: folder models/<id>/ in the store")],
    suite_version: Annotated[Optional[str], typer.Option(help="prompt suite version (default: the configured one)")] = None,
    reference_version: Annotated[
        Optional[str], typer.Option(help="frozen EPS reference version (default: the configured one)")
    ] = None,
    rejudge: Annotated[bool, typer.Option("--rejudge", help="ask the judges again even where a verdict exists")] = False,
    scorer: Annotated[
        Optional[str], typer.Option(help="aggregate scores imported under this scorer name instead of running HPSv3")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="on a server: wait for the run's end, print its scores")
    ] = False,
    local: Annotated[bool, typer.Option("--local", help="run in this process even when a server is configured")] = False,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """Backfill one model: a run of deployment score-model/backfill on the Prefect server
    (production mode: PREFECT_API_URL set, or `make serve` running), else in this process."""
    with user_errors():
        from schemas.settings import VERSION_RE
        from tasks.store.storage import validate_model_id

        validate_model_id(model)
        for flag, value in (("--suite-version", suite_version), ("--reference-version", reference_version)):
            if value is not None and not VERSION_RE.fullmatch(value):
                raise CliError(f"{flag} {value!r} is not a valid version name (letters, digits, '.', '_', '-')")
        settings = cli_settings()
        prepare_prefect(settings)
        api_url, source = (None, "") if local else server_api_url(settings)
        parameters = {"model_id": model, "rejudge": rejudge}
        parameters.update({k: v for k, v in (("suite_version", suite_version), ("reference_version", reference_version),
                                             ("scorer_name", scorer)) if v is not None})
        if api_url:
            backfill_on_server(settings, api_url, source, parameters, wait, fmt)
            return
        why = "--local" if local else "embedded mode: no Prefect server configured (PREFECT_API_URL unset, `make serve` not running)"
        precheck(settings.model_copy(update={k: v for k, v in (
            ("suite_version", suite_version), ("reference_version", reference_version)) if v}),
            model, objects=scorer is None)
        err.print(f"{why}: running score-model in this process", highlight=False, soft_wrap=True)
        from flows.pipeline import score_model_flow

        with progress():
            row = score_model_flow(**parameters)
        print_rows([row], fmt, f"backfill {model}")
        print_quarantine(settings, [model], err)
        warn_uncalibrated(row["uncalibrated"], fmt)


def serve(
    local_server: Annotated[
        bool,
        typer.Option(
            "--local-server",
            help="first start a real Prefect server on 127.0.0.1 (port IMAGEBENCH_PREFECT_PORT, default 4200; "
            "home $IMAGEBENCH_HOME/prefect-server), serve against it, stop it on exit (`make serve`)",
        ),
    ] = False,
    port: Annotated[Optional[int], typer.Option(help="--local-server port (default IMAGEBENCH_PREFECT_PORT or 4200)")] = None,
) -> None:
    """Serve the nightly deployment (cron schedule) and backfills: on the configured Prefect API, or
    with --local-server on a local Prefect server started (and stopped) by this command."""
    with user_errors():
        settings = cli_settings()
        if not local_server:
            prepare_prefect(settings, quiet=False)  # a server's console shows its runs' errors
            url = os.environ.get("PREFECT_API_URL")
            err.print(
                f"serving on the Prefect API at {url}" if url else
                "serving on the embedded Prefect API (no UI; `make serve` starts a real local server)",
                highlight=False, soft_wrap=True,
            )
            from flows.deployments import serve_deployments

            serve_deployments()
            return
        _serve_with_local_server(settings, port)


def _serve_with_local_server(settings: Settings, port: int | None) -> None:
    """`imagebench serve --local-server`: a real Prefect server child process, the deployments served
    against it from this process, both stopped on Ctrl-C / SIGTERM (the server last)."""
    import signal
    import threading

    from flows.server import LocalServer, protect_clients, server_home

    port = port or settings.prefect_port
    server = LocalServer(host="127.0.0.1", port=port, home=server_home(settings.home).resolve())
    configured = os.environ.get("PREFECT_API_URL")
    if configured and configured.rstrip("/") != server.api_url:
        # Decision (docs/OPERATIONS.md): the explicit flag wins over the environment.
        err.print(
            f"[yellow]PREFECT_API_URL={configured} is set, but --local-server serves on the local server it "
            f"starts ({server.api_url}); run plain `imagebench serve` to serve on {configured}[/]",
            highlight=False, soft_wrap=True,
        )
    # Before the first `import prefect` of this process: the client, and every flow run the runner
    # starts, talk to this server and keep their state beside it.
    os.environ["PREFECT_API_URL"] = server.api_url
    os.environ["PREFECT_HOME"] = str(server.home)
    protect_clients(server.home)  # its secret, for this process and the flow runs it starts
    prepare_prefect(settings, quiet=False)  # a server's console shows its runs' errors

    stopping, died = threading.Event(), threading.Event()

    def _terminate(signum, _frame):  # until Prefect's runner installs its own handler
        stopping.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        err.print(f"starting a Prefect server on {server.url} (home {server.home}, log {server.log_path}) ...",
                  highlight=False, soft_wrap=True)
        server.start(wait=False)
        # Imported while the server starts (its first start migrates its database).
        from prefect.runner import Runner
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from flows.deployments import nightly_cron, nightly_timezone, serve_deployments

        server.wait_healthy()
        err.print(f"[green]Prefect server ready[/] in {server.started_in_s:.0f} s", highlight=False, soft_wrap=True)
        # Prefect pauses the served schedules on shutdown (the next `serve` resumes them).
        runner = Runner(pause_on_shutdown=True)

        def _watch() -> None:  # a server that dies takes `serve` down with it, loudly and at once
            while not stopping.wait(2.0):
                if not server.running():
                    died.set()
                    runner.pause_on_shutdown = False  # nothing left to pause
                    err.print(f"[bold red]error:[/] the Prefect server exited ({server.process.returncode}); "
                              f"{server.log_path} ends with:", highlight=False, soft_wrap=True)
                    err.print(server.log_tail(), markup=False, highlight=False)
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

        threading.Thread(target=_watch, name="imagebench-server-watch", daemon=True).start()
        err.print(
            f"\n[bold]imagebench production mode[/]\n"
            f"  UI:        {server.ui_url}\n"
            f"  API:       {server.api_url}\n"
            f"  nightly:   nightly/nightly, cron '{nightly_cron()}' in {nightly_timezone()}\n"
            f"  backfill:  imagebench backfill --model M [--rejudge] [--wait]   (another terminal, same IMAGEBENCH_HOME)\n"
            f"             or the UI: {server.ui_url}/deployments -> score-model/backfill -> Run\n"
            f"  stop:      Ctrl-C (stops the deployments, then the server)\n",
            highlight=False, soft_wrap=True,
        )
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            serve_deployments(runner=runner)
    except KeyboardInterrupt:
        pass
    except Exception:
        if not died.is_set():
            raise
        # The runner's shutdown could not reach the dead server: already reported above.
    finally:
        stopping.set()
        signal.signal(signal.SIGTERM, previous)
        if server.process is not None:
            err.print(f"stopping the Prefect server on {server.url} ...", highlight=False, soft_wrap=True)
            server.stop()
            err.print("Prefect server stopped", highlight=False, soft_wrap=True)
    if died.is_set():
        raise typer.Exit(1)


# ---- backfill on a Prefect server -----------------------------------------------------------------

# "<flow name>/<deployment name>" of flows/deployments.py (not imported here: it loads the flows).
BACKFILL_DEPLOYMENT = "score-model/backfill"
BACKFILL_POLL_S = 2.0


def server_api_url(settings: Settings) -> tuple[str | None, str]:
    """The Prefect API a backfill goes to, and where that came from; (None, "") in embedded mode.

    In order: PREFECT_API_URL (environment, or the active Prefect profile), then the local server
    that `imagebench serve --local-server` (`make serve`) is running for this workspace.
    """
    from flows.warm import embedded_api_url

    embedded = embedded_api_url()  # a warm command's API is the embedded one, not a server
    url = os.environ.get("PREFECT_API_URL", "").strip()
    if url and url != embedded:
        return url, "PREFECT_API_URL"
    from prefect.settings import get_current_settings

    url = (get_current_settings().api.url or "").strip()
    if url and url != embedded:
        return url, "PREFECT_API_URL in the Prefect settings"
    from flows.server import API_URL_FILE, server_home, use_recorded_api

    url = use_recorded_api(settings.home)
    if url:
        return url, f"the local server of `make serve`, {server_home(settings.home) / API_URL_FILE}"
    return None, ""


def _flow_run_url(flow_run) -> str | None:
    from prefect.utilities.urls import url_for

    try:
        return url_for(flow_run)
    except Exception:  # no UI URL known for this API
        return None


def _scores_of_run(settings: Settings, model: str, run_id: str, started) -> list[dict]:
    """The model_scores row the run wrote, when this machine sees the same lake."""
    from tasks.lake.tables import Lake

    try:
        rows = Lake(settings.lake_dir).read("model_scores", [model]).to_pylist()
    except Exception:
        return []
    mine = [r for r in rows if r.get("run_id") == run_id]
    if not mine and started is not None:
        mine = [r for r in rows if r["scored_at"] >= started]
    return sorted(mine, key=lambda r: r["scored_at"])[-1:]


def _run_artifacts(client, flow_run_id) -> list[str]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    try:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    except Exception:
        return []
    return [str(a.data) for a in arts if a.type == "markdown" and a.data]


def backfill_on_server(
    settings: Settings, api_url: str, source: str, parameters: dict, wait: bool, fmt: OutputFormat
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL, temporary_settings

    model = parameters["model_id"]
    hint = "start the server and the deployments first (`make serve`), or run in this process with --local"
    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
        if problem is not None:
            raise CliError(f"cannot reach the Prefect API at {api_url} (from {source}): {problem}; {hint}")
        try:
            deployment = client.read_deployment_by_name(BACKFILL_DEPLOYMENT)
        except ObjectNotFound:
            raise CliError(
                f"no deployment {BACKFILL_DEPLOYMENT!r} on the Prefect server at {api_url}: {hint} "
                "(or register prefect.yaml's deployments for GPU workers: docs/OPERATIONS.md)"
            ) from None
        if "scorer_name" not in parameters:  # imported scores: nothing in the store to look for
            refuse_unknown_model(settings, model)  # before a run exists
        err.print(f"production mode: Prefect server at {api_url} (from {source})", highlight=False, soft_wrap=True)
        flow_run = run_deployment(BACKFILL_DEPLOYMENT, parameters=parameters, timeout=0, as_subflow=False,
                                  tags=["backfill"])
        url = _flow_run_url(flow_run)
        err.print(
            f"backfill of {model}: flow run {flow_run.name} ({flow_run.id}) of {BACKFILL_DEPLOYMENT} created"
            + (f"\n  {url}" if url else ""), highlight=False, soft_wrap=True,
        )
        status = getattr(deployment, "status", None)
        if status is not None and str(getattr(status, "value", status)).upper() == "NOT_READY":
            err.print(
                f"[yellow]nothing is polling {BACKFILL_DEPLOYMENT} right now (no `imagebench serve` or worker): "
                "the run waits, Scheduled, until one starts[/]"
            )
        if not wait:
            err.print(f"not waiting (--wait waits and prints the scores): prefect flow-run inspect {flow_run.id}",
                      highlight=False, soft_wrap=True)
            return
        import time

        seen = None
        try:
            while True:
                flow_run = client.read_flow_run(flow_run.id)
                state = flow_run.state
                if state is not None and state.name != seen:
                    seen = state.name
                    err.print(f"  {model}: {state.name}", highlight=False, soft_wrap=True)
                if state is not None and state.is_final():
                    break
                time.sleep(BACKFILL_POLL_S)
        except KeyboardInterrupt:
            err.print(f"[yellow]stopped waiting; flow run {flow_run.id} goes on on the server[/]" + (f": {url}" if url else ""))
            raise typer.Exit(130) from None
        if not state.is_completed():
            raise CliError(f"backfill of {model} ended {state.name}: {state.message or 'no message'}"
                           + (f" ({url})" if url else ""))
        rows = _scores_of_run(settings, model, str(flow_run.id), flow_run.start_time)
        if rows:
            print_rows(rows, fmt, f"backfill {model}")
            warn_uncalibrated(bool(rows[0].get("uncalibrated")), fmt)
        else:
            err.print(f"completed; the scores are in the lake of the machine that ran it (not {settings.lake_dir}):")
            for text in _run_artifacts(client, flow_run.id):
                err.print(text, markup=False, highlight=False, soft_wrap=True)


def refuse_unknown_model(settings: Settings, model: str) -> None:
    """What the in-process path refuses first (tasks.runs.models.require_objects: exit 1, the store and
    prefix searched, the nearest ids), checked from here before a run is created. A store this
    machine cannot list (a worker's bucket, other credentials) is said, and left to the run."""
    from tasks.lake.tables import Lake
    from tasks.runs.models import require_objects
    from tasks.store.storage import StoreError
    from tasks.runs.units_ingest import open_configured_store

    try:
        store = open_configured_store(settings)
        n_objects = len(store.list_model_objects(model))
    except (StoreError, OSError) as exc:
        err.print(f"[yellow]store {settings.store_uri} cannot be listed from here ({type(exc).__name__}: "
                  f"{exc}): model {model!r} is checked where the run runs[/]", highlight=False, soft_wrap=True)
        return
    require_objects(store, Lake(settings.lake_dir), model, n_objects)
