"""A warm process for the heavy commands: imports paid once, every command a fresh fork.

`imagebench score` spends most of its fixed cost before any image is touched: importing torch,
transformers, Prefect and Great Expectations, and building the GX suites. The warm server pays
that once, then serves each command by forking a child that runs it exactly as a cold process
would (the client's argv, environment, working directory, stdin/stdout/stderr passed over a Unix
socket), so a command's state never leaks into the next one. It also keeps one embedded Prefect
API per workspace (Prefect home), which its commands use instead of starting one each.

- **Started by a first command** through the launcher (`flows/launch.py`) for the commands in
  ``WARM_COMMANDS``: with no server ready, the command runs cold at once and starts the server
  as it ends; the server waits for that command's process to end before it imports anything
  (then at lower CPU priority): the first command does nothing beyond a cold one but compute the
  key and start that process (bench (f)). One server per key: the contents of the
  source files and GX suites it imported and built (an edit and its revert give the same key),
  the Python executable and code path, and only the variables read at import (``KEY_PREFIXES``,
  ``KEY_VARS``): the other ``IMAGEBENCH_*`` settings, the workspace's ``imagebench.yaml`` and
  the reference files are read by each command in its child, as a cold command reads them.
- **At most ``IMAGEBENCH_WARM_MAX_SERVERS``** (default 2) per user: starting another asks the
  least recently used to stop, idle ones first. **Stopped when idle** (``IMAGEBENCH_WARM_IDLE_S``,
  default 900 s) and by ``imagebench warm stop``. **A busy server is never stopped**: asked to stop
  (or sent SIGTERM) it *drains*: it gives its key up at once (a new server of that key may start)
  and takes no new command, and exits when its running commands have ended.
- **One live server per key, and only it touches its files** (the protocol, all in the private
  directory, with ``flock`` locks the kernel drops when their holder dies, so none is ever stale):
  ``warm-KEY.lock`` is the key's mutex, held for a few file operations; ``warm-KEY.starting`` is
  held by the process starting a server (the launcher, then the server it spawned) until that
  server serves or exits, so one start runs per key; ``warm-KEY.serving`` is held by the live
  server for as long as it takes commands (its pid inside). A server binds its own socket and
  writes its own cookie under names of its own (``.warm-KEY.sock.PID``, ``.warm-KEY.cookie.PID``)
  and, under the key's mutex and only if it can take ``.serving``, links them to the public
  names ``warm-KEY.sock`` / ``warm-KEY.cookie``: a server that becomes ready while another serves
  leaves and never takes over a live server's socket. The public names are removed by the server
  that holds ``.serving`` (when it gives the key up), or, once no live server holds it, by
  whoever holds the key's mutex (a server killed with -9 leaves them: its keeper removes them).
- **Its log survives it**: ``warm-KEY.log`` (rotated to ``.log.1`` past 1 MiB when a server
  starts) says why each server stopped taking commands and why it exited; a server killed by a
  signal is logged by its keeper. Files of a key unused for a week are removed.
- **Only this user's warm commands**: the socket is in a private directory and every request
  carries the server's cookie (a random secret in a 0600 file there, as Bazel's server cookie); a
  `run` names a warm command and the environment of this server's key; the Prefect API operation
  takes a home directory, nothing else. The Prefect APIs require their home's secret (flows/apiauth.py).
- **Each connection on its own**: one thread reads every connection without blocking (a silent
  one is dropped after 10 s), replies never wait on a client, and a client that is gone costs nothing.
- **Never orphaned, never orphaning**: a child reports its exit status to its client over a
  channel of its own, and watches it: when the client dies (even ``kill -9``) the child gets
  SIGTERM. A server that dies (even ``kill -9``) closes its connection: the client says so in
  one line and stops the command (its Prefect API died with the server). A keeper process above
  the server is a child subreaper: whatever the server leaves is reaped, never a zombie.
- Signals the client receives (Ctrl-C, SIGTERM, SIGHUP) are forwarded to the child; the
  client exits with the child's exit status (128 + signal when it was killed). A Ctrl-C before
  the command has started anything exits 130 at once.

The socket lives in a private directory (``$TMPDIR/imagebench-<uid>``, mode 0700, ours), never in
the workspace: Unix socket paths are limited to 108 bytes.

``IMAGEBENCH_WARM=off`` runs every command cold, as before (tests do, except the warm ones).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import socket
import stat
import sys
import tempfile
import time
from pathlib import Path

WARM_COMMANDS = frozenset(
    {"score", "backfill", "nightly", "ingest", "hpsv3", "reference", "import-scores", "import-verdicts"}
)
# Variables read when modules are imported (Prefect's settings, HF/torch threading and caches):
# a server only serves clients whose values of these equal its own. Other IMAGEBENCH_* settings
# are read by each command when it runs, in the child, as a cold command reads them.
KEY_PREFIXES = ("PREFECT_", "HF_", "TRANSFORMERS_", "TORCH", "OMP_", "MKL_", "CUDA_", "GX_",
                "TOKENIZERS_", "PYTHON", "LD_", "VIRTUAL_ENV")
KEY_VARS = frozenset({"IMAGEBENCH_TESSERACT"})  # read at import (tasks/judges/ocr.py)
# What the server imported or built at start: the sources, and the GX suites it built from JSON.
CODE_GLOBS = (("flows", "*.py"), ("tasks", "*.py"), ("schemas", "*.py"), ("expectations", "*.json"))
DEFAULT_IDLE_S = 900.0
DEFAULT_MAX_SERVERS = 2
PROTOCOL = 3
_MAX_HEADER = 1 << 20
_MAX_DIR_CHARS = 107 - len("/.warm-0123456789abcdef.sock.4194304")
KEY_LOCK_WAIT_S = 30.0  # the key's mutex is held for a few file operations: a longer wait means a wedged holder
LOG_ROTATE_BYTES = 1 << 20  # a server's log past this is kept as .log.1 when the next server of its key starts
PRUNE_AFTER_S = 7 * 86400.0  # a key none of whose files changed for this long: its files are removed


class WarmUnavailable(RuntimeError):
    """No warm server could be reached or started; the command runs cold."""


def mode() -> str:
    """``IMAGEBENCH_WARM``: ``auto`` (default: use or start a server) or ``off``."""
    value = os.environ.get("IMAGEBENCH_WARM", "auto").strip().lower()
    return "off" if value in ("0", "off", "false", "no") else "auto"


def _number(var: str, default: float, least: float) -> float:
    raw = os.environ.get(var, "")
    try:
        return max(least, float(raw)) if raw else default
    except ValueError:
        return default


def idle_seconds() -> float:
    return _number("IMAGEBENCH_WARM_IDLE_S", DEFAULT_IDLE_S, 1.0)


def max_servers() -> int:
    """``IMAGEBENCH_WARM_MAX_SERVERS`` (default 2): more of this user's servers stop, least recently used first."""
    return int(_number("IMAGEBENCH_WARM_MAX_SERVERS", DEFAULT_MAX_SERVERS, 1))


