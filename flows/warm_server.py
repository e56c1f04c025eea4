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
from tasks.store import private

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


def _note(message: str) -> None:
    """A line in the server's log from a process without logging set up (the keeper)."""
    with contextlib.suppress(OSError):
        os.write(2, f"{time.strftime('%Y-%m-%d %H:%M:%S')} imagebench.warm {message}\n".encode())


def _subreaper_keeper(key: str, starting_fd: int) -> None:
    """Fork: the parent stays behind as a child subreaper that reaps the server and everything it
    leaves (a command whose server was killed finishes as the keeper's child, never a zombie),
    and exits when nothing is left. The child returns and becomes the server. A server killed by
    a signal cannot say so: its keeper writes it in the log and removes the files it left."""
    try:
        import ctypes

        PR_SET_CHILD_SUBREAPER = 36
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    server = os.fork()
    if server == 0:
        return
    os.close(starting_fd)  # the server's to hold and release
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:  # seen before it is reaped: its pid is not reused while its files are removed
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue
        if info is None:
            continue
        if info.si_pid == server and info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
            _note(f"warm server {key} (pid {server}) killed by {signal.Signals(info.si_status).name}")
            _remove_dead(key, server)
        elif info.si_pid == server and info.si_status:
            _note(f"warm server {key} (pid {server}) exited with status {info.si_status}")
            _remove_dead(key, server)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)


def _remove_dead(key: str, pid: int) -> None:
    """The files of the dead server ``pid``: its own socket and cookie, and the public names when
    they are still its own and no live server holds the key."""
    own_sock, own_cookie = warm.own_socket_path(key, pid), warm.own_cookie_path(key, pid)
    with contextlib.suppress(OSError, warm.WarmUnavailable), warm.key_lock(key, 5.0):
        if warm.holder(key, "serving") is None:
            for public, own in ((warm.socket_path(key), own_sock), (warm.cookie_path(key), own_cookie)):
                if warm.same_file(public, own):
                    public.unlink()
    own_sock.unlink(missing_ok=True)
    own_cookie.unlink(missing_ok=True)


