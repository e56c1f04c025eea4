"""`imagebench report`: the whole static site of a workspace, whatever it holds.

A lab may run only Beauty Index studies (or only VAB), with no ImageBench model scored and no EPS
reference built: its report still gets every study page, the pooled page, the VAB pages and an
index that says what the workspace holds. The ImageBench leaderboard is drawn only when models
were scored and their reference verifies; otherwise the index says why it is absent (nothing of
it is required or invented).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SiteSummary:
    index: Path
    models: int
    studies: int
    vab: int
    leaderboard_note: str | None  # why there is no ImageBench leaderboard (None: there is one)


def _scored_models(settings) -> int:
    from tasks.lake.tables import QueryError, query

    try:
        _, rows = query(settings.catalog_path, "SELECT count(*) FROM leaderboard")
    except (QueryError, OSError):  # no catalog or no leaderboard view: nothing was scored
        return 0
    return int(rows[0][0])


def imagebench_data(settings):
    """(ReportData, note): the ImageBench leaderboard's data, or an empty one and why."""
    from tasks.scores.reference import ReferenceError
    from tasks.report import ReportData

    models = _scored_models(settings)
    if not models:
        return ReportData(rows=[], title="imagebench report"), "No ImageBench model has been scored in this workspace."
    from tasks.runs import pinned
    from tasks.lake.report_data import report_data_from_lake

    try:
        suite = pinned.load_pinned_suite(settings)
        reference = pinned.load_verified_reference(settings, suite, None)
    except ReferenceError as exc:
        return ReportData(rows=[], title="imagebench report"), (
            f"{models} ImageBench model(s) are in the lake, but their leaderboard is not drawn: {type(exc).__name__}: {exc}")
    return report_data_from_lake(settings, suite, reference), None


def build_site(settings, out_dir: Path) -> SiteSummary:
    """Study pages (and the pooled page), VAB pages, the ImageBench pages when there is a
    leaderboard, and the index listing what is there."""
    from tasks.report import build_report
    from tasks.report.study import build_study_pages
    from tasks.report.vab import build_vab_pages

    out_dir = Path(out_dir)
    studies = build_study_pages(settings, out_dir)
    vab = build_vab_pages(settings, out_dir)
    data, note = imagebench_data(settings)
    n_studies = sum(1 for s in studies if not s.page.startswith("pooled/"))
    data.meta = {**data.meta, "contents": (f"{len(data.rows)} ImageBench model(s), {n_studies} Beauty Index stud"
                                           f"{'y' if n_studies == 1 else 'ies'}, {len(vab)} VAB set collection(s)")}
    index = build_report(data, out_dir, studies=studies, vab=vab, leaderboard_note=note)
    return SiteSummary(index, len(data.rows), n_studies, len(vab), note)
