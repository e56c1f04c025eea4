"""A warm process for the heavy commands: imports paid once, every command a fresh fork.

`imagebench score` spends most of its fixed cost before any image is touched: importing torch,
transformers, Prefect and Great Expectations, and building the GX suites. The warm server pays
that once, then serves each command by forking a child that runs it exactly as a cold process
would (the client's argv, environment, working directory, stdin/stdout/stderr passed over a Unix
socket), so a command's state never leaks into the next one.

- **Started on demand** by the launcher (`flows/launch.py`) for the commands in
  ``WARM_COMMANDS``, one per (workspace, import-sensitive environment, code version): a key over
  the ``IMAGEBENCH_*``, ``PREFECT_*``, ``HF_*``, torch/OpenMP variables, the Python executable and
  the source files' sizes and mtimes. Another environment or an edited source file gets another
  server; the old one idles out.
- **Stopped when idle** (``IMAGEBENCH_WARM_IDLE_S``, default 900 s without a command) and by
  ``imagebench warm stop``; it removes its socket on the way out.
- **Never orphaned, never orphaning**: the server watches nothing but its idle clock, and holds
  no GPU, model or Prefect server of its own (the children start theirs, as cold commands do).
  A child watches its client's connection: when the client dies (even ``kill -9``) the child is
  sent SIGTERM, and its Prefect API server follows it (flows/ephemeral.py).
- Signals the client receives (Ctrl-C, SIGTERM, SIGHUP) are forwarded to the child; the
  client exits with the child's exit status (128 + signal when it was killed).

The socket lives in a private directory (``$TMPDIR/imagebench-<uid>``, mode 0700, ours), never in
the workspace: Unix socket paths are limited to 108 bytes.

``IMAGEBENCH_WARM=off`` runs every command cold, as before (tests do, except the warm ones).
"""

from __future__ import annotations

import hashlib
import json
import os
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
# a server only serves clients whose values of these equal its own.
KEY_PREFIXES = ("IMAGEBENCH_", "PREFECT_", "HF_", "TRANSFORMERS_", "TORCH", "OMP_", "MKL_", "CUDA_", "GX_",
                "TOKENIZERS_", "PYTHON", "LD_", "VIRTUAL_ENV")
CODE_DIRS = ("flows", "tasks", "schemas")
DEFAULT_IDLE_S = 900.0
PROTOCOL = 1
_MAX_HEADER = 1 << 20


class WarmUnavailable(RuntimeError):
    """No warm server could be reached or started; the command runs cold."""


def mode() -> str:
    """``IMAGEBENCH_WARM``: ``auto`` (default: use or start a server) or ``off``."""
    value = os.environ.get("IMAGEBENCH_WARM", "auto").strip().lower()
    return "off" if value in ("0", "off", "false", "no") else "auto"


def idle_seconds() -> float:
    raw = os.environ.get("IMAGEBENCH_WARM_IDLE_S", "")
    try:
        return max(1.0, float(raw)) if raw else DEFAULT_IDLE_S
    except ValueError:
        return DEFAULT_IDLE_S


def code_root() -> Path:
    return Path(__file__).resolve().parent.parent


def server_key(env: dict[str, str]) -> str:
    """16 hex chars naming the server a client with this environment may use."""
    h = hashlib.sha256()
    h.update(f"{PROTOCOL}\0{sys.executable}\0".encode())
    for k in sorted(env):
        if k.startswith(KEY_PREFIXES):
            h.update(f"{k}={env[k]}\0".encode())
    root = code_root()
    for d in CODE_DIRS:  # an edited source file means another server (stat only: ~2 ms)
        for p in sorted((root / d).rglob("*.py")):
            st = p.stat()
            h.update(f"{p.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


def runtime_dir() -> Path:
    """``$TMPDIR/imagebench-<uid>``: created 0700; refused when not a private directory of ours."""
    d = Path(tempfile.gettempdir()) / f"imagebench-{os.getuid()}"
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


def _ask(path: Path, op: str, timeout: float = 5.0) -> dict | None:
    """The server's reply to ``op``; None when no server answers there."""
    try:
        return _request(path, {"op": op}, timeout)
    except (OSError, ValueError):
        return None


def servers() -> list[dict]:
    """Every warm server of this user: key, socket, pid (None: a stale socket of a dead server)."""
    out = []
    for path in sorted(runtime_dir().glob("warm-*.sock")):
        reply = _ask(path, "ping")
        out.append({"key": path.stem.removeprefix("warm-"), "socket": str(path),
                    "pid": (reply or {}).get("pid"), "current": False})
    return out


def stop(path: Path) -> bool:
    """Ask the server on ``path`` to exit; a stale socket is removed. True when a server answered."""
    reply = _ask(path, "stop")
    if reply is None:
        path.unlink(missing_ok=True)
        return False
    deadline = time.monotonic() + 10.0
    while path.exists() and time.monotonic() < deadline:  # it removes its socket on the way out
        time.sleep(0.05)
    return True


# ---------------------------------------------------------------------------------------------
# The embedded Prefect API, kept by the warm server per Prefect home
# ---------------------------------------------------------------------------------------------

API_MARK = "IMAGEBENCH_WARM_PREFECT_API"  # the URL of the warm server's API: embedded mode, not a server
CHILD_SOCKET: str | None = None  # set in a warm server's child: where to ask for the API


def embedded_api_url() -> str | None:
    """The URL of the warm server's Prefect API when this command uses it (then it counts as the
    embedded API: no `gpu` tag limit, backfills run in this process)."""
    return os.environ.get(API_MARK) or None


def use_warm_prefect_api() -> bool:
    """In a warm server's child, once PREFECT_HOME is set: use the embedded API the warm server
    keeps for that home (started on first use, with the arguments and environment Prefect's own
    ephemeral server gets) instead of starting one per command. False: not a warm child, or a
    Prefect API is configured."""
    if CHILD_SOCKET is None or os.environ.get("PREFECT_API_URL"):
        return False
    import prefect
    from prefect.settings import get_current_settings

    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
           **get_current_settings().to_environment_variables(exclude_unset=True)}
    reply = _request(Path(CHILD_SOCKET), {"op": "prefect-api", "home": os.environ["PREFECT_HOME"], "env": env,
                                          "app_dir": str(prefect.__module_path__.parent)})
    if not reply or "url" not in reply:
        raise WarmUnavailable(f"the warm server gave no Prefect API: {reply}")
    url = reply["url"]
    _wait_healthy(url, float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")))
    os.environ["PREFECT_API_URL"] = url
    os.environ[API_MARK] = url
    return True


def _request(path: Path, obj: dict, timeout: float = 30.0) -> dict | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        send_json(sock, obj)
        reply, _ = recv_json(sock, bytearray())
        return reply
    finally:
        sock.close()


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
