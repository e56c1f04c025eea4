"""One VAB run, without Prefect (flows/vab.py wraps these): which judges, the trial items of a set
collection, batches of answers -> ``vab_trials`` rows, the Great Expectations check, the write.

Judges are named on the command line: ``sharpness`` (the focus measure), ``hpsv3`` (imagebench's
scorer as configured in the settings), or any judge of the endpoints config
(``IMAGEBENCH_JUDGES_CONFIG``: an OpenAI-compatible or local transformers VLM). A judge is built
afresh inside each batch from its :class:`JudgeSpec` (plain data): batches run in parallel threads,
each with its own event loop and HTTP client; the endpoint's limits are not the batch's but the
run's (the spec's ``limits`` scope: tasks/judges/limits.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from schemas.vab import (OFFICIAL_PROMPT_TYPES, PICK_BEST, PICK_BEST_AND_WORST, PROMPT_COMBINED, TRIAL_SCHEME_OFFICIAL, VAB_TRIALS,
                         VabTask, check_judge_name)
from tasks.vab.judges import AnswerCache, HPSv3ImageScorer, ScalarSetJudge, SetJudge, SharpnessScorer, TrialAnswer, TrialItem, VlmSetJudge, judge_with_cache
from tasks.vab.prompts import OFFICIAL_PROMPT_VERSION, OFFICIAL_TEMPERATURE, VAB_PROMPT_VERSION
from tasks.vab.trials import map_back, trial_orders

SCALAR_JUDGES = ("sharpness", "hpsv3")


@dataclass(frozen=True)
class JudgeSpec:
    """A judge as plain data (crosses Prefect task boundaries)."""

    name: str
    kind: str  # "vlm" | "scalar"
    endpoint: Any = None  # schemas.judges.Endpoint for a VLM
    hpsv3: tuple[str, str, bool] | None = None  # base model, checkpoint, uncalibrated
    prompt_version: str = VAB_PROMPT_VERSION  # a VLM's (tasks.vab.prompts); scalar judges answer the combined question
    temperature: float | None = None  # None: the prompt version's default
    limits: Any = None  # tasks.judges.limits.LimitScope: who shares the endpoint's limits (None: this process)

    @property
    def official(self) -> bool:
        return self.kind == "vlm" and self.prompt_version == OFFICIAL_PROMPT_VERSION

    @property
    def stored_name(self) -> str:
        """The name its answers are stored under: the judge's, or ``<judge>@t<T>`` for a VLM sampled at
        a temperature other than its prompt version's default (1.0 official, 0 ours), so a run at
        temperature 0 sits beside the run at 1 instead of replacing it (summarize.py's --t0-dir)."""
        if self.kind != "vlm" or self.temperature is None:
            return self.name
        default = OFFICIAL_TEMPERATURE if self.official else 0.0
        return self.name if float(self.temperature) == default else f"{self.name}@t{float(self.temperature):g}"

    def build(self) -> SetJudge:
        if self.kind == "vlm":
            return VlmSetJudge(self.name, self.endpoint, prompt_version=self.prompt_version, temperature=self.temperature,
                               limits=self.limits)
        if self.name == "sharpness":
            return ScalarSetJudge(SharpnessScorer())
        if self.name == "hpsv3" and self.hpsv3 is not None:
            base, ckpt, uncal = self.hpsv3
            return ScalarSetJudge(HPSv3ImageScorer(base, ckpt, uncalibrated=uncal))
        raise ValueError(f"judge {self.name!r}: unknown scalar scorer")


def hpsv3_weights_problem(settings: Any) -> str | None:
    """One line naming the fix when the HPSv3 weights (or the base model's config) are neither a
    local path nor in the Hugging Face cache. Checked before anything starts, without torch and
    without the network (a hub download attempt is what used to take 37 s to fail)."""
    from huggingface_hub import try_to_load_from_cache

    for what, value, filename in (("checkpoint", settings.hpsv3_checkpoint, "HPSv3.safetensors"),
                                  ("base model", settings.hpsv3_base_model, "config.json")):
        text = str(value)
        if Path(text).expanduser().exists():
            continue
        looks_local = text.startswith((".", "/", "~")) or text.count("/") > 1 or text.endswith(".safetensors")
        if not looks_local and isinstance(try_to_load_from_cache(text, filename), str):
            continue
        where = "not found" if looks_local else "not in the Hugging Face cache"
        return (f"judge 'hpsv3': HPSv3 {what} {text!r} {where}: run `imagebench demo` once for the demo weights "
                f"(UNCALIBRATED), or set IMAGEBENCH_HPSV3_CHECKPOINT (and IMAGEBENCH_HPSV3_BASE_MODEL) to the real ones")
    return None


def resolve_judges(settings: Any, names: Sequence[str], prompt_version: str = VAB_PROMPT_VERSION,
                   temperature: float | None = None) -> list[JudgeSpec]:
    """Specs for judge names; an unknown name is one clear error listing what is known."""
    from tasks.judges.config import load_judges_config
    from tasks.vab.prompts import PROMPT_VERSIONS

    if prompt_version not in PROMPT_VERSIONS:
        raise ValueError(f"unknown VAB prompt version {prompt_version!r}; versions: {', '.join(PROMPT_VERSIONS)}")

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
            problem = hpsv3_weights_problem(settings)
            if problem:
                raise ValueError(problem)
            # uncalibrated demo weights are detected from the checkpoint's metadata by the scorer
            specs.append(JudgeSpec(name, "scalar", hpsv3=(str(settings.hpsv3_base_model), str(settings.hpsv3_checkpoint), False)))
        elif name in endpoints:
            check_judge_name(name)  # a name the VAB tables would refuse fails now, not after judging
            ep = endpoints[name]
            if ep.backend not in ("openai", "transformers"):
                raise ValueError(f"judge {name!r}: backend {ep.backend!r} cannot rank image sets (openai or transformers VLMs only)")
            spec = JudgeSpec(name, "vlm", endpoint=ep, prompt_version=prompt_version, temperature=temperature)
            check_judge_name(spec.stored_name)
            specs.append(spec)
        else:
            known = sorted(SCALAR_JUDGES) + sorted(n for n, e in endpoints.items() if e.backend in ("openai", "transformers"))
            src = f" (endpoints config {settings.judges_config})" if settings.judges_config else " (no endpoints config: IMAGEBENCH_JUDGES_CONFIG)"
            raise ValueError(f"unknown judge {name!r}; known: {known}{src}")
    return specs


def check_prompt_types(prompt_types: Sequence[str] | None, official: bool) -> tuple[str, ...]:
    """The prompt types a run asks: eval.py's ``--prompt-type`` (one of them, or all three); our
    combined prompt has one. ValueError naming what is allowed otherwise."""
    if not official:
        if prompt_types and set(prompt_types) != {PROMPT_COMBINED}:
            raise ValueError(f"--prompt-type {', '.join(prompt_types)} needs --prompt {OFFICIAL_PROMPT_VERSION} "
                             f"(our prompt asks one combined question)")
        return (PROMPT_COMBINED,)
    asked = tuple(pt for pt in OFFICIAL_PROMPT_TYPES if not prompt_types or pt in prompt_types)
    unknown = sorted(set(prompt_types or ()) - set(OFFICIAL_PROMPT_TYPES))
    if unknown or not asked:
        raise ValueError(f"unknown prompt type(s) {unknown}; the official ones: {', '.join(OFFICIAL_PROMPT_TYPES)} (or all)")
    return asked


def trial_items(tasks: Sequence[VabTask], paths: Sequence[Sequence[Path]], scheme: str = TRIAL_SCHEME_OFFICIAL,
                official: bool = False, prompt_types: Sequence[str] | None = None) -> list[TrialItem]:
    """The 3 trials of every task, images in each trial's shown order (tasks.vab.trials, under the
    collection's ``scheme``): one combined question each, or (``official``) each of eval.py's prompt
    types asked (all three by default; pick_best_and_worst for 3+ images only: for 2 it is derived,
    :func:`derived_rows`)."""
    asked = check_prompt_types(prompt_types, official)
    items = []
    for task, task_paths in zip(tasks, paths, strict=True):
        n = len(task.images)
        shas = list(task.image_sha256) or [""] * n
        types = [pt for pt in asked if not (pt == PICK_BEST_AND_WORST and n == 2)]
        for pt in types:
            for trial, order in enumerate(trial_orders(task.task_id, n, scheme)):
                items.append(TrialItem(
                    task_id=task.task_id, trial=trial, order=tuple(order),
                    image_paths=tuple(str(task_paths[p - 1]) for p in order),
                    image_sha256=tuple(shas[p - 1] for p in order), domain=task.domain, prompt_type=pt, scheme=scheme,
                ))
    return items


def derived_rows(rows: Sequence[dict], tasks: Sequence[VabTask]) -> list[dict]:
    """eval.py's pick_best_and_worst rows of 2-image tasks, derived from pick_best answers that were
    read (best = the answer, worst = the other image); none for an error or an unparsable answer."""
    two = {t.task_id for t in tasks if len(t.images) == 2}
    have = {(r["task_id"], r["trial"]) for r in rows if r.get("prompt_type") == PICK_BEST_AND_WORST}
    out = []
    for r in rows:
        if (r.get("prompt_type") == PICK_BEST and r["task_id"] in two and r["state"] == "ok"
                and (r["task_id"], r["trial"]) not in have):
            order = list(r["order"])
            other_shown = 2 if r["best_shown"] == 1 else 1
            out.append({**r, "prompt_type": PICK_BEST_AND_WORST, "worst_shown": other_shown,
                        "worst": map_back(order, other_shown), "detail": "derived from pick_best"})
    return out


def trial_rows(sets: str, judge: SetJudge, items: Sequence[TrialItem], answers: Sequence[TrialAnswer],
               stored_name: str | None = None) -> list[dict]:
    """``vab_trials`` rows: each answer with its shown positions mapped back to stored ones, under
    ``stored_name`` (default: the judge's name)."""
    now = datetime.now(timezone.utc)
    identity = judge.identity()  # once: HPSv3's identity hashes its files
    rows = []
    for it, a in zip(items, answers, strict=True):
        rows.append({
            "sets": sets, "judge": stored_name or judge.name, "judge_kind": judge.kind, "judge_identity": identity,
            "task_id": it.task_id, "trial": it.trial, "prompt_type": it.prompt_type, "order": list(it.order),
            "best_shown": a.best_shown, "worst_shown": a.worst_shown,
            "best": map_back(it.order, a.best_shown) if a.best_shown is not None else None,
            "worst": map_back(it.order, a.worst_shown) if a.worst_shown is not None else None,
            "state": a.state, "detail": a.detail, "decided_at": now, "response": a.response,
        })
    return rows


def judge_batch(sets: str, spec: JudgeSpec, items: Sequence[TrialItem], cache_dir: Path | None) -> tuple[list[dict], int]:
    """Answers of one judge to one batch of trials, as ``vab_trials`` rows; (rows, cache hits)."""
    judge = spec.build()
    answers, hits = judge_with_cache(judge, items, AnswerCache(cache_dir))
    return trial_rows(sets, judge, items, answers, spec.stored_name), hits


def batches(items: Sequence[TrialItem], spec: JudgeSpec, size: int) -> list[list[TrialItem]]:
    """VLM trials in batches of ``size`` (run in parallel); a scalar judge in one batch (it scores
    each distinct image once and may load a model)."""
    if spec.kind != "vlm":
        return [list(items)] if items else []
    return [list(items[i:i + size]) for i in range(0, len(items), max(1, size))]


def trials_table(rows: Sequence[dict]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=VAB_TRIALS).sort_by(
        [("judge", "ascending"), ("task_id", "ascending"), ("prompt_type", "ascending"), ("trial", "ascending")])
