"""`imagebench vab import-answers FILE.csv --sets S --judge NAME`: answers produced elsewhere.

CSV columns ``task_id,trial,order,best,worst``: ``order`` the stored positions as shown,
space-separated (``3 1 2``); ``best``/``worst`` the positions the judge named in the *shown*
order, 1-based; empty = no valid answer. The file is validated whole (a bad row is named by line
and task, every bad row at once, nothing recorded); then the answers are mapped back to stored
positions and stored in ``vab_trials`` (judge_kind ``import``), replacing only this judge's rows,
so they are scored exactly like our own runs. Light: no torch, Prefect or GX.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from schemas.vab import PROMPT_COMBINED, TRIALS, VAB_TRIALS, check_judge_name  # noqa: F401 (check_judge_name: re-exported)
from tasks.vab.sets import load_sets
from tasks.vab.tables import check_set_name, read_csv_with_header, replace_judge_trials
from tasks.vab.trials import check_order, map_back, repeated_orders

COLUMNS = ("task_id", "trial", "order", "best", "worst")


def _int_or_none(text: str, what: str) -> int | None:
    text = (text or "").strip()
    if not text:
        return None
    if not re.fullmatch(r"[0-9]+", text):
        raise ValueError(f"{what} {text!r} is not a position (a whole number, or empty for no valid answer)")
    return int(text)


def parse_answers(file: Path, tasks_by_id: dict[str, Any], sets: str, judge: str) -> list[dict]:
    """VAB_TRIALS rows of the file (validated whole; raises ValueError listing every bad row)."""
    file = Path(file)
    reader = read_csv_with_header(file, COLUMNS)
    now = datetime.now(timezone.utc)
    rows, problems, seen = [], [], {}
    orders: dict[str, list] = {}  # task -> the orders of its trials (also of rows refused for another reason)
    for line, rec in enumerate(reader, 2):
        tid = (rec.get("task_id") or "").strip()
        where = f"line {line}, task {tid!r}"
        try:
            if None in rec:
                raise ValueError("more columns than the header")
            if tid not in tasks_by_id:
                raise ValueError(f"not a task of set collection {sets!r}")
            task = tasks_by_id[tid]
            n = len(task.images)
            trial = _int_or_none(rec["trial"], "trial")
            if trial is None or trial >= TRIALS:
                raise ValueError(f"trial {rec['trial']!r} is not 0..{TRIALS - 1}")
            if (tid, trial) in seen:
                raise ValueError(f"trial {trial} already given on line {seen[(tid, trial)]}")
            seen[(tid, trial)] = line
            parts = (rec["order"] or "").split()
            if not all(p.isdigit() for p in parts):
                raise ValueError(f"order {rec['order']!r} must be space-separated positions")
            order = check_order([int(p) for p in parts], n, "order")
            orders.setdefault(tid, []).append(order)
            best_shown = _int_or_none(rec["best"], "best")
            worst_shown = _int_or_none(rec["worst"], "worst")
            for what, v in (("best", best_shown), ("worst", worst_shown)):
                if v is not None and not 1 <= v <= n:
                    raise ValueError(f"{what}={v} is out of range 1..{n}")
            if n == 2 and worst_shown is not None:
                raise ValueError(f"a 2-image task has no worst (got worst={worst_shown})")
            if best_shown is not None and best_shown == worst_shown:
                raise ValueError(f"best and worst name the same image ({best_shown}): not an answer")
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        valid = best_shown is not None or worst_shown is not None
        rows.append({
            "sets": sets, "judge": judge, "judge_kind": "import",
            "judge_identity": json.dumps({"kind": "import", "file": file.name}),
            "task_id": tid, "trial": trial, "prompt_type": PROMPT_COMBINED, "order": order,
            "best_shown": best_shown, "worst_shown": worst_shown,
            "best": None if best_shown is None else map_back(order, best_shown),
            "worst": None if worst_shown is None else map_back(order, worst_shown),
            "state": "ok" if valid else "unparsable",
            "detail": None if valid else "no valid answer in the imported file",
            "decided_at": now,
        })
    for tid, got in orders.items():
        if len(got) == TRIALS and repeated_orders(got):
            problems.append(f"task {tid!r}: the 3 trials must show 3 different orders, got "
                            + ", ".join(" ".join(map(str, o)) for o in got))
    if problems:
        raise ValueError(f"{file}: {len(problems)} bad row(s), nothing imported: " + "; ".join(problems))
    if not rows:
        raise ValueError(f"{file}: no answer rows")
    return rows


def import_answers(settings: Any, file: Path, sets: str, judge: str) -> dict:
    """Validate, map back and store; returns counts (rows, tasks, tasks short of 3 trials)."""
    from tasks.lake.tables import Lake

    check_set_name(sets)
    check_judge_name(judge)
    tasks = load_sets(settings, sets)
    by_id = {t.task_id: t for t in tasks}
    rows = parse_answers(file, by_id, sets, judge)
    replace_judge_trials(Lake(settings.lake_dir), sets, judge, pa.Table.from_pylist(rows, schema=VAB_TRIALS))
    per_task: dict[str, int] = {}
    for r in rows:
        per_task[r["task_id"]] = per_task.get(r["task_id"], 0) + 1
    return {"rows": len(rows), "tasks": len(per_task), "tasks_in_sets": len(tasks),
            "short_tasks": sum(1 for t in tasks if per_task.get(t.task_id, 0) < TRIALS),
            "unparsable": sum(1 for r in rows if r["state"] != "ok")}
