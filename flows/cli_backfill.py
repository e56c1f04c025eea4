"""`imagebench backfill` in production mode: a run of the `score-model/backfill` deployment on a
Prefect server (PREFECT_API_URL, or the local server of `make serve`), instead of in-process.

Moved out of flows/cli.py (which registers the command). A model id the store has no objects
for is refused here, before any flow run exists, with the message the in-process path gives
(issue 15, item 8): a typo never becomes a run that fails on the server 20 s later.
"""

from __future__ import annotations

import os

import typer

from flows.output import OutputFormat
from schemas.settings import Settings

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

    cli = _cli()
    model = parameters["model_id"]
    hint = "start the server and the deployments first (`make serve`), or run in this process with --local"
    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
        if problem is not None:
            raise cli.CliError(f"cannot reach the Prefect API at {api_url} (from {source}): {problem}; {hint}")
        try:
            deployment = client.read_deployment_by_name(BACKFILL_DEPLOYMENT)
        except ObjectNotFound:
            raise cli.CliError(
                f"no deployment {BACKFILL_DEPLOYMENT!r} on the Prefect server at {api_url}: {hint} "
                "(or register prefect.yaml's deployments for GPU workers: docs/OPERATIONS.md)"
            ) from None
        if "scorer_name" not in parameters:  # imported scores: nothing in the store to look for
            refuse_unknown_model(settings, model)  # before a run exists
        cli.err.print(f"production mode: Prefect server at {api_url} (from {source})", highlight=False, soft_wrap=True)
        flow_run = run_deployment(BACKFILL_DEPLOYMENT, parameters=parameters, timeout=0, as_subflow=False,
                                  tags=["backfill"])
        url = _flow_run_url(flow_run)
        cli.err.print(
            f"backfill of {model}: flow run {flow_run.name} ({flow_run.id}) of {BACKFILL_DEPLOYMENT} created"
            + (f"\n  {url}" if url else ""), highlight=False, soft_wrap=True,
        )
        status = getattr(deployment, "status", None)
        if status is not None and str(getattr(status, "value", status)).upper() == "NOT_READY":
            cli.err.print(
                f"[yellow]nothing is polling {BACKFILL_DEPLOYMENT} right now (no `imagebench serve` or worker): "
                "the run waits, Scheduled, until one starts[/]"
            )
        if not wait:
            cli.err.print(f"not waiting (--wait waits and prints the scores): prefect flow-run inspect {flow_run.id}",
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
                    cli.err.print(f"  {model}: {state.name}", highlight=False, soft_wrap=True)
                if state is not None and state.is_final():
                    break
                time.sleep(BACKFILL_POLL_S)
        except KeyboardInterrupt:
            cli.err.print(f"[yellow]stopped waiting; flow run {flow_run.id} goes on on the server[/]" + (f": {url}" if url else ""))
            raise typer.Exit(130) from None
        if not state.is_completed():
            raise cli.CliError(f"backfill of {model} ended {state.name}: {state.message or 'no message'}"
                           + (f" ({url})" if url else ""))
        rows = _scores_of_run(settings, model, str(flow_run.id), flow_run.start_time)
        if rows:
            cli._print_rows(rows, fmt, f"backfill {model}")
            cli._warn_uncalibrated(bool(rows[0].get("uncalibrated")), fmt)
        else:
            cli.err.print(f"completed; the scores are in the lake of the machine that ran it (not {settings.lake_dir}):")
            for text in _run_artifacts(client, flow_run.id):
                cli.err.print(text, markup=False, highlight=False, soft_wrap=True)


def _cli():
    import flows.cli as cli  # the shared error/output helpers (imported late: cli imports this module)

    return cli


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
        _cli().err.print(f"[yellow]store {settings.store_uri} cannot be listed from here ({type(exc).__name__}: "
                         f"{exc}): model {model!r} is checked where the run runs[/]", highlight=False, soft_wrap=True)
        return
    require_objects(store, Lake(settings.lake_dir), model, n_objects)
