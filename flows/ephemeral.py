"""Prefect's ephemeral API server dies with the command that started it.

Prefect 3.9.1 starts the embedded ("ephemeral") API as a child process
(``SubprocessASGIServer._run_uvicorn_command`` in ``prefect/server/api/server.py``: ``python -m
uvicorn ... prefect.server.api.server:create_app``) and stops it from an ``atexit`` hook. A command
killed with SIGKILL runs no ``atexit`` hook: the server was reparented to PID 1 and kept listening.

The fix, chosen as the least invasive one that is reliable:

- The child is started through this module's ``main`` (``python -m flows.ephemeral <parent pid>
  uvicorn ...``), which watches ``os.getppid()`` from a daemon thread and, once the parent is gone,
  sends itself SIGTERM (uvicorn's graceful shutdown), then exits after a grace period. It then runs
  uvicorn exactly as Prefect asked (same arguments, same environment).
- Only the ``subprocess`` name inside ``prefect.server.api.server`` is replaced, by a shim whose
  ``Popen`` rewrites that one command; everything else passes through. If a Prefect upgrade starts
  the server differently, the command is left as it is (the guard is then off, which
  ``tests/flows/test_lifecycle.py`` would show).

Not ``PR_SET_PDEATHSIG``: it fires when the *thread* that forked the child ends, and Prefect may
start the server from a worker thread that ends long before the command does. Not a process group
either: a SIGKILL sent to the command's pid alone (``kill -9 PID``) does not reach its group.

The same ``Popen`` binds the server's port in this process before the command line that names it
exists, and hands the listening socket to uvicorn (``--fd``: flows/apisocket.py): another local
user who reads the port in ``ps`` can no longer bind it first and receive the secret of the
requests that follow. This process keeps its copy of the socket until it exits. A port taken in
the instant between Prefect's choice (a bind test) and ours gets the answer of a uvicorn that could
not bind it (exit status 3), on which Prefect picks another port.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import types

POLL_S = 0.5  # how often the server looks for its parent
GRACE_S = 10.0  # SIGTERM, then this long for uvicorn's shutdown, then exit regardless
_MARK = "_imagebench_guarded"
_LISTENING: list[socket.socket] = []  # the API ports this process bound: kept open until it exits
STARTUP_FAILURE = 3  # uvicorn's exit status when it cannot start; Prefect then picks another port


def guard_ephemeral_server() -> bool:
    """Make every ephemeral API server this process starts exit when this process dies.
    Idempotent. True when the guard is in place."""
    from prefect.server.api import server as prefect_server

    current = getattr(prefect_server, "subprocess", None)
    if getattr(current, _MARK, False):
        return True
    if not isinstance(current, types.ModuleType):
        return False
    prefect_server.subprocess = _SubprocessShim(current)
    return True


def guarded_command(args: list[str], parent_pid: int) -> list[str]:
    """``[python, -m, uvicorn, ...]`` -> ``[python, -m, flows.ephemeral, <parent pid>, uvicorn, ...]``;
    any other command unchanged."""
    if len(args) >= 3 and list(args[1:3]) == ["-m", "uvicorn"]:
        return [args[0], "-m", __name__ if __name__ != "__main__" else "flows.ephemeral", str(parent_pid), *args[2:]]
    return list(args)


class _SubprocessShim(types.ModuleType):
    """``subprocess`` as seen by prefect.server.api.server: the same, but ``Popen`` guards the
    uvicorn command."""

    def __init__(self, real: types.ModuleType):
        super().__init__("subprocess")
        self._real = real
        setattr(self, _MARK, True)

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def Popen(self, args, *rest, **kwargs):  # noqa: N802 (the name Prefect calls)
        command = guarded_command(list(args), os.getpid())
        if command == list(args) or "--port" not in command:
            return self._real.Popen(command, *rest, **kwargs)
        from flows.apisocket import PortTaken, bind_api_socket, uvicorn_on_socket

        host = command[command.index("--host") + 1] if "--host" in command else "127.0.0.1"
        port = int(command[command.index("--port") + 1])
        try:
            sock = bind_api_socket(host, port)
        except PortTaken as exc:
            print(f"imagebench: the embedded Prefect API could not take its port, another is used: {exc}",
                  file=sys.stderr, flush=True)
            return _NotStarted(command)
        _LISTENING.append(sock)
        kwargs["pass_fds"] = (*kwargs.get("pass_fds", ()), sock.fileno())
        return self._real.Popen(uvicorn_on_socket(command, sock), *rest, **kwargs)


class _NotStarted:
    """What Prefect sees of a server that could not bind its port: a process that exited with
    uvicorn's start-up failure status (SubprocessASGIServer.start then picks another port)."""

    pid = None
    stdin = stdout = stderr = None

    def __init__(self, args: list[str]):
        self.args, self.returncode = args, STARTUP_FAILURE

    def poll(self) -> int:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode

    def terminate(self) -> None:  # nothing runs
        pass

    kill = terminate

    def send_signal(self, _signum: int) -> None:
        pass


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os._exit(0)


def main(argv: list[str]) -> None:
    """Child side: ``<parent pid> <module> [args...]``: run ``python -m <module> args`` while
    watching the parent."""
    if len(argv) < 2 or not argv[0].isdigit():
        raise SystemExit("usage: python -m flows.ephemeral PARENT_PID MODULE [ARGS...]")
    parent_pid, module = int(argv[0]), argv[1]
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="imagebench-parent-watch", daemon=True).start()
    import runpy

    sys.argv = [module, *argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
