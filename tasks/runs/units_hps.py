"""The HPSv3 units: plan batches, score one batch to a staging shard (a crashed run resumes from
them), publish ``hps_scores``."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schemas import lake as lake_schemas
from schemas.settings import Settings
from tasks.store.durable import write_parquet_atomic
from tasks.runs import progress
from tasks.runs.pinned import ScorerSpec, get_scorer
from tasks.runs.reads import ok_images, scores_for
from tasks.runs.run_ids import utcnow
from tasks.scores.suite import Suite


@dataclass(frozen=True)
class HpsItem:
    prompt_id: str
    image_sha256: str
    image_path: str  # absolute path of the content-addressed copy
    prompt: str


@dataclass(frozen=True)
class HpsBatch:
    model_id: str
    scorer_id: str
    items: tuple[HpsItem, ...] = field(repr=False)

    @property
    def key(self) -> str:
        """Identity of the batch's work: same images + same scorer = same shard (resume)."""
        h = hashlib.sha256(self.scorer_id.encode())
        for it in self.items:
            h.update(f"\n{it.prompt_id}\t{it.image_sha256}".encode())
        return h.hexdigest()[:24]

    def __len__(self) -> int:
        return len(self.items)


def plan_hps_batches(
    settings: Settings, suite: Suite, model_id: str, scorer_id: str, batch_images: int, whole: bool = False
) -> list[HpsBatch]:
    """Batches of the model's ok images whose (prompt, image sha256, scorer) is not in the lake
    yet; with ``whole``, all of them (a model whose images were replaced is re-scored whole)."""
    ok = ok_images(settings, model_id)
    scored = scores_for(settings, model_id, scorer_id)
    done = set() if whole else set(zip(scored["prompt_id"].to_pylist(), scored["image_sha256"].to_pylist()))
    todo = [
        HpsItem(p, s, str((settings.home / path).resolve()), suite.by_id[p].prompt)
        for p, s, path in zip(ok["prompt_id"].to_pylist(), ok["image_sha256"].to_pylist(), ok["image_path"].to_pylist())
        # Only EPS-eligible prompts are scored: nothing else uses mu, and the GPU is the bottleneck.
        if (p, s) not in done and suite.by_id[p].eps_eligible
    ]
    todo.sort(key=lambda it: it.prompt_id)
    return [
        HpsBatch(model_id, scorer_id, tuple(todo[i : i + batch_images])) for i in range(0, len(todo), batch_images)
    ]


def _shard_path(settings: Settings, batch: HpsBatch) -> Path:
    return settings.staging_dir / "hps" / batch.model_id / f"{batch.key}.parquet"


@lru_cache(maxsize=None)
def _gpu_slots(n: int) -> threading.BoundedSemaphore:
    """At most ``n`` HPSv3 batches on this process's device at once (the Prefect `gpu` tag limit
    bounds the whole deployment on a real server; this bounds one process in every mode)."""
    return threading.BoundedSemaphore(n)


def shard_exists(settings: Settings, batch: HpsBatch) -> bool:
    """A shard of this exact batch survives from an interrupted run (it will be reused)."""
    return _shard_path(settings, batch).exists()


def score_hps_batch(settings: Settings, suite: Suite, batch: HpsBatch, spec: ScorerSpec) -> Path:
    """Score one batch with HPSv3 and write it as a staging shard. An existing shard (same
    images, same scorer: left by an interrupted run) is reused as it is."""
    return score_hps_batch_timed(settings, suite, batch, spec)[0]


def score_hps_batch_timed(settings: Settings, suite: Suite, batch: HpsBatch, spec: ScorerSpec) -> tuple[Path, float]:
    """:func:`score_hps_batch`, and the seconds spent inferring (not waiting for the device)."""
    shard = _shard_path(settings, batch)
    if shard.exists():
        progress.advance(f"hpsv3 {batch.model_id}", 0, len(batch))
        return shard, 0.0
    scorer = get_scorer(spec)
    identity = scorer.identity
    if identity.scorer_id != batch.scorer_id:
        raise RuntimeError(
            f"scorer changed under the run: planned {batch.scorer_id}, loaded {identity.scorer_id}"
        )
    from tasks.hpsv3.scorer import pin_intra_op_threads

    with _gpu_slots(settings.gpu_concurrency):
        # Pinned here, in whichever process scores (CLI, in-process flow, Dask worker): the
        # same settings give the same bits (docs/RELIABILITY.md, "Numerics").
        pin_intra_op_threads(settings.hpsv3_threads)
        t0 = time.perf_counter()
        result, sizes = scorer.score_with_batch_sizes(
            [it.image_path for it in batch.items],
            [it.prompt for it in batch.items],
            batch_size=settings.batch_size,
            progress=lambda n: progress.advance(f"hpsv3 {batch.model_id}", 0, n),
        )
        inference_s = time.perf_counter() - t0
        runtimes = {size: scorer.runtime(size).to_json() for size in set(sizes)}
    now = utcnow()
    n = len(batch)
    table = pa.Table.from_pydict(
        {
            "model_id": [batch.model_id] * n,
            "prompt_id": [it.prompt_id for it in batch.items],
            "suite_version": [suite.version] * n,
            "image_sha256": [it.image_sha256 for it in batch.items],
            "scorer_name": [identity.scorer_name] * n,
            "scorer_id": [identity.scorer_id] * n,
            "checkpoint_sha256": [identity.checkpoint_sha256] * n,
            "mu": [float(x) for x in result[:, 0]],
            "sigma": [float(x) for x in result[:, 1]],
            "source": ["hpsv3"] * n,
            "uncalibrated": [identity.uncalibrated] * n,
            "scored_at": [now] * n,
            "runtime": [runtimes[size] for size in sizes],
        },
        schema=lake_schemas.HPS_SCORES,
    )
    write_parquet_atomic(table, shard)
    return shard, inference_s


def publish_hps_scores(settings: Settings, suite: Suite, model_id: str, scorer_id: str, shards: list[Path]) -> int:
    """Merge the run's shards into the model's `hps_scores` partition (validated, atomic).

    Rows of other scorers are kept. Rows of this scorer are kept only where they still match a
    current ok image (prompt id + sha256), so a replaced or removed image never keeps a stale mu.
    """
    from tasks.lake.tables import Lake
    from tasks.lake.validation import require_valid

    lake = Lake(settings.lake_dir)
    existing = lake.read("hps_scores", [model_id])
    ok = ok_images(settings, model_id)
    current = set(zip(ok["prompt_id"].to_pylist(), ok["image_sha256"].to_pylist()))
    new = [pq.read_table(s, schema=lake_schemas.HPS_SCORES) for s in shards]
    new_keys = {(p, s) for t in new for p, s in zip(t["prompt_id"].to_pylist(), t["image_sha256"].to_pylist())}
    keep_mask = [
        sid != scorer_id or ((p, s) in current and (p, s) not in new_keys)
        for sid, p, s in zip(
            existing["scorer_id"].to_pylist(), existing["prompt_id"].to_pylist(), existing["image_sha256"].to_pylist()
        )
    ]
    merged = pa.concat_tables([existing.filter(pa.array(keep_mask, pa.bool_())), *new]).cast(lake_schemas.HPS_SCORES)
    require_valid("hps_scores", merged)
    lake.write_partition("hps_scores", model_id, merged)
    for s in shards:
        s.unlink(missing_ok=True)
    return sum(t.num_rows for t in new)
