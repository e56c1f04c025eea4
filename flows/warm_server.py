"""The warm server (see flows/warm.py): ``python -m flows.warm_server KEY``.

Imports what the heavy commands import, builds the Great Expectations suites, then accepts
commands on its socket and runs each in a forked child. It never runs a torch op, a Prefect
client or a thread of its own before forking, so a child starts from a clean, single-threaded
copy (forking a process whose threads hold locks is what makes fork unsafe).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from flows import stopping, warm

log = logging.getLogger("imagebench.warm")


def preload() -> None:
    """What `score`, `nightly` and `reference build` would import and build on their own."""
    # Prefect reads its settings on import: a home of the server's own, never ~/.prefect. Each
    # command sets its workspace's and reads them again (flows/env.py), as a cold one does.
    os.environ["PREFECT_HOME"] = str(warm.runtime_dir() / "prefect-home")
    from flows.env import set_defaults

    set_defaults()  # what a cold command has set when Prefect sets its logging up: the same log levels
    import flows.cli  # noqa: F401  (typer app, rich, settings)
    import flows.pipeline  # noqa: F401  (Prefect, the flows)
    import prefect.server.api.server  # noqa: F401  (the embedded API each command starts)
    import tasks.hpsv3.scorer  # noqa: F401  (torch)
    import transformers.models.qwen2_vl.modeling_qwen2_vl  # noqa: F401  (what load_hpsv3 builds)
    from tasks.lake import validation

    for name in validation.SUITE_NAMES:  # GX context and every suite, built once
        validation._validation_definition(name)


def _reset_after_fork(env: dict[str, str], cwd: str, argv: list[str]) -> None:
    """Make the forked child look like a process the client started itself."""
    import random

    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = ["imagebench", *argv]
    # click names the program from __main__ (here `python -m flows.warm_server`) unless it looks
    # like a script: usage errors then say `imagebench score`, as the cold command does.
    sys.modules["__main__"].__package__ = None
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

    # Module-level consoles (flows.cli.common.err, ...) were made at import, when the server's stderr was
    # its log file: made again, they see this terminal (colours, width, COLUMNS) as a cold one would.
    for module in list(sys.modules.values()):
        if (getattr(module, "__name__", "") or "").split(".")[0] not in ("flows", "tasks"):
            continue
        for obj in list(vars(module).values()):
            if type(obj) is Console and obj._file is None:
                obj.__init__(stderr=obj.stderr)


def _fresh_runner() -> None:
    """The flows' task runner is chosen when flows.pipeline is imported (flows/runners.py), from
    the settings of the process that imports it: the server's. A command whose settings (its
    environment, IMAGEBENCH_CONFIG, its workspace's imagebench.yaml) choose another runner gets
    the flows imported again, in the child, as a cold command would import them."""
    from flows import runners

    try:
        now = runners.runner_settings().model_dump()
    except Exception:  # noqa: BLE001 - an invalid setting: let the import fail as it fails cold
        now = None
    if now != _PRELOADED.get("runner"):
        for name in ("flows.pipeline", "flows.deployments"):
            sys.modules.pop(name, None)
            if hasattr(sys.modules["flows"], name.split(".")[1]):
                delattr(sys.modules["flows"], name.split(".")[1])


_STATUS_FD: int | None = None  # in a child: where its exit status goes


def _tell_status(code: int) -> None:
    if _STATUS_FD is not None:
        try:
            os.write(_STATUS_FD, (json.dumps({"exit": code}) + "\n").encode())
        except OSError:
            pass


def _quiet_interrupt(_signum, _frame) -> None:
    """Ctrl-C before the command itself runs: nothing done yet, end as the launcher does."""
    _tell_status(130)
    os._exit(130)


def _watch_client(status_fd: int) -> None:
    """The client hung up (it died, even by kill -9): end this command as a signal would."""
    try:
        while os.read(status_fd, 4096):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10.0)
    os._exit(128 + signal.SIGTERM)


FORWARDED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}  # what a client passes on to its command


def _child(request: dict, fds: list[int], mask: set) -> None:
    """The forked command: fds are the client's stdin, stdout, stderr and its status channel,
    where the exit status is written (so the client learns it even if the server is gone)."""
    global _STATUS_FD
    _STATUS_FD = status_fd = fds[3]
    signal.signal(signal.SIGINT, _quiet_interrupt)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # what came since the fork is delivered now
    code = 1
    try:
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        _reset_after_fork(request["env"], request["cwd"], request["argv"])
        _fresh_runner()
        threading.Thread(target=_watch_client, args=(status_fd,), name="imagebench-client-watch", daemon=True).start()
        if stopping.applies_to(request["argv"]):  # told to stop, it ends within the grace period, as cold
            stopping.stop_within(stopping.grace_s(request["env"]), _tell_status)
        from flows.cli import main

        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on, as a cold command
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = warm.exit_status(exc.code)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except KeyboardInterrupt:
            code = 130
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - the client must hear about it; print as Python would
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the status is told whatever comes now
        _exit_hooks_of_the_command()
        warm.flush_stdio()
        _tell_status(code)
    os._exit(code)


def _exit_hooks_of_the_command() -> None:
    """What Python runs at exit that finishes a command's work elsewhere, run before the child's
    ``os._exit``: threading's exit hooks (Prefect drains its log and event workers there: skipped,
    a warm command's log records never reached its Prefect API) and logging's flush. The other exit
    handlers were registered before the fork, by the server, and are the server's."""
    import traceback

    shutdown = getattr(threading, "_shutdown", None)  # what Python calls first at exit (CPython)
    try:
        if shutdown is not None:
            shutdown()
        logging.shutdown()
    except Exception:  # noqa: BLE001 - Python prints an exit hook's error and goes on
        traceback.print_exc()


