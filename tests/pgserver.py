"""A throwaway PostgreSQL server: Debian's own binaries (package ``postgresql``, installed by
``make system-deps``), a cluster made by initdb in a temporary folder, listening on 127.0.0.1 on a
free port (and a unix socket in that folder), stopped and removed after. Used by the tests
(fixture ``pg_server`` in tests/conftest.py) and by bench/bench_panel_load.py.

initdb refuses to run as root: as root (tests here and in CI run as root) the cluster belongs to
the ``postgres`` system user that the Debian package creates, and its programs run through
``runuser``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

PG_USER = "postgres"  # the database superuser of the cluster (trust authentication, loopback only)


class PostgresMissing(RuntimeError):
    pass


def pg_bindir() -> Path:
    """Debian keeps the server programs in /usr/lib/postgresql/<major>/bin (not on PATH): the newest."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("initdb")
    if which:
        return Path(which).resolve().parent
    raise PostgresMissing("PostgreSQL server programs (initdb, pg_ctl) not found: `make system-deps` installs "
                          "Debian's postgresql package (apt-get install postgresql)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgServer:
    root: Path
    port: int
    bindir: Path
    run_as: str | None  # the system user owning the cluster (None: ourselves)
    databases: list[str] = field(default_factory=list)

    def _cmd(self, *args: str) -> list[str]:
        return (["runuser", "-u", self.run_as, "--"] if self.run_as else []) + list(args)

    def url(self, database: str = "postgres", password: str | None = None) -> str:
        auth = PG_USER + (f":{password}" if password else "")
        return f"postgresql+psycopg://{auth}@127.0.0.1:{self.port}/{database}"

    def new_database(self, prefix: str = "t") -> str:
        """A fresh empty database; its name."""
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=PG_USER, dbname="postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return name

    def tables(self, database: str) -> list[str]:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=PG_USER, dbname=database) as c:
            return sorted(r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))

    def stop(self) -> None:
        subprocess.run(self._cmd(str(self.bindir / "pg_ctl"), "stop", "-D", str(self.root / "data"), "-m", "fast", "-w"),
                       capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)


def start_pg(max_connections: int = 200, fsync: bool = True) -> PgServer:
    """initdb + pg_ctl start in a new temporary folder; the caller stops it (``PgServer.stop``)."""
    bindir = pg_bindir()
    run_as = None
    root = Path(tempfile.mkdtemp(prefix="imagebench-pg-"))
    if os.geteuid() == 0:
        run_as = PG_USER
        try:
            pw = pwd.getpwnam(PG_USER)
        except KeyError:
            shutil.rmtree(root)
            raise PostgresMissing(f"running as root and there is no {PG_USER!r} user to own the cluster "
                                  "(Debian's postgresql package creates it)") from None
        os.chown(root, pw.pw_uid, pw.pw_gid)
    cmd = (lambda *a: (["runuser", "-u", run_as, "--"] if run_as else []) + list(a))
    init = subprocess.run(cmd(str(bindir / "initdb"), "-D", str(root / "data"), "-U", PG_USER, "-A", "trust",
                              "-E", "UTF8", "--no-sync"), capture_output=True, text=True, timeout=120)
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {init.stderr.strip()[-500:]}")
    last = ""
    for _ in range(5):  # a port taken between choosing and binding: choose again
        port = _free_port()
        opts = (f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root} "
                f"-c max_connections={max_connections} -c fsync={'on' if fsync else 'off'}")
        started = subprocess.run(cmd(str(bindir / "pg_ctl"), "start", "-D", str(root / "data"), "-w", "-t", "60",
                                     "-l", str(root / "server.log"), "-o", opts), capture_output=True, text=True, timeout=90)
        if started.returncode == 0:
            return PgServer(root, port, bindir, run_as)
        last = (root / "server.log").read_text(errors="replace")[-500:] if (root / "server.log").exists() else started.stderr
    shutil.rmtree(root, ignore_errors=True)
    raise RuntimeError(f"PostgreSQL did not start: {last.strip()}")
