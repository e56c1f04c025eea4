"""The panel database: the URLs it takes, its engine, and which database a study lives in.

Two stores are supported (docs/BEAUTY.md, "Where the panel's answers live"):

- ``sqlite:///ABSOLUTE/PATH`` (the default: ``<study folder>/panel.sqlite``): WAL,
  ``synchronous=FULL``, writes start with ``BEGIN IMMEDIATE``;
- ``postgresql+psycopg://USER[:PASSWORD]@HOST[:PORT]/DATABASE`` (psycopg 3, pinned;
  ``postgresql://`` means the same), for several panel servers sharing one database.

Anything else (``+asyncpg``, ``+psycopg2``, MySQL, a typo) is refused in one line naming the URL
without its password, and so is a server that cannot be reached.

Identity: every panel database gets a random ``store_id`` (table ``panel_store``) when its tables
are created. ``open`` writes it, with the URL minus password, to the study's ``panel-store.json``;
every later command compares the database it is pointed at with that record and refuses another
one, naming both, before it reads or writes anything there. A command that only reads never
creates a database: no file, no tables.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, create_engine, event, inspect, select
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError
from pydantic import ValidationError

from schemas.panel import PANEL_STORE_RECORD_FILE, PanelStoreRecord

URL_FORMS = "sqlite:///ABSOLUTE/PATH or postgresql+psycopg://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
IDENTITY_TABLE = "panel_store"
# Connections per panel server: the app answers in a thread pool of 40 (anyio's default), so up
# to 40 requests may hold one at once; PostgreSQL's default max_connections is 100.
PG_POOL_SIZE, PG_MAX_OVERFLOW = 10, 30
# The execution option of a transaction that only reads (``engine.execution_options(**{READ_ONLY: True})``):
# on SQLite it begins deferred instead of taking the write lock.
READ_ONLY = "imagebench_read_only"


class PanelUrlError(ValueError):
    """A panel database URL that cannot be used (one line, no password)."""


class PanelDatabaseUnreachable(RuntimeError):
    """The panel database's server (or file) cannot be reached or opened."""


class StoreMismatch(RuntimeError):
    """The command was pointed at a panel database other than the one the study was opened in."""


def identity_table(md: MetaData) -> Table:
    """``panel_store``: one row (singleton = 1), the database's random id. Each protocol's
    MetaData carries its own copy; they describe the same table."""
    return Table(IDENTITY_TABLE, md,
                 Column("singleton", Integer, primary_key=True, autoincrement=False),
                 Column("store_id", String(32), nullable=False),
                 Column("created_at", BigInteger, nullable=False))


_identity = identity_table(MetaData())


def _scrub(text: str) -> str:
    """A URL we could not parse, with anything that looks like a password removed."""
    return re.sub(r"([^/@:]*):[^@/]*@", r"\1@", text)


def public_url(url: str | URL) -> str:
    """The URL without its password (for messages and the study's record)."""
    if isinstance(url, str):
        try:
            url = make_url(url)
        except ArgumentError:
            return _scrub(url)
    return url._replace(password=None).render_as_string(hide_password=False)  # set(password=None) keeps it


def parse_panel_url(url: str) -> URL:
    """The URL as SQLAlchemy will use it (``postgresql://`` becomes ``postgresql+psycopg://``), or
    :class:`PanelUrlError` naming it and the forms that work."""
    try:
        u = make_url(url)
    except ArgumentError:
        raise PanelUrlError(f"panel database {_scrub(url)!r} is not a database URL: use {URL_FORMS}") from None
    backend, driver = u.get_backend_name(), u.drivername.partition("+")[2]
    shown = public_url(u)
    if backend == "sqlite":
        if driver not in ("", "pysqlite"):
            raise PanelUrlError(f"panel database {shown}: driver {driver} is not supported: use {URL_FORMS}")
        if not u.database or u.database == ":memory:" or u.database.startswith("file:"):
            raise PanelUrlError(f"panel database {shown}: an SQLite panel needs a file path: use {URL_FORMS}")
        return u.set(drivername="sqlite")
    if backend in ("postgresql", "postgres"):
        if driver not in ("", "psycopg"):
            why = " (the panel store is synchronous)" if driver == "asyncpg" else " (not installed; psycopg 3 is)"
            raise PanelUrlError(f"panel database {shown}: driver {driver} is not supported{why}: use {URL_FORMS}")
        if not u.database:
            raise PanelUrlError(f"panel database {shown} names no database: use {URL_FORMS}")
        return u.set(drivername="postgresql+psycopg")
    raise PanelUrlError(f"panel database {shown}: {backend} is not a supported panel store: use {URL_FORMS}")