# Prefect home -> the socket its API serves on, bound by this server before anything names the
# port (flows/apisocket.py) and kept until this server exits: the port stays ours across restarts.
_API_SOCKETS: dict[str, socket.socket] = {}


def _prefect_api(apis: dict, home: object) -> str:
    """The embedded Prefect API for the Prefect home ``home``, started on first use as Prefect
    starts its ephemeral one (same uvicorn arguments), with this server's environment (its key
    fixes every PREFECT_* variable to the client's), that home and its secret (flows/apiauth.py),
    through flows/ephemeral.py so it exits when this server does. Nothing else comes from the request.
    Its port is bound here first and the socket handed to uvicorn (``--fd``): no other local user
    can take the port its command line shows and receive the secret of the requests that follow."""
    import prefect

    from flows import apiauth
    from flows.apisocket import bind_api_socket, uvicorn_on_socket

    if not isinstance(home, str) or not os.path.isabs(home):
        raise ValueError("home: an absolute path")
    st = os.stat(home)
    if not os.path.isdir(home) or st.st_uid != os.getuid():
        raise ValueError(f"home {home}: not a directory of this user")
    known = apis.get(home)
    if known is not None and known[0].poll() is None:
        return known[1]
    sock = _API_SOCKETS.get(home) or _API_SOCKETS.setdefault(home, bind_api_socket("127.0.0.1", 0))
    port = sock.getsockname()[1]
    env = {**os.environ, "PREFECT_HOME": home, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
           "PREFECT__SERVER_FINAL": "1", **apiauth.server_environment(Path(home))}
    env.pop("PREFECT_API_URL", None)
    command = [sys.executable, "-m", "flows.ephemeral", str(os.getpid()), "uvicorn", "--app-dir",
               str(prefect.__module_path__.parent), "--factory", "prefect.server.api.server:create_app", "--host",
               "127.0.0.1", "--port", str(port), "--log-level", "error", "--lifespan", "on"]
    proc = subprocess.Popen(  # noqa: S603
        uvicorn_on_socket(command, sock), env=env, cwd=str(warm.code_root()), stdin=subprocess.DEVNULL,
        pass_fds=(sock.fileno(),),
    )
    apis[home] = (proc, f"http://127.0.0.1:{port}/api")
    log.info("Prefect API for %s on port %d (pid %d)", home, port, proc.pid)
    return apis[home][1]


def _run_request_problem(request: dict, fds: list[int]) -> str | None:
    """Why a `run` request is refused; None when it is what a launcher sends for a warm command."""
    argv, env, cwd = request.get("argv"), request.get("env"), request.get("cwd")
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        return "argv: a list of strings"
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        return "env: strings"
    if not isinstance(cwd, str) or not os.path.isabs(cwd):
        return "cwd: an absolute path"
    if len(fds) != 4:
        return "stdin, stdout, stderr and a status channel must come with the request"
    command = warm.command_of(argv)
    if command not in warm.WARM_COMMANDS or "--help" in argv:
        return f"{command!r} is not a warm command"
    if warm.server_key(env) != _PRELOADED.get("key"):
        return "this environment belongs to another server"
    return None


