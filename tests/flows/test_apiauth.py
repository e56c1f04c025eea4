"""The Prefect API secret a child process inherits from imagebench is not mistaken for one the user
exported: a `serve` started by a process that had talked to another API got that API's secret and
every request of its own runner was refused (401), found by running the serve tests after others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_CHILD = """
import json, sys
from pathlib import Path
from flows import apiauth
apiauth.protect(Path(sys.argv[1]))
import os
print(json.dumps({k: os.environ.get(k) for k in (apiauth.SERVER_VAR, apiauth.CLIENT_VAR)}))
"""


def _child(home: Path, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(home)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_an_inherited_secret_of_ours_is_replaced_and_a_users_own_is_kept(tmp_path, monkeypatch):
    from flows import apiauth

    for var in (apiauth.SERVER_VAR, apiauth.CLIENT_VAR, apiauth.OURS_VAR):
        monkeypatch.delenv(var, raising=False)
    first, second = tmp_path / "first", tmp_path / "second"
    # What a child of a process that talked to the first API inherits (this process stays untouched).
    inherited = dict(os.environ)
    value = apiauth.auth_string(first)
    inherited[apiauth.SERVER_VAR] = inherited[apiauth.CLIENT_VAR] = value
    inherited[apiauth.OURS_VAR] = apiauth._fingerprint(value)
    got = _child(second, inherited)  # a command whose API lives in another home
    want = apiauth.auth_string(second)
    assert want != value and got == {apiauth.SERVER_VAR: want, apiauth.CLIENT_VAR: want}

    user_env = dict(os.environ)
    user_env[apiauth.SERVER_VAR] = user_env[apiauth.CLIENT_VAR] = "the-users-own"
    assert _child(second, user_env) == {apiauth.SERVER_VAR: "the-users-own", apiauth.CLIENT_VAR: "the-users-own"}
