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
- **At most ``IMAGEBENCH_WARM_MAX_SERVERS``** (default 2) per user: starting another stops the
  least recently used. **Stopped when idle** (``IMAGEBENCH_WARM_IDLE_S``, default 900 s) and by
  ``imagebench warm stop``; it removes its socket, cookie and log on the way out.
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
PROTOCOL = 2
_MAX_HEADER = 1 << 20
_MAX_DIR_CHARS = 107 - len("/.warm-0123456789abcdef.sock.4194304")


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
    return runtime_dir() / f"warm-{key}.sock"


def cookie_path(key: str) -> Path:
    """The server's secret (as Bazel's server cookie): every request carries it."""
    return runtime_dir() / f"warm-{key}.cookie"


def log_path(key: str) -> Path:
    return runtime_dir() / f"warm-{key}.log"


def key_of(path: Path) -> str:
    return path.name.removeprefix("warm-").split(".")[0]


def write_cookie(key: str) -> str:
    """A new random cookie for the server ``key`` (0600, replaced atomically)."""
    value = secrets.token_hex(32)
    path = cookie_path(key)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    os.replace(tmp, path)
    return value


def read_cookie(key: str) -> str | None:
    try:
        return cookie_path(key).read_text().strip() or None
    except OSError:
        return None


def cookie_ok(given: object, cookie: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), cookie.encode())


def remove_files(key: str) -> None:
    """A stopped server's socket, cookie and log."""
    for path in (socket_path(key), cookie_path(key), log_path(key)):
        path.unlink(missing_ok=True)


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
    cookie = cookie or read_cookie(key_of(path))
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


def _ask(path: Path, op: str, timeout: float = 5.0) -> dict | None:
    """The server's reply to ``op``; None when no server answers there."""
    try:
        return request(path, {"op": op}, timeout)
    except (OSError, ValueError):
        return None


def servers() -> list[dict]:
    """Every warm server of this user: key, socket, pid (None: a stale socket of a dead server),
    last_used (the socket's mtime: the server touches it at each command)."""
    out = []
    for path in sorted(runtime_dir().glob("warm-*.sock")):
        reply = _ask(path, "ping")
        try:
            used = path.stat().st_mtime
        except OSError:
            continue
        out.append({"key": key_of(path), "socket": str(path), "pid": (reply or {}).get("pid"), "last_used": used})
    return out


def stop(path: Path) -> bool:
    """Ask the server on ``path`` to exit; a stale one's files are removed. True when a server answered."""
    reply = _ask(path, "stop")
    if reply is None:
        remove_files(key_of(path))
        return False
    deadline = time.monotonic() + 10.0
    while path.exists() and time.monotonic() < deadline:  # it removes its files on the way out
        time.sleep(0.05)
    return True


def make_room(new_key: str) -> list[str]:
    """Before starting the server ``new_key``: stop this user's least recently used servers so that
    at most ``max_servers()`` run with it. The keys stopped."""
    others = sorted((s for s in servers() if s["key"] != new_key), key=lambda s: s["last_used"])
    stopped = []
    while len(others) >= max_servers():
        victim = others.pop(0)
        stop(Path(victim["socket"]))
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
