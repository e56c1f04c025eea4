"""The ingest unit: validate a model's objects, stage and publish ``images`` and ``quarantine``."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.parquet as pq

from schemas import lake as lake_schemas
from schemas.settings import Settings
from tasks.store.durable import write_parquet_atomic
from tasks.runs import progress
from tasks.runs.reads import staged_dir
from tasks.scores.suite import Suite, other_suite_prompt_ids


@dataclass(frozen=True)
class IngestSummary:
    model_id: str
    fingerprint: str
    images_ok: int
    images_quarantined: int
    images_missing: int
    objects_quarantined: int


def open_configured_store(settings: Settings):
    from tasks.store.storage import open_store

    return open_store(settings.store_uri, endpoint=settings.s3_endpoint, region=settings.s3_region)


def ingest_and_stage(settings: Settings, suite: Suite, model_id: str) -> IngestSummary:
    """Validate every object of one model into staged `images` / `quarantine` tables.

    Nothing reaches the lake here: the model's new image set is committed together with its
    scores by :func:`commit_model`, so readers never see new images next to old results.
    """
    from tasks.lake.validation import require_valid
    from tasks.store.ingest import ingest_model
    from tasks.store.storage import validate_model_id

    validate_model_id(model_id)
    store = open_configured_store(settings)
    result = ingest_model(
        store,
        model_id,
        suite,
        settings.home,
        progress=lambda total, n=1: progress.advance(f"ingest {model_id}", total, n),
        other_suites=other_suite_prompt_ids(settings.reference_dir, suite.version),
    )
    from tasks.lake.tables import Lake
    from tasks.runs.models import check_model_folder, require_objects

    # No object at all: a typo or a wrong store/prefix, never 192 'missing' rows (nothing staged);
    # only other suites' images: not a model of this suite (the listing again, only then, says so).
    if not result.n_objects:
        check_model_folder(store, Lake(settings.lake_dir), model_id, suite.version, settings.reference_dir)
    require_objects(store, Lake(settings.lake_dir), model_id, result.n_objects)
    require_valid("images", result.images)
    require_valid("quarantine", result.quarantine)
    staged = staged_dir(settings, model_id)
    write_parquet_atomic(result.quarantine, staged / "quarantine.parquet")
    write_parquet_atomic(result.images, staged / "images.parquet")  # last: its presence marks a complete stage
    states = result.images.column("state").to_pylist()
    return IngestSummary(
        model_id=model_id,
        fingerprint=result.fingerprint,
        images_ok=states.count("ok"),
        images_quarantined=states.count("quarantined"),
        images_missing=states.count("missing"),
        objects_quarantined=result.quarantine.num_rows,
    )


def commit_staged_images(settings: Settings, model_id: str) -> bool:
    """Publish a staged ingest (`images` + `quarantine`) to the lake; False when none is staged."""
    from tasks.lake.tables import Lake

    staged = staged_dir(settings, model_id)
    if not (staged / "images.parquet").is_file():
        return False
    lake = Lake(settings.lake_dir)
    lake.write_partition("quarantine", model_id, pq.read_table(staged / "quarantine.parquet", schema=lake_schemas.QUARANTINE))
    lake.write_partition("images", model_id, pq.read_table(staged / "images.parquet", schema=lake_schemas.IMAGES))
    return True


def drop_staged_images(settings: Settings, model_id: str) -> None:
    staged = staged_dir(settings, model_id)
    for name in ("images.parquet", "quarantine.parquet"):  # images first: it marks the stage
        (staged / name).unlink(missing_ok=True)


def ingest_and_publish(settings: Settings, suite: Suite, model_id: str) -> IngestSummary:
    """Ingest one model and publish its `images` and `quarantine` partitions at once
    (`imagebench ingest`; the flows stage and commit with the scores instead)."""
    summary = ingest_and_stage(settings, suite, model_id)
    commit_staged_images(settings, model_id)
    drop_staged_images(settings, model_id)
    return summary


