"""The units of work the flows compose: plain typed functions, runnable and testable without Prefect.

Each unit reads the lake, does one thing, and writes at most the tables it owns:
- ``ingest_and_publish``  -> images, quarantine
- ``score_hps_batch``     -> a staging shard (one per batch; a crashed run resumes from them)
- ``publish_hps_scores``  -> hps_scores
- ``aggregate_model``     -> model_scores
- ``refresh``             -> the DuckDB catalog
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas import lake as lake_schemas
from schemas.reference import ReferenceFile, ScorerIdentity
from schemas.settings import Settings
from tasks import progress
from tasks.suite import Suite, load_suite, other_suite_prompt_ids


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_run_id() -> str:
    return utcnow().strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:8]


# --------------------------------------------------------------------------------------------
# Suite, reference, scorer identity
# --------------------------------------------------------------------------------------------


def load_pinned_suite(settings: Settings) -> Suite:
    """The suite in force, verified against reference/SHA256SUMS."""
    from tasks.reference import verify_suite

    suite = load_suite(settings.suite_path, version=settings.suite_version)
    verify_suite(settings.reference_dir, suite)
    return suite


def load_verified_reference(settings: Settings, suite: Suite, expected_scorer_id: str | None) -> ReferenceFile:
    from tasks.reference import verify_reference

    return verify_reference(
        settings.reference_dir, settings.reference_version, suite, expected_scorer_id=expected_scorer_id
    )


@dataclass(frozen=True)
class ScorerSpec:
    """What to load: hashable, so one scorer is loaded once per worker process."""

    base_model: str
    checkpoint: str
    device: str = "auto"
    dtype: str = "auto"
    rotary: str = "official"  # tasks.hpsv3.model.RopeMode
    # Preprocessing worker processes (None: the device's default; never changes a bit of mu).
    preprocess_workers: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> "ScorerSpec":
        return cls(
            settings.hpsv3_base_model,
            settings.hpsv3_checkpoint,
            settings.device,
            settings.dtype,
            settings.hpsv3_rotary,
            settings.hpsv3_preprocess_workers,
        )


@lru_cache(maxsize=2)
def get_scorer(spec: ScorerSpec):
    """Load the HPSv3 scorer once per process (weights are several GB)."""
    from tasks.hpsv3.scorer import HPSv3Scorer

    return HPSv3Scorer.load(
        spec.base_model,
        spec.checkpoint,
        device=spec.device,
        dtype=spec.dtype,
        rotary=spec.rotary,
        preprocess_workers=spec.preprocess_workers,
    )


@lru_cache(maxsize=4)
def scorer_identity(spec: ScorerSpec) -> ScorerIdentity:
    """The scorer's identity without loading its weights (hashes the checkpoint once, cached)."""
    from tasks.hpsv3.scorer import resolve_identity

    return resolve_identity(spec.base_model, spec.checkpoint)


def golden_for_reference(settings: Settings, spec: ScorerSpec):
    """The golden set's mu under this process's runtime, to be stored in a new reference."""
    from tasks.golden import golden_record, load_golden_set, score_golden
    from tasks.hpsv3.scorer import pin_intra_op_threads

    golden = load_golden_set(settings.reference_dir, settings.golden_set)
    scorer = get_scorer(spec)
    pin_intra_op_threads(settings.hpsv3_threads)
    mus, runtime = score_golden(scorer, golden, settings.batch_size)
    return golden_record(golden, mus, runtime)


def check_runtime(settings: Settings, reference: ReferenceFile, spec: ScorerSpec):
    """The golden-set canary in this process's runtime: a CanaryResult, or CanaryDrift raised."""
    from tasks.golden import run_canary
    from tasks.hpsv3.scorer import pin_intra_op_threads

    scorer = get_scorer(spec)
    pin_intra_op_threads(settings.hpsv3_threads)
    return run_canary(scorer, reference, settings.reference_dir, settings.batch_size)


def imported_identity(scorer_name: str) -> ScorerIdentity:
    return ScorerIdentity(scorer_name=scorer_name, source="import")


