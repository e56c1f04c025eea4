"""`imagebench panel serve`: the judging web app of one open study (tasks/panel/app.py).

Loopback by default: put it behind your HTTPS reverse proxy to reach judges elsewhere (a tested
nginx set-up: docs/BEAUTY.md, "Limits and the reverse proxy"). uvicorn's access log is off; the
app's own request log redacts the link tokens. The server's body, header and connection limits
are tasks/panel/limits.py's, set up by ``make_server``.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from flows.cli.common import cli_settings, err, user_errors

panel_app = typer.Typer(help="The Beauty Index judging web app.", no_args_is_help=True)


@panel_app.command("serve")
def panel_serve(
    study_id: Annotated[str, typer.Argument(metavar="STUDY")],
    host: Annotated[str, typer.Option(help="interface to listen on (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8765,
    url: Annotated[Optional[str], typer.Option(help="the public URL judges reach (default: the panel_url setting, else the URL given at study open); https makes the session cookies Secure")] = None,
) -> None:
    """Serve STUDY's panel until Ctrl-C (judges open the links `study open` printed)."""

    with user_errors():
        import logging
        import sys

        from tasks.beauty.panel import create_app
        from tasks.panel.app import make_server

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        panel_log = logging.getLogger("imagebench.panel")
        panel_log.addHandler(handler)
        panel_log.setLevel(logging.INFO)
        app = create_app(cli_settings(), study_id, public_url=url)
        err.print(f"panel of study {study_id} on http://{host}:{port}/ (Ctrl-C stops it)", highlight=False)
        make_server(app, host, port).run()