class _Conn:
    """A connection being read: its bytes so far, the fds that came with them, its deadline."""

    REQUEST_TIMEOUT_S = 10.0

    def __init__(self, sock: socket.socket):
        self.sock, self.buf, self.fds = sock, bytearray(), []
        self.deadline = time.monotonic() + self.REQUEST_TIMEOUT_S

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        self.sock.close()


def _reply(sock: socket.socket, obj: dict) -> None:
    """A short reply; a client that is gone (or does not read) is its own problem, never ours."""
    try:
        sock.settimeout(1.0)
        warm.send_json(sock, obj)
    except OSError:
        pass


PRELOAD_NICE = 10
_PRELOADED: dict = {}  # what preload() saw: the key, the runner settings


def _lower_priority():
    """While the server imports, a command runs cold beside it (flows/launch.py): the server yields
    the CPU to it (nice 10: about a tenth of a contended core, all of an idle one), when it can
    return to normal afterwards (root, or RLIMIT_NICE allows it). The server has a session of its
    own, hence (with sched_autogroup) a CPU share of its own: that group's nice is lowered too, or
    the process's nice would only count within it. The function that returns both to normal, or None."""
    import resource

    autogroup = Path("/proc/self/autogroup")
    try:
        before = os.getpriority(os.PRIO_PROCESS, 0)
        if os.geteuid() != 0 and resource.getrlimit(resource.RLIMIT_NICE)[0] < 20 - before:
            return None
        os.setpriority(os.PRIO_PROCESS, 0, max(before, PRELOAD_NICE))
    except OSError:
        return None
    try:
        group_before = autogroup.read_text().split()[-1]
        autogroup.write_text(str(PRELOAD_NICE))
    except (OSError, IndexError):
        group_before = None

    def normal() -> None:
        os.setpriority(os.PRIO_PROCESS, 0, before)
        if group_before is not None:
            with contextlib.suppress(OSError):
                autogroup.write_text(group_before)

    return normal


def _subreaper_keeper() -> None:
    """Fork: the parent stays behind as a child subreaper that reaps the server and everything it
    leaves (a command whose server was killed finishes as the keeper's child, never a zombie),
    and exits when nothing is left. The child returns and becomes the server."""
    try:
        import ctypes

        PR_SET_CHILD_SUBREAPER = 36
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.fork() == 0:
        return
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue


