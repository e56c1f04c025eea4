"""`imagebench vab import-results FILE --sets S [--judge NAME]`: the authors' eval.py result files,
as they are (docs/VAB.md, "Official result files").

- ``<model>.json`` (a finished run): ``metadata.model`` and ``results[]``, one row per
  (task_id, prompt_type, trial), pick_best_and_worst rows of 2-image tasks already derived;
- ``<model>.partial.jsonl`` (a run still going or stopped; any file name: told apart from a
  finished file by its content, one JSON row per line): read as eval.py reads it at the end of a run (a later answer replaces an earlier error of
  the same trial, an unreadable line is skipped and counted), then, when the run asked
  pick_best_and_worst (the file has such rows), the 2-image pick_best_and_worst rows are derived
  from pick_best as eval.py derives them.

Each row becomes one ``vab_trials`` row (prompt_type, trial, shown order ``[p + 1 for p in
permutation]``, answer letters mapped to stored positions through the release's labels): an
``error`` row is state ``error``, ``parsed_answer: null`` is ``unparsable``. The file is checked
whole against the set collection (task ids, sizes, domains, ground truths, eval.py's ``correct``,
three distinct orders for 3+ images); every bad row is named and nothing is stored. An answer
naming one image best and worst is imported as eval.py scored it (issue 25 item 3), and every
row's ``model_response`` is kept (``response``). The judge name is ``metadata.model`` after its
last ``/`` (summarize.py's name), a partial file's name up to ``.partial`` (else without its last
suffix), or ``--judge``. Light: no torch, Prefect or GX.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from schemas.vab import (OFFICIAL_DOMAIN_OF, OFFICIAL_PROMPT_TYPES, PICK_BEST, PICK_BEST_AND_WORST, PICK_WORST, TRIALS, VAB_TRIALS,
                         VabTask, check_judge_name)
from tasks.vab.official import official_worst
from tasks.vab.prompts import OFFICIAL_PROMPT_VERSION, letters
from tasks.vab.trials import official_orders, repeated_orders

PARTIAL_SUFFIX = ".partial.jsonl"


def is_partial(text: str) -> bool:
    """Whether a file's text is eval.py's partial file (one result row per line), not its finished
    ``<model>.json`` (one object with metadata and results): by content, whatever the file's name."""
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        return True  # several lines of JSON, or a line cut short: JSONL
    return not (isinstance(whole, dict) and "results" in whole and "metadata" in whole)


def read_results_file(file: Path) -> tuple[dict, list[dict], int]:
    """(metadata, result rows, unreadable lines skipped) of an eval.py result file."""
    file = Path(file)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file}: cannot read: {exc}") from None
    if is_partial(text):
        by_key: dict[tuple, dict] = {}
        skipped = 0
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1  # eval.py skips these too (a line cut short by a crash)
                continue
            if not isinstance(r, dict) or "task_id" not in r or "prompt_type" not in r:
                raise ValueError(f"{file}: a line is not an eval.py result row (no task_id/prompt_type): {line[:80]!r}")
            key = (r["task_id"], r["prompt_type"], r.get("trial", 0))
            if key not in by_key or "error" in by_key[key]:
                by_key[key] = r
        if not by_key and skipped:
            raise ValueError(f"{file}: neither eval.py's result file (JSON with metadata and results) nor its partial file "
                             f"(one JSON result row per line): no line could be read")
        return {"partial": True}, list(by_key.values()), skipped
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file}: not JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("metadata"), dict) or not isinstance(data.get("results"), list):
        raise ValueError(f"{file}: not an eval.py result file (an object with metadata and results[])")
    if not isinstance(data["metadata"].get("model"), str) or not data["metadata"]["model"]:
        raise ValueError(f"{file}: metadata.model is missing")
    if not all(isinstance(r, dict) for r in data["results"]):
        raise ValueError(f"{file}: results[] holds something other than objects")
    return data["metadata"], data["results"], 0


def default_judge_name(file: Path, metadata: dict) -> str:
    if metadata.get("model"):
        return metadata["model"].rsplit("/", 1)[-1]
    name = Path(file).name
    return name.split(".partial", 1)[0] if ".partial" in name else Path(name).stem


