"""The panel shell's store: what every protocol's panel database shares, durable at once.

``SqlStore`` (engine, ``BEGIN IMMEDIATE`` write transactions on SQLite, row locks on PostgreSQL,
sessions of the protocol's ``SESSIONS`` table), the refusals (``PanelError`` and its kinds, each
with the HTTP status the app answers with), tokens and session cookies kept as sha256 hex, never
in clear, and timestamps as UTC microseconds since the epoch (exact, portable). Embedded SQLite
in WAL mode by default (``<study_dir>/panel.sqlite``, ``synchronous=FULL``: a committed answer
survives a power cut), or PostgreSQL when several servers run (``IMAGEBENCH_PANEL_DATABASE``; the
URLs, the engine and the study's record of its database are tasks/panel/db.py). SQLAlchemy Core
only (installed with Prefect).

Each protocol keeps its own tables and store on this base: the Beauty Index's in
tasks/beauty/store.py, VAB's in tasks/vab/store.py.

Busy SQLite (issue 26 item 1): SQLite has one writer at a time, and its busy handler polls (sleeps
of up to 100 ms), so 40 request threads of one server contending for the write lock lose most of
their time asleep while the lock is free, and on a loaded machine some waited past the busy timeout
(a 503). A server's writers therefore take turns on one lock of this process first
(:data:`WRITER_WAIT_S`; handed over at once), and the busy timeout is left to other processes
(``study status``, a second server); the session lookup that starts every request only reads, in a
deferred transaction that never waits for the write lock (WAL).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import (
    MetaData,
    Table,
    select,
)
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from tasks.panel.db import (  # noqa: F401 - make_engine, open_engine re-exported
    READ_ONLY, attach, identity_table, make_engine, one_line, open_engine, public_url, write_record)

PANEL_DB_NAME = "panel.sqlite"
PANEL_DATABASE_ENV = "IMAGEBENCH_PANEL_DATABASE"
# How long a write waits for this process's earlier writers to the same SQLite file before it is a
# 503 "try again": under a reverse proxy's 60 s read timeout (docs/BEAUTY.md), with the busy timeout.
WRITER_WAIT_S = 30.0
_writer_locks: dict[str, threading.RLock] = {}
_writer_locks_guard = threading.Lock()


def writer_turn(engine: Engine) -> threading.RLock | None:
    """The lock this process's writers to ``engine``'s SQLite file take turns on (one per file,
    whatever the number of stores or engines on it); None for PostgreSQL (row locks, no single writer).
    Reentrant: a store method that writes inside another's transaction does not wait for itself."""
    if engine.dialect.name != "sqlite":
        return None
    key = os.path.realpath(engine.url.database)
    with _writer_locks_guard:
        return _writer_locks.setdefault(key, threading.RLock())


def study_database(study_dir: str | os.PathLike[str], database: str | None = None) -> str:
    """The database URL a study's command uses: ``database`` (the setting), else
    ``$IMAGEBENCH_PANEL_DATABASE``, else the study folder's own ``panel.sqlite``."""
    return database or os.environ.get(PANEL_DATABASE_ENV) or f"sqlite:///{Path(study_dir).resolve() / PANEL_DB_NAME}"


class PanelError(RuntimeError):
    """A request the store refuses; ``status`` is the HTTP status the app answers with."""

    status = 400


class StudyClosed(PanelError):
    status = 409


class NotInQueue(PanelError):
    status = 403


class OutOfOrder(PanelError):
    status = 409


class StoreUnavailable(PanelError):
    """The database is locked past the busy timeout, full or unreachable: nothing was recorded."""

    status = 503


