"""What the units of work read back: a model's image set (staged or published), its OK images,
its HPSv3 scores, and the content fingerprint of its images."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas import lake as lake_schemas
from schemas.settings import Settings


def staged_dir(settings: Settings, model_id: str) -> Path:
    from tasks.store.storage import validate_model_id

    return settings.staging_dir / "ingest" / validate_model_id(model_id)


def model_images(settings: Settings, model_id: str) -> pa.Table:
    """The model's image set this run works on: the staged ingest when there is one, else the lake's."""
    from tasks.lake.tables import Lake

    staged = staged_dir(settings, model_id) / "images.parquet"
    if staged.is_file():
        return pq.read_table(staged, schema=lake_schemas.IMAGES)
    return Lake(settings.lake_dir).read("images", [model_id])


def content_fingerprint(images: pa.Table) -> str:
    """sha256 over the model's (prompt, state, image sha256) lines: what its result was computed
    from. Two listings with the same image bytes have the same content fingerprint."""
    lines = sorted(
        f"{p}\t{st}\t{sha or ''}"
        for p, st, sha in zip(
            images["prompt_id"].to_pylist(), images["state"].to_pylist(), images["image_sha256"].to_pylist()
        )
    )
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def ok_images(settings: Settings, model_id: str) -> pa.Table:
    images = model_images(settings, model_id)
    return images.filter(pc.equal(images["state"], "ok"))


def scores_for(settings: Settings, model_id: str, scorer_id: str) -> pa.Table:
    from tasks.lake.tables import Lake

    scores = Lake(settings.lake_dir).read("hps_scores", [model_id])
    return scores.filter(pc.equal(scores["scorer_id"], scorer_id))
