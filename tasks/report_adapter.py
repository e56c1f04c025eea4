"""Lake -> ReportData for `imagebench report` (the site generator itself is tasks/report)."""

from __future__ import annotations

import numpy as np

from schemas.reference import ReferenceFile
from schemas.settings import Settings
from tasks.suite import Suite


def report_data_from_lake(settings: Settings, suite: Suite, reference: ReferenceFile):
    from tasks import stats
    from tasks.lake import query
    from tasks.report import ImageRow, LeaderboardRow, ReportData
    from tasks.views import model_prompts, paired_vectors

    columns, rows = query(settings.catalog_path, "SELECT * FROM leaderboard")
    leaderboard = [dict(zip(columns, r)) for r in rows]
    out_rows, by_category, by_tag, images = [], {}, {}, []
    eligible = {p.prompt_id for p in suite.prompts if p.eps_eligible}
    for r in leaderboard:
        model_id = r["model_id"]
        out_rows.append(
            LeaderboardRow(
                model_id=model_id,
                capability=r["capability"], capability_lo=r["capability_lo"], capability_hi=r["capability_hi"],
                eps=r["eps"], eps_lo=r["eps_lo"], eps_hi=r["eps_hi"],
                overall=r["overall"], overall_lo=r["overall_lo"], overall_hi=r["overall_hi"],
                rank=r["rank"], rank_best=r["rank"], rank_worst=r["rank_worst"],
                coverage=r["judge_coverage"], provisional=bool(r["provisional"]), complete=bool(r["complete"]),
                uncalibrated=bool(r["uncalibrated"]),
                eps_prompts_scored=r["eps_prompts_scored"], eps_prompts_eligible=r["eps_prompts_eligible"],
                judged=r["verdicts_pass"] + r["verdicts_fail"], total=len(suite.prompts),
            )
        )
        views = model_prompts(settings, suite, reference, model_id)
        verdicts, contributions = paired_vectors(views, suite, reference)
        judged = stats.judge_decided([v.state for v in views], verdicts)
        by_category[model_id] = _groups(suite, verdicts, judged, contributions, eligible, "category", stats)
        by_tag[model_id] = _groups(suite, verdicts, judged, contributions, eligible, "tag", stats)
        for p, v in zip(suite.prompts, views):
            images.append(
                ImageRow(
                    model_id=model_id, prompt_id=p.prompt_id, category=p.category, tag=p.tag, prompt=p.prompt,
                    question=p.question, image_path=v.image_path, state=v.state, reason=v.reason, mu=v.mu,
                    verdict=v.verdict if v.state == "ok" else None, judge=v.judge, rationale=v.rationale,
                    eps_eligible=p.eps_eligible,
                )
            )
    return ReportData(
        rows=out_rows,
        by_category=by_category,
        by_tag=by_tag,
        images=images,
        categories=list(dict.fromkeys(p.category for p in suite.prompts)),
        tag_categories={p.tag: p.category for p in suite.prompts},
        image_root=settings.home.resolve(),
        meta={"suite": suite.version, "reference": reference.version, "scorer": f"{reference.scorer.scorer_name} {reference.scorer_id}"},
    )


def _groups(suite: Suite, verdicts, judged, contributions: np.ndarray, eligible: set[str], key: str, stats) -> dict:
    from tasks.report import GroupScore

    groups = [getattr(p, key) for p in suite.prompts]
    out = {}
    for name, cap in stats.capability_breakdown(verdicts, groups, judged).items():
        elig = [i for i, g in enumerate(groups) if g == name and suite.prompts[i].prompt_id in eligible]
        eps = 100.0 * float(np.mean(contributions[elig])) if elig else None
        out[name] = GroupScore(
            capability=None if cap.capability != cap.capability else cap.capability, eps=eps, n=cap.total,
            decided=cap.decided, judged=cap.judged,
        )
    return out