def keeps_prefect_api() -> bool:
    """``IMAGEBENCH_WARM_KEEP_API`` (default on): a warm command uses the Prefect API its server
    keeps per workspace; off: it starts its own, as a cold command does."""
    return os.environ.get("IMAGEBENCH_WARM_KEEP_API", "on").strip().lower() not in ("0", "off", "false", "no")


def command_of(argv: list[str]) -> str | None:
    """The sub-command name: the first argument that is not an option (`--debug` comes first)."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg
    return None


def exit_status(code: object) -> int:
    """The exit status Python gives ``sys.exit(code)``: None is 0, a non-integer is 1 (Python prints it)."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def flush_stdio() -> None:
    """Flush stdout and stderr before ``os._exit`` (which does not); a closed or broken stream is let be."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - the process is ending: nothing more to do for that stream
            pass


def code_root() -> Path:
    return Path(__file__).resolve().parent.parent


def code_digest() -> str:
    """sha256 over the contents of what the server imports and builds at start (~10 ms): an edit
    and its revert give back the same digest, a touched file without a change changes nothing."""
    h = hashlib.sha256()
    root = code_root()
    for d, pattern in CODE_GLOBS:
        for p in sorted((root / d).rglob(pattern)):
            try:
                data = p.read_bytes()
            except OSError:
                continue
            h.update(f"{p.relative_to(root)}\0{len(data)}\0".encode())
            h.update(data)
    return h.hexdigest()


def server_key(env: dict[str, str]) -> str:
    """16 hex chars naming the server a client with this environment may use."""
    h = hashlib.sha256()
    h.update(f"{PROTOCOL}\0{sys.executable}\0{code_root()}\0{code_digest()}\0".encode())
    for k in sorted(env):
        if k.startswith(KEY_PREFIXES) or k in KEY_VARS:
            h.update(f"{k}={env[k]}\0".encode())
    return h.hexdigest()[:16]


def runtime_dir() -> Path:
    """``$TMPDIR/imagebench-<uid>``: created 0700; refused when not a private directory of ours."""
    d = Path(tempfile.gettempdir()) / f"imagebench-{os.getuid()}"
    if len(str(d)) > _MAX_DIR_CHARS:  # a socket path has at most 107 bytes: a long $TMPDIR cannot hold it
        d = Path("/tmp") / f"imagebench-{os.getuid()}"
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(d)
    except OSError as exc:
        raise WarmUnavailable(f"cannot create {d}: {exc}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise WarmUnavailable(f"{d} is not a private directory of this user")
    return d


def socket_path(key: str) -> Path:
    """The public socket of the server that serves ``key`` (a link to that server's own socket)."""
    return runtime_dir() / f"warm-{key}.sock"


def cookie_path(key: str) -> Path:
    """The serving server's secret (as Bazel's server cookie): every request carries it."""
    return runtime_dir() / f"warm-{key}.cookie"


def own_socket_path(key: str, pid: int) -> Path:
    """Where the server ``pid`` binds its socket; its children and a draining server's callers use it."""
    return runtime_dir() / f".warm-{key}.sock.{pid}"


def own_cookie_path(key: str, pid: int) -> Path:
    return runtime_dir() / f".warm-{key}.cookie.{pid}"


def log_path(key: str) -> Path:
    return runtime_dir() / f"warm-{key}.log"


def lock_path(key: str, what: str) -> Path:
    """``lock`` (the key's mutex), ``starting`` (a start under way), ``serving`` (the live server)."""
    return runtime_dir() / f"warm-{key}.{what}"


def key_of(path: Path) -> str:
    return path.name.lstrip(".").removeprefix("warm-").split(".")[0]


def _pid_of_own(path: Path) -> int | None:
    """The pid in a server's own file name (``.warm-KEY.sock.PID``); None for a public name."""
    tail = path.name.rsplit(".", 1)[-1]
    return int(tail) if path.name.startswith(".") and tail.isdigit() else None


def write_cookie(path: Path) -> str:
    """A new random cookie in ``path`` (0600, written whole before it appears)."""
    value = secrets.token_hex(32)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    os.replace(tmp, path)
    return value


def read_cookie(key: str) -> str | None:
    return _read_cookie(cookie_path(key))


def _read_cookie(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def cookie_ok(given: object, cookie: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), cookie.encode())


def link_over(target: Path, name: Path) -> None:
    """Make ``name`` another name of ``target`` in one step (a stale ``name`` replaced)."""
    tmp = name.with_name(f".link-{name.name}.{os.getpid()}")  # matches no server's file name
    tmp.unlink(missing_ok=True)
    os.link(target, tmp)
    os.replace(tmp, name)


def same_file(a: Path, b: Path) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_ino, sa.st_dev) == (sb.st_ino, sb.st_dev)


