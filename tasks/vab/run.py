"""One VAB run, without Prefect (flows/vab.py wraps these): which judges, the trial items of a set
collection, batches of answers -> ``vab_trials`` rows, the Great Expectations check, the write.

Judges are named on the command line: ``sharpness`` (the focus measure), ``hpsv3`` (imagebench's
scorer as configured in the settings), or any judge of the endpoints config
(``IMAGEBENCH_JUDGES_CONFIG``: an OpenAI-compatible or local transformers VLM). A judge is built
afresh inside each batch from its :class:`JudgeSpec` (plain data): batches run in parallel threads,
each with its own event loop and HTTP client.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from schemas.vab import TRIALS, VAB_TRIALS, VabTask
from tasks.vab.judges import AnswerCache, HPSv3ImageScorer, ScalarSetJudge, SetJudge, SharpnessScorer, TrialAnswer, TrialItem, VlmSetJudge, judge_with_cache
from tasks.vab.trials import map_back, trial_orders

SCALAR_JUDGES = ("sharpness", "hpsv3")


@dataclass(frozen=True)
class JudgeSpec:
    """A judge as plain data (crosses Prefect task boundaries)."""

    name: str
    kind: str  # "vlm" | "scalar"
    endpoint: Any = None  # schemas.judges.Endpoint for a VLM
    hpsv3: tuple[str, str, bool] | None = None  # base model, checkpoint, uncalibrated

    def build(self) -> SetJudge:
        if self.kind == "vlm":
            return VlmSetJudge(self.name, self.endpoint)
        if self.name == "sharpness":
            return ScalarSetJudge(SharpnessScorer())
        if self.name == "hpsv3" and self.hpsv3 is not None:
            base, ckpt, uncal = self.hpsv3
            return ScalarSetJudge(HPSv3ImageScorer(base, ckpt, uncalibrated=uncal))
        raise ValueError(f"judge {self.name!r}: unknown scalar scorer")


def resolve_judges(settings: Any, names: Sequence[str]) -> list[JudgeSpec]:
    """Specs for judge names; an unknown name is one clear error listing what is known."""
    from tasks.judges.config import load_judges_config

    if not names:
        raise ValueError("name at least one judge (--judge sharpness, --judge hpsv3, or a judge of the endpoints config)")
    endpoints = dict(load_judges_config(settings.judges_config).judges) if settings.judges_config else {}
    specs, seen = [], set()
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        if name == "sharpness":
            specs.append(JudgeSpec(name, "scalar"))
        elif name == "hpsv3":
            # uncalibrated demo weights are detected from the checkpoint's metadata by the scorer
            specs.append(JudgeSpec(name, "scalar", hpsv3=(str(settings.hpsv3_base_model), str(settings.hpsv3_checkpoint), False)))
        elif name in endpoints:
            ep = endpoints[name]
            if ep.backend not in ("openai", "transformers"):
                raise ValueError(f"judge {name!r}: backend {ep.backend!r} cannot rank image sets (openai or transformers VLMs only)")
            specs.append(JudgeSpec(name, "vlm", endpoint=ep))
        else:
            known = sorted(SCALAR_JUDGES) + sorted(n for n, e in endpoints.items() if e.backend in ("openai", "transformers"))
            src = f" (endpoints config {settings.judges_config})" if settings.judges_config else " (no endpoints config: IMAGEBENCH_JUDGES_CONFIG)"
            raise ValueError(f"unknown judge {name!r}; known: {known}{src}")
    return specs


def trial_items(tasks: Sequence[VabTask], paths: Sequence[Sequence[Path]]) -> list[TrialItem]:
    """The 3 trials of every task: images in each trial's shown order (tasks.vab.trials)."""
    items = []
    for task, task_paths in zip(tasks, paths, strict=True):
        shas = list(task.image_sha256) or [""] * len(task.images)
        for trial, order in enumerate(trial_orders(task.task_id, len(task.images))):
            items.append(TrialItem(
                task_id=task.task_id, trial=trial, order=tuple(order),
                image_paths=tuple(str(task_paths[p - 1]) for p in order),
                image_sha256=tuple(shas[p - 1] for p in order), domain=task.domain,
            ))
    assert len(items) == TRIALS * len(tasks)
    return items


def trial_rows(sets: str, judge: SetJudge, items: Sequence[TrialItem], answers: Sequence[TrialAnswer]) -> list[dict]:
    """``vab_trials`` rows: each answer with its shown positions mapped back to stored ones."""
    now = datetime.now(timezone.utc)
    identity = judge.identity()  # once: HPSv3's identity hashes its files
    rows = []
    for it, a in zip(items, answers, strict=True):
        rows.append({
            "sets": sets, "judge": judge.name, "judge_kind": judge.kind, "judge_identity": identity,
            "task_id": it.task_id, "trial": it.trial, "order": list(it.order),
            "best_shown": a.best_shown, "worst_shown": a.worst_shown,
            "best": map_back(it.order, a.best_shown) if a.best_shown is not None else None,
            "worst": map_back(it.order, a.worst_shown) if a.worst_shown is not None else None,
            "state": a.state, "detail": a.detail, "decided_at": now,
        })
    return rows


def judge_batch(sets: str, spec: JudgeSpec, items: Sequence[TrialItem], cache_dir: Path | None) -> tuple[list[dict], int]:
    """Answers of one judge to one batch of trials, as ``vab_trials`` rows; (rows, cache hits)."""
    judge = spec.build()
    answers, hits = judge_with_cache(judge, items, AnswerCache(cache_dir))
    return trial_rows(sets, judge, items, answers), hits


def batches(items: Sequence[TrialItem], spec: JudgeSpec, size: int) -> list[list[TrialItem]]:
    """VLM trials in batches of ``size`` (run in parallel); a scalar judge in one batch (it scores
    each distinct image once and may load a model)."""
    if spec.kind != "vlm":
        return [list(items)] if items else []
    return [list(items[i:i + size]) for i in range(0, len(items), max(1, size))]


def trials_table(rows: Sequence[dict]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=VAB_TRIALS).sort_by([("judge", "ascending"), ("task_id", "ascending"), ("trial", "ascending")])
