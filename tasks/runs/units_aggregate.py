"""The aggregate unit: EPS, Capability and intervals per model -> ``model_scores``; ``refresh`` -> the
DuckDB catalog."""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from schemas import lake as lake_schemas
from schemas.reference import ReferenceFile, ScorerIdentity
from schemas.settings import Settings
from tasks.runs.reads import content_fingerprint, ok_images, scores_for
from tasks.runs.run_ids import utcnow
from tasks.scores.suite import Suite


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
    from tasks.lake.tables import Lake

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
    eps: object  # tasks.scores.eps.EpsResult
    cap: object  # tasks.scores.stats.CapabilityResult
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
    from tasks.scores import stats
    from tasks.scores.eps import eps

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
# (tasks.scores.stats.bootstrap_draws), so this only bounds memory (~ 8 B x 2 x models x 100 x prompts).
_BOOTSTRAP_CHUNK = 64


def _model_scores_row(
    suite: Suite, reference: ReferenceFile, ref_sha: str, run_id: str, inputs: _ModelInputs, ci, scored_at: dt.datetime
) -> dict:
    """The `model_scores` row of one model from its inputs and bootstrap intervals (pure)."""

    def finite(x: float) -> float | None:
        return None if x is None or x != x else float(x)

    result, cap, states = inputs.eps, inputs.cap, inputs.states
    capability = finite(cap.capability)
    eps = finite(result.eps)  # None: no eligible prompt scored (absent, never 0)
    overall = None if capability is None or eps is None else 0.5 * capability + 0.5 * eps
    return {
        "model_id": inputs.model_id,
        "suite_version": suite.version,
        "reference_version": reference.version,
        "reference_sha256": ref_sha,
        "scorer_name": reference.scorer.scorer_name,
        "scorer_id": reference.scorer_id,
        "eps": eps,
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
        "eps_lo": finite(ci.eps[0]) if eps is not None else None,
        "eps_hi": finite(ci.eps[1]) if eps is not None else None,
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
    from tasks.lake.tables import Lake
    from tasks.lake.validation import require_valid
    from tasks.scores import stats
    from tasks.scores.reference import load_reference_mu

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
        scores = scores_for(settings, model_id, identity.scorer_id)
        if identity.source == "hpsv3":
            ok = ok_images(settings, model_id)
            current = set(zip(ok["prompt_id"].to_pylist(), ok["image_sha256"].to_pylist()))
            mask = [(p, s) in current for p, s in zip(scores["prompt_id"].to_pylist(), scores["image_sha256"].to_pylist())]
            scores = scores.filter(pa.array(mask, pa.bool_()))
        tables.append(scores)
    return pa.concat_tables(tables) if tables else lake_schemas.HPS_SCORES.empty_table()


def models_scored_by(settings: Settings, scorer_id: str) -> list[str]:
    """Models with at least one hps_scores row of ``scorer_id`` (sorted)."""
    from tasks.lake.scan import models_with

    return models_with(settings.lake_dir, "hps_scores", "scorer_id", scorer_id)


def reference_sha256(settings: Settings) -> str:
    return hashlib.sha256(settings.reference_path.read_bytes()).hexdigest()


def refresh(settings: Settings, suite: Suite) -> Path:
    from tasks.lake.tables import refresh_catalog

    refresh_catalog(settings.lake_dir, settings.catalog_path, suite, settings.reference_version)
    return settings.catalog_path
