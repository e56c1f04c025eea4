"""Where the Prefect API secret may go: only to a listener this workspace's own process bound.

Every Prefect API imagebench starts listens on loopback, which every local user can reach, and
every request of ours carries the workspace's secret (flows/apiauth.py). A port is public too:
a uvicorn command line shows ``--port N`` to ``ps``, and the server used to bind it seconds after
it was announced. Another user who binds it first and answers ``/api/health`` receives the next
request's ``Authorization`` header (issue 24 item 1). Two rules close that:

- **Bind before announcing.** The process that starts an API binds its port first
  (:func:`bind_api_socket`), then hands the socket to uvicorn (``--fd N``, the same descriptor
  through ``pass_fds``), and keeps its own copy open for as long as it uses the API: the port is
  never free between its choice and the server's start, nor after a server crash.
  Used by the cold command's ephemeral API (flows/ephemeral.py), the warm server's API
  (flows/warm_server.py) and ``make serve``'s server (flows/server.py).
- **Check a server we did not start in this process.** ``backfill`` reaches ``make serve``'s
  server through its ``api-url`` file. Before a request with the secret, it checks who listens
  there (:func:`listener_problem`): Linux's ``/proc/net/tcp{,6}`` gives the owner (uid) and inode
  of every listening socket, and ``/proc/<pid>/fd`` shows which process holds one. A listener of
  another user, or not held by the recorded ``serve`` process, is not ours.

No Prefect import here.
"""

from __future__ import annotations

import os
import pwd
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

BACKLOG = 2048  # uvicorn's default
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
_PROC_NET = Path("/proc/net")


class PortTaken(OSError):
    """The port cannot be bound: someone else holds it (who, when /proc says)."""


def bind_api_socket(host: str, port: int, listen: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port`` 0: one the kernel picks), to hand to uvicorn,
    which listens on it: pass it with ``pass_fds`` (the server's copy alone is made inheritable;
    no other program this process starts gets one). Raises :class:`PortTaken`.

    Without ``listen``: bound only, and without SO_REUSEADDR, so that no other socket of anyone may
    bind an overlapping address (Linux refuses it unless both sockets set SO_REUSEADDR), while a
    client that connects before the server is up is refused at once, as a client polling
    ``/health`` expects (Prefect's ephemeral start retries only a refused connection; a listening
    socket nobody accepts on would make it time out). With ``listen`` (a fixed port such as
    ``make serve``'s, where a connection of the last server may still be in TIME_WAIT):
    SO_REUSEADDR as uvicorn sets it, and listening at once, which makes the port ours alone (a
    second listener is refused whatever its options); connections then wait until the server
    accepts them. TCP_NODELAY either way, as asyncio sets it on the sockets it binds (an accepted
    socket inherits it from its listener)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if listen:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        holder = describe_holders(port)
        taken = PortTaken(f"port {host}:{port} is taken{f' ({holder})' if holder else ''}: {exc.strerror or exc}")
        taken.errno = exc.errno
        raise taken from None
    return sock


def uvicorn_on_socket(args: list[str], sock: socket.socket) -> list[str]:
    """A ``uvicorn`` command line made to serve on ``sock`` (``--fd N``), whatever ``--host`` and
    ``--port`` it names: uvicorn then binds nothing itself (those two stay, for ``ps`` readers)."""
    out = list(args)
    if "--fd" in out:
        i = out.index("--fd")
        del out[i:i + 2]
    return [*out, "--fd", str(sock.fileno())]


# ---- who listens on a port ------------------------------------------------------------------------


@dataclass(frozen=True)
class Listener:
    address: str  # the local address it is bound to, as text ("127.0.0.1", "0.0.0.0", "::")
    port: int
    uid: int
    inode: int


def _address(hex_text: str) -> str:
    """/proc/net/tcp{,6} addresses: 32-bit words in this machine's byte order, as hex."""
    words = [struct.pack("=I", int(hex_text[i:i + 8], 16)) for i in range(0, len(hex_text), 8)]
    raw = b"".join(words)
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def listeners(port: int) -> list[Listener] | None:
    """The listening TCP sockets on ``port`` (IPv4 and IPv6), this network namespace; None where
    /proc/net/tcp does not exist (not Linux): who listens cannot be told."""
    if not (_PROC_NET / "tcp").exists():
        return None
    found = []
    for name in ("tcp", "tcp6"):
        try:
            lines = (_PROC_NET / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port:
                found.append(Listener(_address(address), port, int(fields[7]), int(fields[9])))
    return found


def _reaches(listener: Listener, host: str) -> bool:
    """Whether a connection to ``host`` (an IPv4 loopback address) may land on ``listener``: bound
    to that address, or to a wildcard (an IPv6 wildcard takes IPv4 too unless IPV6_V6ONLY, which
    /proc does not show: counted)."""
    return listener.address in (host, "0.0.0.0", "::", f"::ffff:{host}")


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def describe_holders(port: int) -> str:
    """Who holds ``port`` when it is not this user: "user bob", "this user"; "" when unknown."""
    found = listeners(port) or []
    others = sorted({_user(x.uid) for x in found if x.uid != os.getuid()})
    if others:
        return f"held by {'another user' if len(others) == 1 else 'other users'}: {', '.join(others)}"
    return "held by a process of this user" if found else ""


def holds(pid: int, inode: int) -> bool:
    """Whether process ``pid`` has the socket ``inode`` open (only readable for our own processes)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    target = f"socket:[{inode}]"
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


def listener_problem(host: str, port: int, pid: int | None = None) -> str | None:
    """Why a request to ``host:port`` could reach a listener that is not ours; None when every
    listener it could reach belongs to this user (and, with ``pid``, is held by that process)."""
    found = listeners(port)
    if found is None:
        return f"who listens on {host}:{port} cannot be checked here (no /proc/net/tcp)"
    reachable = [x for x in found if _reaches(x, host)]
    if not reachable:
        return f"nothing listens on {host}:{port}"
    foreign = sorted({_user(x.uid) for x in reachable if x.uid != os.getuid()})
    if foreign:
        return f"{host}:{port} is held by another user ({', '.join(foreign)})"
    if pid is not None and not all(holds(pid, x.inode) for x in reachable):
        return f"{host}:{port} is not held by process {pid}"
    return None
