"""`imagebench deploy`: prefect.yaml's deployments for GPU workers, on a Prefect server, in one command
(issue 26 item 6). The work is flows/production.py's; this is its command line."""

from __future__ import annotations

from flows.cli.common import CliError, cli_settings, err, prepare_prefect, user_errors


def deploy() -> None:
    """Register the nightly and backfill deployments for Prefect workers: on the configured Prefect
    server (PREFECT_API_URL, else this workspace's `make serve` server), create prefect.yaml's work
    pool (imagebench-gpu, type process) if missing, run `prefect deploy --all`, and print how to
    start a worker."""
    with user_errors():
        from rich.markup import escape

        settings = cli_settings()
        prepare_prefect(settings)
        from flows.production import ProductionError, deploy_for_workers, find_server, worker_commands

        def say(line: str) -> None:
            err.print(escape(line), highlight=False, soft_wrap=True)

        server = find_server(settings, say=lambda line: err.print(f"[yellow]{escape(line)}[/]", highlight=False,
                                                                   soft_wrap=True))
        if server is None:
            raise CliError(
                "no Prefect server to deploy to (PREFECT_API_URL unset, `make serve` not running): start one with "
                "`imagebench serve --local-server --workers` (it deploys by itself), or set PREFECT_API_URL "
                "(and PREFECT_API_AUTH_STRING) to your server's"
            )
        say(f"Prefect server at {server.api_url} (from {server.source})")
        try:
            pool = deploy_for_workers(settings, server, say)
        except ProductionError as exc:
            raise CliError(str(exc)) from None
        err.print("\nstart a worker on each machine that runs the flows (a checkout with `make setup` done):",
                  highlight=False)
        for line in worker_commands(server, pool):
            err.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
        err.print("(on another machine: its own checkout as IMAGEBENCH_CHECKOUT, and a PREFECT_API_URL it reaches)\n"
                  "then: imagebench backfill --model M [--wait], or wait for the nightly schedule", highlight=False)
