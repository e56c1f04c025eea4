"""The pooled Beauty Index page of the static site: ``pooled/beauty-index.html``.

Every analysed, non-simulated study of the lake (native or imported from another lab's bundle)
gives its whole-panel Beauty Index per tool; tools run by two or more studies are pooled by
``tasks.beauty.pooled.pool_tools`` (random effects, DerSimonian-Laird). SIMULATED studies are left
out (made-up answers are no evidence); studies whose plan postdates their answers are pooled and
marked "not pre-registered" beside their row.
"""

from __future__ import annotations

import math
from pathlib import Path

from markupsafe import Markup

POOLED_PAGE = "pooled/beauty-index.html"


def _f(x, digits: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def pooled_page_context(index_rows: list[dict], prereg_notes: dict[str, str | None], simulated: list[str]) -> dict:
    """What the template shows (pure). ``index_rows``: study_index rows (group "all") of the
    pooled studies; ``prereg_notes``: study id -> None when pre-registered, else why not."""
    from tasks.beauty.pooled import pool_tools
    from tasks.report.svg import beauty_index_bars

    pooled = []
    for p in pool_tools(index_rows):
        re = p.pooled
        forest = [{"tool": s["study_id"], "beauty_index": s["beauty_index"], "beauty_index_lo": s["beauty_index_lo"],
                   "beauty_index_hi": s["beauty_index_hi"], "answers": s["answers"]} for s in p.studies]
        forest.append({"tool": "pooled (random effects)", "beauty_index": min(max(re.estimate, 0.0), 100.0),
                       "beauty_index_lo": max(re.lo, 0.0), "beauty_index_hi": min(re.hi, 100.0),
                       "answers": sum(s["answers"] for s in p.studies)})
        pooled.append({
            "tool": p.tool, "estimate": f"{_f(re.estimate)} [{_f(re.lo)}, {_f(re.hi)}]", "estimate_value": f"{re.estimate:.4f}",
            "tau2": _f(re.tau2, 2), "tau2_value": f"{re.tau2:.6f}", "tau": _f(math.sqrt(re.tau2)), "i2": f"{100 * re.i2:.0f}%",
            "k": re.k, "forest": Markup(beauty_index_bars(forest, uid=f"forest-svg-{len(pooled) + 1}")),
            "studies": [{"study_id": s["study_id"], "bi": f"{_f(s['beauty_index'])} [{_f(s['beauty_index_lo'])}, {_f(s['beauty_index_hi'])}]",
                         "answers": s["answers"], "weight": f"{100 * s['weight']:.0f}%",
                         "prereg": "yes" if prereg_notes.get(s["study_id"]) is None else "NOT pre-registered"} for s in p.studies],
        })
    ids = sorted({r["study_id"] for r in index_rows})
    studies = [f"{sid}: {'pre-registered' if prereg_notes.get(sid) is None else prereg_notes[sid]}" for sid in ids]
    studies += [f"{sid}: left out (SIMULATED answers)" for sid in simulated]
    notes = [] if pooled else ["No tool was run by two or more analysed studies yet: nothing to pool."]
    if any(prereg_notes.get(sid) for sid in ids):
        notes.append("Some pooled studies are not pre-registered (their plan postdates their answers): see each row.")
    return {"pooled": pooled, "studies": studies, "notes": notes}


def build_pooled_page(settings, out_dir: Path) -> str | None:
    """Write the pooled page when two or more analysed studies exist; returns its path relative to
    the site root (None when there is nothing to pool, and an earlier page is removed)."""
    from tasks.beauty.prereg import status_of
    from tasks.beauty.study import load_study
    from tasks.beauty.tables import read_study_partition, studies_in_lake
    from tasks.lake.tables import Lake
    from tasks.report.build import CSP, _env, _write_text

    lake = Lake(settings.lake_dir)
    rows, notes, simulated = [], {}, []
    for study_id in studies_in_lake(lake):
        index = [r for r in read_study_partition(lake, "study_index", study_id).to_pylist() if r["panel_group"] == "all"]
        if not index:
            continue
        if any(r["simulated"] for r in index):
            simulated.append(study_id)
            continue
        try:
            _, prereg, _ = load_study(settings, study_id)
            notes[study_id] = status_of(prereg, read_study_partition(lake, "study_answers", study_id)).note
        except (OSError, ValueError) as exc:
            notes[study_id] = f"pre-registration not checked ({type(exc).__name__})"
        rows += index
    page = Path(out_dir) / POOLED_PAGE
    if len({r["study_id"] for r in rows}) < 2:
        page.unlink(missing_ok=True)
        return None
    ctx = pooled_page_context(rows, notes, simulated)
    html = _env().get_template("pooled.html").render(title="Beauty Index pooled across studies", meta={}, generated_at=None,
                                                     csp=CSP, root="../", **ctx)
    _write_text(page, html)
    return POOLED_PAGE
