"""Static leaderboard site: ``build_report(ReportData, out_dir) -> index.html``.

The site is self-contained (no CDN, no network at view time): a sortable leaderboard with 95%
intervals, rank bands and flags; a Capability-vs-EPS scatter and per-category / per-tag heatmaps
as inline SVG; one page per model with every image's thumbnail, mu, verdict and rationale. See
docs/REPORT.md. The lake -> ReportData adapter lives with the CLI.
"""

from tasks.report.build import MARKER, ReportError, build_report, ci_text, page_name, rank_text
from tasks.report.model import GroupScore, ImageRow, LeaderboardRow, ReportData

__all__ = [
    "MARKER",
    "GroupScore",
    "ImageRow",
    "LeaderboardRow",
    "ReportData",
    "ReportError",
    "build_report",
    "ci_text",
    "page_name",
    "rank_text",
]
