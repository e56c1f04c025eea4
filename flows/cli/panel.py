"""`imagebench panel serve`: the judging web app of one open study (tasks/panel/app.py).

Loopback by default: put it behind your HTTPS reverse proxy to reach judges elsewhere (a tested
nginx set-up: docs/BEAUTY.md, "Limits and the reverse proxy"). uvicorn's access log is off; the
app's own request log redacts the link tokens. The server's body, header and connection limits
are tasks/panel/limits.py's, set up by ``make_server``.
"""

from __future__ import annotations

import signal
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
        server = make_server(app, host, port)
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)  # the lines below say it; its warnings still show
        err.print(f"panel of study {study_id} on http://{host}:{port}/ (Ctrl-C stops it)", highlight=False)
        stopped_by = _serve_until_told(server)
    if stopped_by is not None:
        err.print(f"panel of study {study_id} stopped ({signal.Signals(stopped_by).name}); every answer it "
                  "received is kept", highlight=False)
        raise typer.Exit(128 + stopped_by)


def _serve_until_told(server) -> int | None:
    """Run the uvicorn ``server`` until SIGINT or SIGTERM has shut it down gracefully; the signal.

    uvicorn, once shut down, raises the signal again for the default handler; the launcher's stop
    watch (flows/stopping.py) would count that as a second Ctrl-C and print "SIGINT again:
    stopping now". Here the signals go to uvicorn's own handler and are not raised again: the
    first is a graceful stop (requests in flight get tasks/panel/limits.py's grace), a second
    one ends the process at once (the stop watch)."""
    import threading
    from contextlib import contextmanager

    got: list[int] = []

    def on_signal(number: int, frame) -> None:
        got.append(number)
        server.handle_exit(number, frame)

    @contextmanager
    def capture_signals():
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    server.capture_signals = capture_signals  # instead of uvicorn's, which raises the signal again
    server.run()
    return got[0] if got else None
