"""What every run pins before it scores: the suite, the frozen reference, the scorer's identity and
the golden-set canary."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from schemas.reference import ReferenceFile, ScorerIdentity
from schemas.settings import Settings
from tasks.scores.suite import Suite, load_suite


def load_pinned_suite(settings: Settings) -> Suite:
    """The suite in force, verified against reference/SHA256SUMS."""
    from tasks.scores.reference import verify_suite

    suite = load_suite(settings.suite_path, version=settings.suite_version)
    verify_suite(settings.reference_dir, suite)
    return suite


def load_verified_reference(settings: Settings, suite: Suite, expected_scorer_id: str | None) -> ReferenceFile:
    from tasks.scores.reference import verify_reference

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
    from tasks.hpsv3.scorer import pin_intra_op_threads
    from tasks.scores.golden import golden_record, load_golden_set, score_golden

    golden = load_golden_set(settings.reference_dir, settings.golden_set)
    scorer = get_scorer(spec)
    pin_intra_op_threads(settings.hpsv3_threads)
    mus, runtime = score_golden(scorer, golden, settings.batch_size)
    return golden_record(golden, mus, runtime)


def check_runtime(settings: Settings, reference: ReferenceFile, spec: ScorerSpec):
    """The golden-set canary in this process's runtime: a CanaryResult, or CanaryDrift raised."""
    from tasks.hpsv3.scorer import pin_intra_op_threads
    from tasks.scores.golden import run_canary

    scorer = get_scorer(spec)
    pin_intra_op_threads(settings.hpsv3_threads)
    return run_canary(scorer, reference, settings.reference_dir, settings.batch_size)


def imported_identity(scorer_name: str) -> ScorerIdentity:
    return ScorerIdentity(scorer_name=scorer_name, source="import")
