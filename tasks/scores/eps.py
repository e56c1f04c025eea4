"""EPS math: pure functions over plain mappings and column tables, float64 everywhere, no I/O.

EPS (the HPSv3-based "expected preference score") compares a model's HPSv3 mu on each EPS-eligible
prompt with the frozen reference mu of that prompt::

    EPS = 100 * mean over ALL eligible prompts p of  sigmoid(mu[p] - mu_ref[p])

An eligible prompt without a mu (image missing or quarantined) contributes 0: it is a loss and is
counted in ``prompts_lost``. That holds while at least one eligible prompt has a mu: with none, EPS
is NaN (absent, as Capability with no judged verdict), never 0 (a figure with nothing behind it,
docs/STATISTICS.md section 2). A model's EPS therefore depends only on its own mu and the frozen
reference: adding, removing or re-scoring any other model never changes it.

The reference mu of a prompt is the median of the baseline models' mu on that prompt
(:func:`reference_medians`), computed once and frozen in ``reference/eps-reference-<v>.json``.

Tables (``scores``) may be a ``pyarrow.Table``, a polars or pandas ``DataFrame``, a mapping of
column name to sequence, or an iterable of row dicts; nothing here imports polars or pandas.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import expit

__all__ = ["EpsResult", "eps", "reference_medians", "sigmoid", "table_columns"]


def sigmoid(x: Any) -> Any:
    """Numerically stable logistic function in float64 (scalar in, numpy float64 out; array in,
    array out). ``sigmoid(-800) == 0.0`` and ``sigmoid(800) == 1.0`` without overflow warnings."""
    return expit(np.asarray(x, dtype=np.float64))


@dataclass(frozen=True)
class EpsResult:
    eps: float  # 0..100; NaN when no eligible prompt has a mu (prompts_scored == 0)
    prompts_scored: int  # eligible prompts that had a mu
    prompts_eligible: int  # all eligible prompts of the suite (the denominator)
    prompts_lost: int  # eligible prompts without a mu: each counted as 0

    @property
    def complete(self) -> bool:
        return self.prompts_lost == 0


def _check_ids(eligible_ids: Sequence[str]) -> list[str]:
    ids = list(eligible_ids)
    if not ids:
        raise ValueError("no EPS-eligible prompts: EPS is undefined")
    dup = sorted(p for p, n in Counter(ids).items() if n > 1)
    if dup:
        raise ValueError(f"eligible_ids has duplicates: {dup[:5]}")
    return ids


def eps(
    mu_by_prompt: Mapping[str, float],
    mu_ref: Mapping[str, float],
    eligible_ids: Sequence[str],
) -> EpsResult:
    """EPS of one model.

    ``mu_by_prompt``: the model's HPSv3 mu per prompt id (prompts without a usable image are simply
    absent). ``mu_ref``: the frozen reference mu per prompt id. ``eligible_ids``: the suite's
    EPS-eligible prompt ids (the denominator). mu of non-eligible prompts is ignored. With no
    eligible prompt scored, ``eps`` is NaN: the lost images count 0 only beside a scored one.

    Raises ``ValueError`` when ``mu_ref`` lacks an eligible prompt, when a reference or model mu of
    an eligible prompt is not finite, or when ``eligible_ids`` is empty or has duplicates.
    """
    ids = _check_ids(eligible_ids)
    no_ref = [p for p in ids if p not in mu_ref]
    if no_ref:
        raise ValueError(
            f"reference has no mu_ref for {len(no_ref)} eligible prompt(s): {no_ref[:5]} "
            "(reference built for another suite?)"
        )
    ref = np.array([mu_ref[p] for p in ids], dtype=np.float64)
    bad_ref = [p for p, v in zip(ids, ref) if not math.isfinite(v)]
    if bad_ref:
        raise ValueError(f"non-finite mu_ref for prompt(s) {bad_ref[:5]}")

    scored_idx: list[int] = []
    mus: list[float] = []
    for i, p in enumerate(ids):
        if p in mu_by_prompt and mu_by_prompt[p] is not None:
            v = float(mu_by_prompt[p])
            if not math.isfinite(v):
                raise ValueError(f"non-finite mu {v!r} for eligible prompt {p!r}")
            scored_idx.append(i)
            mus.append(v)
    mu = np.array(mus, dtype=np.float64)
    wins = sigmoid(mu - ref[scored_idx]) if scored_idx else np.zeros(0, dtype=np.float64)
    # fsum: exactly rounded, so the result does not depend on prompt order.
    # Nothing scored: no figure (NaN), not 0 from the lost images alone.
    value = 100.0 * math.fsum(wins.tolist()) / len(ids) if scored_idx else math.nan
    return EpsResult(
        eps=float(value),
        prompts_scored=len(scored_idx),
        prompts_eligible=len(ids),
        prompts_lost=len(ids) - len(scored_idx),
    )


def table_columns(table: Any, names: Sequence[str]) -> dict[str, list]:
    """Columns ``names`` of a table-like object as Python lists.

    Accepts a ``pyarrow.Table``, a polars or pandas ``DataFrame``, a mapping of column name to
    sequence, or an iterable of row mappings. Raises ``ValueError`` naming missing columns."""
    if isinstance(table, Mapping):
        missing = [n for n in names if n not in table]
        if missing:
            raise ValueError(f"table lacks column(s) {missing}")
        cols = {n: list(table[n]) for n in names}
    elif hasattr(table, "column_names") and hasattr(table, "column"):  # pyarrow.Table
        missing = [n for n in names if n not in table.column_names]
        if missing:
            raise ValueError(f"table lacks column(s) {missing}")
        cols = {n: table.column(n).to_pylist() for n in names}
    elif hasattr(table, "get_column") and hasattr(table, "columns"):  # polars.DataFrame
        missing = [n for n in names if n not in table.columns]
        if missing:
            raise ValueError(f"table lacks column(s) {missing}")
        cols = {n: table.get_column(n).to_list() for n in names}
    elif hasattr(table, "columns") and hasattr(table, "iloc"):  # pandas.DataFrame
        missing = [n for n in names if n not in table.columns]
        if missing:
            raise ValueError(f"table lacks column(s) {missing}")
        cols = {n: table[n].tolist() for n in names}
    elif isinstance(table, Iterable):
        rows = list(table)
        missing = sorted({n for r in rows for n in names if n not in r})
        if missing:
            raise ValueError(f"rows lack key(s) {missing}")
        cols = {n: [r[n] for r in rows] for n in names}
    else:
        raise TypeError(f"cannot read columns from {type(table).__name__}")
    lengths = {len(v) for v in cols.values()}
    if len(lengths) > 1:
        raise ValueError(f"columns {list(names)} have different lengths {sorted(lengths)}")
    return cols


def reference_medians(
    scores: Any,
    baseline_models: Sequence[str],
    eligible_ids: Sequence[str],
) -> dict[str, tuple[float, int]]:
    """Reference mu per eligible prompt: the median of the baseline models' mu.

    ``scores`` has columns ``model_id``, ``prompt_id``, ``mu`` (see :func:`table_columns`); rows of
    other models and of non-eligible prompts are ignored. Returns ``{prompt_id: (mu_ref,
    n_models)}`` in ``eligible_ids`` order. The median is numpy's: with an even number of models it
    is the mean of the two middle values.

    Every baseline model must have exactly one finite mu for every eligible prompt: otherwise a
    ``ValueError`` names each offending model (missing prompts with their count and the first few
    ids, duplicate (model, prompt) rows, non-finite mu). A reference built from partial coverage
    would silently mix different baseline sets per prompt, so partial coverage is refused.
    """
    ids = _check_ids(eligible_ids)
    models = list(baseline_models)
    if not models:
        raise ValueError("no baseline models given")
    dup_models = sorted(m for m, n in Counter(models).items() if n > 1)
    if dup_models:
        raise ValueError(f"baseline models listed more than once: {dup_models}")

    cols = table_columns(scores, ["model_id", "prompt_id", "mu"])
    wanted = set(models)
    eligible = set(ids)
    per_model: dict[str, dict[str, list[float]]] = {m: {} for m in models}
    for m, p, v in zip(cols["model_id"], cols["prompt_id"], cols["mu"]):
        if m in wanted:
            per_model[m].setdefault(p, []).append(v)

    problems: list[str] = []
    for m in models:
        rows = per_model[m]
        missing = [p for p in ids if p not in rows]
        if missing:
            problems.append(
                f"baseline model {m!r} lacks {len(missing)} of {len(ids)} eligible prompts "
                f"(first: {missing[:5]})"
            )
        dups = sorted(p for p, vs in rows.items() if len(vs) > 1)
        if dups:
            problems.append(
                f"baseline model {m!r} has duplicate (model, prompt) rows for {len(dups)} "
                f"prompt(s) (first: {dups[:5]})"
            )
        bad = sorted(
            p for p, vs in rows.items() if p in eligible and any(v is None or not math.isfinite(float(v)) for v in vs)
        )
        if bad:
            problems.append(f"baseline model {m!r} has null or non-finite mu for prompt(s) {bad[:5]}")
    if problems:
        raise ValueError("cannot compute reference medians: " + "; ".join(problems))

    out: dict[str, tuple[float, int]] = {}
    for p in ids:
        values = np.array([per_model[m][p][0] for m in models], dtype=np.float64)
        out[p] = (float(np.median(values)), int(values.size))
    return out
