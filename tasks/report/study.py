"""A Beauty Index study's page in the static site: ``studies/<study_id>.html``.

Tool x prompt heatmap of % yes, per-tool bars with 95% intervals, panel groups side by side, the
hypothesis table and the pixel metrics (FID, KID, CLIP, IS, HPSv3 mu) next to the Beauty Index.
Read from the study's lake tables (written by the `study-analyze` flow); every note the study
carries (SIMULATED, not pre-registered, TINY RANDOM) is a banner on the page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from markupsafe import Markup

from tasks.report.svg import HeatCol, HeatRow, beauty_index_bars, heatmap
from tasks.scores import display

STUDIES_DIR = "studies"
METRIC_COLUMNS = (("fid", "FID"), ("kid", "KID"), ("clip_score", "CLIP score"), ("inception_score", "Inception Score"),
                  ("hps_mu", "HPSv3 mu"))


@dataclass(frozen=True)
class StudyLink:
    study_id: str
    title: str
    page: str  # relative to the site root
    simulated: bool


def _f(x, digits: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def hps_uncalibrated(pixel: pa.Table) -> bool:
    """Whether the study's HPSv3 mu comes from uncalibrated (demo) weights. A row written before the
    table recorded it (hps_uncalibrated null) with a mu from TINY RANDOM networks may be: it is
    marked, since an uncalibrated figure must never read as a real one."""
    return any(r.get("hps_uncalibrated") or (r.get("hps_uncalibrated") is None and r.get("hps_mu") is not None
                                              and r.get("weights") == "TINY RANDOM") for r in pixel.to_pylist())


def _ci(x, lo, hi, digits: int = 1) -> str:
    return f"{_f(x, digits)} [{_f(lo, digits)}, {_f(hi, digits)}]" if x is not None else "–"


def study_page_context(study_id: str, tables: dict[str, pa.Table], title: str, question: str, prompts: dict[str, str],
                       notes: list[str], prereg_text: str) -> dict:
    """What the template shows, from the study's lake tables (pure: tests call it directly)."""
    from tasks.beauty.publish import leaderboard_rows

    index, rates = tables["study_index"], tables["study_rates"]
    answers, hyps, pixel = tables["study_answers"], tables["study_hypotheses"], tables["study_pixel_metrics"]
    ranked = leaderboard_rows(index)
    tools = [r["tool"] for r in ranked]
    metrics = {r["tool"]: r for r in pixel.to_pylist()}
    metric_cols = [(c, label) for c, label in METRIC_COLUMNS if any(m.get(c) is not None for m in metrics.values())]
    # Quality control (issue 16 item 9): with any answer flagged, the index without them sits beside
    # the index (same resamples and seed; "–" where no unflagged answer of the tool is left).
    n_flagged = sum(r.get("flagged_answers") or 0 for r in ranked)
    rows = [{"tool": r["tool"], "rank": r["rank"] if r["rank"] is not None else "–",
             "bi": _ci(r["beauty_index"], r["beauty_index_lo"], r["beauty_index_hi"]), "answers": r["answers"],
             "flagged": r.get("flagged_answers") or 0,
             "bi_unflagged": _ci(r.get("beauty_index_unflagged"), r.get("beauty_index_unflagged_lo"),
                                 r.get("beauty_index_unflagged_hi")),
             "metrics": [(_ci(metrics[r["tool"]]["fid"], metrics[r["tool"]]["fid_lo"], metrics[r["tool"]]["fid_hi"])
                          if c == "fid" else display.mu(metrics[r["tool"]].get(c)) if c == "hps_mu"
                          else _f(metrics[r["tool"]].get(c), 3 if c == "kid" else 2)) if r["tool"] in metrics else "–"
                         for c, _ in metric_cols]} for r in ranked]
    metric_note = None
    if metrics:
        weights = sorted({m["weights"] for m in metrics.values() if m.get("weights")})
        n = sorted({m["n_images"] for m in metrics.values() if m.get("n_images") is not None})
        metric_note = (f"Pixel metrics beside the Beauty Index (weights: {', '.join(weights) or 'unknown'}). FID on "
                       f"{', '.join(map(str, n)) or 'a few'} images per tool is noisy: read its interval.")
    prompt_ids = sorted({r["prompt_id"] for r in rates.to_pylist()}, key=lambda p: list(prompts).index(p) if p in prompts else 10**6)
    rate = {(r["tool"], r["prompt_id"]): r for r in rates.to_pylist()}
    cells = [[(rate[(t, p)]["yes_rate"] if (t, p) in rate else None,
               f"{t} x {prompts.get(p, p)}: " + (f"{rate[(t, p)]['yes_rate']:.0f}% yes ({rate[(t, p)]['yes']}/{rate[(t, p)]['answers']})"
                                                  if (t, p) in rate else "no answers")) for p in prompt_ids] for t in tools]
    hm = heatmap([HeatRow(t) for t in tools], [HeatCol(prompts.get(p, p)) for p in prompt_ids], cells,
                 title="% of judges who said yes, per tool and prompt", uid="hm-yes")
    groups = sorted({r["panel_group"] for r in index.to_pylist()} - {"all"})
    by_group = {(r["tool"], r["panel_group"]): r for r in index.to_pylist()}
    gcells = [[(by_group[(t, g)]["beauty_index"] if (t, g) in by_group else None,
                f"{t}, {g}: " + (_ci(by_group[(t, g)]["beauty_index"], by_group[(t, g)]["beauty_index_lo"], by_group[(t, g)]["beauty_index_hi"])
                                 if (t, g) in by_group else "no answers")) for g in groups] for t in tools]
    ghm = heatmap([HeatRow(t) for t in tools], [HeatCol(g) for g in groups], gcells,
                  title="Beauty Index per tool and panel group", uid="hm-groups")
    group_rows = [(t, [_ci(by_group[(t, g)]["beauty_index"], by_group[(t, g)]["beauty_index_lo"], by_group[(t, g)]["beauty_index_hi"])
                       if (t, g) in by_group else "–" for g in groups]) for t in tools]
    hyp_rows = [{"hypothesis": h["hypothesis"], "statement": h["statement"], "test": h["test"],
                 "effect": (f"{h['effect_name'] or ''} " + _ci(h["effect"], h["effect_lo"], h["effect_hi"], 3)).strip(),
                 "p": _f(h["p_value"], 4), "p_holm": _f(h["p_holm"], 4), "verdict": h["verdict"], "detail": h["detail"] or "",
                 "headline": h["headline"]} for h in hyps.to_pylist()]
    sources = sorted(set(answers.column("source").to_pylist()))
    return {
        "study_id": study_id, "study_title": title or study_id, "question": question, "notes": notes,
        "n_answers": answers.num_rows, "n_flagged": n_flagged, "n_judges": len(set(answers.column("judge_id").to_pylist())),
        "source": ", ".join(sources), "prereg": prereg_text, "rows": rows, "metric_cols": metric_cols,
        "metric_note": metric_note, "bars": Markup(beauty_index_bars(ranked)), "heatmap": Markup(hm),
        "groups_heatmap": Markup(ghm), "groups": groups, "group_rows": group_rows, "hypotheses": hyp_rows,
        "hps_uncalibrated": hps_uncalibrated(pixel) and any(c == "hps_mu" for c, _ in metric_cols),
    }


