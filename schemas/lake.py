"""Arrow schemas of every lake table. One table is written by exactly one task.

Every table is partitioned by model: ``<lake>/<table>/model_id=<id>/data.parquet``. ``model_id``
is also stored inside each file so readers need no hive partitioning.
"""

from __future__ import annotations

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")

# Image states: every (model, prompt) of the suite gets exactly one row in `images`.
IMAGE_STATES = ("ok", "quarantined", "missing")

# Reasons an object is quarantined (column `reason` of `quarantine`, and of `images` when not ok).
QUARANTINE_REASONS = (
    "empty_file",
    "not_decodable",
    "truncated",
    "unsupported_format",
    "unsupported_mode",
    "animated",
    "too_small",
    "too_large",
    "decompression_bomb",
    "bad_aspect_ratio",
    "bad_key",
    "unknown_prompt",
    "duplicate_prompt",
    "duplicate_image",
)

IMAGES = pa.schema(
    [
        pa.field("model_id", pa.string(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("suite_version", pa.string(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("reason", pa.string()),  # quarantine reason, or null
        pa.field("object_uri", pa.string()),  # where the image came from (null when missing)
        pa.field("image_sha256", pa.string()),  # sha256 of the object's bytes
        pa.field("image_path", pa.string()),  # content-addressed copy, relative to the workspace
        pa.field("format", pa.string()),  # PNG / JPEG / WEBP
        pa.field("width", pa.int32()),
        pa.field("height", pa.int32()),
        pa.field("source_mode", pa.string()),  # PIL mode before RGB conversion
        pa.field("byte_size", pa.int64()),
        pa.field("source_fingerprint", pa.string(), nullable=False),  # sha256 of the model's object listing
        pa.field("ingested_at", TS, nullable=False),
    ]
)

QUARANTINE = pa.schema(
    [
        pa.field("model_id", pa.string(), nullable=False),
        pa.field("object_uri", pa.string(), nullable=False),
        pa.field("prompt_id", pa.string()),  # parsed from the key, when it parses
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),  # human-readable message
        pa.field("byte_size", pa.int64()),
        pa.field("image_sha256", pa.string()),
        pa.field("quarantined_at", TS, nullable=False),
    ]
)

HPS_SCORES = pa.schema(
    [
        pa.field("model_id", pa.string(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("suite_version", pa.string(), nullable=False),
        pa.field("image_sha256", pa.string()),  # null only for imported scores without hashes
        pa.field("scorer_name", pa.string(), nullable=False),
        pa.field("scorer_id", pa.string(), nullable=False),  # hash of the scorer identity
        pa.field("checkpoint_sha256", pa.string()),  # null for imported scores
        pa.field("mu", pa.float64(), nullable=False),
        pa.field("sigma", pa.float64()),
        pa.field("source", pa.string(), nullable=False),  # "hpsv3" (scored here) or "import"
        pa.field("uncalibrated", pa.bool_(), nullable=False),  # demo weights: not a real HPSv3 score
        pa.field("scored_at", TS, nullable=False),
        # The ScorerRuntime that computed mu, as canonical JSON (library versions, device, dtype,
        # rotary mode, attention kernel, forward batch size, threads); null for imported scores.
        pa.field("runtime", pa.string()),
    ]
)

MODEL_SCORES = pa.schema(
    [
        pa.field("model_id", pa.string(), nullable=False),
        pa.field("suite_version", pa.string(), nullable=False),
        pa.field("reference_version", pa.string(), nullable=False),
        pa.field("reference_sha256", pa.string(), nullable=False),
        pa.field("scorer_name", pa.string(), nullable=False),
        pa.field("scorer_id", pa.string(), nullable=False),
        # Null when no eligible prompt was scored (eps_prompts_scored = 0): absent, never 0. Files
        # written when this was required read the same (nullability is not checked on read).
        pa.field("eps", pa.float64()),
        pa.field("eps_prompts_scored", pa.int32(), nullable=False),
        pa.field("eps_prompts_eligible", pa.int32(), nullable=False),
        pa.field("eps_prompts_lost", pa.int32(), nullable=False),  # missing or quarantined: counted as 0
        pa.field("images_ok", pa.int32(), nullable=False),
        pa.field("images_quarantined", pa.int32(), nullable=False),
        pa.field("images_missing", pa.int32(), nullable=False),
        pa.field("complete", pa.bool_(), nullable=False),
        pa.field("uncalibrated", pa.bool_(), nullable=False),
        # 95% interval of EPS from the paired bootstrap's variance, on the logit scale (resampling
        # prompts with a fixed seed, so each model's interval depends only on its own data;
        # docs/STATISTICS.md section 4). Capability's interval is Wilson's.
        pa.field("eps_lo", pa.float64()),  # null with eps
        pa.field("eps_hi", pa.float64()),
        # Capability: 100 * PASS / (PASS + FAIL); missing/quarantined images are FAIL; ERROR,
        # UNPARSABLE and not-judged are undecided (coverage < 1 -> provisional). Null: nothing judged.
        pa.field("capability", pa.float64()),
        pa.field("capability_lo", pa.float64()),
        pa.field("capability_hi", pa.float64()),
        pa.field("verdicts_pass", pa.int32(), nullable=False),
        pa.field("verdicts_fail", pa.int32(), nullable=False),
        pa.field("verdicts_undecided", pa.int32(), nullable=False),  # ERROR, UNPARSABLE or not judged
        pa.field("judge_coverage", pa.float64(), nullable=False),  # (PASS + FAIL) / prompts in the suite
        pa.field("overall", pa.float64()),  # 0.5 * capability + 0.5 * eps; null when either is
        pa.field("overall_lo", pa.float64()),
        pa.field("overall_hi", pa.float64()),
        pa.field("provisional", pa.bool_(), nullable=False),  # Capability/Overall not final: judge coverage < 1
        pa.field("source_fingerprint", pa.string()),  # listing fingerprint the scores were computed from
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("scored_at", TS, nullable=False),
    ]
)

# Every request sent to a judge (one row per attempt, including retries and fallbacks).
JUDGE_CALLS = pa.schema(
    [
        pa.field("model_id", pa.string(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("image_sha256", pa.string(), nullable=False),
        pa.field("judge", pa.string(), nullable=False),  # judge name in the endpoints config
        pa.field("judge_model", pa.string(), nullable=False),  # model the endpoint was asked for
        pa.field("reported_model", pa.string()),  # model the endpoint said answered
        pa.field("endpoint", pa.string()),  # endpoint name/host, never a key
        pa.field("template", pa.string(), nullable=False),
        pa.field("template_sha256", pa.string(), nullable=False),
        pa.field("sampling", pa.string(), nullable=False),  # canonical JSON of sampling settings
        pa.field("attempt", pa.int32(), nullable=False),
        pa.field("outcome", pa.string(), nullable=False),  # PASS / FAIL / UNPARSABLE / ERROR
        pa.field("error", pa.string()),
        pa.field("raw_text", pa.string()),
        pa.field("latency_s", pa.float64()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("completion_tokens", pa.int64()),
        pa.field("requested_at", TS, nullable=False),
    ]
)

# What makes a judge_calls row unique (the expectation suite checks it; a resumed commit uses it
# to append only calls the lake does not hold yet).
JUDGE_CALLS_KEY = ("model_id", "prompt_id", "image_sha256", "judge", "template_sha256", "sampling", "attempt", "requested_at")

# The decided verdict per (model, prompt): what Capability counts.
VERDICTS = pa.schema(
    [
        pa.field("model_id", pa.string(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("suite_version", pa.string(), nullable=False),
        pa.field("image_sha256", pa.string()),  # null for imported verdicts without hashes
        pa.field("question_sha256", pa.string(), nullable=False),
        pa.field("verdict", pa.string(), nullable=False),  # PASS / FAIL / ERROR / UNPARSABLE
        pa.field("reason", pa.string()),  # why ERROR / UNPARSABLE
        pa.field("judge", pa.string(), nullable=False),  # which judge decided
        pa.field("judge_model", pa.string(), nullable=False),
        pa.field("template_sha256", pa.string(), nullable=False),
        pa.field("sampling", pa.string(), nullable=False),
        pa.field("identity", pa.string(), nullable=False),  # hash of the verdict identity (skip key)
        pa.field("rationale", pa.string()),
        pa.field("source", pa.string(), nullable=False),  # "judged" or "import"
        pa.field("decided_at", TS, nullable=False),
    ]
)

TABLES: dict[str, pa.Schema] = {
    "images": IMAGES,
    "quarantine": QUARANTINE,
    "hps_scores": HPS_SCORES,
    "model_scores": MODEL_SCORES,
    "judge_calls": JUDGE_CALLS,
    "verdicts": VERDICTS,
}

# ---- run records ------------------------------------------------------------------------------
# One row per flow run (nightly, score-model/backfill, reference-build), partitioned by run:
# ``<lake>/runs/run_id=<run_id>/data.parquet``. Stage seconds are busy time summed over that
# stage's tasks (stages overlap: HPSv3 and judges run side by side), total_s is wall time.

# "running": written when the run starts and at each stage; "crashed": a running record whose
# process is gone (tasks/runs/state.py), rewritten so by the next run or `imagebench runs`.
RUN_STATUSES = ("running", "completed", "failed", "crashed")

# Discovery outcome of each model in a run (see docs/OPERATIONS.md, "What nightly scores").
MODEL_DISPOSITIONS = (
    "new",          # no complete result under the current suite, reference and scorer
    "incremental",  # images added since its result: only those are scored
    "replaced",     # an image changed or disappeared: re-scored whole, old results replaced
    "unchanged",    # objects re-listed differently but same content hashes: nothing to score
    "up_to_date",   # listing unchanged since its complete result: not even downloaded
    "invalid",      # object-store folder that is no model of the suite (bad name, empty, no object of its prompts): skipped, reported
    "busy",         # another run holds the model's lock: skipped (nightly) or refused
    "errored",      # the model's work failed (message in `errors`); other models unaffected
)

STAGES = ("ingest", "hpsv3", "judge", "commit", "catalog")

RUNS = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("flow", pa.string(), nullable=False),
        pa.field("flow_run_id", pa.string()),
        pa.field("deployment", pa.string()),
        pa.field("parameters_json", pa.string(), nullable=False),
        pa.field("suite_version", pa.string(), nullable=False),
        pa.field("reference_version", pa.string(), nullable=False),
        pa.field("scorer_id", pa.string()),
        # The ScorerRuntime the run scored in (canonical JSON) and the golden-set canary's largest
        # |drift| against the reference's build runtime; null when the run scored nothing.
        pa.field("runtime", pa.string()),
        pa.field("canary_max_drift", pa.float64()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("stage", pa.string()),  # the last stage the run entered (how far a crashed run got)
        pa.field("error", pa.string()),
        pa.field("started_at", TS, nullable=False),
        pa.field("finished_at", TS, nullable=False),
        pa.field("total_s", pa.float64(), nullable=False),
        pa.field("models_discovered", pa.int32(), nullable=False),
        *[pa.field(f"models_{d}", pa.list_(pa.string()), nullable=False) for d in MODEL_DISPOSITIONS],
        pa.field("errors", pa.list_(pa.string()), nullable=False),
        pa.field("corrupt_files", pa.list_(pa.string()), nullable=False),
        pa.field("images_ok", pa.int32(), nullable=False),
        pa.field("images_quarantined", pa.int32(), nullable=False),
        pa.field("images_missing", pa.int32(), nullable=False),
        pa.field("hps_images_scored", pa.int32(), nullable=False),
        pa.field("hps_images_resumed", pa.int32(), nullable=False),  # from shards of a killed run
        pa.field("judge_items", pa.int32(), nullable=False),
        pa.field("verdicts_decided", pa.int32(), nullable=False),
        pa.field("prefect_tasks", pa.int32(), nullable=False),
        *[pa.field(f"{s}_s", pa.float64(), nullable=False) for s in STAGES],
    ]
)

RUN_TABLES: dict[str, pa.Schema] = {"runs": RUNS}

# ---- the model registry -----------------------------------------------------------------------
# Append-only record of what people decided about a model (`imagebench models retire/unretire`):
# ``<lake>/model_events/model_id=<id>/data.parquet``, rows only ever added. A model whose latest
# event is "retired" is hidden from the leaderboard (the view reads this table) and skipped by the
# nightly; its rows stay in the lake. Written only by tasks/runs/models.py.

MODEL_EVENT_KINDS = ("retired", "unretired")

MODEL_EVENTS = pa.schema(
    [
        pa.field("model_id", pa.string(), nullable=False),
        pa.field("event", pa.string(), nullable=False),  # one of MODEL_EVENT_KINDS
        pa.field("reason", pa.string(), nullable=False),  # why, as the person gave it
        pa.field("actor", pa.string(), nullable=False),  # who: --by, else user@host
        pa.field("at", TS, nullable=False),  # when
    ]
)

REGISTRY_TABLES: dict[str, pa.Schema] = {"model_events": MODEL_EVENTS}
