"""The panel store of a VAB expert study: experts, their queues (two protocols), answers.

Same durability rules as the Beauty Index store (both on the panel shell's tasks/panel/store.py, whose engine, errors and
token hashing it reuses): SQLite WAL + ``synchronous=FULL`` + ``BEGIN IMMEDIATE`` by default, or a
database URL; an answer's primary key is (study, expert, position), so a double click or a retried
POST records one answer; tokens and session cookies are stored as sha256 only.

Queue item = one task under one protocol: ``rank`` (pick best and, for 3+ images, worst) or
``score`` (0-10 per image, one decimal). ``shown_order`` is the stored positions (1-based) in the
order this expert sees them (space-separated); answers are kept in the shown order *and* mapped back.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, func, select
from sqlalchemy.exc import IntegrityError

from tasks.panel.db import identity_table, public_url
from tasks.panel.store import (
    NotInQueue,
    OutOfOrder,
    PanelError,
    StudyClosed,
    from_us,
    SqlStore,
    now_us,
    sha256_hex,
    study_database,
    to_us,
)

VAB_PANEL_DB_NAME = "panel.sqlite"
PROTOCOLS = ("rank", "score")

metadata = MetaData()
vstudies = Table(
    "vab_panel_studies", metadata,
    Column("study_id", String(64), primary_key=True),
    Column("sets", String(64), nullable=False),
    Column("state", String(16), nullable=False),  # open | closed
    Column("opened_at", BigInteger, nullable=False),
    Column("closed_at", BigInteger),
    Column("order_seed", BigInteger, nullable=False),
    Column("export_salt", String(64), nullable=False),
    Column("admin_token_sha256", String(64), nullable=False, unique=True),
)
vtasks = Table(
    "vab_panel_tasks", metadata,
    Column("study_id", String(64), primary_key=True),
    Column("task_id", String(128), primary_key=True),
    Column("domain", String(32), nullable=False),
    Column("n_images", Integer, nullable=False),
)
vimages = Table(
    "vab_panel_images", metadata,
    Column("study_id", String(64), primary_key=True),
    Column("image_id", String(64), primary_key=True),  # opaque, random
    Column("task_id", String(128), nullable=False),
    Column("stored_position", Integer, nullable=False),
    Column("source_sha256", String(64), nullable=False),
)
vexperts = Table(
    "vab_panel_experts", metadata,
    Column("study_id", String(64), primary_key=True),
    Column("label", String(64), primary_key=True),
    Column("token_sha256", String(64), nullable=False, unique=True),
)
vqueue = Table(
    "vab_panel_queue", metadata,
    Column("study_id", String(64), primary_key=True),
    Column("label", String(64), primary_key=True),
    Column("position", Integer, primary_key=True, autoincrement=False),
    Column("protocol", String(8), nullable=False),
    Column("task_id", String(128), nullable=False),
    Column("shown_order", String(32), nullable=False),  # stored positions as shown, e.g. "3 1 2"
    Column("shown_at", BigInteger),
)
vanswers = Table(
    "vab_panel_answers", metadata,
    Column("study_id", String(64), primary_key=True),
    Column("label", String(64), primary_key=True),
    Column("position", Integer, primary_key=True, autoincrement=False),
    Column("protocol", String(8), nullable=False),
    Column("task_id", String(128), nullable=False),
    Column("shown_order", String(32), nullable=False),
    Column("best_shown", Integer),
    Column("worst_shown", Integer),
    Column("scores_shown", String(64)),  # "7.5 3 9.1": one score per shown slot
    Column("shown_at", BigInteger, nullable=False),
    Column("answered_at", BigInteger, nullable=False),
)
vsessions = Table(
    "vab_panel_sessions", metadata,
    Column("session_sha256", String(64), primary_key=True),
    Column("study_id", String(64), nullable=False),
    Column("role", String(8), nullable=False),  # expert | admin
    Column("label", String(64)),
    Column("created_at", BigInteger, nullable=False),
)
identity_table(metadata)  # panel_store: the database's random id (tasks/panel/db.py)


@dataclass(frozen=True)
class VabItem:
    position: int
    total: int
    protocol: str
    task_id: str
    domain: str
    shown_order: tuple[int, ...]
    image_ids: tuple[str, ...]  # in the shown order
    shown_at: int


def order_text(order: Sequence[int]) -> str:
    return " ".join(str(int(i)) for i in order)


def parse_order(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split())


class VabPanelStore(SqlStore):
    """One VAB study's rows in a panel database."""

    STUDIES = vstudies
    SESSIONS = vsessions
    METADATA = metadata
    KIND = "VAB study"

    @classmethod
    def open(cls, study_dir: str | os.PathLike[str], study_id: str, database: str | None = None,
             busy_timeout_s: float = 10.0, *, create: bool = False) -> "VabPanelStore":
        """The study's database (``database``, else ``$IMAGEBENCH_PANEL_DATABASE``, else
        ``<study_dir>/panel.sqlite``), checked against the study's record of its store;
        ``create=True`` only for ``vab panel open``."""
        store = cls.find(study_dir, study_id, database, busy_timeout_s, create=create)
        if store is None:
            url = public_url(study_database(study_dir, database))
            raise PanelError(f"VAB study {study_id} has no panel in {url}: it was never opened there (imagebench vab panel open)")
        return store

    # ---- lifecycle ------------------------------------------------------------------------------
    def create_study(self, *, sets: str, order_seed: int, admin_token_sha256: str, opened_at: datetime,
                     task_rows: Sequence[dict], image_rows: Sequence[dict], expert_rows: Sequence[dict],
                     queues: dict[str, Sequence[dict]]) -> None:
        sid = self.study_id
        try:
            with self._tx() as c:
                c.execute(vstudies.insert().values(study_id=sid, sets=sets, state="open", opened_at=to_us(opened_at),
                                                   order_seed=order_seed, export_salt=secrets.token_hex(16),
                                                   admin_token_sha256=admin_token_sha256))
                c.execute(vtasks.insert(), [dict(r, study_id=sid) for r in task_rows])
                c.execute(vimages.insert(), [dict(r, study_id=sid) for r in image_rows])
                c.execute(vexperts.insert(), [dict(r, study_id=sid) for r in expert_rows])
                c.execute(vqueue.insert(), [dict(study_id=sid, label=label, position=i, protocol=q["protocol"],
                                                 task_id=q["task_id"], shown_order=order_text(q["shown_order"]))
                                            for label, items in queues.items() for i, q in enumerate(items)])
        except IntegrityError as exc:
            raise PanelError(f"VAB study {sid} already exists in the panel database") from exc

    def exists(self) -> bool:
        return self.study_row() is not None

    def _require_open(self, c) -> None:
        row = c.execute(select(vstudies.c.state).where(vstudies.c.study_id == self.study_id)).first()
        if row is None:
            raise PanelError(f"VAB study {self.study_id} is not in the panel database")
        if row.state != "open":
            raise StudyClosed(f"study {self.study_id} is closed: it accepts no answers")

    # ---- tokens and sessions --------------------------------------------------------------------
    def expert_for_token(self, token: str) -> str | None:
        with self._tx() as c:
            return c.execute(select(vexperts.c.label).where(vexperts.c.study_id == self.study_id,
                                                            vexperts.c.token_sha256 == sha256_hex(token))).scalar()

    def is_admin_token(self, token: str) -> bool:
        row = self.study_row()
        return row is not None and secrets.compare_digest(row["admin_token_sha256"], sha256_hex(token))

    # ---- queue and answers -------------------------------------------------------------------
    def _image_ids(self, c, task_id: str, order: Sequence[int]) -> tuple[str, ...]:
        rows = dict(c.execute(select(vimages.c.stored_position, vimages.c.image_id).where(
            vimages.c.study_id == self.study_id, vimages.c.task_id == task_id)).all())
        return tuple(rows[p] for p in order)

    def next_item(self, label: str) -> VabItem | None:
        """The expert's first unanswered item (None when done); ``shown_at`` set once, kept on reload."""
        sid = self.study_id
        with self._tx() as c:
            self._require_open(c)
            total = c.execute(select(func.count()).select_from(vqueue).where(vqueue.c.study_id == sid, vqueue.c.label == label)).scalar()
            done = c.execute(select(func.count()).select_from(vanswers).where(vanswers.c.study_id == sid, vanswers.c.label == label)).scalar()
            if done >= total:
                return None
            q = c.execute(select(vqueue).where(vqueue.c.study_id == sid, vqueue.c.label == label,
                                               vqueue.c.position == done)).mappings().first()
            shown = q["shown_at"]
            if shown is None:
                prev = c.execute(select(func.max(vanswers.c.answered_at)).where(vanswers.c.study_id == sid, vanswers.c.label == label)).scalar()
                shown = max(now_us(), prev or 0)
                slot = (vqueue.c.study_id == sid, vqueue.c.label == label, vqueue.c.position == done)
                c.execute(vqueue.update().where(*slot, vqueue.c.shown_at.is_(None)).values(shown_at=shown))
                shown = c.execute(select(vqueue.c.shown_at).where(*slot)).scalar()
            domain = c.execute(select(vtasks.c.domain).where(vtasks.c.study_id == sid, vtasks.c.task_id == q["task_id"])).scalar()
            order = parse_order(q["shown_order"])
            return VabItem(done, total, q["protocol"], q["task_id"], domain, order, self._image_ids(c, q["task_id"], order), shown)

    def image_in_queue(self, label: str, image_id: str) -> bool:
        with self._tx() as c:
            task = c.execute(select(vimages.c.task_id).where(vimages.c.study_id == self.study_id,
                                                             vimages.c.image_id == image_id)).scalar()
            return task is not None and c.execute(select(vqueue.c.position).where(
                vqueue.c.study_id == self.study_id, vqueue.c.label == label, vqueue.c.task_id == task)).first() is not None

    def record_answer(self, label: str, position: int, image_ids: Sequence[str], *, protocol: str,
                      best_shown: int | None = None, worst_shown: int | None = None,
                      scores_shown: Sequence[float] | None = None) -> bool:
        """Record one answer, durable on return. True: recorded now; False: already recorded (a
        double click or retried POST). The caller validated the values; the store checks the place:
        :class:`NotInQueue` (images not the ones of that position), :class:`OutOfOrder`, :class:`StudyClosed`."""
        sid = self.study_id
        with self._tx() as c:
            self._require_open(c)
            q = c.execute(select(vqueue).where(vqueue.c.study_id == sid, vqueue.c.label == label,
                                               vqueue.c.position == position).with_for_update()).mappings().first()
            if q is None or q["protocol"] != protocol or \
                    self._image_ids(c, q["task_id"], parse_order(q["shown_order"])) != tuple(image_ids):
                raise NotInQueue(f"these images are not item {position} of this expert's queue")
            if c.execute(select(vanswers.c.position).where(vanswers.c.study_id == sid, vanswers.c.label == label,
                                                            vanswers.c.position == position)).first():
                return False
            done = c.execute(select(func.count()).select_from(vanswers).where(vanswers.c.study_id == sid, vanswers.c.label == label)).scalar()
            if position != done:
                raise OutOfOrder(f"item {position} is not the next one (item {done} is)")
            prev = c.execute(select(func.max(vanswers.c.answered_at)).where(vanswers.c.study_id == sid, vanswers.c.label == label)).scalar()
            shown = q["shown_at"] if q["shown_at"] is not None else now_us()
            return self.insert_once(c, vanswers, dict(
                study_id=sid, label=label, position=position, protocol=protocol, task_id=q["task_id"],
                shown_order=q["shown_order"], best_shown=best_shown, worst_shown=worst_shown,
                scores_shown=None if scores_shown is None else " ".join(f"{s:g}" for s in scores_shown),
                shown_at=shown, answered_at=max(now_us(), shown, prev or 0)))

    def progress(self) -> list[dict]:
        sid = self.study_id
        with self._tx() as c:
            labels = list(c.execute(select(vexperts.c.label).where(vexperts.c.study_id == sid).order_by(vexperts.c.label)).scalars())
            out = []
            for label in labels:
                total = c.execute(select(func.count()).select_from(vqueue).where(vqueue.c.study_id == sid, vqueue.c.label == label)).scalar()
                done = c.execute(select(func.count()).select_from(vanswers).where(vanswers.c.study_id == sid, vanswers.c.label == label)).scalar()
                out.append({"label": label, "answered": done, "total": total})
        return out

    # ---- export -------------------------------------------------------------------------------
    def n_images(self) -> dict[str, int]:
        with self._tx() as c:
            return dict(c.execute(select(vtasks.c.task_id, vtasks.c.n_images).where(vtasks.c.study_id == self.study_id)).all())

    def expert_id(self, label: str) -> str:
        """The exported name of an expert: ``expert-<12 hex of sha256(salt + label)>`` (labels stay here)."""
        salt = self.study_row()["export_salt"]
        return "expert-" + hashlib.sha256((salt + label).encode()).hexdigest()[:12]

    def answer_rows(self) -> list[dict]:
        """Every answer mapped back to stored positions, with the exported expert id."""
        with self._tx() as c:
            rows = c.execute(select(vanswers).where(vanswers.c.study_id == self.study_id)
                             .order_by(vanswers.c.label, vanswers.c.position)).mappings().all()
        ids = {label: self.expert_id(label) for label in {r["label"] for r in rows}}
        out = []
        for r in rows:
            order = parse_order(r["shown_order"])
            d = {"expert": ids[r["label"]], "task_id": r["task_id"], "protocol": r["protocol"], "order": list(order),
                 "shown_at": from_us(r["shown_at"]), "answered_at": from_us(r["answered_at"])}
            if r["protocol"] == "rank":
                d.update(best_shown=r["best_shown"], worst_shown=r["worst_shown"], best=order[r["best_shown"] - 1],
                         worst=None if r["worst_shown"] is None else order[r["worst_shown"] - 1])
            else:
                shown = [float(x) for x in r["scores_shown"].split()]
                stored = [0.0] * len(order)
                for slot, pos in enumerate(order):
                    stored[pos - 1] = shown[slot]
                d.update(scores_shown=shown, scores=stored)
            out.append(d)
        return out