# ---------------------------------------------------------------------------------------------
# Locks: flock on files of the private directory; the kernel drops a lock when its holder dies.
# ---------------------------------------------------------------------------------------------


def take_lock(path: Path, wait_s: float) -> int | None:
    """A descriptor holding an exclusive flock on ``path`` (created 0600), or None when another
    process held it for ``wait_s`` seconds (0: no wait). A lock file is removed only by `prune`,
    while holding it: the descriptor must still be the file at ``path`` once locked."""
    deadline = time.monotonic() + wait_s
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)
            continue
        except OSError:
            os.close(fd)
            raise
        st, here = os.fstat(fd), None
        with contextlib.suppress(FileNotFoundError):
            here = os.stat(path, follow_symlinks=False)
        if here is not None and (here.st_ino, here.st_dev) == (st.st_ino, st.st_dev):
            return fd
        os.close(fd)  # removed by prune while we waited: lock the file there now


@contextlib.contextmanager
def key_lock(key: str, wait_s: float = KEY_LOCK_WAIT_S):
    """The key's mutex: every take or probe of its ``starting`` and ``serving`` locks, every change
    of its public names happens under it."""
    fd = take_lock(lock_path(key, "lock"), wait_s)
    if fd is None:
        raise WarmUnavailable(f"the lock {lock_path(key, 'lock')} was held for {wait_s:.0f} s")
    try:
        yield
    finally:
        os.close(fd)


