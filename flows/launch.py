"""The `imagebench` entry point: heavy commands through the warm server (flows/warm.py), the
rest in this process.

Imports here are the standard library only: deciding costs a few milliseconds, and `sql` or
`leaderboard` go straight to flows.cli as before. A command never waits for a server to start:
when none is ready for its environment, it runs cold and starts one as it ends, which begins only
once this process has ended (started beside it, the server's imports took CPU from the command
on a 2-core machine: bench (f)).
"""

from __future__ import annotations

import os
import signal
import sys


def _interrupted_early(signum, _frame) -> None:
    """Ctrl-C before the command has done anything: exit as an interrupted command, no traceback."""
    os._exit(128 + signum)


signal.signal(signal.SIGINT, _interrupted_early)  # first thing: the imports below take time

import atexit  # noqa: E402
import selectors  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402

from flows import stopping, warm  # noqa: E402
from tasks.store import private  # noqa: E402  (standard library only)

# The exit status of a command run in this process; set, the process ends after the exit handlers
# without the interpreter's teardown (see _end_without_teardown).
_cold_status: int | None = None
SERVER_GONE_GRACE_S = 10.0  # the command's process gets this long to end on SIGTERM, then SIGKILL
START_LOCK_WAIT_S = 10.0  # the key's mutex is held for a few file operations; past this, no server is started


