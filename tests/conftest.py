"""Shared fixtures: a real S3 server over loopback (tests/s3server.py) and generic helpers.

- ``s3_server`` (session): one SeaweedFS (or moto) process for the whole run, stopped at the end.
- ``s3_env``: the environment boto3 reads (dummy credentials, region, IMAGEBENCH_S3_ENDPOINT),
  isolated from the developer's own AWS config.
- ``s3_bucket``: a fresh, empty bucket for one test.
- ``pg_server`` (session): a throwaway PostgreSQL cluster (tests/pgserver.py), for the panel store.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.s3server import S3Server, start_s3_server

# Variables of the AWS chain that could leak the developer's real setup into tests.
_AWS_VARS_TO_CLEAR = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "IMAGEBENCH_STORE",
)


def isolate_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No profile, no shared config/credential files, no instance metadata lookups."""
    for var in _AWS_VARS_TO_CLEAR:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


# Every command the tests spawn runs cold: a warm server (flows/warm.py) per test workspace would
# outlive its test. The tests of the warm server turn it on themselves.
os.environ["IMAGEBENCH_WARM"] = "off"
# A terminal's width is a fact of the machine that runs the suite (a CI runner may export COLUMNS=80):
# tables are printed as in a pipe of no stated width. A test of a given width sets its own.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)
# The suite's own process makes files as an imagebench process does (umask 077: tasks/store/private.py),
# so a workspace a test builds in-process is as private as one a command builds (not closed, with a
# line said, by the first command run on it). The shared-server tests run their commands under
# umask 022 themselves (tests/otheruser.py), so that nothing passes thanks to a strict umask.
os.umask(0o077)

@pytest.fixture(scope="session")
def prefect_harness():
    """One Prefect test server for the whole session (tests/flows and tests/beauty share it)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=600):  # a machine shared with other jobs: minutes
        yield


@pytest.fixture(scope="session")
def other_user():
    """A second, unprivileged local account for the shared-server attacks (tests/otheruser.py):
    created when the tests run as root (as CI does), removed at the end; skipped otherwise."""
    from tests.otheruser import create_other_user, remove_other_user

    user = create_other_user()
    if user is None:
        pytest.skip("needs root to create a second local account (CI runs as root)")
    try:
        yield user
    finally:
        remove_other_user(user)


@pytest.fixture()
def reachable_tmp():
    """A folder every local account can enter (0755 under /tmp): where a workspace under attack
    lives (tests/otheruser.py)."""
    from tests.otheruser import reachable_dir

    with reachable_dir() as path:
        yield path


@pytest.fixture(scope="session")
def pg_server():
    """One throwaway PostgreSQL cluster for the session (tests/pgserver.py); tests make their own
    databases in it (``pg_server.new_database()``). Stopped and removed at the end."""
    from tests.pgserver import start_pg

    server = start_pg(fsync=False)  # durability is SQLite's and PostgreSQL's own business, not what is tested
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server() -> S3Server:
    server = start_s3_server()
    print(f"\n[s3server] {server.backend} at {server.endpoint_url} ready in {server.startup_s:.2f}s")
    try:
        yield server
    finally:
        t0 = time.monotonic()
        server.stop()
        print(f"\n[s3server] {server.backend} stopped in {time.monotonic() - t0:.2f}s")


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path) -> S3Server:
    """boto3's standard chain resolves to the test server's dummy credentials, and nothing else."""
    isolate_aws_env(monkeypatch, tmp_path)
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


@pytest.fixture
def s3_bucket(s3_env: S3Server) -> str:
    """A fresh, empty bucket. Not deleted afterwards: the server's data dir goes at session end
    (SeaweedFS takes ~0.2 s to drop a bucket's volumes; not worth paying per test)."""
    return s3_env.create_bucket()


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """An environment where boto3's chain finds no credentials at all (and fails fast)."""
    isolate_aws_env(monkeypatch, tmp_path)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))


# Recorded machines (tests/machines/README.md): an AMX + AVX-512 Intel Xeon and an AVX2-only AMD EPYC.
RECORDED_MACHINES = ("intel-xeon-amx", "amd-epyc-7763-avx2")


@pytest.fixture(params=RECORDED_MACHINES)
def recorded_machine(request, monkeypatch):
    """A test that reads machine facts (CPU flags, vendor, torch's capability, MKL's line, cores)
    takes them from this fixture, run once per recorded machine: the code reads them through its
    one seam (IMAGEBENCH_CPU_FACTS, tasks/hpsv3/cpu.py), so the test holds on any CPU."""
    from pathlib import Path

    from tasks.hpsv3.cpu import CPU_FACTS_ENV, load_recorded_machine

    path = Path(__file__).parent / "machines" / f"{request.param}.json"
    monkeypatch.setenv(CPU_FACTS_ENV, str(path))
    return load_recorded_machine(path)
