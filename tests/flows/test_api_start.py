"""A flow command starts its embedded Prefect API before it imports what its flows need, so the two
waits overlap (issue 18, item 9: the nightly's fixed cost): ``prepare_prefect(..., preload=...)``.

Each case runs in a fresh interpreter (Prefect's embedded server is a per-process singleton):
the preloaded module, imported by ``prepare_prefect``, finds the API's process already launched;
when ``prepare_prefect`` returns, the API answers ``/health`` before any Prefect call; the first
flow then runs on that same server (no second one is started) and its process is the guarded one
(``flows.ephemeral``: it dies with the command). With a Prefect API configured, nothing starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.flows.conftest import REPO

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[2])
    from schemas.settings import load_settings
    from flows.cli.common import prepare_prefect

    prepare_prefect(load_settings(), preload=("probe_preload",))
    import probe_preload
    from prefect.server.api.server import SubprocessASGIServer

    out = {"seen_at_preload": probe_preload.SEEN, "instances": len(SubprocessASGIServer._instances)}
    server = SubprocessASGIServer._instances.get(None)
    if server is not None and server.server_process is not None:
        import httpx

        out["health"] = httpx.get(f"{server.api_url}/health", timeout=10).status_code
        out["cmdline"] = open(f"/proc/{server.server_process.pid}/cmdline", "rb").read().decode().split("\\0")
        from prefect import flow

        @flow
        def hello() -> int:
            return 7

        out["flow"] = hello()
        out["instances_after_flow"] = len(SubprocessASGIServer._instances)
        out["same_process"] = SubprocessASGIServer._instances.get(None) is server and server.server_process.poll() is None
    json.dump(out, open(sys.argv[1], "w"))
    """
)

PROBE = textwrap.dedent(
    """
    # Imported by prepare_prefect's preload: what the embedded API looked like at that moment.
    from prefect.server.api.server import SubprocessASGIServer

    _server = SubprocessASGIServer._instances.get(None)
    SEEN = {
        "launched": _server is not None and _server.server_process is not None,
        "running": bool(_server is not None and _server.running),
    }
    """
)


def _run(tmp_path: Path, **extra_env: str) -> dict:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "probe_preload.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "IMAGEBENCH_"))}
    env.update(IMAGEBENCH_HOME=str(tmp_path / "home"), IMAGEBENCH_WARM="off", PYTHONPATH=str(REPO), **extra_env)
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out), str(tmp_path / "mods")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_embedded_api_boots_while_the_command_imports(tmp_path):
    got = _run(tmp_path)
    # launched before the preload was imported: the import and the API's start-up overlapped
    assert got["seen_at_preload"] == {"launched": True, "running": True}
    assert got["health"] == 200  # up when prepare_prefect returns, before any Prefect call
    assert got["cmdline"][1:3] == ["-m", "flows.ephemeral"] and "uvicorn" in got["cmdline"]  # dies with the command
    assert got["flow"] == 7 and got["instances_after_flow"] == 1 and got["same_process"]


def test_nothing_starts_when_a_prefect_api_is_configured(tmp_path):
    # an address where nothing listens: prepare_prefect must not start (or call) anything
    got = _run(tmp_path, PREFECT_API_URL="http://127.0.0.1:9/api")
    assert got == {"seen_at_preload": {"launched": False, "running": False}, "instances": 0}
