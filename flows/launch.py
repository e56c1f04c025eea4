"""The `imagebench` entry point: heavy commands through the warm server (flows/warm.py), the
rest in this process.

Imports here are the standard library only: deciding costs a few milliseconds, and `sql` or
`leaderboard` go straight to flows.cli as before.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from flows import warm

START_TIMEOUT_S = 120.0  # the server's imports; a first command waits for them once


def _command(argv: list[str]) -> str | None:
    """The sub-command name: the first argument that is not an option (`--debug` comes first)."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg
    return None


def _connect(path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        return sock
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None


def _start_server(key: str, path, env: dict[str, str]) -> None:
    """Detached (own session, stdio to its log), so it outlives this command and no terminal
    signal reaches it; it exits when idle."""
    log_dir = warm.runtime_dir()
    with open(log_dir / f"warm-{key}.log", "ab") as logf:
        subprocess.Popen(  # noqa: S603 - our own module, our interpreter
            [sys.executable, "-m", "flows.warm_server", key],
            env=env, cwd=str(warm.code_root()), stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
            start_new_session=True, close_fds=True,
        )


def connect_or_start(env: dict[str, str]) -> socket.socket:
    key = warm.server_key(env)
    path = warm.socket_path(key)
    sock = _connect(path)
    if sock is not None:
        return sock
    if path.exists():  # a server that died: its socket is stale
        path.unlink(missing_ok=True)
    lock = warm.runtime_dir() / f"warm-{key}.starting"
    try:  # one starter per key: a second command waits for the first one's server
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        _start_server(key, path, env)
    except FileExistsError:
        if time.time() - os.stat(lock).st_mtime > START_TIMEOUT_S:  # a starter that died
            lock.unlink(missing_ok=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            sock = _connect(path)
            if sock is not None:
                return sock
            time.sleep(0.05)
    finally:
        lock.unlink(missing_ok=True)
    raise warm.WarmUnavailable(f"the warm server did not start within {START_TIMEOUT_S:.0f} s (log: {warm.runtime_dir()}/warm-{key}.log)")


def run_warm(argv: list[str]) -> int:
    """Run ``imagebench ARGV`` in a child of the warm server; its exit status."""
    env = dict(os.environ)
    sock = connect_or_start(env)
    with sock:
        warm.send_json(sock, {"op": "run", "argv": argv, "env": env, "cwd": os.getcwd()}, fds=[0, 1, 2])
        buf = bytearray()
        reply, _ = warm.recv_json(sock, buf)
        if reply is None or "pid" not in reply:
            raise warm.WarmUnavailable(f"the warm server refused the command: {reply}")
        child = int(reply["pid"])

        def forward(signum, _frame) -> None:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, forward)
        try:
            reply, _ = warm.recv_json(sock, buf)
        except (OSError, ValueError):  # dispatched: never run it a second time, cold
            reply = None
        if reply is None:  # the server died under the command
            print("error: the warm imagebench server stopped while running this command", file=sys.stderr)
            return 1
        return int(reply["exit"])


def main() -> None:
    argv = sys.argv[1:]
    if warm.mode() != "off" and _command(argv) in warm.WARM_COMMANDS and "--help" not in argv:
        try:
            sys.exit(run_warm(argv))
        except (warm.WarmUnavailable, OSError) as exc:
            print(f"imagebench: running cold ({exc})", file=sys.stderr)
    from flows.cli import main as cold_main

    cold_main()


if __name__ == "__main__":
    main()