# --------------------------------------------------------------------------------------------
# Ingest
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IngestSummary:
    model_id: str
    fingerprint: str
    images_ok: int
    images_quarantined: int
    images_missing: int
    objects_quarantined: int


def open_configured_store(settings: Settings):
    from tasks.storage import open_store

    return open_store(settings.store_uri, endpoint=settings.s3_endpoint, region=settings.s3_region)


def _staged_dir(settings: Settings, model_id: str) -> Path:
    from tasks.storage import validate_model_id

    return settings.staging_dir / "ingest" / validate_model_id(model_id)


def ingest_and_stage(settings: Settings, suite: Suite, model_id: str) -> IngestSummary:
    """Validate every object of one model into staged `images` / `quarantine` tables.

    Nothing reaches the lake here: the model's new image set is committed together with its
    scores by :func:`commit_model`, so readers never see new images next to old results.
    """
    from tasks.ingest import ingest_model
    from tasks.storage import validate_model_id
    from tasks.validation import require_valid

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
    from tasks.lake import Lake
    from tasks.models import require_objects

    # No object at all: a typo or a wrong store/prefix, never 192 'missing' rows (nothing staged).
    require_objects(store, Lake(settings.lake_dir), model_id, result.n_objects)
    require_valid("images", result.images)
    require_valid("quarantine", result.quarantine)
    staged = _staged_dir(settings, model_id)
    _write_parquet_atomic(result.quarantine, staged / "quarantine.parquet")
    _write_parquet_atomic(result.images, staged / "images.parquet")  # last: its presence marks a complete stage
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
    from tasks.lake import Lake

    staged = _staged_dir(settings, model_id)
    if not (staged / "images.parquet").is_file():
        return False
    lake = Lake(settings.lake_dir)
    lake.write_partition("quarantine", model_id, pq.read_table(staged / "quarantine.parquet", schema=lake_schemas.QUARANTINE))
    lake.write_partition("images", model_id, pq.read_table(staged / "images.parquet", schema=lake_schemas.IMAGES))
    return True


def drop_staged_images(settings: Settings, model_id: str) -> None:
    staged = _staged_dir(settings, model_id)
    for name in ("images.parquet", "quarantine.parquet"):  # images first: it marks the stage
        (staged / name).unlink(missing_ok=True)


def ingest_and_publish(settings: Settings, suite: Suite, model_id: str) -> IngestSummary:
    """Ingest one model and publish its `images` and `quarantine` partitions at once
    (`imagebench ingest`; the flows stage and commit with the scores instead)."""
    summary = ingest_and_stage(settings, suite, model_id)
    commit_staged_images(settings, model_id)
    drop_staged_images(settings, model_id)
    return summary


def model_images(settings: Settings, model_id: str) -> pa.Table:
    """The model's image set this run works on: the staged ingest when there is one, else the lake's."""
    from tasks.lake import Lake

    staged = _staged_dir(settings, model_id) / "images.parquet"
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


# --------------------------------------------------------------------------------------------
# HPSv3
# --------------------------------------------------------------------------------------------


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


def _ok_images(settings: Settings, model_id: str) -> pa.Table:
    images = model_images(settings, model_id)
    return images.filter(pc.equal(images["state"], "ok"))


def _scores_for(settings: Settings, model_id: str, scorer_id: str) -> pa.Table:
    from tasks.lake import Lake

    scores = Lake(settings.lake_dir).read("hps_scores", [model_id])
    return scores.filter(pc.equal(scores["scorer_id"], scorer_id))


def plan_hps_batches(
    settings: Settings, suite: Suite, model_id: str, scorer_id: str, batch_images: int, whole: bool = False
) -> list[HpsBatch]:
    """Batches of the model's ok images whose (prompt, image sha256, scorer) is not in the lake
    yet; with ``whole``, all of them (a model whose images were replaced is re-scored whole)."""
    ok = _ok_images(settings, model_id)
    scored = _scores_for(settings, model_id, scorer_id)
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


