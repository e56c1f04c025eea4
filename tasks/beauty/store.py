"""The Beauty Index's panel store: its tables (studies, blinded images, judges, queues, answers,
memos' metadata, sessions) and ``PanelStore``, one study's rows, on the panel shell's
``SqlStore`` (tasks/panel/store.py: durability, transactions, tokens, errors).

Embedded SQLite in WAL mode by default (``<study_dir>/panel.sqlite``, ``synchronous=FULL``), or
PostgreSQL when several servers run (``IMAGEBENCH_PANEL_DATABASE``; tasks/panel/db.py). An
answer's primary key is (study, judge, position), so a double click or a retried POST can only
ever record one answer.
"""

from __future__ import annotations

import os
import secrets
import statistics
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import pyarrow as pa
from sqlalchemy import BigInteger, Boolean, Column, Float, Integer, MetaData, String, Table, func, select
from sqlalchemy.exc import IntegrityError

from schemas.study import STUDY_ANSWERS, salted_judge_id
from tasks.panel.db import identity_table, open_engine, public_url
from tasks.panel.timing import BrowserTiming, screen_time
from tasks.panel.store import (
    NextItem, NotInQueue, OutOfOrder, PanelError, SqlStore, StudyClosed, add_missing_columns, from_us, new_token, now_us,
    sha256_hex, study_database, to_us,
)

metadata = MetaData()
studies = Table(
    "panel_studies", metadata,
    Column("study_id", String(64), primary_key=True),
    Column("state", String(16), nullable=False),  # open | closed
    Column("opened_at", BigInteger, nullable=False),
    Column("closed_at", BigInteger),
    Column("order_seed", BigInteger, nullable=False),
    Column("memo", Boolean, nullable=False),
    Column("admin_token_sha256", String(64), nullable=False, unique=True),
)
images = Table(
    "panel_images", metadata,
    Column("study_id", String(64), primary_key=True),
    Column("image_id", String(64), primary_key=True),  # opaque, random
    Column("tool", String(128), nullable=False),
    Column("prompt_id", String(64), nullable=False),
    Column("source_sha256", String(64), nullable=False),
    Column("blind_sha256", String(64), nullable=False),
)
judges = Table(
    "panel_judges", metadata,
    Column("study_id", String(64), primary_key=True),
    Column("label", String(64), primary_key=True),
    Column("panel_group", String(64), nullable=False),
    Column("token_sha256", String(64), nullable=False, unique=True),
)
queue = Table(
    "panel_queue", metadata,
    Column("study_id", String(64), primary_key=True),
    Column("label", String(64), primary_key=True),
    Column("position", Integer, primary_key=True, autoincrement=False),
    Column("image_id", String(64), nullable=False),
    Column("shown_at", BigInteger),  # first time the server rendered it to the judge
    Column("image_served_at", BigInteger),  # first time the server sent the image's bytes to the judge (QC)
)
answers = Table(
    "panel_answers", metadata,
    Column("study_id", String(64), primary_key=True),
    Column("label", String(64), primary_key=True),
    Column("position", Integer, primary_key=True, autoincrement=False),
    Column("image_id", String(64), nullable=False),
    Column("answer", Boolean, nullable=False),
    Column("shown_at", BigInteger, nullable=False),
    Column("answered_at", BigInteger, nullable=False),
    Column("memo_id", String(64)),
    Column("image_served_at", BigInteger),  # copied from the queue: null = answered an image never loaded
    # The judge's browser's own times (ms from the page's time origin; tasks/panel/timing.py, issue
    # 27 item 4): image requested, image loaded (null: not loaded when answered), answered. All
    # null: the page sent none (no script), the server's times stand alone.
    Column("browser_request_ms", Float),
    Column("browser_loaded_ms", Float),
    Column("browser_answer_ms", Float),
)
memos = Table(
    "panel_memos", metadata,
    Column("study_id", String(64), primary_key=True),
    Column("memo_id", String(64), primary_key=True),
    Column("label", String(64), nullable=False),
    Column("position", Integer, nullable=False),
    Column("object_key", String(1024), nullable=False),
    Column("media_type", String(64), nullable=False),
    Column("byte_size", Integer, nullable=False),
    Column("consent", Boolean, nullable=False),  # to keeping it with the answer (the upload needs it)
    Column("uploaded_at", BigInteger, nullable=False),
    # When the judge also ticked the separate consent to publishing the recording in the open-data
    # bundle (schemas.study.MEMO_PUBLISH_CONSENT); null = never published (issue 27 item 1).
    Column("publish_consent_at", BigInteger),
)
sessions = Table(
    "panel_sessions", metadata,
    Column("session_sha256", String(64), primary_key=True),
    Column("study_id", String(64), nullable=False),
    Column("role", String(8), nullable=False),  # judge | admin
    Column("label", String(64)),
    Column("created_at", BigInteger, nullable=False),
)
# Deviations from the pre-registration (issue 27 item 5): each look at the results before the close,
# with its typed reason. Written once; no code path updates or deletes a row. The export publishes
# them (tasks/beauty/prereg.py: deviations.json and the datasheet).
deviations = Table(
    "panel_deviations", metadata,
    Column("study_id", String(64), primary_key=True),
    Column("deviation_id", String(64), primary_key=True),
    Column("at", BigInteger, nullable=False),
    Column("kind", String(64), nullable=False),
    Column("reason", String(2000), nullable=False),
    Column("answers", Integer, nullable=False),  # answers recorded when it happened
    Column("by", String(32), nullable=False),  # "admin page" | "command line"
)
identity_table(metadata)  # panel_store: the database's random id (tasks/panel/db.py)


