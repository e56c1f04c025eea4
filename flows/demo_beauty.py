"""`make demo`'s Beauty Index study, the flow-running part: the study opened and filled with
SIMULATED answers (tasks/beauty/demo_study.py), then analysed by the `study-analyze` flow."""

from __future__ import annotations


def run_demo_study(settings, console) -> bool:
    """Open, fill with SIMULATED answers and analyse the demo study (each step once). Returns
    True when it analysed now, False when an earlier run already had."""
    from tasks.beauty.demo_study import DEMO_MIXED_RESAMPLES, DEMO_STUDY_ID, fill_demo_study

    if not fill_demo_study(settings, console):
        return False
    from flows.beauty import study_analyze_flow

    study_analyze_flow(DEMO_STUDY_ID, mixed_resamples=DEMO_MIXED_RESAMPLES)
    return True