def _write_parquet_atomic(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


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
    _write_parquet_atomic(table, shard)
    return shard, inference_s


def publish_hps_scores(settings: Settings, suite: Suite, model_id: str, scorer_id: str, shards: list[Path]) -> int:
    """Merge the run's shards into the model's `hps_scores` partition (validated, atomic).

    Rows of other scorers are kept. Rows of this scorer are kept only where they still match a
    current ok image (prompt id + sha256), so a replaced or removed image never keeps a stale mu.
    """
    from tasks.lake import Lake
    from tasks.validation import require_valid

    lake = Lake(settings.lake_dir)
    existing = lake.read("hps_scores", [model_id])
    ok = _ok_images(settings, model_id)
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


# --------------------------------------------------------------------------------------------
# Judges
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeSetup:
    """The routing in force (pinned like the suite) and this deployment's endpoints."""

    routing: object  # schemas.judges.Routing
    judges_config: object  # schemas.judges.JudgesConfig

    @property
    def key(self) -> str:
        """Identity of the routing + endpoints in force (part of a judge shard's identity)."""
        h = hashlib.sha256(self.routing.model_dump_json().encode())
        h.update(self.judges_config.model_dump_json().encode() if self.judges_config is not None else b"-")
        return h.hexdigest()[:16]


def load_judge_setup(settings: Settings) -> JudgeSetup:
    from tasks.judges import load_judges_config, load_routing
    from tasks.reference import SuiteTampered, read_sha256sums

    path = settings.routing_path
    if not path.is_file():
        raise FileNotFoundError(f"{path}: judge routing file not found (IMAGEBENCH_ROUTING_VERSION={settings.routing_version})")
    pinned = read_sha256sums(settings.reference_dir).get(path.name)
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    if pinned != actual:
        raise SuiteTampered(
            f"{path}: sha256 {actual} does not match reference/SHA256SUMS ({pinned or 'not pinned'}); "
            "the routing is part of the benchmark definition: a change is a new version in a new file"
        )
    config = load_judges_config(settings.judges_config)
    return JudgeSetup(load_routing(path, config, str(settings.judges_config or "no judges config")), config)


def plan_judge_items(settings: Settings, suite: Suite, model_id: str, rejudge: bool) -> tuple[list, frozenset[str]]:
    """The model's ok images that have no settled verdict for their current bytes.

    Imported verdicts stand until `--rejudge`; identities already in the lake are skipped by
    the router (an ERROR is not settled: the next run asks again).
    """
    from tasks.judges import make_items, settled_identities
    from tasks.lake import Lake

    lake = Lake(settings.lake_dir)
    images = model_images(settings, model_id).to_pylist()
    verdicts = lake.read("verdicts", [model_id])
    current = {r["prompt_id"]: r["image_sha256"] for r in images if r["state"] == "ok"}
    imported = {
        r["prompt_id"]
        for r in verdicts.to_pylist()
        if r["source"] == "import" and r["image_sha256"] in (None, current.get(r["prompt_id"]))
    }
    rows = [r for r in images if r["state"] == "ok" and (rejudge or r["prompt_id"] not in imported)]
    items = make_items(suite, model_id, rows, image_root=settings.home.resolve())
    known = frozenset() if rejudge else frozenset(settled_identities(verdicts))
    return items, known


def judge_batch(settings: Settings, setup: JudgeSetup, items: list, known: frozenset[str], rejudge: bool) -> Path | None:
    """Ask the routed judges about one batch; write its calls + verdicts as a staging shard."""
    from tasks.judges import judge_items

    if not items:
        return None
    # Same items, same judges, same known identities: the shard of an interrupted run is reused,
    # so a resumed run never pays for the same judgement twice.
    h = hashlib.sha256(f"{setup.key}\t{rejudge}".encode())
    for i in items:
        h.update(f"\n{i.prompt_id}\t{i.image_sha256}".encode())
    h.update("\n".join(sorted(known)).encode())
    base = settings.staging_dir / "judge" / items[0].model_id / h.hexdigest()[:24]
    if base.with_suffix(".verdicts.parquet").exists() and base.with_suffix(".calls.parquet").exists():
        progress.advance(f"judge {items[0].model_id}", 0, len(items))
        return base
    run = judge_items(
        items, setup.routing, setup.judges_config, known_identities=known, rejudge=rejudge,
        progress=lambda n: progress.advance(f"judge {items[0].model_id}", 0, n),
    )
    if run.calls.num_rows == 0 and run.verdicts.num_rows == 0:
        return None
    _write_parquet_atomic(run.calls, base.with_suffix(".calls.parquet"))
    _write_parquet_atomic(run.verdicts, base.with_suffix(".verdicts.parquet"))  # last: marks the shard complete
    return base


def publish_judgements(settings: Settings, model_id: str, shards: list[Path | None]) -> int:
    """Append the run's calls to `judge_calls`; its verdicts replace the model's verdict for
    those prompts in `verdicts` (one decided verdict per prompt). Both validated, atomic."""
    from tasks.lake import Lake
    from tasks.validation import require_valid

    shards = [s for s in shards if s is not None]
    if not shards:
        return 0
    lake = Lake(settings.lake_dir)
    calls = [pq.read_table(s.with_suffix(".calls.parquet"), schema=lake_schemas.JUDGE_CALLS) for s in shards]
    new = [pq.read_table(s.with_suffix(".verdicts.parquet"), schema=lake_schemas.VERDICTS) for s in shards]
    new_verdicts = pa.concat_tables(new) if new else lake_schemas.VERDICTS.empty_table()
    decided = set(new_verdicts["prompt_id"].to_pylist())
    existing = lake.read("verdicts", [model_id])
    keep = existing.filter(pa.array([p not in decided for p in existing["prompt_id"].to_pylist()], pa.bool_()))
    verdicts = pa.concat_tables([keep, new_verdicts]).cast(lake_schemas.VERDICTS)
    existing_calls = lake.read("judge_calls", [model_id])

    def call_keys(table: pa.Table) -> list[tuple]:
        return list(zip(*(table[c].to_pylist() for c in lake_schemas.JUDGE_CALLS_KEY)))

    # A run killed inside its commit may have appended these shards' calls already: the resumed
    # commit appends only calls the lake does not hold, so history never gets a row twice.
    committed = set(call_keys(existing_calls))
    fresh = [t.filter(pa.array([k not in committed for k in call_keys(t)], pa.bool_())) for t in calls]
    all_calls = pa.concat_tables([existing_calls, *fresh]).cast(lake_schemas.JUDGE_CALLS)
    require_valid("verdicts", verdicts)
    require_valid("judge_calls", all_calls)
    lake.write_partition("judge_calls", model_id, all_calls)
    lake.write_partition("verdicts", model_id, verdicts)
    for s in shards:
        s.with_suffix(".calls.parquet").unlink(missing_ok=True)
        s.with_suffix(".verdicts.parquet").unlink(missing_ok=True)
    return new_verdicts.num_rows


# --------------------------------------------------------------------------------------------
# Aggregate
# --------------------------------------------------------------------------------------------


def _latest_verdicts_in(table: pa.Table, current_sha: dict[str, str | None]) -> dict[str, dict]:
    """The decided verdict per prompt for the model's current images (newest first wins), from
    the model's `verdicts` rows.

    A verdict counts only for the image it judged: a replaced image has no verdict until judged
    again. Imported verdicts without an image hash count for whatever image is current.
    """
    prompts, shas, at = (table[c].to_pylist() for c in ("prompt_id", "image_sha256", "decided_at"))
    latest: dict[str, int] = {}  # row index; only the winners become dicts (a stable sort, as before)
    for i in sorted(range(len(prompts)), key=at.__getitem__):
        if prompts[i] in current_sha and (shas[i] is None or shas[i] == current_sha[prompts[i]]):
            latest[prompts[i]] = i
    return dict(zip(latest, table.take(pa.array(list(latest.values()), pa.int64())).to_pylist()))


def _latest_verdicts(settings: Settings, model_id: str, current_sha: dict[str, str | None]) -> dict[str, dict]:
    """:func:`_latest_verdicts_in` of the model's `verdicts` partition."""
    from tasks.lake import Lake

    return _latest_verdicts_in(Lake(settings.lake_dir).read("verdicts", [model_id]), current_sha)


def _recorded_fingerprint_in(model_scores: pa.Table, suite_version: str, reference: ReferenceFile) -> str | None:
    for r in model_scores.to_pylist():
        if (r["suite_version"], r["reference_version"], r["scorer_id"]) == (suite_version, reference.version, reference.scorer_id):
            return r["source_fingerprint"]
    return None


def split_by_model(table: pa.Table, model_ids: list[str]) -> dict[str, pa.Table]:
    """One table per model id (rows in their original order; an empty table for a model with none).

    `Lake.read` puts each model's rows together: then each is a zero-copy slice (a `take` per
    model on a table of 1,000 partitions' chunks costs milliseconds each)."""
    column = table["model_id"].to_pylist()
    runs: dict[str, tuple[int, int]] = {}
    contiguous = True
    start = 0
    for i in range(1, len(column) + 1):
        if i == len(column) or column[i] != column[start]:
            if column[start] in runs:
                contiguous = False
                break
            runs[column[start]] = (start, i - start)
            start = i
    if contiguous:
        empty = table.slice(0, 0)
        return {m: table.slice(*runs[m]) if m in runs else empty for m in model_ids}
    index: dict[str, list[int]] = {m: [] for m in model_ids}
    for i, m in enumerate(column):
        if m in index:
            index[m].append(i)
    combined = table.combine_chunks()
    return {m: combined.take(pa.array(idx, pa.int64())) for m, idx in index.items()}


# Partitions written (or read) at once by the batch paths: each write ends in two fsyncs (file
# and directory), which wait on the disk, not the CPU; overlapping them is much of an import's speed.
_WRITERS = 8


def read_models(lake, table: str, model_ids: list[str]) -> pa.Table:
    """``lake.read(table, model_ids)``, the partitions read on :data:`_WRITERS` threads (Parquet
    decoding releases the GIL; 1,000 partitions one after the other take seconds). Same rows,
    same order (by model id), same errors."""
    from concurrent.futures import ThreadPoolExecutor

    ids = sorted(set(model_ids))
    if len(ids) <= 1:
        return lake.read(table, ids)
    with ThreadPoolExecutor(max_workers=min(_WRITERS, len(ids)), thread_name_prefix="lake-read") as pool:
        parts = list(pool.map(lambda m: lake.read(table, [m]), ids))
    return pa.concat_tables(parts)


def for_each_model(fn, model_ids: list[str]) -> None:
    """``fn(model_id)`` for every model, on :data:`_WRITERS` threads (each model's write is its
    own atomic replace, under its own partition lock); the first error is raised once all ended."""
    from concurrent.futures import ThreadPoolExecutor

    if len(model_ids) <= 1:
        for m in model_ids:
            fn(m)
        return
    with ThreadPoolExecutor(max_workers=min(_WRITERS, len(model_ids)), thread_name_prefix="lake-write") as pool:
        futures = [pool.submit(fn, m) for m in model_ids]
    for f in futures:
        f.result()


@dataclass(frozen=True)
class _ModelInputs:
    """What one model's result is computed from, before the bootstrap (see :func:`_prepare_model`)."""

    model_id: str
    states: list[str]
    eps: object  # tasks.scoring.EpsResult
    cap: object  # tasks.stats.CapabilityResult
    verdicts: list
    contributions: list
    uncalibrated: bool
    fingerprint: str | None


def _prepare_model(
    suite: Suite,
    reference: ReferenceFile,
    mu_ref: dict[str, float],
    model_id: str,
    scores: pa.Table,
    images: pa.Table | None,
    verdicts: pa.Table,
    model_scores: pa.Table | None,
    fingerprint: str | None,
) -> _ModelInputs:
    """One model's EPS, Capability and bootstrap inputs from its own lake rows: ``scores`` (its
    `hps_scores` rows of the reference's scorer), ``images`` (its `images`; unused for imported
    scores), ``verdicts`` and ``model_scores`` (its partitions; the latter only read for imported
    scores, whose result keeps the fingerprint it was recorded with). Pure: no I/O."""
    from tasks import stats
    from tasks.scoring import eps

    scorer = reference.scorer
    prompt_ids = [p.prompt_id for p in suite.prompts]
    if scorer.source == "import":
        # Scores produced elsewhere: no images of ours to check them against.
        # A prompt has an image there if the lab sent a score or a verdict for it.
        mu_by_prompt = dict(zip(scores["prompt_id"].to_pylist(), scores["mu"].to_pylist()))
        sha_by_prompt: dict[str, str | None] = {p: None for p in prompt_ids}
        decided = _latest_verdicts_in(verdicts, sha_by_prompt)
        state_by_prompt = {p: ("ok" if p in mu_by_prompt or p in decided else "missing") for p in prompt_ids}
    else:
        if images is None or images.num_rows == 0:
            raise RuntimeError(f"model {model_id!r} has no ingested images: run `imagebench ingest --model {model_id}`")
        fingerprint = content_fingerprint(images)  # what this result was computed from
        state_by_prompt = dict(zip(images["prompt_id"].to_pylist(), images["state"].to_pylist()))
        sha_by_prompt = dict(zip(images["prompt_id"].to_pylist(), images["image_sha256"].to_pylist()))
        ok = {(p, s) for p, s in sha_by_prompt.items() if state_by_prompt[p] == "ok"}
        mu_by_prompt = {
            p: m
            for p, s, m in zip(scores["prompt_id"].to_pylist(), scores["image_sha256"].to_pylist(), scores["mu"].to_pylist())
            if (p, s) in ok
        }
        unscored = [p for p, _ in ok if p not in mu_by_prompt and suite.by_id[p].eps_eligible]
        if unscored:
            raise RuntimeError(
                f"model {model_id!r}: {len(unscored)} ok images have no HPSv3 score yet "
                f"(e.g. {sorted(unscored)[:3]}); run `imagebench score --model {model_id}`"
            )
        decided = _latest_verdicts_in(verdicts, sha_by_prompt)
    states = [state_by_prompt.get(p, "missing") for p in prompt_ids]
    raw = [decided[p]["verdict"] if p in decided else None for p in prompt_ids]
    effective = stats.effective_verdicts(states, raw)
    if fingerprint is None and model_scores is not None:
        # Imported scores: keep whatever fingerprint the result was recorded with.
        fingerprint = _recorded_fingerprint_in(model_scores, suite.version, reference)
    return _ModelInputs(
        model_id=model_id,
        states=states,
        eps=eps(mu_by_prompt, mu_ref, suite.eligible_ids),
        cap=stats.capability(effective, judged=stats.judge_decided(states, raw)),
        verdicts=effective,
        contributions=stats.eps_contributions(mu_by_prompt, mu_ref, prompt_ids, suite.eligible_ids),
        uncalibrated=bool(scorer.uncalibrated) or any(scores["uncalibrated"].to_pylist()),
        fingerprint=fingerprint,
    )


# Models per bootstrap call: a model's intervals do not depend on the others in the call
# (tasks.stats.bootstrap_draws), so this only bounds memory (~ 8 B x 2 x models x 100 x prompts).
_BOOTSTRAP_CHUNK = 64


def _model_scores_row(
    suite: Suite, reference: ReferenceFile, ref_sha: str, run_id: str, inputs: _ModelInputs, ci, scored_at: dt.datetime
) -> dict:
    """The `model_scores` row of one model from its inputs and bootstrap intervals (pure)."""

    def finite(x: float) -> float | None:
        return None if x is None or x != x else float(x)

    result, cap, states = inputs.eps, inputs.cap, inputs.states
    capability = finite(cap.capability)
    overall = None if capability is None else 0.5 * capability + 0.5 * result.eps
    return {
        "model_id": inputs.model_id,
        "suite_version": suite.version,
        "reference_version": reference.version,
        "reference_sha256": ref_sha,
        "scorer_name": reference.scorer.scorer_name,
        "scorer_id": reference.scorer_id,
        "eps": result.eps,
        "eps_prompts_scored": result.prompts_scored,
        "eps_prompts_eligible": result.prompts_eligible,
        "eps_prompts_lost": result.prompts_lost,
        "images_ok": states.count("ok"),
        "images_quarantined": states.count("quarantined"),
        "images_missing": states.count("missing"),
        # One definition (docs/LAKE.md): every suite prompt has an ok image and every eligible
        # one a mu. Judge coverage is `provisional`, not this.
        "complete": result.prompts_lost == 0 and states.count("ok") == len(suite.prompts),
        "uncalibrated": inputs.uncalibrated,
        "eps_lo": finite(ci.eps[0]),
        "eps_hi": finite(ci.eps[1]),
        "capability": capability,
        "capability_lo": finite(ci.capability[0]) if capability is not None else None,
        "capability_hi": finite(ci.capability[1]) if capability is not None else None,
        "verdicts_pass": cap.passed,
        "verdicts_fail": cap.failed,
        "verdicts_undecided": cap.undecided,
        "judge_coverage": cap.coverage,
        "overall": overall,
        "overall_lo": finite(ci.overall[0]) if overall is not None else None,
        "overall_hi": finite(ci.overall[1]) if overall is not None else None,
        "provisional": cap.provisional,
        "source_fingerprint": inputs.fingerprint,
        "run_id": run_id,
        "scored_at": scored_at,
    }


def aggregate_models(
    settings: Settings,
    suite: Suite,
    reference: ReferenceFile,
    model_ids: list[str],
    run_id: str,
    fingerprints: dict[str, str | None] | None = None,
    known: dict[str, pa.Table] | None = None,
) -> list[dict]:
    """EPS, Capability, Overall and their 95% intervals for each model -> its `model_scores` row
    (returned in the order of ``model_ids``).

    Everything here depends only on each model's own rows and the frozen reference, so scoring
    another model never changes it (the bootstrap's prompt resamples depend only on the seed):
    many models aggregated at once get exactly the rows they would get one at a time. Done in
    one pass for speed (an import of 1,000 models): the lake read once per table, the bootstrap
    over chunks of models, one Great Expectations check of all new rows before any is written;
    then each model's partition is replaced on its own (atomic per model). A model that cannot
    be aggregated (e.g. HPSv3 scores missing) raises before anything is written.
    ``fingerprints``: model -> content fingerprint for imported scores (None: the recorded one).
    ``known``: table -> these models' rows of it as the lake holds them (just written or read by the caller).
    """
    from tasks import stats
    from tasks.lake import Lake
    from tasks.reference import load_reference_mu
    from tasks.validation import require_valid

    ids = list(dict.fromkeys(model_ids))
    if not ids:
        return []
    lake = Lake(settings.lake_dir)
    imported = reference.scorer.source == "import"
    known = known or {}
    scores_all = known["hps_scores"] if "hps_scores" in known else read_models(lake, "hps_scores", ids)
    scores = split_by_model(scores_all.filter(pc.equal(scores_all["scorer_id"], reference.scorer_id)), ids)
    verdicts = split_by_model(known["verdicts"] if "verdicts" in known else read_models(lake, "verdicts", ids), ids)
    images = None if imported else split_by_model(read_models(lake, "images", ids), ids)
    recorded = split_by_model(known["model_scores"] if "model_scores" in known else read_models(
        lake, "model_scores", ids), ids) if imported else None
    mu_ref = load_reference_mu(reference)
    fingerprints = fingerprints or {}
    prepared = [
        _prepare_model(
            suite, reference, mu_ref, m, scores[m], None if images is None else images[m], verdicts[m],
            None if recorded is None else recorded[m], fingerprints.get(m),
        )
        for m in ids
    ]
    eligible_mask = [p.eps_eligible for p in suite.prompts]
    ref_sha = reference_sha256(settings)
    rows: list[dict] = []
    for start in range(0, len(prepared), _BOOTSTRAP_CHUNK):
        chunk = prepared[start : start + _BOOTSTRAP_CHUNK]
        cis = stats.bootstrap_scores(
            [x.model_id for x in chunk], [x.verdicts for x in chunk], [x.contributions for x in chunk],
            eligible_mask, n_resamples=settings.bootstrap_resamples, seed=0,
        )
        rows += [_model_scores_row(suite, reference, ref_sha, run_id, x, cis[x.model_id], utcnow()) for x in chunk]
    table = pa.Table.from_pylist(rows, schema=lake_schemas.MODEL_SCORES)
    # One check of all new rows: every expectation of the suite is per row, or unique on keys that
    # include model_id, so this is the check of each model's row, at one call's cost.
    require_valid("model_scores", table)
    position = {m: i for i, m in enumerate(ids)}
    for_each_model(
        lambda m: lake.replace_rows(
            "model_scores", m, table.slice(position[m], 1), match_on=["suite_version", "reference_version", "scorer_id"]
        ),
        ids,
    )
    return rows


def aggregate_model(
    settings: Settings,
    suite: Suite,
    reference: ReferenceFile,
    model_id: str,
    run_id: str,
    fingerprint: str | None,
) -> dict:
    """EPS, Capability, Overall and their 95% intervals for one model -> its `model_scores` row
    (:func:`aggregate_models` of one model)."""
    return aggregate_models(settings, suite, reference, [model_id], run_id, {model_id: fingerprint})[0]


def current_scores(settings: Settings, model_ids: list[str], identity: ScorerIdentity) -> pa.Table:
    """The scorer's mu for each model's current images (imported scores: all rows of that scorer)."""
    tables = []
    for model_id in model_ids:
        scores = _scores_for(settings, model_id, identity.scorer_id)
        if identity.source == "hpsv3":
            ok = _ok_images(settings, model_id)
            current = set(zip(ok["prompt_id"].to_pylist(), ok["image_sha256"].to_pylist()))
            mask = [(p, s) in current for p, s in zip(scores["prompt_id"].to_pylist(), scores["image_sha256"].to_pylist())]
            scores = scores.filter(pa.array(mask, pa.bool_()))
        tables.append(scores)
    return pa.concat_tables(tables) if tables else lake_schemas.HPS_SCORES.empty_table()


def models_scored_by(settings: Settings, scorer_id: str) -> list[str]:
    """Models with at least one hps_scores row of ``scorer_id`` (sorted)."""
    from tasks.lake_scan import models_with

    return models_with(settings.lake_dir, "hps_scores", "scorer_id", scorer_id)


def reference_sha256(settings: Settings) -> str:
    return hashlib.sha256(settings.reference_path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------------------------
# Discovery (nightly) and catalog
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelPlan:
    model_id: str
    status: str  # "candidate" (to ingest) | "up_to_date" | "invalid" | "retired"
    fingerprint: str | None  # listing fingerprint of the object store now
    detail: str = ""


def _result_fingerprints(
    settings: Settings, suite: Suite, reference: ReferenceFile, model_ids: list[str] | None = None
) -> dict[str, str | None]:
    """model -> content fingerprint its current result (suite, reference, scorer) was computed from."""
    from tasks.lake import Lake

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
    """
    from tasks.lake import Lake
    from tasks.models import retired_models
    from tasks.storage import InvalidModelId, is_model_id, listing_fingerprint, validate_model_id

    store = open_configured_store(settings)
    names = sorted(store.list_models())  # only these models' results are read: not the whole lake
    results = _result_fingerprints(settings, suite, reference, [m for m in names if is_model_id(m)])
    lake = Lake(settings.lake_dir)
    retired = retired_models(lake)
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
        if not objects and not lake.partition_path("images", model_id).is_file():
            # An empty folder never ingested: nothing to score (one with ingested images goes on
            # to ingest, which refuses it loudly: tasks.models.require_objects).
            plans.append(ModelPlan(model_id, "invalid", None, f"empty folder: no objects under models/{model_id}/"))
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
    from tasks.lake import Lake
    from tasks.storage import atomic_write

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
    from tasks.storage import validate_model_id

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
    from tasks.storage import validate_model_id

    for stage in ("ingest", "hps", "judge"):
        shutil.rmtree(settings.staging_dir / stage / validate_model_id(model_id), ignore_errors=True)


def refresh(settings: Settings, suite: Suite) -> Path:
    from tasks.lake import refresh_catalog

    refresh_catalog(settings.lake_dir, settings.catalog_path, suite, settings.reference_version)
    return settings.catalog_path


def dump_json(obj: object) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, default=str)