def build_study_pages(settings, out_dir: Path) -> list[StudyLink]:
    """Write ``studies/<id>.html`` for every analysed study of the lake into the report folder
    ``out_dir`` (pages of studies no longer in the lake are removed). Returns links for the index."""
    from tasks.beauty.prereg import status_of
    from tasks.beauty.publish import SIMULATED_BANNER
    from tasks.beauty.sources import load_study_context
    from tasks.beauty.tables import read_study_partition, studies_in_lake
    from tasks.lake.tables import Lake
    from tasks.report.build import CSP, _env, _prepare_out_dir, _write_text

    _prepare_out_dir(Path(out_dir))  # refuses a folder that is not a report, before writing anything
    lake = Lake(settings.lake_dir)
    env = _env()
    links = []
    for study_id in studies_in_lake(lake):
        tables = {t: read_study_partition(lake, t, study_id) for t in
                  ("study_answers", "study_rates", "study_index", "study_hypotheses", "study_pixel_metrics")}
        simulated = bool(tables["study_index"].num_rows and tables["study_index"].column("simulated")[0].as_py())
        notes = [SIMULATED_BANNER] if simulated else []
        title, question, prompts, prereg_text = study_id, "Did this make you feel something?", {}, "unknown (study folder not found)"
        try:
            ctx = load_study_context(settings, study_id)
            title, question, prompts = ctx.definition.title or study_id, ctx.definition.question, ctx.prompts
            status = status_of(ctx.prereg, tables["study_answers"])
            if status.note:
                notes.append(status.note)
            if ctx.prereg is None:
                prereg_text = "none (answers imported; the plan was not pinned before them)"
            elif not status.preregistered:
                prereg_text = f"NOT pre-registered: written {ctx.prereg.created_at}, after {status.early_answers} of the answers"
            else:
                prereg_text = f"pinned at open, {ctx.prereg.created_at} (definition sha256 {ctx.prereg.definition_sha256[:12]}...)"
            shape = ctx.prereg.blinding if ctx.prereg is not None else None
            if shape is not None:  # the shape decision and the blinding report's figure (issue 27 item 7)
                prereg_text += (f"; images {shape.shape} to {shape.aspect}: the picture's shape alone tells apart "
                                f"{shape.tools_told_apart_by_shape} of {shape.tools} tools")
            from tasks.beauty.sources import study_deviations

            looks = study_deviations(ctx) or []  # an imported study's too: its bundle's
            if looks:  # a look at the results before the close (issue 27 item 5)
                notes.append(f"deviation from the pre-registration: the results were looked at {len(looks)} time(s) "
                             f"before the panel closed (first {looks[0]['at']:%Y-%m-%d %H:%M} UTC, after "
                             f"{looks[0]['answers']} answers; reasons in the bundle's deviations.json)")
            from tasks.beauty.bundles import imported_from

            origin = imported_from(ctx.study_dir)
            if origin:
                prereg_text += (f"; imported from the open-data bundle {origin['bundle']} (study {origin['original_study_id']}, "
                                f"SHA256SUMS sha256 {origin['sha256sums_sha256'][:12]}... verified)")
        except (OSError, ValueError, RuntimeError) as exc:  # the lake is the record; the folder may be elsewhere
            notes.append(f"study folder not readable here ({type(exc).__name__}): prompts shown by id")
        flagged = sum(r["flagged_answers"] or 0 for r in tables["study_index"].to_pylist() if r["panel_group"] == "all")
        if flagged:  # quality control (tasks/beauty/quality.py): the index is also computed without them
            notes.append(f"quality control: {flagged} of {tables['study_answers'].num_rows} answers flagged (image not loaded, "
                         "or answered faster than the study's threshold); the Beauty Index without them is beside "
                         "the index in the table below (study_index: beauty_index_unflagged)")
        weights = set(tables["study_pixel_metrics"].column("weights").to_pylist())
        if "TINY RANDOM" in weights:
            notes.append("pixel metrics from TINY RANDOM networks (no weights given): they show the pipeline only")
        if hps_uncalibrated(tables["study_pixel_metrics"]):  # the HPSv3 mu column: demo weights (issue 26 item 7)
            from schemas.study import HPS_UNCALIBRATED_NOTE

            notes.append(HPS_UNCALIBRATED_NOTE)
        ctx_page = study_page_context(study_id, tables, title, question, prompts, notes, prereg_text)
        html = env.get_template("study.html").render(title=f"Beauty Index: {study_id}", meta={}, generated_at=None,
                                                     csp=CSP, root="../", **ctx_page)
        page = f"{STUDIES_DIR}/{study_id}.html"
        _write_text(Path(out_dir) / page, html)
        links.append(StudyLink(study_id, title, page, simulated))
    keep = {Path(link.page).name for link in links}
    for f in (Path(out_dir) / STUDIES_DIR).glob("*.html") if (Path(out_dir) / STUDIES_DIR).is_dir() else ():
        if f.name not in keep:
            f.unlink()
    from tasks.report.pooled import build_pooled_page  # tools shared by studies, pooled (issue 16 item 13)

    pooled = build_pooled_page(settings, Path(out_dir))
    if pooled:
        links.append(StudyLink("pooled", "Pooled across studies: random-effects Beauty Index per shared tool", pooled, False))
    return links
