"""Where a study's answers come from: its panel store, or answers imported / simulated into the
lake. One study has one source (import refuses a study whose panel holds answers). The study's
secret salt for judge ids (:func:`study_salt`) is here too: every source hashes labels with it.

The study itself (study.yaml, pre-registration, folder) is loaded by ``tasks.beauty.study``; the
panel store is ``tasks.beauty.store.PanelStore``. Both are imported lazily: nothing here pulls in
torch, Prefect or GX.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from schemas.study import PreRegistration, StudyDefinition
from tasks.store.durable import create_new

SALT_FILE = "judge-salt"  # in the study folder; never exported, never logged


class StudyNotReady(RuntimeError):
    """The study cannot be analysed yet (no answers, or a plan that changed after answers arrived)."""


@dataclass(frozen=True)
class StudyContext:
    definition: StudyDefinition
    prereg: PreRegistration | None
    study_dir: Path
    prompt_ids: list[str]
    prompts: dict[str, str]  # prompt_id -> prompt text
    suite_sha256: str
    panel_database: str | None = None  # the setting (None: $IMAGEBENCH_PANEL_DATABASE or the folder's panel.sqlite)

    @property
    def study_id(self) -> str:
        return self.definition.study_id


def load_study_context(settings, study_id: str) -> StudyContext:
    from tasks.beauty.study import load_study
    from tasks.beauty.suite import load_beauty_suite

    definition, prereg, study_dir = load_study(settings, study_id)
    suite = load_beauty_suite(settings.reference_dir, definition.suite)
    return StudyContext(
        definition=definition, prereg=prereg, study_dir=Path(study_dir),
        prompt_ids=[p.prompt_id for p in suite.prompts], prompts={p.prompt_id: p.prompt for p in suite.prompts},
        suite_sha256=suite.sha256, panel_database=getattr(settings, "panel_database", None),
    )


def _open_store(ctx: StudyContext):
    """The study's panel store, or None when the study was never opened for the panel app. Read
    only: no database is created, and one other than the study's own is refused (naming both)."""
    from tasks.beauty.store import PanelStore

    store = PanelStore.find(ctx.study_dir, ctx.study_id, ctx.panel_database)
    if store is not None and not store.exists():
        store.dispose()
        return None
    return store


def study_salt(study_dir: Path) -> str:
    """The study's secret salt for judge ids, created once (0600) on first use."""
    path = Path(study_dir) / SALT_FILE
    salt = secrets.token_hex(32)
    if create_new(path, salt + "\n"):
        return salt
    salt = path.read_text().strip()
    if len(salt) < 32:
        raise ValueError(f"{path}: judge salt is shorter than 32 characters (corrupt?)") from None
    return salt


def has_panel_store(ctx: StudyContext) -> bool:
    """Whether the study was opened for the panel app."""
    store = _open_store(ctx)
    if store is None:
        return False
    store.dispose()
    return True


def panel_answers(ctx: StudyContext) -> pa.Table | None:
    """The panel store's answers (STUDY_ANSWERS, salted judge ids), or None without a store."""
    store = _open_store(ctx)
    if store is None:
        return None
    try:
        return store.answers_table(study_salt(ctx.study_dir))
    finally:
        store.dispose()


def panel_memos(ctx: StudyContext) -> list[dict]:
    """The memos kept with the judge's consent (object key, media type, label, position), or []."""
    store = _open_store(ctx)
    if store is None:
        return []
    try:
        return store.memo_rows()
    finally:
        store.dispose()


def panel_deviations(ctx: StudyContext) -> list[dict] | None:
    """The deviations from the pre-registration recorded in the panel store (a look at the
    results before the close, issue 27 item 5), oldest first; None without a store."""
    store = _open_store(ctx)
    if store is None:
        return None
    try:
        return store.deviations()
    finally:
        store.dispose()


def study_deviations(ctx: StudyContext) -> list[dict] | None:
    """The study's deviations from the pre-registration, oldest first: its panel store's, or, for a
    study imported from a bundle, the ones the bundle brought (tasks/beauty/bundles.py); None when
    the study has neither (never opened for the panel app, imported from a bundle without them)."""
    from tasks.beauty.bundles import imported_deviations

    found = panel_deviations(ctx)
    return found if found is not None else imported_deviations(ctx.study_dir)


def collect_answers(settings, ctx: StudyContext) -> pa.Table:
    """The answers to analyse: the panel store's when it holds any, else what was imported (or
    simulated) into the lake. Refuses a study without answers."""
    from tasks.beauty.tables import read_study_partition
    from tasks.lake.tables import Lake

    live = panel_answers(ctx)
    if live is not None and live.num_rows:
        return live
    stored = read_study_partition(Lake(settings.lake_dir), "study_answers", ctx.study_id)
    stored = stored.filter(pc.is_in(stored.column("source"), pa.array(["import", "simulated"])))
    if stored.num_rows:
        return stored
    raise StudyNotReady(
        f"study {ctx.study_id} has no answers yet: judges answer in the panel app (imagebench panel serve), "
        "or bring a CSV with imagebench study import-answers FILE --study ID"
    )


def verify_plan(settings, ctx: StudyContext) -> None:
    """Refuse to analyse a study whose plan changed after it was pinned at ``open``: the
    pre-registration's bytes must still match the study folder's SHA256SUMS and the study.yaml in
    force must be the definition it pinned (tasks.beauty.study.load_study checks both, now)."""
    from tasks.beauty.study import load_study

    load_study(settings, ctx.study_id)
