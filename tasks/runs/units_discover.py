"""Discovery (the nightly's plan: which models are new, changed or current) and the commit of a model."""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from schemas.reference import ReferenceFile
from schemas.settings import Settings
from tasks.runs.reads import content_fingerprint, model_images
from tasks.runs.units_aggregate import aggregate_model
from tasks.runs.units_hps import publish_hps_scores
from tasks.runs.units_ingest import (
    commit_staged_images,
    open_configured_store,
)
from tasks.runs.units_judge import publish_judgements
from tasks.scores.suite import Suite


@dataclass(frozen=True)
class ModelPlan:
    model_id: str
    status: str  # "candidate" (to ingest) | "up_to_date" | "invalid" (no model of the suite: skipped) | "retired"
    fingerprint: str | None  # listing fingerprint of the object store now
    detail: str = ""


def _result_fingerprints(
    settings: Settings, suite: Suite, reference: ReferenceFile, model_ids: list[str] | None = None
) -> dict[str, str | None]:
    """model -> content fingerprint its current result (suite, reference, scorer) was computed from."""
    from tasks.lake.tables import Lake

    scores = Lake(settings.lake_dir).read("model_scores", model_ids)
    out: dict[str, str | None] = {}
    for m, sv, rv, sid, fp in zip(
        scores["model_id"].to_pylist(),
        scores["suite_version"].to_pylist(),
        scores["reference_version"].to_pylist(),
        scores["scorer_id"].to_pylist(),
        scores["source_fingerprint"].to_pylist(),
    ):
        if sv == suite.version and rv == reference.version and sid == reference.scorer_id:
            out[m] = fp
    return out


def discover_models(settings: Settings, suite: Suite, reference: ReferenceFile) -> list[ModelPlan]:
    """Every model folder of the object store, and whether it must be ingested this run.

    A model is up to date (not even downloaded) when its object listing (keys, sizes, ETags) is
    the one its lake images were ingested from AND it has a result under this suite, reference
    and scorer computed from exactly those images (content fingerprint). Anything else is a
    candidate: ingest hashes the bytes and :func:`classify` says what to do.

    A folder that is no model of the suite is "invalid", with why: a name that is no model id, an
    empty folder, or objects of which none names a prompt of the suite (a Beauty Index tool's
    images in the layout before issue 26 item 2, stray files; tasks.runs.models.not_a_model) and
    no image of it ever ingested. The nightly skips it with that line; the run goes on.
    """
    from tasks.lake.tables import Lake
    from tasks.runs.models import nightly_skip, retired_models
    from tasks.scores.suite import prompt_ids_by_suite
    from tasks.store.storage import (
        InvalidModelId,
        is_model_id,
        listing_fingerprint,
        validate_model_id,
    )

    store = open_configured_store(settings)
    names = sorted(store.list_models())  # only these models' results are read: not the whole lake
    results = _result_fingerprints(settings, suite, reference, [m for m in names if is_model_id(m)])
    lake = Lake(settings.lake_dir)
    retired = retired_models(lake)
    suites = prompt_ids_by_suite(settings.reference_dir)
    suites[suite.version] = frozenset(suite.by_id)  # the run's own suite, whatever its file holds
    plans = []
    for model_id in names:
        try:
            validate_model_id(model_id)
        except InvalidModelId as exc:
            plans.append(ModelPlan(model_id, "invalid", None, str(exc)))
            continue
        if model_id in retired:  # `imagebench models retire`: kept in the lake, not scored
            plans.append(ModelPlan(model_id, "retired", None, f"retired: {retired[model_id]['reason']}"))
            continue
        objects = store.list_model_objects(model_id)
        why = nightly_skip(lake, model_id, [o.key for o in objects], suite.version, suites)
        if why:  # `imagebench models list` shows the same line (tasks.runs.models.list_models)
            plans.append(ModelPlan(model_id, "invalid", None, why))
            continue
        fp = listing_fingerprint(objects)
        status = "candidate"
        if model_id in results:
            images = lake.read("images", [model_id])
            ingested_from = set(images["source_fingerprint"].to_pylist())
            if ingested_from == {fp} and results[model_id] == content_fingerprint(images):
                status = "up_to_date"
        plans.append(ModelPlan(model_id, status, fp))
    return plans