def _connect(path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        return sock
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None


def _start_server(key: str, env: dict[str, str]) -> int | None:
    """Start the server of ``key`` unless one serves it or is starting (looked at now, under the
    key's mutex: one may have become ready while this command ran). Detached (own session, stdio to
    its log), so it outlives this command and no terminal signal reaches it; it exits when idle. It
    waits for this process to end before it imports anything (flows/warm_server.py --after), so it
    never competes with this command's end, and it inherits the hold on ``warm-KEY.starting``
    (released once it serves or gives up). Its process id; None when none was started."""
    try:
        with warm.key_lock(key, START_LOCK_WAIT_S):
            if warm.holder(key, "serving") is not None:
                return None
            starting = warm.take_lock(warm.lock_path(key, "starting"), 0)
    except warm.WarmUnavailable:
        return None
    if starting is None:
        return None
    try:
        warm.make_room(key)
        warm.rotate_log(key)
        logf = os.open(warm.log_path(key), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(  # noqa: S603 - our own module, our interpreter
                [sys.executable, "-m", "flows.warm_server", key, "--after", str(os.getpid()), "--starting-fd", str(starting)],
                env=env, cwd=str(warm.code_root()), stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                start_new_session=True, close_fds=True, pass_fds=(starting,),
            )
        finally:
            os.close(logf)
        warm.write_pid(starting, proc.pid)
        return proc.pid
    finally:
        os.close(starting)


def connect(key: str) -> tuple[socket.socket, str] | None:
    """A connection to the server that serves ``key`` and its cookie; None when none answers (this
    command then runs cold and starts one as it ends). Files are never removed here: a server's are
    its own, and a dead one's go when the next takes the key (flows/warm.py)."""
    path = warm.socket_path(key)
    cookie = warm.read_cookie(key)
    sock = _connect(path) if cookie else None
    return (sock, cookie) if sock is not None else None


class _Client:
    """Signals before the server answered with the command's pid are kept, then forwarded."""

    def __init__(self) -> None:
        self.sent = False
        self.child: int | None = None
        self.pending: list[int] = []

    def on_signal(self, signum, _frame) -> None:
        if self.child is not None:
            try:
                os.kill(self.child, signum)
            except ProcessLookupError:
                pass
        elif not self.sent:
            os._exit(128 + signum)  # nothing sent: nothing to stop
        else:
            self.pending.append(signum)

    def got_pid(self, pid: int) -> None:
        self.child = pid
        for signum in self.pending:
            self.on_signal(signum, None)


def _exit_of(sock: socket.socket, buf: bytearray) -> int | None:
    """The exit status sent on ``sock`` (None at EOF or on a broken connection)."""
    try:
        reply, _ = warm.recv_json(sock, buf)
    except (OSError, ValueError):
        return None
    return int(reply["exit"]) if reply and "exit" in reply else None


def run_warm(sock: socket.socket, cookie: str, argv: list[str], key: str = "") -> int:
    """Run ``imagebench ARGV`` in a child of the warm server; its exit status. The child reports
    it on a channel of its own; the server's connection says whether the server still lives."""
    client = _Client()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, client.on_signal)
    mine, childs = socket.socketpair()
    with sock, mine:
        request = {"op": "run", "argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "cookie": cookie}
        client.sent = True
        try:
            warm.send_json(sock, request, fds=[0, 1, 2, childs.fileno()])
        finally:
            childs.close()
        buf = bytearray()
        reply, _ = warm.recv_json(sock, buf)
        if reply is None or "pid" not in reply:  # refused: nothing ran, so the command runs cold
            client.sent = False
            raise warm.WarmUnavailable(f"the warm server refused the command: {(reply or {}).get('error', reply)}")
        client.got_pid(int(reply["pid"]))
        sel = selectors.DefaultSelector()
        sel.register(mine, selectors.EVENT_READ)
        sel.register(sock, selectors.EVENT_READ)
        mine_buf = bytearray()
        while True:
            ready = {key.fileobj for key, _ in sel.select()}
            if mine in ready:  # the command's own word; EOF without it: killed, the server says how
                code = _exit_of(mine, mine_buf)
                if code is not None:
                    return code
                sel.unregister(mine)
                sock.settimeout(5.0)
                code = _exit_of(sock, buf)
                return code if code is not None else _server_gone(client.child, None, key)
            if sock in ready:
                code = _exit_of(sock, buf)
                if code is not None:
                    return code
                return _server_gone(client.child, mine, key)


def _server_gone(child: int, channel: socket.socket | None, key: str = "") -> int:
    """The server died under the command: its Prefect API went with it, so the command is
    stopped (it would only retry a dead API) and this is said in one line."""
    if channel is not None:
        channel.setblocking(False)
        try:  # it may have told its status a moment before
            code = _exit_of(channel, bytearray())
            if code is not None:
                return code
        except BlockingIOError:
            pass
        channel.setblocking(True)
        try:
            os.kill(child, signal.SIGTERM)
        except ProcessLookupError:
            pass
        channel.settimeout(SERVER_GONE_GRACE_S)
        try:
            while channel.recv(4096):
                pass
        except OSError:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
    try:
        why = f"; why it stopped: {warm.log_path(key)}" if key else ""
    except warm.WarmUnavailable:
        why = ""
    print(f"imagebench: error: the warm server stopped while running this command (process {child}, now "
          f"stopped); its run's record: `imagebench runs`, and $IMAGEBENCH_HOME/logs/imagebench.log{why}",
          file=sys.stderr)
    return 1


def _end_without_teardown() -> None:
    """The last exit handler (the first registered: they run in reverse order), so Python has
    already joined the threads and run every other handler (Prefect's API stopped, logs flushed).
    What remains is freeing every object of a process that imported torch, Prefect and Great
    Expectations: 3-4 s of a cold `score` here (bench (f)). Skip it, as the warm server's child does."""
    if _cold_status is None:
        return
    warm.flush_stdio()
    os._exit(_cold_status)


def main() -> None:
    global _cold_status
    private.enter_private()  # umask 077 before anything is created; the caller's kept for the warm child
    argv = sys.argv[1:]
    to_start = None  # the key of the server this command starts as it ends
    if warm.mode() != "off" and warm.command_of(argv) in warm.WARM_COMMANDS and "--help" not in argv:
        env = dict(os.environ)
        try:
            key = warm.server_key(env)
            to_start = key  # none answers, or it refused the command (nothing ran): cold, then start one
            found = connect(key)
            if found is not None:
                sys.exit(run_warm(*found, argv, key))
        except (warm.WarmUnavailable, OSError) as exc:
            print(f"imagebench: running cold ({exc})", file=sys.stderr)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, _interrupted_early)
    atexit.register(_end_without_teardown)  # before the command's own handlers: runs after them
    if stopping.applies_to(argv):  # told to stop, it ends within the grace period (flows/stopping.py)
        stopping.stop_within(stopping.grace_s())
    status = 1  # an exception that escapes: Python prints its traceback and exits 1
    try:
        from flows.cli import main as cold_main

        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on the command's own handling
        try:
            cold_main()
            status = 0
        except KeyboardInterrupt:  # before the command's own handling took over (Typer building the app)
            sys.exit(128 + signal.SIGINT)
    except SystemExit as exc:
        status = warm.exit_status(exc.code)
        raise
    finally:
        _cold_status = status
        if to_start is not None:  # the next command of this environment will be warm
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                _start_server(to_start, env)
            except (warm.WarmUnavailable, OSError):
                pass


if __name__ == "__main__":
    main()
