"""The static site's VAB pages: one page per set collection with judges' answers in the lake
(``vab/<S>.html``): strict best-and-worst per judge with 95% intervals, drawn beside the published
figures (best of 20 MLLMs + 6 reward models 26.5%, human experts 68.9%) and the random judge on
this collection; the leaderboard, position bias, and the audit of imagebench's own judges (each
judge links to its audit rows). Metrics come from tasks.vab.metrics, the audit from
``$IMAGEBENCH_HOME/vab/audits/<S>.json`` (tasks.vab.audit)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from markupsafe import Markup

from schemas.vab import PUBLISHED_BEST_MODEL_STRICT, PUBLISHED_EXPERT_STRICT
from tasks.report.svg import FONT, esc

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


def bars_svg(bars: list[dict], uid: str) -> str:
    """Horizontal bars (0-100) of strict best-and-worst: ours (with 95% whiskers), the published
    figures and the random baseline in their own colours."""
    label_w = min(280.0, max([len(b["label"]) for b in bars] + [6]) * 6.6 + 14)
    bar_w, row_h = 420.0, 26
    width, height = label_w + bar_w + 70, row_h * len(bars) + 40
    x0 = label_w
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart bars" id="{esc(uid)}" viewBox="0 0 {width:.0f} {height:.0f}" '
           f'width="{width:.0f}" height="{height:.0f}" role="img" aria-label="strict best-and-worst accuracy" {FONT} font-size="12">',
           "<title>Strict best-and-worst accuracy, % of tasks (ours with 95% intervals, published figures, random judge)</title>",
           f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>']
    for t in (0, 25, 50, 75, 100):
        x = x0 + bar_w * t / 100
        out.append(f'<line x1="{x:.1f}" y1="4" x2="{x:.1f}" y2="{height - 26:.1f}" stroke="#e3e3e3"/>')
        out.append(f'<text x="{x:.1f}" y="{height - 10:.1f}" text-anchor="middle" fill="#555" font-size="11">{t}</text>')
    for i, b in enumerate(bars):
        y, v = 6 + row_h * i, b["value"]
        colour = {"ours": OURS, "published": PUBLISHED, "baseline": BASELINE}[b["source"]]
        out.append(f'<g class="bar {b["source"]}" data-label="{esc(b["label"])}" data-value="{"" if v is None else f"{v:.4f}"}">'
                   f'<title>{esc(b["label"])}: {_f(v)}%</title>')
        out.append(f'<text x="{x0 - 8:.1f}" y="{y + 15:.1f}" text-anchor="end" fill="#222">{esc(b["label"])}</text>')
        if v is not None:
            out.append(f'<rect x="{x0:.1f}" y="{y + 4:.1f}" width="{bar_w * v / 100:.1f}" height="14" fill="{colour}"/>')
            lo, hi = b.get("lo"), b.get("hi")
            if lo is not None and hi is not None:
                xl, xh, ym = x0 + bar_w * lo / 100, x0 + bar_w * hi / 100, y + 11
                out.append(f'<line x1="{xl:.1f}" y1="{ym:.1f}" x2="{xh:.1f}" y2="{ym:.1f}" stroke="#111" stroke-width="1.5"/>')
            out.append(f'<text x="{x0 + bar_w * v / 100 + 6:.1f}" y="{y + 15:.1f}" fill="#222">{_f(v)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def page_context(sets: str, tasks: list, trials, audit: dict | None, n_resamples: int = 2000) -> dict:
    from tasks.vab.metrics import random_baselines, strict_metrics

    metrics = sorted(strict_metrics(tasks, trials, n_resamples).values(), key=lambda m: (-(m["strict_both"] or 0), m["judge"]))
    audited = {r["judge"] for r in (audit or {}).get("rows", [])}
    rows, bars, notes = [], [], []
    idents = {}
    for r in trials.select(["judge", "judge_identity"]).to_pylist():
        idents.setdefault(r["judge"], r["judge_identity"])
    for m in metrics:
        lo, hi = m["strict_both_ci"] or (None, None)
        ident = idents.get(m["judge"]) or ""
        uncal = '"uncalibrated":true' in ident.replace(" ", "")
        if uncal:
            notes.append(f"judge {m['judge']}: UNCALIBRATED demo weights (a tiny random HPSv3-architecture model): its numbers show the pipeline, not HPSv3")
        pooled = m["position_bias"]["pooled"]
        rows.append({"judge": m["judge"], "kind": m["judge_kind"] or "", "both": f"{_f(m['strict_both'])} [{_f(lo)}, {_f(hi)}]",
                     "best": _f(m["strict_best"]), "worst": _f(m["strict_worst"]), "single": _f(m["single_both"]),
                     "tasks": m["tasks"], "invalid": sum(m["invalid_trials"].values()), "uncalibrated": uncal,
                     "slot1": _f(pooled["rates"][0]) if pooled["rates"] else "–",
                     "slot1_uniform": _f(pooled["uniform"][0]) if pooled["uniform"] else "–",
                     "audit": f"#{anchor(m['judge'])}" if m["judge"] in audited else None})
        bars.append({"label": m["judge"], "value": m["strict_both"], "lo": lo, "hi": hi, "source": "ours"})
    base = random_baselines(tasks)["overall"]["strict_both"]
    bars += [{"label": "published: best of 26 models", "value": PUBLISHED_BEST_MODEL_STRICT, "source": "published"},
             {"label": "published: human experts", "value": PUBLISHED_EXPERT_STRICT, "source": "published"},
             {"label": "random judge (this collection)", "value": base, "source": "baseline"}]
    audit_rows = [{**r, "anchor": anchor(r["judge"]),
                   "both": f"{_f(r['strict_both'])} [{_f(r['strict_both_lo'])}, {_f(r['strict_both_hi'])}]",
                   "best": f"{_f(r['strict_best'])} [{_f(r['strict_best_lo'])}, {_f(r['strict_best_hi'])}]",
                   "single": _f(r["single_best"])} for r in (audit or {}).get("rows", [])]
    return {"sets": sets, "n_tasks": len(tasks), "rows": rows, "bars": Markup(bars_svg(bars, f"vab-bars-{sets}")),
            "audit_rows": audit_rows, "audit_notes": (audit or {}).get("notes", []),
            "audited_at": (audit or {}).get("audited_at"), "notes": notes,
            "published": (PUBLISHED_BEST_MODEL_STRICT, PUBLISHED_EXPERT_STRICT), "random": _f(base, 2)}


def build_vab_pages(settings, out_dir: Path, n_resamples: int = 2000) -> list[VabLink]:
    """Write ``vab/<S>.html`` for every set collection with answers in the lake (pages of
    collections no longer there are removed). Returns links for the index."""
    from tasks.lake import Lake
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