def classify(settings: Settings, suite: Suite, reference: ReferenceFile, model_id: str) -> str:
    """What the freshly staged image set of a model means for its result (see
    schemas.lake.MODEL_DISPOSITIONS): "new", "incremental", "replaced" or "unchanged"."""
    from tasks.store.durable import atomic_write
    from tasks.lake.tables import Lake

    recorded = _result_fingerprints(settings, suite, reference, [model_id]).get(model_id)
    if recorded is None:
        return "new"
    staged = model_images(settings, model_id)
    staged_fingerprint = content_fingerprint(staged)
    if staged_fingerprint == recorded:
        _drop_disposition_note(settings, model_id)  # left by a run killed after its result
        return "unchanged"
    # A run killed mid-commit may already have put this image set in the lake, which then no
    # longer holds the images the result came from: the first classification of this image set
    # against this result is noted and reused on resume, until the new result is written.
    note_path = _disposition_note(settings, model_id)
    key = {"staged": staged_fingerprint, "result": recorded}
    with contextlib.suppress(OSError, ValueError):
        note = json.loads(note_path.read_text())
        if {k: note.get(k) for k in key} == key and note.get("disposition") in ("incremental", "replaced"):
            return note["disposition"]
    before = Lake(settings.lake_dir).read("images", [model_id])
    now = {p: sha for p, st, sha in zip(staged["prompt_id"].to_pylist(), staged["state"].to_pylist(), staged["image_sha256"].to_pylist()) if st == "ok"}
    kept = all(
        now.get(p) == sha
        for p, st, sha in zip(before["prompt_id"].to_pylist(), before["state"].to_pylist(), before["image_sha256"].to_pylist())
        if st == "ok"
    )
    disposition = "incremental" if kept else "replaced"
    note_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(note_path, json.dumps({**key, "disposition": disposition}).encode())
    return disposition


def _disposition_note(settings: Settings, model_id: str) -> Path:
    """Outside the model's stages: it must outlive `drop_model_staging`, which runs before the
    result is written; `commit_model` removes it once the result is in place."""
    from tasks.store.storage import validate_model_id

    return settings.staging_dir / "disposition" / validate_model_id(model_id) / "disposition.json"


def _drop_disposition_note(settings: Settings, model_id: str) -> None:
    shutil.rmtree(_disposition_note(settings, model_id).parent, ignore_errors=True)


@dataclass(frozen=True)
class CommitResult:
    row: dict | None  # the model_scores row (None when not aggregated)
    hps_rows: int
    verdicts: int


def commit_model(
    settings: Settings,
    suite: Suite,
    reference: ReferenceFile | None,
    model_id: str,
    scorer_id: str,
    hps_shards: list[Path],
    judge_shards: list[Path | None],
    run_id: str,
) -> CommitResult:
    """Publish one model's run to the lake in one step, result last.

    Order: images + quarantine (the staged ingest), hps_scores, judge_calls + verdicts, then the
    model_scores row, which is what the leaderboard reads: a model's old result is replaced by a
    single atomic rename, after everything it is computed from is in place. Each file is itself
    replaced atomically and each step is idempotent, so a run killed anywhere in here commits the
    same thing again when resumed (tests/flows/test_operations.py kills it at every step).
    """
    commit_staged_images(settings, model_id)
    hps_rows = publish_hps_scores(settings, suite, model_id, scorer_id, hps_shards)
    verdicts = publish_judgements(settings, model_id, judge_shards)
    # Everything the result is computed from is in the lake now. The model's staging (this run's
    # and whatever a killed run left that this run did not need) goes before the result is
    # written, so no model ever has a result next to stale staging.
    drop_model_staging(settings, model_id)
    row = aggregate_model(settings, suite, reference, model_id, run_id, None) if reference is not None else None
    if row is not None:
        _drop_disposition_note(settings, model_id)
    return CommitResult(row, hps_rows, verdicts)


def drop_model_staging(settings: Settings, model_id: str) -> None:
    """Remove one model's staged ingest, HPSv3 shards and judge shards, temp files included."""
    from tasks.store.storage import validate_model_id

    for stage in ("ingest", "hps", "judge"):
        shutil.rmtree(settings.staging_dir / stage / validate_model_id(model_id), ignore_errors=True)
