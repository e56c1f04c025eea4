"""Lake -> ReportData for `imagebench report` (the site generator itself is tasks/report)."""

from __future__ import annotations

import numpy as np

from schemas.reference import ReferenceFile
from schemas.settings import Settings
from tasks.scores.suite import Suite


def report_data_from_lake(settings: Settings, suite: Suite, reference: ReferenceFile):
    from tasks.lake.tables import query
    from tasks.report import ImageRow, LeaderboardRow, ReportData
    from tasks.lake.views import model_prompts, paired_vectors

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
                coverage=r["coverage"], provisional=bool(r["provisional"]), complete=bool(r["complete"]),
                uncalibrated=bool(r["uncalibrated"]),
                eps_prompts_scored=r["eps_prompts_scored"], eps_prompts_eligible=r["eps_prompts_eligible"],
                judged=r["judged"], decided=r["decided"], total=r["prompts"],
            )
        )
        views = model_prompts(settings, suite, reference, model_id)
        verdicts, contributions = paired_vectors(views, suite, reference)
        states = [v.state for v in views]
        scored = [v.mu is not None for v in views]
        by_category[model_id] = _groups(suite, states, verdicts, contributions, eligible, "category", scored)
        by_tag[model_id] = _groups(suite, states, verdicts, contributions, eligible, "tag", scored)
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


def _groups(suite: Suite, states, verdicts, contributions: np.ndarray, eligible: set[str], key: str,
            scored: list[bool]) -> dict:
    """Per group: its PASS / FAIL / no-image / undecided counts, which add up over the groups to
    the model's headline Capability (tasks/scores/breakdown.py), and its EPS."""
    from tasks.scores.breakdown import capability_by_group, group_eps
    from tasks.report import GroupScore

    groups = [getattr(p, key) for p in suite.prompts]
    out = {}
    for g in capability_by_group(states, verdicts, groups)[0]:
        elig = [i for i, x in enumerate(groups) if x == g.group and suite.prompts[i].prompt_id in eligible]
        eps = group_eps(contributions, scored, elig)  # None: no eligible prompt of the group scored
        out[g.group] = GroupScore(
            capability=g.capability, eps=eps, n=g.prompts, decided=g.decided, judged=g.judged, passed=g.passed,
            failed=g.failed, no_image=g.failed_no_image, undecided=g.undecided,
        )
    return out