class PanelStore(SqlStore):
    """One study's rows in a panel database. Open with :meth:`open`."""

    STUDIES = studies
    SESSIONS = sessions
    METADATA = metadata

    # ---- opening ----------------------------------------------------------------------------
    @classmethod
    def open(cls, study_dir_or_url: str | os.PathLike[str], study_id: str | None = None,
             database: str | None = None, busy_timeout_s: float = 10.0, *, create: bool = False) -> "PanelStore":
        """``open(study_dir)``: the study's database (``database``, else ``$IMAGEBENCH_PANEL_DATABASE``,
        else ``<study_dir>/panel.sqlite``), study id = the folder's name, checked against the study's
        record of its store (tasks/panel/db.py); ``create=True`` only for ``study open``.
        ``open(url, study_id=...)``: a database URL directly (tables created)."""
        text = os.fspath(study_dir_or_url)
        if "://" in text:
            if not study_id:
                raise ValueError(f"PanelStore.open({text.split('://')[0]}://...): a database URL needs study_id")
            engine = open_engine(text, metadata, busy_timeout_s)
            add_missing_columns(engine, metadata)
            return cls(engine, study_id)
        store = cls.find(text, study_id, database, busy_timeout_s, create=create)
        if store is None:
            url = public_url(study_database(text, database))
            raise PanelError(f"study {study_id or Path(text).name} has no panel in {url}: it was never opened there "
                             "(imagebench study open)")
        return store

    # ---- study lifecycle ------------------------------------------------------------------
    def exists(self) -> bool:
        with self._tx() as c:
            return c.execute(select(studies.c.study_id).where(studies.c.study_id == self.study_id)).first() is not None

    def create_study(self, *, order_seed: int, memo: bool, admin_token_sha256: str, opened_at: datetime,
                     image_rows: Sequence[dict], judge_rows: Sequence[dict], queues: dict[str, Sequence[str]]) -> None:
        """Everything ``study open`` decides, in one transaction (all or nothing)."""
        sid = self.study_id
        try:
            with self._tx() as c:
                c.execute(studies.insert().values(study_id=sid, state="open", opened_at=to_us(opened_at),
                                                  order_seed=order_seed, memo=memo, admin_token_sha256=admin_token_sha256))
                c.execute(images.insert(), [dict(r, study_id=sid) for r in image_rows])
                c.execute(judges.insert(), [dict(r, study_id=sid) for r in judge_rows])
                c.execute(queue.insert(), [dict(study_id=sid, label=label, position=i, image_id=img)
                                           for label, ids in queues.items() for i, img in enumerate(ids)])
        except IntegrityError as exc:
            raise PanelError(f"study {sid} already exists in the panel database") from exc

    def _require_open(self, c) -> dict:
        row = c.execute(select(studies).where(studies.c.study_id == self.study_id)).mappings().first()
        if row is None:
            raise PanelError(f"study {self.study_id} is not open (no such study in the panel database)")
        if row["state"] != "open":
            raise StudyClosed(f"study {self.study_id} is closed: it accepts no answers")
        return dict(row)

    # ---- tokens and sessions ----------------------------------------------------------------
    def judge_for_token(self, token: str) -> str | None:
        with self._tx() as c:
            return c.execute(select(judges.c.label).where(judges.c.study_id == self.study_id,
                                                          judges.c.token_sha256 == sha256_hex(token))).scalar()

    def is_admin_token(self, token: str) -> bool:
        with self._tx() as c:
            got = c.execute(select(studies.c.admin_token_sha256).where(studies.c.study_id == self.study_id)).scalar()
        return got is not None and secrets.compare_digest(got, sha256_hex(token))

    # ---- a judge's queue ------------------------------------------------------------------
    def queue_of(self, label: str) -> list[str]:
        with self._tx() as c:
            return list(c.execute(select(queue.c.image_id).where(queue.c.study_id == self.study_id, queue.c.label == label)
                                  .order_by(queue.c.position)).scalars())

    def next_item(self, label: str) -> NextItem | None:
        """The first unanswered image of the judge's queue (None when done); its ``shown_at`` is
        set the first time it is served and kept on a reload (resuming shows the same image)."""
        sid = self.study_id
        with self._tx() as c:
            self._require_open(c)
            total = c.execute(select(func.count()).select_from(queue).where(queue.c.study_id == sid, queue.c.label == label)).scalar()
            done = c.execute(select(func.count()).select_from(answers).where(answers.c.study_id == sid, answers.c.label == label)).scalar()
            if done >= total:
                return None
            row = c.execute(select(queue.c.image_id, queue.c.shown_at).where(
                queue.c.study_id == sid, queue.c.label == label, queue.c.position == done)).first()
            shown = row.shown_at
            if shown is None:
                # Monotonic: never before the previous answer (a wall clock stepping back).
                prev = c.execute(select(func.max(answers.c.answered_at)).where(answers.c.study_id == sid, answers.c.label == label)).scalar()
                shown = max(now_us(), prev or 0)
                # Only if still unset: two concurrent first GETs (PostgreSQL) keep the first time.
                slot = (queue.c.study_id == sid, queue.c.label == label, queue.c.position == done)
                c.execute(queue.update().where(*slot, queue.c.shown_at.is_(None)).values(shown_at=shown))
                shown = c.execute(select(queue.c.shown_at).where(*slot)).scalar()
            return NextItem(done, row.image_id, total, shown)

    def progress_of(self, label: str) -> tuple[int, int]:
        sid = self.study_id
        with self._tx() as c:
            total = c.execute(select(func.count()).select_from(queue).where(queue.c.study_id == sid, queue.c.label == label)).scalar()
            done = c.execute(select(func.count()).select_from(answers).where(answers.c.study_id == sid, answers.c.label == label)).scalar()
        return done, total

    def image_in_queue(self, label: str, image_id: str) -> bool:
        with self._tx() as c:
            return c.execute(select(queue.c.position).where(queue.c.study_id == self.study_id, queue.c.label == label,
                                                            queue.c.image_id == image_id)).first() is not None

    def serve_image(self, label: str, image_id: str) -> bool:
        """Whether the judge may be sent this image's bytes now (in their queue, study open); the
        first time, its queue row records when (``image_served_at``: the answer's QC evidence that
        the image was loaded, and the start of its time on screen)."""
        sid = self.study_id
        with self._tx() as c:
            row = c.execute(select(studies.c.state).where(studies.c.study_id == sid)).first()
            if row is None or row.state != "open":
                return False
            where = (queue.c.study_id == sid, queue.c.label == label, queue.c.image_id == image_id)
            if c.execute(select(queue.c.position).where(*where)).first() is None:
                return False
            c.execute(queue.update().where(*where, queue.c.image_served_at.is_(None)).values(image_served_at=now_us()))
        return True

    def relink_judge(self, label: str) -> str:
        """A new link for a judge who lost theirs: the new token's hash replaces the old one (the
        old link dies) and the judge's sessions end. Returns the token (shown once)."""
        token = new_token()
        with self._tx() as c:
            self._require_open(c)
            n = c.execute(judges.update().where(judges.c.study_id == self.study_id, judges.c.label == label)
                          .values(token_sha256=sha256_hex(token))).rowcount
            if n != 1:
                raise PanelError(f"study {self.study_id} has no judge {label!r}")
            c.execute(sessions.delete().where(sessions.c.study_id == self.study_id, sessions.c.role == "judge",
                                              sessions.c.label == label))
        return token

    def record_answer(self, label: str, position: int, image_id: str, answer: bool, memo_id: str | None = None,
                      timing: BrowserTiming | None = None) -> bool:
        """Record one answer, durable when this returns. True: recorded now; False: this exact
        answer slot was already recorded (a double click or a retried POST: nothing is added).
        ``timing``: the browser's times sent with it (time on screen, tasks/panel/timing.py).
        Raises :class:`NotInQueue` for an image not at that place of the judge's queue,
        :class:`OutOfOrder` for skipping ahead, :class:`StudyClosed` once closed."""
        sid = self.study_id
        with self._tx() as c:
            self._require_open(c)
            # FOR UPDATE (PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises): a second POST of
            # the same answer waits here for the first, then sees its row below.
            q = c.execute(select(queue.c.image_id, queue.c.shown_at, queue.c.image_served_at).where(
                queue.c.study_id == sid, queue.c.label == label, queue.c.position == position).with_for_update()).first()
            if q is None or q.image_id != image_id:
                raise NotInQueue(f"image {image_id!r} is not at position {position} of this judge's queue")
            if c.execute(select(answers.c.position).where(answers.c.study_id == sid, answers.c.label == label,
                                                           answers.c.position == position)).first():
                return False  # already answered: no going back to change it, no duplicate
            done = c.execute(select(func.count()).select_from(answers).where(answers.c.study_id == sid, answers.c.label == label)).scalar()
            if position != done or q.shown_at is None:
                raise OutOfOrder(f"position {position} is not the judge's current image (next is {done})")
            if memo_id is not None:
                m = c.execute(select(memos.c.label, memos.c.position).where(memos.c.study_id == sid, memos.c.memo_id == memo_id)).first()
                if m is None or m.label != label or m.position != position:
                    raise NotInQueue("that memo does not belong to this answer")
            return self.insert_once(c, answers, dict(study_id=sid, label=label, position=position, image_id=image_id,
                                                     answer=answer, shown_at=q.shown_at,
                                                     answered_at=max(now_us(), q.shown_at), memo_id=memo_id,
                                                     image_served_at=q.image_served_at,
                                                     browser_request_ms=timing.request_ms if timing else None,
                                                     browser_loaded_ms=timing.loaded_ms if timing else None,
                                                     browser_answer_ms=timing.answer_ms if timing else None))

    def record_memo(self, label: str, position: int, memo_id: str, object_key: str, media_type: str, byte_size: int,
                    publish: bool = False) -> None:
        """A memo uploaded with the judge's consent, for the judge's current (unanswered) image;
        ``publish``: the judge also gave the separate consent to publishing the recording, recorded
        with its time."""
        sid = self.study_id
        with self._tx() as c:
            self._require_open(c)
            done = c.execute(select(func.count()).select_from(answers).where(answers.c.study_id == sid, answers.c.label == label)).scalar()
            if position != done:
                raise OutOfOrder(f"a memo can only go with the judge's current image (position {done})")
            now = now_us()
            c.execute(memos.insert().values(study_id=sid, memo_id=memo_id, label=label, position=position,
                                            object_key=object_key, media_type=media_type, byte_size=byte_size,
                                            consent=True, uploaded_at=now, publish_consent_at=now if publish else None))

    # ---- admin and export -----------------------------------------------------------------
    def judge_progress(self) -> list[dict]:
        """Each judge's progress, nothing of their answers' content: answered of total, the last
        answer's time, the last sign of life (an answer, or the current image shown or sent) and the
        median download time of their images as their browser measured it (None: never measured;
        tasks/panel/timing.py). What the admin page shows while the PI stays blind (issue 27 item 5)."""
        sid = self.study_id
        with self._tx(read_only=True) as c:
            total = dict(c.execute(select(queue.c.label, func.count()).where(queue.c.study_id == sid).group_by(queue.c.label)).all())
            rows = c.execute(select(judges.c.label, judges.c.panel_group).where(judges.c.study_id == sid).order_by(judges.c.label)).all()
            got = c.execute(select(answers.c.label, answers.c.answered_at, answers.c.image_served_at, *_BROWSER_TIMES)
                            .where(answers.c.study_id == sid)).all()
            # The queue's latest shown/sent time per judge: the current image counts as activity.
            seen = dict(c.execute(select(queue.c.label, func.max(func.coalesce(queue.c.image_served_at, queue.c.shown_at)))
                                  .where(queue.c.study_id == sid).group_by(queue.c.label)).all())
        done: dict[str, int] = {}
        last: dict[str, int] = {}
        downloads: dict[str, list[int]] = {}
        for r in got:
            done[r.label] = done.get(r.label, 0) + 1
            last[r.label] = max(last.get(r.label, 0), r.answered_at)
            d = screen_time(r.image_served_at, r.answered_at, _timing(r)).download_us
            if d is not None:
                downloads.setdefault(r.label, []).append(d)
        out = []
        for r in rows:
            activity = max([t for t in (last.get(r.label), seen.get(r.label)) if t is not None], default=None)
            ds = sorted(downloads.get(r.label, []))
            out.append({"label": r.label, "group": r.panel_group, "answered": done.get(r.label, 0),
                        "total": total.get(r.label, 0),
                        "last_answer_at": from_us(last[r.label]) if r.label in last else None,
                        "last_activity_us": activity,
                        "median_download_s": statistics.median(ds) / 1e6 if ds else None,
                        "downloads_measured": len(ds)})
        return out

    def pair_counts(self) -> list[dict]:
        """Answers and yes per (tool, prompt), every image of the study listed (zeros included)."""
        sid = self.study_id
        j = answers.join(images, (answers.c.study_id == images.c.study_id) & (answers.c.image_id == images.c.image_id))
        with self._tx() as c:
            got = {(r.tool, r.prompt_id): (r.n, r.yes) for r in c.execute(
                select(images.c.tool, images.c.prompt_id, func.count().label("n"),
                       func.sum(answers.c.answer.cast(Integer)).label("yes"))
                .select_from(j).where(answers.c.study_id == sid).group_by(images.c.tool, images.c.prompt_id))}
            pairs = c.execute(select(images.c.tool, images.c.prompt_id).where(images.c.study_id == sid)
                              .distinct().order_by(images.c.tool, images.c.prompt_id)).all()
        return [{"tool": t, "prompt_id": p, "answers": got.get((t, p), (0, 0))[0], "yes": int(got.get((t, p), (0, 0))[1] or 0)}
                for t, p in pairs]

    def record_deviation(self, kind: str, reason: str, by: str) -> dict:
        """Record a deviation from the pre-registration (a look at the results before the close)
        with its reason and the number of answers then; refused once the study is closed (the
        results are then the study's, no deviation). Returns the row as :meth:`deviations` gives it."""
        deviations.create(self.engine, checkfirst=True)  # a panel database created before this table
        sid = self.study_id
        with self._tx() as c:
            self._require_open(c)
            n = c.execute(select(func.count()).select_from(answers).where(answers.c.study_id == sid)).scalar()
            row = dict(study_id=sid, deviation_id=secrets.token_hex(8), at=now_us(), kind=kind, reason=reason, answers=n, by=by)
            c.execute(deviations.insert().values(**row))
        return _deviation(row)

    def deviations(self) -> list[dict]:
        """Every recorded deviation of the study, oldest first: at (UTC), kind, reason, answers, by."""
        from sqlalchemy import inspect

        if not inspect(self.engine).has_table(deviations.name):
            return []
        with self._tx(read_only=True) as c:
            rows = c.execute(select(deviations).where(deviations.c.study_id == self.study_id)
                             .order_by(deviations.c.at, deviations.c.deviation_id)).mappings().all()
        return [_deviation(r) for r in rows]

    def answer_count(self) -> int:
        with self._tx() as c:
            return c.execute(select(func.count()).select_from(answers).where(answers.c.study_id == self.study_id)).scalar()

    def first_answer_at(self) -> datetime | None:
        with self._tx() as c:
            us = c.execute(select(func.min(answers.c.answered_at)).where(answers.c.study_id == self.study_id)).scalar()
        return from_us(us) if us is not None else None

    def image_rows(self) -> list[dict]:
        with self._tx() as c:
            return [dict(r) for r in c.execute(select(images).where(images.c.study_id == self.study_id)
                                               .order_by(images.c.tool, images.c.prompt_id)).mappings()]

    def memo_rows(self, linked_only: bool = True) -> list[dict]:
        """Memos kept (consent given). ``linked_only`` (the export): only the memo each answer
        names in its ``memo_id``, so a memo recorded then abandoned (a reload, a second take) is
        never attributed to an answer: at most one per (judge, position), exactly the linked one."""
        q = select(memos).where(memos.c.study_id == self.study_id, memos.c.consent.is_(True))
        if linked_only:
            q = q.join(answers, (answers.c.study_id == memos.c.study_id) & (answers.c.memo_id == memos.c.memo_id)
                       & (answers.c.label == memos.c.label) & (answers.c.position == memos.c.position))
        with self._tx() as c:
            return [dict(r) for r in c.execute(q.order_by(memos.c.label, memos.c.position, memos.c.uploaded_at)).mappings()]

    def answers_table(self, salt: str) -> pa.Table:
        """Every panel answer, schema ``schemas.study.STUDY_ANSWERS``; ``judge_id`` is
        sha256(salt + label): the label itself never leaves the store."""
        if not salt:
            raise ValueError("answers_table needs a non-empty salt (judge ids are salted hashes)")
        sid = self.study_id
        j = (answers.join(images, (answers.c.study_id == images.c.study_id) & (answers.c.image_id == images.c.image_id))
             .join(judges, (answers.c.study_id == judges.c.study_id) & (answers.c.label == judges.c.label)))
        with self._tx() as c:
            rows = c.execute(select(answers.c.label, judges.c.panel_group, images.c.tool, images.c.prompt_id,
                                    answers.c.image_id, answers.c.position, answers.c.answer, answers.c.shown_at,
                                    answers.c.answered_at, answers.c.memo_id, answers.c.image_served_at,
                                    *_BROWSER_TIMES)
                             .select_from(j).where(answers.c.study_id == sid)
                             .order_by(answers.c.label, answers.c.position)).all()
        out = [{"study_id": sid, "judge_id": salted_judge_id(salt, r.label),
                "panel_group": r.panel_group, "tool": r.tool, "prompt_id": r.prompt_id, "image_id": r.image_id,
                "position": r.position, "answer": bool(r.answer), "shown_at": from_us(r.shown_at),
                "answered_at": from_us(r.answered_at), "memo": r.memo_id is not None, "source": "panel",
                **answer_quality(r.image_served_at, r.answered_at, _timing(r))} for r in rows]
        return pa.Table.from_pylist(out, schema=STUDY_ANSWERS)


def _deviation(row) -> dict:
    return {"at": from_us(row["at"]), "kind": row["kind"], "reason": row["reason"], "answers": row["answers"], "by": row["by"]}


_BROWSER_TIMES = (answers.c.browser_request_ms, answers.c.browser_loaded_ms, answers.c.browser_answer_ms)


def _timing(row) -> BrowserTiming | None:
    """The browser's times stored with an answer (None when its page sent none)."""
    if row.browser_answer_ms is None:
        return None
    return BrowserTiming(row.browser_request_ms, row.browser_loaded_ms, row.browser_answer_ms)


def answer_quality(image_served_at: int | None, answered_at: int, timing: BrowserTiming | None = None) -> dict:
    """QC evidence of one answer: whether the image was on screen before the answer (the server
    had sent its bytes and, when the page said, the browser had loaded them) and for how many
    seconds: from the browser's load event to the answer, bounded by the server's window, or that
    window itself when the page sent no times (tasks/panel/timing.py, issue 27 item 4)."""
    seen = screen_time(image_served_at, answered_at, timing)
    return {"image_loaded": seen.loaded,
            "seconds_on_screen": seen.on_screen_us / 1e6 if seen.loaded and seen.on_screen_us is not None else None}