def is_sqlite(u: URL) -> bool:
    return u.get_backend_name() == "sqlite"


def one_line(exc: BaseException) -> str:
    """A driver's message on one line (psycopg's span several)."""
    return " ".join(str(getattr(exc, "orig", None) or exc).split())


def make_engine(url: str | URL, busy_timeout_s: float = 10.0) -> Engine:
    """An engine for a supported URL (:func:`parse_panel_url`). SQLite: the folder is created,
    WAL + ``synchronous=FULL`` + busy timeout, ``BEGIN IMMEDIATE``. PostgreSQL: a pool the size
    of the app's thread pool, a connect timeout, connections checked before use."""
    u = parse_panel_url(url) if isinstance(url, str) else url
    if is_sqlite(u):
        Path(u.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(u, connect_args={"timeout": busy_timeout_s, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (below)
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn):
            if conn.get_execution_options().get(READ_ONLY):
                conn.exec_driver_sql("BEGIN")  # a reader in WAL mode: a snapshot, never waits for the write lock
            else:
                conn.exec_driver_sql("BEGIN IMMEDIATE")  # take the write lock up front: no upgrade deadlock

        return engine
    return create_engine(u, pool_pre_ping=True, pool_size=PG_POOL_SIZE, max_overflow=PG_MAX_OVERFLOW,
                         pool_timeout=max(busy_timeout_s, 1.0),
                         connect_args={"connect_timeout": max(2, int(busy_timeout_s))})


def ensure_identity(engine: Engine) -> str:
    """The database's store id, drawn and written the first time (two creators at once: one wins)."""
    with engine.begin() as c:
        got = c.execute(select(_identity.c.store_id)).scalar()
    if got:
        return got
    try:
        with engine.begin() as c:
            c.execute(_identity.insert().values(singleton=1, store_id=secrets.token_hex(16),
                                                created_at=int(datetime.now(UTC).timestamp() * 1_000_000)))
    except IntegrityError:
        pass  # another process drew it first: theirs stands
    with engine.begin() as c:
        return c.execute(select(_identity.c.store_id)).scalar()


def open_engine(url: str, tables: MetaData, busy_timeout_s: float = 10.0) -> Engine:
    """An engine with ``tables`` (and the identity) created: for callers that name the URL
    themselves (tests, benchmarks). A study's commands go through :func:`attach`."""
    u = parse_panel_url(url)
    engine = make_engine(u, busy_timeout_s)
    try:
        tables.create_all(engine)
        ensure_identity(engine)
    except OperationalError as exc:
        engine.dispose()
        raise PanelDatabaseUnreachable(f"panel database {public_url(u)} cannot be used: {one_line(exc)}") from None
    return engine


# ---- a study's record of its store --------------------------------------------------------------


def read_record(study_dir: Path) -> PanelStoreRecord | None:
    path = Path(study_dir) / PANEL_STORE_RECORD_FILE
    if not path.is_file():
        return None
    try:
        return PanelStoreRecord.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, ValidationError) as exc:
        raise StoreMismatch(f"{path} is not a panel store record ({one_line(exc)[:200]}): restore it from a backup") from None


def write_once_read_only(path: Path, data: bytes) -> None:
    """Write ``path`` whole (fsynced) and only if it does not exist (hard-link create-once:
    FileExistsError otherwise), then make it read-only: a study's records are never rewritten."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, path)
    finally:
        os.unlink(tmp)
    os.chmod(path, 0o400)  # read-only, and private as the whole workspace (issue 24 item 2)


def write_record(study_dir: Path, url: str | URL, store_id: str) -> PanelStoreRecord:
    """Create-once (a complete temp file hard-linked to the name: fails if one exists), read-only."""
    record = PanelStoreRecord(url=public_url(url), store_id=store_id, recorded_at=datetime.now(UTC).isoformat())
    d = Path(study_dir)
    d.mkdir(parents=True, exist_ok=True)
    write_once_read_only(d / PANEL_STORE_RECORD_FILE, (json.dumps(record.model_dump(), indent=1, sort_keys=True) + "\n").encode())
    return record


@dataclass
class Attached:
    engine: Engine
    url: URL
    store_id: str | None  # None: a database made before ids existed, never opened a study since
    record: PanelStoreRecord | None


def _probe(u: URL, busy_timeout_s: float, mine: set[str]) -> tuple[Engine | None, bool, str | None]:
    """(engine or None, whether the database holds any of this protocol's tables, its store id), creating
    nothing: a missing SQLite file is not created, an empty PostgreSQL database is left empty."""
    if is_sqlite(u) and not Path(u.database).is_file():
        return None, False, None
    engine = make_engine(u, busy_timeout_s)
    try:
        names = set(inspect(engine).get_table_names())
        sid = None
        if IDENTITY_TABLE in names:
            with engine.begin() as c:
                sid = c.execute(select(_identity.c.store_id)).scalar()
    except OperationalError as exc:
        engine.dispose()
        raise PanelDatabaseUnreachable(f"panel database {public_url(u)} cannot be used: {one_line(exc)}") from None
    return engine, bool(names & mine), sid


def _mismatch(what: str, record: PanelStoreRecord, u: URL, there: str) -> StoreMismatch:
    return StoreMismatch(
        f"{what} lives in panel database {record.url} (store id {record.store_id}), but this command would use "
        f"{public_url(u)} ({there}): set IMAGEBENCH_PANEL_DATABASE (setting panel_database) to the study's "
        "database, or unset it for the study's own panel.sqlite")


def attach(study_dir: Path, url: str, tables: MetaData, what: str, *, create: bool,
           busy_timeout_s: float = 10.0) -> Attached | None:
    """The engine of the database a study lives in, checked against the study's record.

    ``create=False`` (every command but ``open``): None when the study records no store and the
    database holds no panel (nothing is created); :class:`StoreMismatch` when the study records
    another store. ``create=True`` (``open``): the tables and the identity are created, unless the
    study records another store (refused first, nothing created)."""
    u = parse_panel_url(url)
    record = read_record(study_dir)
    mine = set(tables.tables) - {IDENTITY_TABLE}  # this protocol's tables
    try:
        engine, present, sid = _probe(u, busy_timeout_s, mine)
    except PanelDatabaseUnreachable as exc:
        if record is None:
            raise
        raise _mismatch(what, record, u, str(exc).partition(" cannot be used: ")[2] or str(exc)) from None
    if record is not None and sid != record.store_id:
        if engine is not None:
            engine.dispose()
        raise _mismatch(what, record, u, f"store id {sid}" if sid else "no panel store there")
    if not create and not present:
        if engine is not None:
            engine.dispose()
        return None
    engine = engine or make_engine(u, busy_timeout_s)
    try:
        tables.create_all(engine)  # on an existing panel: the tables a newer imagebench added
        if create:
            sid = ensure_identity(engine)
    except OperationalError as exc:
        engine.dispose()
        raise PanelDatabaseUnreachable(f"panel database {public_url(u)} cannot be used: {one_line(exc)}") from None
    return Attached(engine, u, sid, record)
