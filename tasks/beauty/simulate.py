"""SIMULATED answers for `make demo`'s study: made up, labelled so on every output.

A logistic model with a tool effect (graded by the tool's place in study.yaml: the first tool is
liked most), a prompt effect, a judge leniency and a small lift for the aphantasia group, so the
demo's heatmap, intervals and hypotheses have something to show. Deterministic from the seed.
Nothing here claims anything about real tools or real judges.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa

from schemas.study import STUDY_ANSWERS, StudyDefinition, salted_judge_id

SIMULATION_START = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)  # fixed: the demo's tables do not change between runs


def simulate_answers(
    definition: StudyDefinition, prompt_ids: list[str], salt: str, seed: int = 7,
    image_ids: dict[tuple[str, str], str] | None = None, start: datetime | None = None,
) -> pa.Table:
    """One SIMULATED answer per (declared judge, tool, prompt), in a per-judge shuffled order,
    schema ``STUDY_ANSWERS`` with source ``"simulated"``. ``image_ids``: (tool, prompt) -> the
    opaque id of the opened study's blinded image, when it was opened. ``start``: the first
    answer's time (default ``SIMULATION_START``; an opened study starts an hour after its
    pre-registration, so its simulated answers never predate its plan)."""
    if not definition.simulated:
        raise ValueError(f"study {definition.study_id}: simulated answers only go to a study.yaml with simulated: true")
    rng = np.random.default_rng(seed)
    tools = list(definition.tools)
    tool_effect = np.linspace(1.0, -1.0, len(tools))
    prompt_effect = rng.normal(0.0, 0.9, len(prompt_ids))
    rows = []
    for j, judge in enumerate(definition.judges):
        leniency = rng.normal(0.0, 0.5) + (0.6 if judge.group == "aphantasia" else 0.0)
        pairs = [(t, p) for t in range(len(tools)) for p in range(len(prompt_ids))]
        order = rng.permutation(len(pairs))
        clock = (start or SIMULATION_START) + timedelta(hours=j)
        for position, k in enumerate(order):
            t, p = pairs[k]
            prob = 1.0 / (1.0 + np.exp(-(tool_effect[t] + prompt_effect[p] + leniency)))
            shown = clock
            answered = shown + timedelta(seconds=float(rng.uniform(1.5, 9.0)))
            clock = answered + timedelta(seconds=1)
            rows.append({
                "study_id": definition.study_id, "judge_id": salted_judge_id(salt, judge.label),
                "panel_group": judge.group, "tool": tools[t], "prompt_id": prompt_ids[p],
                "image_id": (image_ids or {}).get((tools[t], prompt_ids[p])), "position": position,
                "answer": bool(rng.random() < prob), "shown_at": shown, "answered_at": answered,
                "memo": False, "source": "simulated",
            })
    return pa.Table.from_pylist(rows, schema=STUDY_ANSWERS)


def record_simulated_answers(settings, study_id: str, seed: int = 7) -> int:
    """Simulate the study's answers and store them in the lake (``study_answers``, source
    ``"simulated"``), replacing earlier simulated ones. Returns the number of answers."""
    from tasks.beauty.sources import study_salt
    from tasks.beauty.sources import _open_store, load_study_context
    from tasks.beauty.tables import write_study_partition
    from tasks.lake.tables import Lake

    ctx = load_study_context(settings, study_id)
    image_ids = None
    store = _open_store(ctx)
    if store is not None:
        try:
            image_ids = {(r["tool"], r["prompt_id"]): r["image_id"] for r in store.image_rows()}
        finally:
            store.dispose()
    start = None
    if ctx.prereg is not None:
        start = datetime.fromisoformat(ctx.prereg.created_at).astimezone(timezone.utc).replace(microsecond=0) + timedelta(hours=1)
    table = simulate_answers(ctx.definition, ctx.prompt_ids, study_salt(ctx.study_dir), seed, image_ids, start)
    write_study_partition(Lake(settings.lake_dir), "study_answers", study_id, table)
    return table.num_rows