def sha256_hex(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token() -> str:
    """A judge/admin/session secret: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def to_us(ts: datetime) -> int:
    if ts.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware (UTC)")
    return int(ts.timestamp() * 1_000_000)


def from_us(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC)


def now_us() -> int:
    return to_us(datetime.now(UTC))


@dataclass(frozen=True)
class NextItem:
    position: int
    image_id: str
    total: int
    shown_at: int


class SqlStore:
    """One study's rows in a panel database (the Beauty Index's and VAB's share the mechanics):
    an engine from :func:`open_engine`, write transactions that name a failure, the study's row of
    ``STUDIES`` (a table with study_id, state "open"/"closed", closed_at) and the browser sessions of
    ``SESSIONS`` (a table with session_sha256, study_id, role, label, created_at)."""

    STUDIES: Table  # each protocol's studies table
    SESSIONS: Table  # each protocol's sessions table
    METADATA: MetaData  # each protocol's tables
    KIND = "study"  # how messages name a study of this protocol
    store_id: str | None = None  # the database's id, when opened for a study (tasks/panel/db.py)
    record = None  # the study's PanelStoreRecord, once written

    def record_in(self, study_dir: str | os.PathLike[str]) -> None:
        """Write the study's record of this database (by ``open``, once, before anything of the
        study is written): every later command is checked against it."""
        if self.record is None:
            if not self.store_id:
                raise PanelError("this store was not opened for a study (PanelStore.open(study_dir, create=True))")
            self.record = write_record(Path(study_dir), self.engine.url, self.store_id)

    def study_row(self) -> dict | None:
        with self._tx(read_only=True) as c:
            row = c.execute(select(self.STUDIES).where(self.STUDIES.c.study_id == self.study_id)).mappings().first()
        return dict(row) if row else None

    def close(self, when: datetime | None = None) -> bool:
        """Close the study (False when it was already closed). A closed study accepts nothing."""
        studies = self.STUDIES
        with self._tx() as c:
            n = c.execute(studies.update().where(studies.c.study_id == self.study_id, studies.c.state == "open")
                          .values(state="closed", closed_at=to_us(when or datetime.now(UTC)))).rowcount
        return n == 1

    @classmethod
    def find(cls, study_dir: str | os.PathLike[str], study_id: str | None = None, database: str | None = None,
             busy_timeout_s: float = 10.0, *, create: bool = False):
        """The study's store, or None when the study records none and its database holds no panel
        of this kind (nothing is created). Raises ``StoreMismatch`` when pointed at another database."""
        folder = Path(study_dir)
        study_id = study_id or folder.name
        got = attach(folder, study_database(folder, database), cls.METADATA, f"{cls.KIND} {study_id}", create=create,
                     busy_timeout_s=busy_timeout_s)
        if got is None:
            return None
        add_missing_columns(got.engine, cls.METADATA)  # columns a newer imagebench added (a panel opened before)
        store = cls(got.engine, study_id)
        store.store_id, store.record = got.store_id, got.record
        return store

    def __init__(self, engine: Engine, study_id: str):
        self.engine = engine
        self.study_id = study_id
        self._reader = engine.execution_options(**{READ_ONLY: True})
        self._writers = writer_turn(engine)

    def dispose(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _tx(self, read_only: bool = False) -> Iterator:
        """A transaction; a write first takes this process's turn on an SQLite file (module
        docstring). ``read_only``: a snapshot that never waits for the write lock (SQLite)."""
        turn = None if read_only else self._writers
        if turn is not None and not turn.acquire(timeout=WRITER_WAIT_S):
            raise StoreUnavailable(f"the panel database is busy (its writers queued past {WRITER_WAIT_S:g} s); "
                                   "nothing was saved, try again")
        try:
            with (self._reader if read_only else self.engine).begin() as conn:
                yield conn
        except OperationalError as exc:  # locked past the busy timeout, disk full, server gone
            raise StoreUnavailable(f"the panel database could not record this ({one_line(exc)}); nothing was saved, try again") from exc
        except PoolTimeout as exc:  # every connection busy past the pool timeout (PostgreSQL under load)
            raise StoreUnavailable("the panel database is busy; nothing was saved, try again") from exc
        finally:
            if turn is not None:
                turn.release()

    def insert_once(self, c, table: Table, values: dict) -> bool:
        """Insert a row unless its primary key is taken (then nothing happens): False when it was.
        ``ON CONFLICT DO NOTHING``, so a duplicate racing past our checks never surfaces as an
        IntegrityError (a 500) on either store."""
        dialect = pg_dialect if self.engine.dialect.name == "postgresql" else sqlite_dialect
        # RETURNING, not rowcount: psycopg reports -1 for an INSERT executed this way.
        key = list(table.primary_key.columns)[0]
        return c.execute(dialect.insert(table).values(**values).on_conflict_do_nothing().returning(key)).first() is not None

    def new_session(self, role: str, label: str | None, replace: bool = False) -> str:
        """A new browser session: the secret goes into the cookie, only its hash into the table.
        ``replace``: the same link opened again keeps one session (the older ones of this role and
        label end)."""
        secret = new_token()
        t = self.SESSIONS
        with self._tx() as c:
            if replace:
                same = t.c.label.is_(None) if label is None else t.c.label == label
                c.execute(t.delete().where(t.c.study_id == self.study_id, t.c.role == role, same))
            c.execute(t.insert().values(session_sha256=sha256_hex(secret), study_id=self.study_id, role=role,
                                        label=label, created_at=now_us()))
        return secret

    def session(self, secret: str | None, max_age_s: float | None = None, at_us: int | None = None) -> tuple[str, str | None] | None:
        """(role, label) of the session whose secret this is, or None (unknown, or older than
        ``max_age_s`` at ``at_us``, default now)."""
        if not secret or len(secret) > 128:
            return None
        t = self.SESSIONS
        with self._tx(read_only=True) as c:  # every request starts here: it must not queue behind writers
            row = c.execute(select(t.c.role, t.c.label, t.c.created_at).where(
                t.c.session_sha256 == sha256_hex(secret), t.c.study_id == self.study_id)).first()
        if row is None:
            return None
        if max_age_s is not None and (now_us() if at_us is None else at_us) - row.created_at > max_age_s * 1_000_000:
            return None
        return (row[0], row[1])


def add_missing_columns(engine: Engine, tables: MetaData) -> list[str]:
    """Add the nullable columns a newer version declares to tables an older one created (a study
    opened before QC columns existed keeps running: its older answers read as "no evidence").
    Returns ``table.column`` for each column added."""
    from sqlalchemy import inspect

    insp = inspect(engine)
    added = []
    for table in tables.sorted_tables:
        if not insp.has_table(table.name):
            continue
        have = {c["name"] for c in insp.get_columns(table.name)}
        for col in table.columns:
            if col.name not in have and col.nullable and not col.primary_key:
                kind = col.type.compile(dialect=engine.dialect)
                try:
                    with engine.begin() as c:
                        c.exec_driver_sql(f'ALTER TABLE "{table.name}" ADD COLUMN "{col.name}" {kind}')
                except DBAPIError:  # another server added it at the same moment: fine if it is there now
                    if col.name not in {c["name"] for c in inspect(engine).get_columns(table.name)}:
                        raise
                    continue
                added.append(f"{table.name}.{col.name}")
    return added

