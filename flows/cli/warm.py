"""`imagebench warm status|stop`: the warm servers of this user (flows/warm.py)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from flows.cli.common import err, user_errors

warm_app = typer.Typer(help="The warm server that runs heavy commands without paying imports each time.",
                       no_args_is_help=True)


@warm_app.command("status")
def warm_status() -> None:
    """List this user's warm servers; the one this environment would use is marked."""
    from flows import warm

    with user_errors():
        mine = warm.server_key(dict(os.environ))
        found = warm.servers()
        if warm.mode() == "off":
            err.print("IMAGEBENCH_WARM=off: commands run cold", highlight=False)
        if not found:
            err.print("no warm server running", highlight=False)
        for s in found:
            state = f"pid {s['pid']}" if s["pid"] else "not answering (stale socket)"
            if s["pid"] and s["draining"]:
                state += f" draining ({s['commands']} running, then it exits)"
            elif s["pid"] and s["commands"] is not None:
                state += f" {s['commands']} running"
            mark = "  <- this environment" if s["key"] == mine and not s["draining"] else ""
            print(f"{s['key']}  {state}  {s['socket']}{mark}")


@warm_app.command("stop")
def warm_stop(
    all_servers: Annotated[bool, typer.Option("--all", help="every warm server of this user")] = False,
) -> None:
    """Stop the warm server of this environment (or all of them); running commands finish first:
    a busy server takes no new command and exits when they end."""
    from pathlib import Path

    from flows import warm

    with user_errors():
        mine = warm.server_key(dict(os.environ))
        targets = [s for s in warm.servers() if (all_servers or s["key"] == mine) and not s["draining"]]
        if not targets:
            err.print("no warm server to stop", highlight=False)
        for s in targets:
            reply = warm.stop(Path(s["socket"]))
            if reply is None:
                said = "stale socket removed"
            elif reply.get("commands"):
                said = f"stopping: it takes no new command and exits when its {reply['commands']} running end"
            else:
                said = "stopped"
            err.print(f"{s['key']}: {said}", highlight=False)
