"""The warm server (see flows/warm.py): ``python -m flows.warm_server KEY``.

Imports what the heavy commands import, builds the Great Expectations suites, then accepts
commands on its socket and runs each in a forked child. It never runs a torch op, a Prefect
client or a thread of its own before forking, so a child starts from a clean, single-threaded
copy (forking a process whose threads hold locks is what makes fork unsafe).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

from flows import warm

log = logging.getLogger("imagebench.warm")


def preload() -> None:
    """What `score`, `nightly` and `reference build` would import and build on their own."""
    # Prefect reads its settings on import: a home of the server's own, never ~/.prefect. Each
    # command sets its workspace's and reads them again (flows/env.py), as a cold one does.
    os.environ["PREFECT_HOME"] = str(warm.runtime_dir() / "prefect-home")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    import flows.cli  # noqa: F401  (typer app, rich, settings)
    import flows.pipeline  # noqa: F401  (Prefect, the flows)
    import prefect.server.api.server  # noqa: F401  (the embedded API each command starts)
    import tasks.hpsv3.scorer  # noqa: F401  (torch)
    import transformers.models.qwen2_vl.modeling_qwen2_vl  # noqa: F401  (what load_hpsv3 builds)
    from tasks import validation

    for name in validation.SUITE_NAMES:  # GX context and every suite, built once
        validation._validation_definition(name)


def _reset_after_fork(env: dict[str, str], cwd: str, argv: list[str]) -> None:
    """Make the forked child look like a process the client started itself."""
    import random

    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = ["imagebench", *argv]
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        new = open(fd, "r" if fd == 0 else "w", encoding=getattr(old, "encoding", None) or "utf-8",  # noqa: SIM115
                   errors=getattr(old, "errors", None), buffering=1 if fd and os.isatty(fd) else -1, closefd=False)
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)
    random.seed()  # a cold process seeds from the OS; so does every child
    try:
        import numpy as np

        np.random.seed()
    except ImportError:
        pass
    from rich.console import Console

    # Module-level consoles (flows.cli.err, ...) were made at import, when the server's stderr was
    # its log file: made again, they see this terminal (colours, width, COLUMNS) as a cold one would.
    for module in list(sys.modules.values()):
        if (getattr(module, "__name__", "") or "").split(".")[0] not in ("flows", "tasks"):
            continue
        for obj in list(vars(module).values()):
            if type(obj) is Console and obj._file is None:
                obj.__init__(stderr=obj.stderr)


def _watch_client(conn: socket.socket) -> None:
    """The client hung up (it died, even by kill -9): end this command as a signal would."""
    try:
        while conn.recv(4096):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10.0)
    os._exit(128 + signal.SIGTERM)


def _child(listener: socket.socket, conn: socket.socket, request: dict, fds: list[int]) -> None:
    listener.close()
    code = 1
    try:
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _reset_after_fork(request["env"], request["cwd"], request["argv"])
        threading.Thread(target=_watch_client, args=(conn,), name="imagebench-client-watch", daemon=True).start()
        from flows.cli import main

        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except KeyboardInterrupt:
            code = 130
    except BaseException:  # noqa: BLE001 - the client must hear about it; print as Python would
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
    os._exit(code)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prefect_api(apis: dict, request: dict) -> str:
    """The embedded Prefect API for ``request["home"]``, started on first use exactly as Prefect
    starts its ephemeral one (same uvicorn arguments, the child's settings as environment),
    through flows/ephemeral.py so it exits when this server does."""
    home = request["home"]
    known = apis.get(home)
    if known is not None and known[0].poll() is None:
        return known[1]
    port = _free_port()
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "flows.ephemeral", str(os.getpid()), "uvicorn", "--app-dir", request["app_dir"],
         "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "error", "--lifespan", "on"],
        env=request["env"], cwd=str(warm.code_root()), stdin=subprocess.DEVNULL,
    )
    apis[home] = (proc, f"http://127.0.0.1:{port}/api")
    log.info("Prefect API for %s on port %d (pid %d)", home, port, proc.pid)
    return apis[home][1]


def serve(key: str) -> int:
    path = warm.socket_path(key)
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    listener.bind(str(tmp))
    os.chmod(tmp, 0o600)
    listener.listen(16)
    os.replace(tmp, path)  # ready: clients connect from now on
    path_ino = os.stat(path).st_ino
    warm.CHILD_SOCKET = str(path)  # children ask here for the Prefect API (flows/env.py)
    log.info("warm server %s ready on %s (pid %d)", key, path, os.getpid())
    children: dict[int, socket.socket] = {}
    apis: dict[str, tuple[subprocess.Popen, str]] = {}  # Prefect home -> its embedded API
    stopping = False

    def stop(_signum, _frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    idle_s = warm.idle_seconds()
    last_busy = time.monotonic()
    try:
        while not stopping:
            try:  # socket removed (`warm stop` of a wedged server) or taken over: leave
                if os.stat(path).st_ino != path_ino:
                    break
            except FileNotFoundError:
                break
            for pid in list(children):  # reap; the parent tells the client how its child ended
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    conn = children.pop(pid)
                    code = os.waitstatus_to_exitcode(status)
                    try:
                        warm.send_json(conn, {"exit": code if code >= 0 else 128 - code})
                    except OSError:
                        pass
                    conn.close()
            if children:
                last_busy = time.monotonic()
            elif time.monotonic() - last_busy > idle_s:
                log.info("warm server %s idle for %.0f s: exiting", key, idle_s)
                break
            if not sel.select(timeout=0.2):
                continue
            conn, _ = listener.accept()
            try:
                request, fds = warm.recv_json(conn, bytearray(), want_fds=3)
            except (OSError, ValueError):
                conn.close()
                continue
            if request is None or request.get("op") == "ping":
                if request is not None:
                    warm.send_json(conn, {"pid": os.getpid(), "key": key})
                conn.close()
                continue
            if request.get("op") == "prefect-api":
                warm.send_json(conn, {"url": _prefect_api(apis, request)})
                conn.close()
                continue
            if request.get("op") == "stop":
                warm.send_json(conn, {"stopping": os.getpid()})
                conn.close()
                break
            if request.get("op") != "run" or len(fds) != 3:
                for fd in fds:
                    os.close(fd)
                warm.send_json(conn, {"error": "bad request"})
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                sel.close()
                for other in children.values():
                    other.close()
                _child(listener, conn, request, fds)
            for fd in fds:
                os.close(fd)
            warm.send_json(conn, {"pid": pid})
            children[pid] = conn
            last_busy = time.monotonic()
    finally:
        try:
            if os.stat(path).st_ino == path_ino:
                path.unlink()
        except OSError:
            pass
        listener.close()
        for pid, conn in children.items():  # stopping with commands running: they finish on their own
            conn.close()
        for proc, _url in apis.values():  # they would also see us gone (flows/ephemeral.py)
            proc.terminate()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit("usage: python -m flows.warm_server KEY")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    log.setLevel(logging.INFO)
    code = serve(argv[0])
    logging.shutdown()
    os._exit(code)  # tearing down a process that imported torch, Prefect and GX takes seconds: skip it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
