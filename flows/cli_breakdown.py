"""`imagebench breakdown`: one model's Capability and EPS per group, adding up to the headline
(tasks/scores/breakdown.py); the table ends with the model's total, which is its leaderboard Capability."""

from __future__ import annotations

from schemas.settings import Settings

BREAKDOWN_GROUPS = ("category", "subcategory", "tag", "difficulty")
BREAKDOWN_COLUMNS = ("capability", "pass", "fail", "fail_no_image", "undecided", "decided", "judged", "prompts",
                     "coverage", "eps", "eps_prompts")


def breakdown_rows(settings: Settings, model: str, by: str) -> tuple[list[str], list[list], list, bool]:
    """(columns, one row per group, the total row, whether its EPS comes from uncalibrated demo
    weights). ``fail`` counts every FAIL the headline counts: those of a judge and the missing or
    quarantined images (``fail_no_image``, FAIL by rule)."""
    from tasks.runs import pinned
    from tasks.scores.breakdown import capability_by_group
    from tasks.lake.views import model_prompts, paired_vectors

    suite = pinned.load_pinned_suite(settings)
    reference = pinned.load_verified_reference(settings, suite, None)
    views = model_prompts(settings, suite, reference, model)
    verdicts, contributions = paired_vectors(views, suite, reference)
    groups = [getattr(p, by) for p in suite.prompts]
    per_group, total = capability_by_group([v.state for v in views], verdicts, groups)

    def row(g, members: list[int]) -> list:
        elig = [i for i in members if suite.prompts[i].eps_eligible]
        eps = 100.0 * float(sum(contributions[i] for i in elig)) / len(elig) if elig else None
        return [g.group, g.capability, g.passed, g.failed, g.failed_no_image, g.undecided, g.decided, g.judged,
                g.prompts, g.coverage, eps, len(elig)]

    rows = [row(g, [i for i, x in enumerate(groups) if x == g.group]) for g in per_group]
    return [by, *BREAKDOWN_COLUMNS], rows, row(total, list(range(len(groups)))), bool(reference.scorer.uncalibrated)