def holder(key: str, what: str) -> int | None:
    """Under the key's mutex: the pid written in the lock ``what`` (``starting``, ``serving``)
    while a live process holds it (0 before it wrote one); None when nobody holds it."""
    path = lock_path(key, what)
    fd = take_lock(path, 0)
    if fd is not None:
        os.close(fd)
        return None
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def write_pid(fd: int, pid: int) -> None:
    """Name the holder of a lock (read by `holder`)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(pid).encode(), 0)


def remove_stale(key: str) -> bool:
    """The public socket and cookie of ``key`` when no live server holds the key (a server killed
    with -9 left them). True when removed."""
    try:
        with key_lock(key, 5.0):
            if holder(key, "serving") is not None:
                return False
            for path in (socket_path(key), cookie_path(key)):
                path.unlink(missing_ok=True)
            return True
    except WarmUnavailable:
        return False


def rotate_log(key: str) -> None:
    """Called by a server's starter: a log past LOG_ROTATE_BYTES becomes ``.log.1`` (a server
    still draining writes on there), so a key's logs stay under twice that."""
    path = log_path(key)
    with contextlib.suppress(OSError):
        if path.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))


def prune(now: float | None = None) -> list[str]:
    """Remove the files of keys none of whose files changed for PRUNE_AFTER_S (an edited tree
    leaves a key behind at each edit): their locks, logs and stale sockets, never those of a key a
    live process holds. The keys removed."""
    rt, now = runtime_dir(), time.time() if now is None else now
    by_key: dict[str, list[Path]] = {}
    for path in rt.iterdir():
        if path.name.lstrip(".").startswith("warm-"):
            by_key.setdefault(key_of(path), []).append(path)
    pruned = []
    for key, paths in by_key.items():
        try:
            if max(os.lstat(p).st_mtime for p in paths) > now - PRUNE_AFTER_S:
                continue
        except OSError:
            continue
        fd = take_lock(lock_path(key, "lock"), 0)
        if fd is None:
            continue
        try:
            if holder(key, "serving") is not None or holder(key, "starting") is not None:
                continue
            if any(_alive(pid) for p in paths if (pid := _pid_of_own(p))):
                continue  # a draining server's own files
            for path in [*rt.glob(f"warm-{key}.*"), *rt.glob(f".warm-{key}.*")]:
                if path != lock_path(key, "lock"):
                    path.unlink(missing_ok=True)
            lock_path(key, "lock").unlink(missing_ok=True)  # last, while held: a waiter locks afresh
            pruned.append(key)
        finally:
            os.close(fd)
    return pruned


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


# ---------------------------------------------------------------------------------------------
# Wire format: one JSON line each way per message; the client's fds travel with the request.
# ---------------------------------------------------------------------------------------------


def send_json(sock: socket.socket, obj: dict, fds: list[int] | None = None) -> None:
    data = (json.dumps(obj) + "\n").encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


