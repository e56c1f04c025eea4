"""The static site's VAB pages: one page per set collection with judges' answers in the lake
(``vab/<S>.html``), written by ``imagebench report`` and ``imagebench demo``. Two charts: strict
best-and-worst over 3 trials per machine judge with 95% Wilson intervals, beside the published best
model (26.5%) and the 3-trial random judge; one-trial best-and-worst (people answer once; machines
the mean of their 3 trials) beside the published experts (68.9%) and the one-trial random judge.
Then our leaderboard (strict, with the bootstrap interval beside Wilson), the official toolkit's
metrics (p^3 and ap@1 per prompt type, tasks.vab.official_view.official_scores), position bias,
and the audit of imagebench's own judges (each judge links to its audit rows; the audit from
``$IMAGEBENCH_HOME/vab/audits/<S>.json``, tasks.vab.audit)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from markupsafe import Markup

from schemas.vab import PUBLISHED_BEST_MODEL_STRICT, PUBLISHED_EXPERT_STRICT
from tasks.report.svg import IntervalBar, interval_bars

VAB_DIR = "vab"
OURS, PUBLISHED, BASELINE = "#3b528b", "#b5651d", "#9a9a9a"


@dataclass(frozen=True)
class VabLink:
    sets: str
    title: str
    page: str  # relative to the site root
    notes: tuple[str, ...]


def _f(x, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def anchor(judge: str) -> str:
    return "audit-" + re.sub(r"[^A-Za-z0-9_-]", "-", judge)


def bars_svg(bars: list[dict], uid: str, title: str) -> str:
    """Horizontal bars (0-100), each row's label above its bar: ours (with 95% whiskers), the
    published figures and the random baseline in their own colours (tasks.report.svg.interval_bars)."""
    colours = {"ours": OURS, "published": PUBLISHED, "baseline": BASELINE}
    return interval_bars([IntervalBar(b["label"], b["value"], b.get("lo"), b.get("hi"), tip=f"{b['label']}: {_f(b['value'])}%",
                                      text=_f(b["value"]), kind=b["source"], fill=colours[b["source"]]) for b in bars],
                         uid, title, bar_w=400.0)


def _pct100(x: float | None) -> float | None:
    return None if x is None else 100.0 * x


def official_rows(official: dict[str, dict[str, dict]], order: list[str]) -> list[dict]:
    """Rows of the official-metrics table: per judge (in ``order``) and prompt type, p^3 and ap@1
    (percent) of best, worst and both, and the tasks counted."""
    rows = []
    for judge in order:
        for ptype, r in official.get(judge, {}).items():
            rows.append({"judge": judge, "prompt_type": ptype, "tasks": r["tasks"], "trials": r["trials_per_task"],
                         **{k: _f(_pct100(r[k])) for k in ("p3_best", "p3_worst", "p3_both", "ap1_best", "ap1_worst", "ap1_both")}})
    return rows


def page_context(sets: str, tasks: list, trials, audit: dict | None, n_resamples: int = 2000) -> dict:
    from tasks.vab.metrics import random_baselines, strict_metrics
    from tasks.vab.official_view import official_scores
    from tasks.vab.present import is_one_trial, ranked, uncalibrated_notes

    metrics = ranked(strict_metrics(tasks, trials, n_resamples).values())
    audited = {r["judge"] for r in (audit or {}).get("rows", [])}
    rows, three, one = [], [], []
    for m in metrics:
        single = is_one_trial(m)
        lo, hi = m["strict_both_ci"] or (None, None)
        blo, bhi = m["strict_both_boot"] or (None, None)
        slo, shi = m["single_both_ci"] or (None, None)
        pooled = m["position_bias"]["pooled"]
        absent = m["strict_both"] is None  # never asked for both (e.g. a pick_best-only run): absent, not 0
        rows.append({"judge": m["judge"], "kind": m["judge_kind"] or "", "trials": m["trials_per_task"],
                     "both": "–" if single or absent else f"{_f(m['strict_both'])} [{_f(lo)}, {_f(hi)}]",
                     "both_boot": "–" if single or absent else f"[{_f(blo)}, {_f(bhi)}]",
                     "one_trial": "–" if m["single_both"] is None else f"{_f(m['single_both'])} [{_f(slo)}, {_f(shi)}]",
                     "best": "–" if single else _f(m["strict_best"]), "worst": "–" if single else _f(m["strict_worst"]),
                     "tasks": m["tasks"], "invalid": sum(m["invalid_trials"].values()), "uncalibrated": m["uncalibrated"],
                     "slot1": _f(pooled["rates"][0]) if pooled["rates"] else "–",
                     "slot1_uniform": _f(pooled["uniform"][0]) if pooled["uniform"] else "–",
                     "audit": f"#{anchor(m['judge'])}" if m["judge"] in audited else None})
        if not single:
            three.append({"label": m["judge"], "value": m["strict_both"], "lo": lo, "hi": hi, "source": "ours"})
        one.append({"label": m["judge"] + (" (1 trial)" if single else " (mean of 3 trials)"), "value": m["single_both"],
                    "lo": slo, "hi": shi, "source": "ours"})
    base = random_baselines(tasks)["overall"]
    three += [{"label": "published: best of 26 models", "value": PUBLISHED_BEST_MODEL_STRICT, "source": "published"},
              {"label": "random judge, 3 trials (this collection)", "value": base["strict_both"], "source": "baseline"}]
    one += [{"label": "published: human experts", "value": PUBLISHED_EXPERT_STRICT, "source": "published"},
            {"label": "random judge, 1 trial (this collection)", "value": base["single_both"], "source": "baseline"}]
    audit_rows = [{**r, "anchor": anchor(r["judge"]), "uncalibrated": bool(r.get("uncalibrated")),
                   "both": f"{_f(r['strict_both'])} [{_f(r['strict_both_lo'])}, {_f(r['strict_both_hi'])}]",
                   "best": f"{_f(r['strict_best'])} [{_f(r['strict_best_lo'])}, {_f(r['strict_best_hi'])}]",
                   "single": _f(r["single_best"])} for r in (audit or {}).get("rows", [])]
    official = official_rows(official_scores(tasks, trials), [m["judge"] for m in metrics])
    return {"sets": sets, "n_tasks": len(tasks), "rows": rows,
            "bars": Markup(bars_svg(three, f"vab-bars-{sets}", "Strict best-and-worst accuracy over 3 trials, % of tasks "
                                    "(ours with 95% Wilson intervals, published best model, random judge)")),
            "bars_one": Markup(bars_svg(one, f"vab-bars-one-{sets}", "One-trial best-and-worst accuracy, % of tasks (people "
                                        "answer once; machines: mean of their 3 trials), published experts, random judge")),
            "official": official, "audit_rows": audit_rows, "audit_notes": (audit or {}).get("notes", []),
            "audited_at": (audit or {}).get("audited_at"), "notes": uncalibrated_notes(metrics),
            "published": (PUBLISHED_BEST_MODEL_STRICT, PUBLISHED_EXPERT_STRICT), "random": _f(base["strict_both"], 2),
            "random_one": _f(base["single_both"], 1)}


def build_vab_pages(settings, out_dir: Path, n_resamples: int = 2000) -> list[VabLink]:
    """Write ``vab/<S>.html`` for every set collection with answers in the lake (pages of
    collections no longer there are removed). Returns links for the index."""
    from tasks.lake.tables import Lake
    from tasks.report.build import CSP, _env, _prepare_out_dir, _write_text
    from tasks.vab.audit import read_audit
    from tasks.vab.sets import load_sets
    from tasks.vab.tables import collections_in_lake, read_partition

    out_dir = Path(out_dir)
    _prepare_out_dir(out_dir)
    lake = Lake(settings.lake_dir)
    env = _env()
    links = []
    for sets in collections_in_lake(lake, "vab_trials"):
        trials = read_partition(lake, "vab_trials", sets)
        try:
            tasks = load_sets(settings, sets)
        except (LookupError, ValueError):
            continue  # answers without their pinned collection here: nothing to score against
        ctx = page_context(sets, tasks, trials, read_audit(settings, sets), n_resamples)
        html = env.get_template("vab.html").render(title=f"VAB: {sets}", meta={}, generated_at=None, csp=CSP, root="../", **ctx)
        page = f"{VAB_DIR}/{sets}.html"
        _write_text(out_dir / page, html)
        links.append(VabLink(sets, f"VAB set collection {sets} ({len(tasks)} tasks)", page, tuple(ctx["notes"])))
    keep = {Path(link.page).name for link in links}
    vdir = out_dir / VAB_DIR
    for f in vdir.glob("*.html") if vdir.is_dir() else ():
        if f.name not in keep:
            f.unlink()
    return links