def derive_two_image_rows(rows: list[dict], tasks_by_id: dict[str, VabTask]) -> list[dict]:
    """eval.py's pick_best_and_worst rows of 2-image tasks: from each pick_best row that was read
    (no error, a parsed best) and has no pick_best_and_worst row of the same trial."""
    have = {(r["task_id"], r.get("trial", 0)) for r in rows if r["prompt_type"] == PICK_BEST_AND_WORST}
    out = []
    for r in rows:
        task = tasks_by_id.get(r.get("task_id"))
        parsed = r.get("parsed_answer")
        if (task is None or len(task.images) != 2 or r["prompt_type"] != PICK_BEST or "error" in r
                or (r["task_id"], r.get("trial", 0)) in have or not isinstance(parsed, dict) or not parsed.get("best")):
            continue
        labels = task.labels or letters(2)
        others = [la for la in labels if la != parsed["best"]]
        gt = {"best": labels[task.best - 1], "worst": labels[official_worst(task) - 1]}
        if len(others) == 1:
            worst = others[0]
            out.append({**r, "prompt_type": PICK_BEST_AND_WORST, "parsed_answer": {"best": parsed["best"], "worst": worst},
                        "ground_truth": gt, "correct": parsed["best"] == gt["best"] and worst == gt["worst"],
                        "derived_from": PICK_BEST})
    return out


def _trial_row(r: dict, task: VabTask) -> dict:
    """The vab_trials fields of one result row; ValueError saying what is wrong with it."""
    n = len(task.images)
    labels = task.labels or letters(n)
    pt, trial = r.get("prompt_type"), r.get("trial", 0)
    if pt not in OFFICIAL_PROMPT_TYPES:
        raise ValueError(f"prompt_type {pt!r} is not one of {', '.join(OFFICIAL_PROMPT_TYPES)}")
    if not isinstance(trial, int) or isinstance(trial, bool) or trial not in range(TRIALS):
        raise ValueError(f"trial {trial!r} is not 0..{TRIALS - 1}")
    if "n_images" in r and r["n_images"] != n:
        raise ValueError(f"n_images {r['n_images']!r}, the set collection's task has {n} images")
    if "domain" in r and r["domain"] != OFFICIAL_DOMAIN_OF[task.domain]:
        raise ValueError(f"domain {r['domain']!r}, the set collection says {OFFICIAL_DOMAIN_OF[task.domain]!r}")
    perm = r.get("permutation")
    if perm is None and "error" in r:
        order = official_orders(task.task_id, n)[trial]  # eval.py's "no GT" errors carry no permutation
    elif isinstance(perm, list) and all(isinstance(p, int) and not isinstance(p, bool) for p in perm) and sorted(perm) == list(range(n)):
        order = [p + 1 for p in perm]
    else:
        raise ValueError(f"permutation {perm!r} is not a permutation of 0..{n - 1}")
    want = {"best": labels[task.best - 1], "worst": labels[official_worst(task) - 1]}
    keys = ("best",) if pt == PICK_BEST else ("worst",) if pt == PICK_WORST else ("best", "worst")
    gt = r.get("ground_truth")
    if gt is not None and (not isinstance(gt, dict) or any(gt.get(k) != want[k] for k in keys)):
        raise ValueError(f"ground_truth {gt!r} differs from the set collection's labels {dict((k, want[k]) for k in keys)} "
                         f"(results of another release?)")
    row = {"task_id": task.task_id, "trial": trial, "prompt_type": pt, "order": order,
           "best_shown": None, "worst_shown": None, "best": None, "worst": None}
    if "error" in r:
        return {**row, "state": "error", "detail": str(r["error"])[:500]}
    parsed = r.get("parsed_answer")
    if parsed is None:
        tail = str(r.get("model_response") or "")[-200:]
        return {**row, "state": "unparsable", "detail": f"no answer read by eval.py; answer ended: {tail!r}"}
    if not isinstance(parsed, dict):
        raise ValueError(f"parsed_answer {parsed!r} is not an object")
    for k in keys:
        if parsed.get(k) not in labels:
            raise ValueError(f"parsed_answer {k} {parsed.get(k)!r} is not one of the labels {labels}")
        stored = labels.index(parsed[k]) + 1
        row[k], row[f"{k}_shown"] = stored, order.index(stored) + 1
    correct = all(row[k] == (task.best if k == "best" else official_worst(task)) for k in keys)
    if "correct" in r and bool(r["correct"]) != correct:
        raise ValueError(f"correct={r['correct']!r}, but the answer {parsed} against the labels is {correct}")
    detail = "derived from pick_best" if r.get("derived_from") else None
    return {**row, "state": "ok", "detail": detail}