def recv_json(sock: socket.socket, buf: bytearray, want_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message (None at EOF) and the fds that came with its first bytes."""
    fds: list[int] = []
    while b"\n" not in buf:
        if want_fds and not fds:
            data, got, _flags, _addr = socket.recv_fds(sock, 65536, want_fds)
            fds.extend(got)
        else:
            data = sock.recv(65536)
        if not data:
            for fd in fds:
                os.close(fd)
            return None, []
        buf.extend(data)
        if len(buf) > _MAX_HEADER:
            raise ValueError("warm: message too long")
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return json.loads(line), fds


# ---------------------------------------------------------------------------------------------
# `imagebench warm status|stop`
# ---------------------------------------------------------------------------------------------


def request(path: Path, obj: dict, timeout: float = 30.0, cookie: str | None = None) -> dict | None:
    """One request to the server on ``path`` (its cookie added) and its reply; None at EOF."""
    pid = _pid_of_own(path)
    cookie = cookie or _read_cookie(own_cookie_path(key_of(path), pid) if pid else cookie_path(key_of(path)))
    if cookie is None:
        raise ConnectionRefusedError(f"no cookie for {path}: no server")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        send_json(sock, {**obj, "cookie": cookie})
        reply, _ = recv_json(sock, bytearray())
        return reply
    finally:
        sock.close()


def _ask(path: Path, op: str, timeout: float = 5.0, **fields: str) -> dict | None:
    """The server's reply to ``op``; None when no server answers there."""
    try:
        return request(path, {"op": op, **fields}, timeout)
    except (OSError, ValueError):
        return None


def servers() -> list[dict]:
    """Every warm server of this user: key, socket, pid (None: a stale socket of a dead server),
    commands (running now; None: not said), draining (it takes no new command and exits when they end: then
    ``socket`` is its own), last_used (the socket's mtime: the server touches it at each command)."""
    out, public = [], []
    rt = runtime_dir()
    for path in sorted(rt.glob("warm-*.sock")):
        reply = _ask(path, "ping") or {}
        try:
            used = path.stat().st_mtime
        except OSError:
            continue
        public.append(path)
        out.append({"key": key_of(path), "socket": str(path), "pid": reply.get("pid"),
                    "commands": reply.get("commands"), "draining": bool(reply.get("draining")), "last_used": used})
    for path in sorted(rt.glob(".warm-*.sock.*")):  # servers that gave their key up and still run commands
        if any(same_file(path, p) for p in public) or not (reply := _ask(path, "ping")) or not reply.get("draining"):
            continue
        out.append({"key": key_of(path), "socket": str(path), "pid": reply.get("pid"), "commands": reply.get("commands", 0),
                    "draining": True, "last_used": path.stat().st_mtime})
    return out


def stop(path: Path, why: str = "imagebench warm stop") -> dict | None:
    """Ask the server on ``path`` to stop: idle, it exits; busy, it drains (it gives its key up at
    once and exits when its commands end). Its reply (``commands``: how many still run); None when
    no server answered (a stale socket's files are then removed)."""
    reply = _ask(path, "stop", why=why)
    if reply is None:
        if _pid_of_own(path) is None:
            remove_stale(key_of(path))
        return None
    deadline = time.monotonic() + 10.0
    own = own_socket_path(key_of(path), reply.get("stopping", 0))
    while same_file(path, own) and _pid_of_own(path) is None and time.monotonic() < deadline:
        time.sleep(0.05)  # it removes its public names at its next turn
    return reply


def make_room(new_key: str) -> list[str]:
    """Before starting the server ``new_key``: ask this user's other live servers to stop so that
    at most ``max_servers()`` take commands with it: idle ones first, least recently used first; a
    busy one drains (its running commands end normally). Stale sockets are removed, and keys
    unused for a week pruned. The keys asked to stop."""
    everyone = servers()
    for s in everyone:
        if s["pid"] is None:
            remove_stale(s["key"])
    with contextlib.suppress(OSError):
        prune()
    # A server that does not say how many commands it runs speaks an older protocol (its key is
    # not this code's): it is left to stop when idle, never asked here.
    others = sorted((s for s in everyone if s["key"] != new_key and s["pid"] and not s["draining"]
                     and s["commands"] is not None), key=lambda s: (s["commands"] > 0, s["last_used"]))
    stopped = []
    while len(others) >= max_servers():
        victim = others.pop(0)
        stop(Path(victim["socket"]), f"making room for warm server {new_key} (IMAGEBENCH_WARM_MAX_SERVERS={max_servers()})")
        stopped.append(victim["key"])
    return stopped


# ---------------------------------------------------------------------------------------------
# The embedded Prefect API, kept by the warm server per Prefect home
# ---------------------------------------------------------------------------------------------

API_MARK = "IMAGEBENCH_WARM_PREFECT_API"  # the URL of the warm server's API: embedded mode, not a server
CHILD_SOCKET: str | None = None  # set in a warm server's child: where to ask for the API
CHILD_COOKIE: str | None = None


def embedded_api_url() -> str | None:
    """The URL of the warm server's Prefect API when this command uses it (then it counts as the
    embedded API: no `gpu` tag limit, backfills run in this process)."""
    return os.environ.get(API_MARK) or None


def use_warm_prefect_api() -> bool:
    """In a warm server's child, once PREFECT_HOME is set: use the embedded API the warm server
    keeps for that home (started on first use, as Prefect starts its ephemeral one, requiring the
    home's secret: flows/apiauth.py) instead of starting one per command. False: not a warm
    child, a Prefect API is configured, or IMAGEBENCH_WARM_KEEP_API=off."""
    if CHILD_SOCKET is None or os.environ.get("PREFECT_API_URL") or not keeps_prefect_api():
        return False
    reply = request(Path(CHILD_SOCKET), {"op": "prefect-api", "home": os.environ["PREFECT_HOME"]}, cookie=CHILD_COOKIE)
    if not reply or "url" not in reply:
        raise WarmUnavailable(f"the warm server gave no Prefect API: {(reply or {}).get('error', reply)}")
    url = reply["url"]
    _wait_healthy(url, float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")))
    os.environ["PREFECT_API_URL"] = url
    os.environ[API_MARK] = url
    return True


def _wait_healthy(url: str, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise WarmUnavailable(f"the warm Prefect API {url} did not answer within {timeout_s:.0f} s")
        time.sleep(0.1)
