"""Every Prefect API imagebench starts requires a secret: Prefect's server auth string.

Prefect 3.9.1 protects its API with ``PREFECT_SERVER_API_AUTH_STRING`` (server side: every request
but ``GET /health`` and ``/ready`` needs ``Authorization: Basic base64(<string>)``, else 401) and
sends ``PREFECT_API_AUTH_STRING`` from its clients. imagebench starts three kinds of API on
127.0.0.1, all reachable by every local user: the ephemeral one of a cold command, the long-lived
one a warm server keeps per workspace (flows/warm_server.py) and the real server of
``imagebench serve --local-server``. Each gets the secret of its Prefect home, a random string in
``<PREFECT_HOME>/api-auth`` (mode 0600, made on first use), and every client imagebench starts
gets it too (the command itself, the flow runs ``serve`` starts, ``backfill`` to the local server).

A secret the user exported (either variable, set to something imagebench did not set) is kept.
This module does not import Prefect: the settings must be in the environment before Prefect reads
them.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

AUTH_FILE = "api-auth"  # in the Prefect home the API keeps its database in
SERVER_VAR = "PREFECT_SERVER_API_AUTH_STRING"
CLIENT_VAR = "PREFECT_API_AUTH_STRING"
_set_by_us: set[str] = set()  # values this process exported: a later workspace may replace them
# Fingerprints of the values imagebench exported, passed down to child processes: a child (a served
# flow run, `serve`, a command a test or a script starts) inherits the parent's secret, and must not
# mistake it for one the user exported (it would then keep another API's secret and get 401s).
OURS_VAR = "IMAGEBENCH_API_AUTH_OURS"


def _fingerprint(value: str) -> str:
    import hashlib

    return hashlib.sha256(value.encode()).hexdigest()[:16]


def _ours(value: str) -> bool:
    return value in _set_by_us or _fingerprint(value) in os.environ.get(OURS_VAR, "").split()


class ApiAuthError(OSError):
    """The secret file cannot be made or is not private to this user."""


def auth_string(prefect_home: Path) -> str:
    """The secret of the API on ``prefect_home``, created (0600, random) when missing."""
    path = Path(prefect_home) / AUTH_FILE
    try:
        Path(prefect_home).mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ApiAuthError(f"cannot create the Prefect API secret {path}: {exc.strerror or exc}") from None
    else:  # ours, new: write it whole before anyone reads it (readers retry an empty file below)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    for _ in range(50):
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise ApiAuthError(f"{path} is not a private file of this user (mode 0600): the Prefect API secret "
                                   "must not be readable by others; remove it and run again")
            value = path.read_text().strip()
        except OSError as exc:
            if isinstance(exc, ApiAuthError):
                raise
            raise ApiAuthError(f"cannot read the Prefect API secret {path}: {exc.strerror or exc}") from None
        if value:
            return value
        import time

        time.sleep(0.01)  # another process created it a moment ago and is writing it
    raise ApiAuthError(f"the Prefect API secret {path} is empty: remove it and run again")


def _export(var: str, value: str) -> None:
    current = os.environ.get(var)
    if current is None or _ours(current):
        os.environ[var] = value
        _set_by_us.add(value)
        marks = os.environ.get(OURS_VAR, "").split()
        if _fingerprint(value) not in marks:
            os.environ[OURS_VAR] = " ".join([*marks, _fingerprint(value)][-8:])


def protect(prefect_home: Path, server: bool = True) -> None:
    """Export the secret of ``prefect_home`` for the clients of this process (and, with
    ``server``, for an API it starts: the ephemeral one, which inherits this environment)."""
    value = auth_string(prefect_home)
    if server:
        _export(SERVER_VAR, value)
    _export(CLIENT_VAR, value)


def server_environment(prefect_home: Path) -> dict[str, str]:
    """What an API process on ``prefect_home`` needs in its environment to require the secret."""
    return {SERVER_VAR: auth_string(prefect_home)}