def _response(r: dict) -> str | None:
    text = r.get("model_response")
    return text if isinstance(text, str) else None


def parse_results(file: Path, tasks: list[VabTask], sets: str, judge: str | None = None) -> tuple[str, list[dict], dict]:
    """(judge name, VAB_TRIALS rows, counts) of an eval.py result file, validated whole; raises
    ValueError listing every bad row."""
    file = Path(file)
    metadata, results, skipped = read_results_file(file)
    by_id = {t.task_id: t for t in tasks}
    name = check_judge_name(judge if judge is not None else default_judge_name(file, metadata))
    # eval.py derives only when its run asked pick_best_and_worst: a partial file shows that by its
    # pick_best_and_worst rows (of 3+-image tasks); a finished .json holds its derived rows already
    asked_both = any(r.get("prompt_type") == PICK_BEST_AND_WORST for r in results)
    derived = derive_two_image_rows(results, by_id) if metadata.get("partial") and asked_both else []
    problems: list[str] = []
    seen: dict[tuple, int] = {}
    rows: list[dict] = []
    now = datetime.now(timezone.utc)
    identity = json.dumps({"kind": "import", "format": "vab-eval-results", "file": file.name, "model": metadata.get("model"),
                           "prompt": OFFICIAL_PROMPT_VERSION, "temperature": metadata.get("temperature"),
                           "benchmark": metadata.get("benchmark")}, sort_keys=True)
    for i, r in enumerate(results + derived):
        where = f"row {i}" if i < len(results) else f"derived row {i - len(results)}"
        where += f", task {r.get('task_id')!r}, {r.get('prompt_type')} trial {r.get('trial', 0)}"
        task = by_id.get(r.get("task_id"))
        try:
            if task is None:
                raise ValueError(f"not a task of set collection {sets!r}")
            key = (r["task_id"], r.get("prompt_type"), r.get("trial", 0))
            if key in seen:
                raise ValueError(f"given twice (also row {seen[key]})")
            seen[key] = i
            fields = _trial_row(r, task)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        rows.append({"sets": sets, "judge": name, "judge_kind": "import", "judge_identity": identity, **fields,
                     "decided_at": now, "response": _response(r)})
    orders: dict[tuple, list] = defaultdict(list)
    for row in rows:
        orders[(row["task_id"], row["prompt_type"])].append(row["order"])
    for (tid, pt), got in orders.items():
        if len(got) == TRIALS and repeated_orders(got):
            problems.append(f"task {tid!r}, {pt}: the 3 trials must show 3 different orders, got {got}")
    if problems:
        shown = problems[:20]
        more = f"; and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise ValueError(f"{file}: {len(problems)} bad row(s), nothing imported: " + "; ".join(shown) + more)
    if not rows:
        raise ValueError(f"{file}: no result rows")
    states: dict[str, int] = defaultdict(int)
    for row in rows:
        states[row["state"]] += 1
    differ = sum(1 for row in rows if row["order"] != official_orders(row["task_id"], len(row["order"]))[row["trial"]])
    counts = {"rows": len(rows), "tasks": len({r["task_id"] for r in rows}), "tasks_in_sets": len(tasks),
              "states": dict(states), "derived": sum(1 for r in rows if r["detail"] == "derived from pick_best"),
              "skipped_lines": skipped, "orders_not_official": differ}
    return name, rows, counts


def import_results(settings: Any, file: Path, sets: str, judge: str | None = None) -> tuple[str, dict]:
    """Validate and store (replacing only this judge's rows); returns (judge name, counts)."""
    from tasks.lake.tables import Lake
    from tasks.vab.sets import load_sets
    from tasks.vab.tables import check_set_name, replace_judge_trials

    check_set_name(sets)
    tasks = load_sets(settings, sets)
    name, rows, counts = parse_results(file, tasks, sets, judge)
    replace_judge_trials(Lake(settings.lake_dir), sets, name, pa.Table.from_pylist(rows, schema=VAB_TRIALS))
    return name, counts