class _Server:
    """One warm server: its own socket and cookie, the key it serves while it holds
    ``warm-KEY.serving``, its commands, and why it stopped taking them (``reason``)."""

    def __init__(self, key: str) -> None:
        self.key, self.pid = key, os.getpid()
        self.sock_path, self.cookie_file = warm.own_socket_path(key, self.pid), warm.own_cookie_path(key, self.pid)
        self.serving: int | None = None  # the descriptor holding warm-KEY.serving
        self.reason: str | None = None  # set: draining (no new command; exits when its commands end)
        self.children: dict[int, socket.socket] = {}  # command pid -> its client's connection
        self.reading: dict[int, _Conn] = {}  # fileno -> a connection whose request is not complete yet
        self.apis: dict[str, tuple[subprocess.Popen, str]] = {}  # Prefect home -> its embedded API
        self.served = 0
        self.signalled: int | None = None
        self.room: subprocess.Popen | None = None
        self.cookie = warm.write_cookie(self.cookie_file)
        self.sock_path.unlink(missing_ok=True)  # a dead process's of the same pid
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.sock_path))
        os.chmod(self.sock_path, 0o600)
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ)

    def take_key(self) -> str | None:
        """Serve the key: under its mutex, take ``warm-KEY.serving`` and link the public names to
        this server's own. None when done; else why not (a live server has it: left alone)."""
        with warm.key_lock(self.key):
            fd = warm.take_lock(warm.lock_path(self.key, "serving"), 0)
            if fd is None:
                return f"warm server pid {warm.holder(self.key, 'serving')} already serves this key: its socket is left alone"
            warm.write_pid(fd, self.pid)
            self.serving = fd
            warm.link_over(self.cookie_file, warm.cookie_path(self.key))
            warm.link_over(self.sock_path, warm.socket_path(self.key))  # ready: clients connect from now on
        return None

    def give_up(self, why: str) -> None:
        """Take no new command: the public names removed (while still this server's) and the key
        released, so a new server of the key may start; this one exits when its commands end."""
        if self.reason is None:
            self.reason = why
            log.info("warm server %s (pid %d) takes no new command: %s (%d running)", self.key, self.pid, why,
                     len(self.children))
        if self.serving is None:
            return
        for public, own in ((warm.socket_path(self.key), self.sock_path), (warm.cookie_path(self.key), self.cookie_file)):
            if warm.same_file(public, own):  # nobody else changes them while this server holds .serving
                public.unlink(missing_ok=True)
        os.close(self.serving)
        self.serving = None

    def make_room(self) -> None:
        """Another key's server may have started beside this one: the cap is kept now too, by a
        process of its own (this one must keep serving; two servers pinging each other from their
        loops would wait on each other)."""
        self.room = subprocess.Popen(  # noqa: S603 - our own module, our interpreter
            [sys.executable, "-c", "import sys; from flows import warm; warm.make_room(sys.argv[1])", self.key],
            cwd=str(warm.code_root()), stdin=subprocess.DEVNULL,
        )

    def still_public(self) -> bool:
        return warm.same_file(warm.socket_path(self.key), self.sock_path)

    def drop(self, conn: _Conn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn.sock)
        self.reading.pop(conn.sock.fileno(), None)
        conn.close()

    def handle(self, conn: _Conn, request: dict) -> None:
        fds, conn.fds = conn.fds, []
        sock = conn.sock
        sock.setblocking(True)
        op = request.get("op")
        if not warm.cookie_ok(request.get("cookie"), self.cookie):
            refusal = {"error": "not authenticated (no or wrong cookie)"}
        elif op == "ping":
            refusal = {"pid": self.pid, "key": self.key, "commands": len(self.children), "draining": self.reason is not None}
        elif op == "stop":
            why = request.get("why")
            self.give_up(why if isinstance(why, str) and why else "asked to stop")
            refusal = {"stopping": self.pid, "commands": len(self.children)}
        elif op == "prefect-api":
            try:
                refusal = {"url": _prefect_api(self.apis, request.get("home"))}
            except (OSError, ValueError) as exc:
                refusal = {"error": f"prefect-api: {exc}"}
        elif op == "run":
            problem = f"draining ({self.reason})" if self.reason is not None else _run_request_problem(request, fds)
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
            self.sel.close()
            self.listener.close()
            if self.serving is not None:
                os.close(self.serving)  # the key is the server's: a command outliving it holds nothing
            sock.close()  # the client learns that the server died from this connection alone
            for other in [*self.children.values(), *(c.sock for c in self.reading.values())]:
                other.close()
            _child(request, fds, mask)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in fds:
            os.close(fd)
        _reply(sock, {"pid": pid})
        self.children[pid] = sock
        self.served += 1
        log.info("warm server %s (pid %d) runs %s as pid %d", self.key, self.pid, warm.command_of(request["argv"]), pid)
        with contextlib.suppress(OSError):
            os.utime(self.sock_path)  # last used: the least recently used server stops first (warm.make_room)

    def reap(self) -> None:
        """Tell each client whose command ended how it ended (if it still listens)."""
        for pid in list(self.children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                sock = self.children.pop(pid)
                code = os.waitstatus_to_exitcode(status)
                _reply(sock, {"exit": code if code >= 0 else 128 - code})
                sock.close()

    def read_ready(self, timeout: float) -> None:
        for event, _mask in self.sel.select(timeout=timeout):
            if event.fileobj is self.listener:
                try:
                    sock, _ = self.listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                sock.setblocking(False)
                conn = _Conn(sock)
                self.reading[sock.fileno()] = conn
                self.sel.register(sock, selectors.EVENT_READ, conn)
                continue
            conn = event.data
            try:
                data, fds, _flags, _addr = socket.recv_fds(conn.sock, 65536, 4)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                self.drop(conn)
                continue
            conn.fds.extend(fds)
            conn.buf.extend(data)
            if not data or len(conn.buf) > warm._MAX_HEADER or len(conn.fds) > 4:
                self.drop(conn)
                continue
            if b"\n" not in conn.buf:
                continue
            self.sel.unregister(conn.sock)
            self.reading.pop(conn.sock.fileno(), None)
            try:
                request = json.loads(bytes(conn.buf).partition(b"\n")[0])
                if not isinstance(request, dict):
                    raise ValueError
            except ValueError:
                conn.close()
                continue
            self.handle(conn, request)

    def loop(self) -> None:
        """Serve until drained: commands until told to stop (or idle), then its running commands
        to their end; its own socket stays open meanwhile (its commands ask it for their API)."""
        idle_s = warm.idle_seconds()
        last_busy = time.monotonic()
        while True:
            if self.signalled is not None:
                self.give_up(f"{signal.Signals(self.signalled).name} received")
                self.signalled = None
            if self.reason is None and not self.still_public():
                self.give_up(f"its socket {warm.socket_path(self.key)} was removed or is not its own any more")
            self.reap()
            if self.room is not None and self.room.poll() is not None:
                self.room = None
            now = time.monotonic()
            for conn in [c for c in self.reading.values() if c.deadline < now]:  # silent clients: dropped
                self.drop(conn)
            if self.children:
                last_busy = now
            elif self.reason is not None:
                return
            elif now - last_busy > idle_s:
                self.give_up(f"idle for {idle_s:.0f} s")
                continue
            self.read_ready(0.2)

    def close(self) -> None:
        """On the way out: the key released, its own files removed, its Prefect APIs stopped."""
        self.give_up(self.reason or "exiting")
        self.listener.close()
        for conn in list(self.reading.values()):
            conn.close()
        for sock in self.children.values():  # only after an error: their clients say the server stopped
            sock.close()
        self.sock_path.unlink(missing_ok=True)
        self.cookie_file.unlink(missing_ok=True)
        for proc, _url in self.apis.values():  # they would also see us gone (flows/ephemeral.py)
            proc.terminate()


def serve(key: str, starting_fd: int) -> int:
    """Import, then serve ``key`` unless a live server already does (this one then exits and
    leaves that server's socket alone). ``starting_fd`` holds ``warm-KEY.starting``: released
    once this server serves the key or has given up. Every way out is logged with its reason."""
    server: _Server | None = None
    try:
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
        server = _Server(key)

        def on_signal(signum, _frame) -> None:
            server.signalled = signum

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            refused = server.take_key()
        finally:
            os.close(starting_fd)
            starting_fd = -1
        if refused is not None:
            server.reason = refused
            return 0
        warm.CHILD_SOCKET, warm.CHILD_COOKIE = str(server.sock_path), server.cookie  # children ask here for the API
        log.info("warm server %s ready on %s (pid %d)", key, warm.socket_path(key), server.pid)
        server.make_room()
        server.loop()
        return 0
    except BaseException as exc:
        if server is not None:
            server.reason = f"error: {exc!r}"
        log.exception("warm server %s (pid %d) failed", key, os.getpid())
        return 1
    finally:
        if starting_fd >= 0:
            os.close(starting_fd)
        if server is not None:
            server.close()
        log.info("warm server %s (pid %d) exiting: %s; %d commands served", key, os.getpid(),
                 server.reason if server is not None else "an error before it could serve",
                 server.served if server is not None else 0)


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


USAGE = "usage: python -m flows.warm_server KEY [--after PID] [--starting-fd FD]"


def _arguments(argv: list[str]) -> tuple[str, int | None, int | None]:
    """KEY, the pid to wait for (--after) and the inherited descriptor holding warm-KEY.starting."""
    if not argv or argv[0].startswith("-") or len(argv) % 2 != 1:
        raise SystemExit(USAGE)
    options = dict(zip(argv[1::2], argv[2::2]))
    if set(options) - {"--after", "--starting-fd"} or not all(v.isdigit() for v in options.values()):
        raise SystemExit(USAGE)
    after, fd = options.get("--after"), options.get("--starting-fd")
    return argv[0], int(after) if after else None, int(fd) if fd else None


def _starting_lock(key: str, fd: int | None) -> tuple[int | None, str | None]:
    """The descriptor holding warm-KEY.starting: inherited from the launcher that started this
    server, else taken here (started by hand). (None, why) when another server serves the key or
    is starting."""
    with warm.key_lock(key):
        serving = warm.holder(key, "serving")
        if serving is not None:
            return None, f"warm server pid {serving} already serves this key"
        if fd is None:
            fd = warm.take_lock(warm.lock_path(key, "starting"), 0)
            if fd is None:
                return None, f"another server of this key is starting (pid {warm.holder(key, 'starting')})"
            warm.write_pid(fd, os.getpid())
    return fd, None


def main(argv: list[str]) -> int:
    private.enter_private()  # its commands and Prefect APIs inherit umask 077 (tasks/store/private.py)
    key, after, starting_fd = _arguments(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    log.setLevel(logging.INFO)
    if after is not None:
        # Started by a command that ran cold (flows/launch.py): its user gets the prompt back before
        # this server takes any CPU, disk or memory beyond this interpreter's start.
        ended = wait_for_exit(after, AFTER_WAIT_S)
        log.info("starting at %.6f: process %d %s", time.time(), after,
                 "ended" if ended else f"still running after {AFTER_WAIT_S:.0f} s")
    try:
        starting_fd, why_not = _starting_lock(key, starting_fd)
    except warm.WarmUnavailable as exc:
        starting_fd, why_not = None, str(exc)
    if starting_fd is None:
        log.info("warm server %s (pid %d) not starting: %s", key, os.getpid(), why_not)
        logging.shutdown()
        return 0
    _subreaper_keeper(key, starting_fd)
    log.info("warm server %s (pid %d) importing", key, os.getpid())
    code = serve(key, starting_fd)
    logging.shutdown()
    os._exit(code)  # tearing down a process that imported torch, Prefect and GX takes seconds: skip it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
