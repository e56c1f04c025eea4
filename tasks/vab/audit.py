"""The audit (issue 10 item 6): how often imagebench's own judges agree with the experts.

imagebench's own judges are its HPSv3 scorer (ranking a set by mu) and the Capability judges of
the judge routing (the VLMs the nightly flow asks PASS/FAIL questions), here asked the VAB question
through the same endpoints. ``vab audit`` runs them on an expert-labelled collection (imported, or
built from our suite's images) with the `vab-run` flow, then reports per *category* (a task's
``substyle`` when the collection sets one, e.g. the suite category of lake-built sets; else its
domain) the agreement with the experts' labels: strict best, strict best-and-worst, single-trial
best, each with a 95% Wilson interval (honest at 0% and 100%) and the task bootstrap beside it;
each row says whether the judge ran on uncalibrated (demo) weights. The result is written to
``$IMAGEBENCH_HOME/vab/audits/<S>.json``, which the report's VAB page links each judge to.
Pure functions plus one JSON file; no torch, Prefect or GX.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from schemas.vab import VabTask
from tasks.vab.metrics import bootstrap_interval, identity_is_uncalibrated, rows_of, task_outcomes, wilson_interval
from tasks.vab.tables import check_set_name

AUDIT_DIR = "vab/audits"


def own_judges(settings: Any) -> tuple[list[str], list[str]]:
    """(judges to audit, notes): ``hpsv3`` and every VLM judge of the routing that the endpoints
    config defines (openai or transformers); the routing's other judges are named in the notes."""
    from tasks.judges.config import load_judges_config, load_routing, routing_judges
    from tasks.judges.registry import BUILTIN_JUDGES

    names, notes = ["hpsv3"], []
    endpoints = dict(load_judges_config(settings.judges_config).judges) if settings.judges_config else {}
    try:
        routed = routing_judges(load_routing(settings.routing_path))
    except (OSError, ValueError) as exc:
        return names, [f"no judge routing read ({exc}): only HPSv3 audited"]
    for name in routed:
        ep = endpoints.get(name)
        if ep is not None and ep.backend in ("openai", "transformers"):
            names.append(name)
        elif ep is None and name in BUILTIN_JUDGES:  # built in (Tesseract): reads one image's text
            notes.append(f"Capability judge {name!r} not audited: the built-in OCR judge reads the text in one image; "
                         "it cannot rank image sets")
        else:
            notes.append(f"Capability judge {name!r} not audited: " + ("not in the endpoints config" if ep is None else f"backend {ep.backend!r} cannot rank image sets"))
    return names, notes


def category_of(task: VabTask) -> str:
    return task.substyle or task.domain


def _share(values: Sequence[bool], n_resamples: int, seed: int) -> dict:
    ci = wilson_interval(sum(values), len(values))
    boot = bootstrap_interval(list(values), None, n_resamples, seed=seed) if values else None
    return {"pct": 100.0 * sum(values) / len(values) if values else None, "lo": ci[0] if ci else None,
            "hi": ci[1] if ci else None, "boot_lo": boot[0] if boot else None, "boot_hi": boot[1] if boot else None}


def audit(tasks: Sequence[VabTask], trials: Any, judges: Sequence[str], n_resamples: int = 2000, seed: int = 0) -> list[dict]:
    """One row per (judge, category), plus category ``all``: tasks, and agreement with the experts
    (strict best, strict both, single-trial best) with 95% Wilson intervals (``*_lo``/``*_hi``)
    and bootstrap ones (``*_boot_lo``/``*_boot_hi``), and ``uncalibrated``."""
    cats = {t.task_id: category_of(t) for t in tasks}
    trials = rows_of(trials)
    rows = []
    for judge in judges:
        uncal = any(identity_is_uncalibrated(r.get("judge_identity")) for r in trials if r["judge"] == judge)
        outs = task_outcomes(tasks, trials, judge)
        groups: dict[str, list] = defaultdict(list)
        for o in outs:
            groups[cats[o.task_id]].append(o)
        for cat, group in [("all", outs), *sorted(groups.items())]:
            sb = _share([o.strict_best for o in group], n_resamples, seed)
            both = _share([o.strict_both for o in group], n_resamples, seed)
            single = [b for o in group for b in o.best_trials]
            rows.append({"judge": judge, "category": cat, "tasks": len(group),
                         "strict_best": sb["pct"], "strict_best_lo": sb["lo"], "strict_best_hi": sb["hi"],
                         "strict_best_boot_lo": sb["boot_lo"], "strict_best_boot_hi": sb["boot_hi"],
                         "strict_both": both["pct"], "strict_both_lo": both["lo"], "strict_both_hi": both["hi"],
                         "strict_both_boot_lo": both["boot_lo"], "strict_both_boot_hi": both["boot_hi"],
                         "single_best": 100.0 * sum(single) / len(single) if single else None, "uncalibrated": uncal})
    return rows


def audit_path(settings: Any, sets: str) -> Path:
    return Path(settings.home) / AUDIT_DIR / f"{check_set_name(sets)}.json"


def write_audit(settings: Any, sets: str, rows: list[dict], notes: list[str]) -> Path:
    from tasks.store.durable import atomic_write

    path = audit_path(settings, sets)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"sets": sets, "audited_at": datetime.now(timezone.utc).isoformat(), "rows": rows, "notes": notes}
    atomic_write(path, (json.dumps(body, indent=1) + "\n").encode())
    return path


def read_audit(settings: Any, sets: str) -> dict | None:
    path = audit_path(settings, sets)
    return json.loads(path.read_text()) if path.is_file() else None
