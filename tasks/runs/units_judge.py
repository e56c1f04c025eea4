"""The judge units: the routing in force, one batch of verdicts to a staging shard, publish ``verdicts``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schemas import lake as lake_schemas
from schemas.settings import Settings
from tasks.store.durable import write_parquet_atomic
from tasks.runs import progress
from tasks.runs.reads import model_images
from tasks.scores.suite import Suite


@dataclass(frozen=True)
class JudgeSetup:
    """The routing in force (pinned like the suite) and this deployment's endpoints."""

    routing: object  # schemas.judges.Routing
    judges_config: object  # schemas.judges.JudgesConfig
    # tasks.judges.limits.LimitScope: who shares each endpoint's limits (the flow decides: this
    # machine's lock files, or the Prefect server's global limits); None = this process
    limits: object = None

    @property
    def key(self) -> str:
        """Identity of the routing + endpoints in force (part of a judge shard's identity)."""
        h = hashlib.sha256(self.routing.model_dump_json().encode())
        h.update(self.judges_config.model_dump_json().encode() if self.judges_config is not None else b"-")
        return h.hexdigest()[:16]


def load_judge_setup(settings: Settings) -> JudgeSetup:
    from tasks.judges import load_judges_config, load_routing
    from tasks.scores.reference import SuiteTampered, read_sha256sums

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
    from tasks.lake.tables import Lake

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
        progress=lambda n: progress.advance(f"judge {items[0].model_id}", 0, n), limits=setup.limits,
    )
    if run.calls.num_rows == 0 and run.verdicts.num_rows == 0:
        return None
    write_parquet_atomic(run.calls, base.with_suffix(".calls.parquet"))
    write_parquet_atomic(run.verdicts, base.with_suffix(".verdicts.parquet"))  # last: marks the shard complete
    return base


def publish_judgements(settings: Settings, model_id: str, shards: list[Path | None]) -> int:
    """Append the run's calls to `judge_calls`; its verdicts replace the model's verdict for
    those prompts in `verdicts` (one decided verdict per prompt). Both validated, atomic."""
    from tasks.lake.tables import Lake
    from tasks.lake.validation import require_valid

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