def serve(key: str) -> int:
    path = warm.socket_path(key)
    normal = _lower_priority()
    preload()
    _PRELOADED["key"] = key
    try:
        from flows import runners

        _PRELOADED["runner"] = runners.runner_settings().model_dump()
    except Exception:  # noqa: BLE001
        _PRELOADED["runner"] = None
    if normal is not None:
        normal()
    cookie = warm.write_cookie(key)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    listener.bind(str(tmp))
    os.chmod(tmp, 0o600)
    listener.listen(64)
    listener.setblocking(False)
    os.replace(tmp, path)  # ready: clients connect from now on
    path_ino = os.stat(path).st_ino
    (warm.runtime_dir() / f"warm-{key}.starting").unlink(missing_ok=True)  # the launchers' lock (flows/launch.py)
    warm.CHILD_SOCKET, warm.CHILD_COOKIE = str(path), cookie  # children ask here for the Prefect API
    log.info("warm server %s ready on %s (pid %d)", key, path, os.getpid())
    children: dict[int, socket.socket] = {}  # command pid -> its client's connection
    reading: dict[int, _Conn] = {}  # fileno -> a connection whose request is not complete yet
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

    def drop(conn: _Conn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn.sock)
        reading.pop(conn.sock.fileno(), None)
        conn.close()

    def handle(conn: _Conn, request: dict) -> None:
        nonlocal stopping, last_busy
        fds, conn.fds = conn.fds, []
        sock = conn.sock
        sock.setblocking(True)
        op = request.get("op")
        if not warm.cookie_ok(request.get("cookie"), cookie):
            refusal = {"error": "not authenticated (no or wrong cookie)"}
        elif op == "ping":
            refusal = {"pid": os.getpid(), "key": key}
        elif op == "stop":
            refusal, stopping = {"stopping": os.getpid()}, True
        elif op == "prefect-api":
            try:
                refusal = {"url": _prefect_api(apis, request.get("home"))}
            except (OSError, ValueError) as exc:
                refusal = {"error": f"prefect-api: {exc}"}
        elif op == "run":
            problem = _run_request_problem(request, fds)
            refusal = {"error": f"refused: {problem}"} if problem else None
        else:
            refusal = {"error": f"unknown op {op!r}"}
        if refusal is not None:
            for fd in fds:
                os.close(fd)
            _reply(sock, refusal)
            sock.close()
            return
        # Signals forwarded by the client may come at once: held until the child has its handlers
        # (the server's would swallow them), then delivered.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        pid = os.fork()
        if pid == 0:
            sel.close()
            listener.close()
            sock.close()  # the client learns that the server died from this connection alone
            for other in [*children.values(), *(c.sock for c in reading.values())]:
                other.close()
            _child(request, fds, mask)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in fds:
            os.close(fd)
        _reply(sock, {"pid": pid})
        children[pid] = sock
        last_busy = time.monotonic()
        with contextlib.suppress(OSError):
            os.utime(path)  # last used: the least recently used server stops first (warm.make_room)

    try:
        while not stopping:
            try:  # socket removed (`warm stop` of a wedged server) or taken over: leave
                if os.stat(path).st_ino != path_ino:
                    break
            except FileNotFoundError:
                break
            for pid in list(children):  # reap; tell the client how its command ended (if it still listens)
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    sock = children.pop(pid)
                    code = os.waitstatus_to_exitcode(status)
                    _reply(sock, {"exit": code if code >= 0 else 128 - code})
                    sock.close()
            now = time.monotonic()
            for conn in [c for c in reading.values() if c.deadline < now]:  # silent clients: dropped
                drop(conn)
            if children:
                last_busy = now
            elif now - last_busy > idle_s:
                log.info("warm server %s idle for %.0f s: exiting", key, idle_s)
                break
            for event, _mask in sel.select(timeout=0.2):
                if event.fileobj is listener:
                    try:
                        sock, _ = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    sock.setblocking(False)
                    conn = _Conn(sock)
                    reading[sock.fileno()] = conn
                    sel.register(sock, selectors.EVENT_READ, conn)
                    continue
                conn = event.data
                try:
                    data, fds, _flags, _addr = socket.recv_fds(conn.sock, 65536, 4)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    drop(conn)
                    continue
                conn.fds.extend(fds)
                conn.buf.extend(data)
                if not data or len(conn.buf) > warm._MAX_HEADER or len(conn.fds) > 4:
                    drop(conn)
                    continue
                if b"\n" not in conn.buf:
                    continue
                sel.unregister(conn.sock)
                reading.pop(conn.sock.fileno(), None)
                try:
                    request = json.loads(bytes(conn.buf).partition(b"\n")[0])
                    if not isinstance(request, dict):
                        raise ValueError
                except ValueError:
                    conn.close()
                    continue
                handle(conn, request)
    finally:
        try:
            if os.stat(path).st_ino == path_ino:
                warm.remove_files(key)
        except OSError:
            pass
        listener.close()
        for conn in list(reading.values()):
            conn.close()
        for pid, sock in children.items():  # stopping with commands running: they finish on their own
            sock.close()
        for proc, _url in apis.values():  # they would also see us gone (flows/ephemeral.py)
            proc.terminate()
    return 0


AFTER_WAIT_S = 60.0  # a starter still tearing down after this long is not waited for any longer


def wait_for_exit(pid: int, timeout_s: float) -> bool:
    """Whether process `pid` ended within `timeout_s` (a pidfd where Linux has one: woken at the
    exit itself, reaped or not; else polled)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            return bool(select.select([fd], [], [], timeout_s)[0])
        finally:
            os.close(fd)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        time.sleep(0.02)
    return False


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--after"):
        raise SystemExit("usage: python -m flows.warm_server KEY [--after PID]")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    log.setLevel(logging.INFO)
    if len(argv) == 3:
        # Started by a command that ran cold (flows/launch.py): its user gets the prompt back before
        # this server takes any CPU, disk or memory beyond this interpreter's start.
        pid = int(argv[2])
        ended = wait_for_exit(pid, AFTER_WAIT_S)
        log.info("starting at %.6f: process %d %s", time.time(), pid,
                 "ended" if ended else f"still running after {AFTER_WAIT_S:.0f} s")
    _subreaper_keeper()
    code = serve(argv[0])
    logging.shutdown()
    os._exit(code)  # tearing down a process that imported torch, Prefect and GX takes seconds: skip it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
