"""The README's production section as written (issue 26 item 6), each command run as a user runs it:
separate processes over 127.0.0.1, a real Prefect server, Prefect's own worker.

- `imagebench serve --local-server --workers` (make serve's server, the work pool and prefect.yaml's
  deployments), its banner's worker commands pasted into a shell: `imagebench backfill --wait`
  completes on the process worker with the tiny model. `imagebench deploy` against the same server
  is idempotent, and refused while a plain `imagebench serve` serves the same names.
- The banner says where the UI's password is, never the password itself.
- No "Prefect collects anonymous usage data" notice on a terminal (DO_NOT_TRACK, flows/env.py).
"""

from __future__ import annotations

import base64
import json
import os
import pty
import re
import select
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.flows.conftest import REPO, eligible_ids, put_model

BIN = Path(sys.executable).parent
NOTICE = "collects anonymous usage data"
# Prefect reads these to decide it is in CI, where it stays silent: a terminal of a person has none.
CI_VARS = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "JENKINS_URL", "TRAVIS", "CIRCLECI", "BUILDKITE", "TF_BUILD",
           "CODEBUILD_BUILD_ID", "BITBUCKET_COMMIT", "TEAMCITY_VERSION", "DRONE", "SEMAPHORE", "APPVEYOR", "BUDDY",
           "CI_NAME")


def _imagebench(*args: str) -> list[str]:
    return [str(BIN / "imagebench"), *args]


def _user_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A person's shell: no Prefect variables of the test run, no CI markers, no opt-out of ours."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_") and k not in CI_VARS and k not in ("DO_NOT_TRACK", "IMAGEBENCH_API_AUTH_OURS")}
    env.update(HOME=str(tmp_path / "user-home"), PYTHONUNBUFFERED="1", COLUMNS="200", **extra)
    return env


def _on_a_terminal(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 240) -> tuple[int, str]:
    """Run ``cmd`` with a pseudo-terminal as stdin, stdout and stderr (what `make demo` gets); its
    exit code and everything it wrote."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the terminal's other side is closed (the process ended)
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            pytest.fail(f"{cmd} still running after {timeout:.0f} s:\n{out.decode(errors='replace')}")
    finally:
        os.close(master)
    return proc.wait(30), out.decode(errors="replace")


def test_no_telemetry_notice_on_a_terminal(tmp_path):
    """A first command of a workspace on a terminal, as `make demo` runs it: Prefect's "collects
    anonymous usage data" notice is not printed (it is the client's; PREFECT_SERVER_ANALYTICS_ENABLED,
    what the Makefile set, is the server's). The same command with DO_NOT_TRACK=0 exported (a user's
    own value wins) prints it: the command does reach Prefect on a terminal."""
    outputs = {}
    for case, extra in (("default", {}), ("user opts in", {"DO_NOT_TRACK": "0"})):
        home = tmp_path / case.replace(" ", "-")
        env = _user_env(home, IMAGEBENCH_HOME=str(home / "data"), IMAGEBENCH_WARM="off", **extra)
        (home / "user-home").mkdir(parents=True)
        # Prefect is set up (its home made in the workspace), then the run stops: no reference.
        code, out = _on_a_terminal(_imagebench("backfill", "--model", "m1", "--local"), env, home)
        assert code == 1 and "reference" in out, out
        assert (home / "data" / "prefect").is_dir(), out
        outputs[case] = out
    assert NOTICE in outputs["user opts in"], outputs["user opts in"]
    assert NOTICE not in outputs["default"], outputs["default"]
