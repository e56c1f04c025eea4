"""Per-prompt views of one model (what the report pages and `imagebench compare` read).

Same rules as ``work.aggregate_model``: a verdict or mu counts only for the image it was
produced from; missing and quarantined images are FAIL for Capability and 0 for EPS (no EPS at
all when no eligible prompt was scored: ``stats.eps_contributions``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schemas.reference import ReferenceFile
from schemas.settings import Settings
from tasks.scores.suite import Suite


@dataclass(frozen=True)
class PromptView:
    prompt_id: str
    state: str  # ok / quarantined / missing
    reason: str | None
    image_path: str | None  # relative to the workspace
    image_sha256: str | None
    mu: float | None
    verdict: str | None  # as judged (None: not judged); missing/quarantined -> FAIL
    judge: str | None
    rationale: str | None


def model_prompts(settings: Settings, suite: Suite, reference: ReferenceFile, model_id: str) -> list[PromptView]:
    from tasks.scores import stats
    from tasks.lake.tables import Lake
    from tasks.runs.units_aggregate import _latest_verdicts
    from tasks.runs.reads import scores_for

    lake = Lake(settings.lake_dir)
    images = {r["prompt_id"]: r for r in lake.read("images", [model_id]).to_pylist()}
    scores = scores_for(settings, model_id, reference.scorer_id).to_pylist()
    imported = reference.scorer.source == "import"
    if imported:
        mu = {r["prompt_id"]: r["mu"] for r in scores}
        sha = {p.prompt_id: (images.get(p.prompt_id) or {}).get("image_sha256") for p in suite.prompts}
    else:
        sha = {p: r["image_sha256"] for p, r in images.items() if r["state"] == "ok"}
        mu = {r["prompt_id"]: r["mu"] for r in scores if sha.get(r["prompt_id"]) == r["image_sha256"]}
    decided = _latest_verdicts(settings, model_id, {p.prompt_id: sha.get(p.prompt_id) for p in suite.prompts})
    views = []
    for p in suite.prompts:
        img = images.get(p.prompt_id)
        v = decided.get(p.prompt_id)
        state = img["state"] if img else ("ok" if imported and (p.prompt_id in mu or v) else "missing")
        views.append(
            PromptView(
                prompt_id=p.prompt_id,
                state=state,
                reason=img["reason"] if img else None,
                image_path=img["image_path"] if img else None,
                image_sha256=img["image_sha256"] if img else None,
                mu=mu.get(p.prompt_id),
                verdict=stats.effective_verdict(state, v["verdict"] if v else None),
                judge=v["judge"] if v else None,
                rationale=v["rationale"] if v else None,
            )
        )
    return views


def paired_vectors(views: list[PromptView], suite: Suite, reference: ReferenceFile) -> tuple[list, np.ndarray]:
    """(verdicts, EPS contributions) in suite order, the inputs of ``stats.compare``."""
    from tasks.scores import stats
    from tasks.scores.reference import load_reference_mu

    prompt_ids = [p.prompt_id for p in suite.prompts]
    mu = {v.prompt_id: v.mu for v in views if v.mu is not None}
    contributions = stats.eps_contributions(mu, load_reference_mu(reference), prompt_ids, suite.eligible_ids)
    return [v.verdict for v in views], contributions
