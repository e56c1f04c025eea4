"""What a study bundle publishes about its judges, as the lab chose it (issue 27 items 1 and 2).

``PublicationChoices`` are the options of `imagebench study export` that make judges less
distinguishable, each written into the bundle (``anonymity.json`` and the datasheet):

- ``times``: the resolution of the published ``shown_at`` / ``answered_at``: ``minute`` (the
  default), ``hour``, ``day`` or ``none``. Whatever the resolution, a time at or after the
  pre-registration's ``created_at`` is published at or after it, and one before it before it
  (``export_time``), so `study import-bundle` gives the home verdict. ``none`` keeps only that:
  every time at or after the plan is ``created_at`` itself, every time before it 1970-01-01.
- ``drop_partial_judges``: withhold the answers of the judges who did not answer their whole
  queue (every tool x prompt): their answer count, below the full one, singles them out.
- ``merge_groups``: publish small panel groups as one (``a+b`` is published as ``a-or-b``), in the
  answers, study.json and the datasheet; the per-group rows of ``beauty_index.csv`` of the groups
  merged are withheld (with the answers they would tell which judges form each group).

The export computes the re-identification figures of the rows it would publish
(tasks/beauty/reident.py) and refuses, naming the figures and what each option would leave, when a
judge is unique on a published quasi-identifier set. Pure functions; no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from schemas.study import GROUP_NAME_RE
from tasks.beauty.reident import AnonymityReport

TIME_RESOLUTIONS = ("minute", "hour", "day", "none")
NO_TIME = datetime(1970, 1, 1, tzinfo=timezone.utc)  # `--times none`: "before the plan"
MERGED_JOINER = "-or-"


@dataclass(frozen=True)
class PublicationChoices:
    times: str = "minute"
    drop_partial_judges: bool = False
    merge_groups: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.times not in TIME_RESOLUTIONS:
            raise ValueError(f"--times {self.times!r}: choose one of {', '.join(TIME_RESOLUTIONS)}")
        seen: set[str] = set()
        for merge in self.merge_groups:
            if len(merge) < 2 or len(set(merge)) != len(merge):
                raise ValueError(f"--merge-groups {'+'.join(merge)}: name two or more different groups, e.g. a+b")
            twice = seen.intersection(merge)
            if twice:
                raise ValueError(f"--merge-groups: group(s) {sorted(twice)} named in two merges")
            seen.update(merge)
            if not GROUP_NAME_RE.fullmatch(merged_name(merge)):
                raise ValueError(f"--merge-groups {'+'.join(merge)}: the merged name {merged_name(merge)!r} is too long")

    def group_map(self) -> dict[str, str]:
        """Panel group -> the group it is published as (only the merged ones)."""
        return {g: merged_name(m) for m in self.merge_groups for g in m}

    def flags(self) -> str:
        """The `study export` options that give these choices."""
        out = [f"--times {self.times}"]
        out += ["--drop-partial-judges"] if self.drop_partial_judges else []
        out += [f"--merge-groups {'+'.join(m)}" for m in self.merge_groups]
        return " ".join(out)

    def to_json(self) -> dict:
        return {"times": self.times, "drop_partial_judges": self.drop_partial_judges,
                "merge_groups": {merged_name(m): list(m) for m in self.merge_groups}, "export_options": self.flags()}


def merged_name(groups: tuple[str, ...]) -> str:
    return MERGED_JOINER.join(groups)


def parse_merge(text: str) -> tuple[str, ...]:
    """``a+b`` (the `--merge-groups` value) -> ("a", "b")."""
    return tuple(g.strip() for g in text.split("+"))


def check_groups(choices: PublicationChoices, groups: list[str]) -> None:
    """Every merged group is a group of the study, and no merged name is already a group."""
    for merge in choices.merge_groups:
        unknown = [g for g in merge if g not in groups]
        if unknown:
            raise ValueError(f"--merge-groups {'+'.join(merge)}: {unknown} not among the study's panel groups ({', '.join(groups)})")
        if merged_name(merge) in groups:
            raise ValueError(f"--merge-groups {'+'.join(merge)}: the study already has a group named {merged_name(merge)!r}")


def floor_to(ts: datetime, times: str) -> datetime:
    """``ts`` floored to the resolution (``none``: 1970-01-01, before any plan)."""
    if times == "minute":
        return ts.replace(second=0, microsecond=0)
    if times == "hour":
        return ts.replace(minute=0, second=0, microsecond=0)
    if times == "day":
        return ts.replace(hour=0, minute=0, second=0, microsecond=0)
    return NO_TIME.astimezone(ts.tzinfo) if ts.tzinfo else NO_TIME.replace(tzinfo=None)


def export_time(ts, created: datetime | None, times: str = "minute"):
    """An answer time as the bundle publishes it (None stays None):

    - ``ts`` at or after the plan's ``created_at``: ``max(floor_to(ts), created_at)``;
    - ``ts`` before it (or no plan): ``floor_to(ts)``, which is before it too.

    So a bundle's times stand on the same side of ``created_at`` as the real ones, answer for
    answer, and ``tasks.beauty.prereg.status_of`` gives the bundle (`study import-bundle`) exactly
    the verdict it gives the study at home: a study answered in the minute it was opened stays
    pre-registered, and one whose answers predate its plan is still refused with the same count.
    Flooring alone would move an answer given seconds after the open to before it. Nothing new is
    published: ``created_at`` is in preregistration.json, and the only thing told beyond the
    resolution is on which side of it an answer falls, which is what the verdict says. The rule is
    monotone (answered_at stays >= shown_at) and idempotent (a re-exported imported bundle keeps
    its times)."""
    if ts is None:
        return None
    floored = floor_to(ts, times)
    if created is not None and ts >= created:
        return max(floored, created)
    return floored


@dataclass(frozen=True)
class Withheld:
    """What the choices left out of the published answers."""

    judges: int = 0
    answers: int = 0


def apply_choices(rows: list[dict], choices: PublicationChoices, full_queue: int,
                  created: datetime | None) -> tuple[list[dict], Withheld]:
    """The answer rows as published: partial judges withheld (when chosen), groups merged, times
    at the chosen resolution. ``rows`` carry the exact times; ``full_queue``: answers in a whole
    queue (tools x prompts)."""
    counts = Counter(r["judge_id"] for r in rows)
    partial = {j for j, n in counts.items() if n < full_queue} if choices.drop_partial_judges else set()
    groups = choices.group_map()
    out = [dict(r, panel_group=groups.get(r["panel_group"], r["panel_group"]),
                shown_at=export_time(r["shown_at"], created, choices.times),
                answered_at=export_time(r["answered_at"], created, choices.times))
           for r in rows if r["judge_id"] not in partial]
    return out, Withheld(len(partial), sum(counts[j] for j in partial))


def alternatives(choices: PublicationChoices, group_sizes: Mapping[str, int]) -> list[PublicationChoices]:
    """The options the refusal offers, each one step from ``choices``: every coarser time
    resolution, withholding partial judges, and merging the two smallest groups not yet merged."""
    out = [replace(choices, times=t) for t in TIME_RESOLUTIONS[TIME_RESOLUTIONS.index(choices.times) + 1:]]
    if not choices.drop_partial_judges:
        out.append(replace(choices, drop_partial_judges=True))
    merged = {g for m in choices.merge_groups for g in m}
    free = sorted((n, g) for g, n in group_sizes.items() if g not in merged and n)
    if len(free) >= 2:
        out.append(replace(choices, merge_groups=(*choices.merge_groups, (free[0][1], free[1][1]))))
    return out


def _step(base: PublicationChoices, alt: PublicationChoices) -> str:
    if alt.times != base.times:
        return f"--times {alt.times}"
    if alt.drop_partial_judges != base.drop_partial_judges:
        return "--drop-partial-judges"
    return f"--merge-groups {'+'.join(alt.merge_groups[-1])}"


def refusal(study_id: str, report: AnonymityReport, choices: PublicationChoices,
            unique_with: Callable[[PublicationChoices], int], group_sizes: Mapping[str, int]) -> str:
    """The one-line refusal: how many judges are unique on what, and what each option would leave
    (``unique_with(choices)``: judges unique on the rows those choices would publish)."""
    if report.judges < 2:
        return (f"study {study_id}: export refused: its {report.judges} judge is unique on anything the bundle would "
                "publish, whatever the options: a study of one judge cannot be published anonymously")
    sets = "; ".join(f"({', '.join(q.columns)}): {q.unique_judges} unique, smallest class {q.min_class_size}"
                     for q in report.quasi_identifiers)
    offers = ", ".join(f"{_step(choices, alt)} ({unique_with(alt)} would stay unique)"
                       for alt in alternatives(choices, group_sizes))
    return (f"study {study_id}: export refused: {len(report.unique_ids)} of {report.judges} judges would be unique on "
            f"what the bundle publishes (k-anonymity 1: anyone who knows their group, how many answers they gave or "
            f"when they took part singles them out) with {choices.flags()}: {sets}. Options, combinable, each recorded "
            f"in the bundle: {offers or 'none left: a judge alone in the study cannot be published anonymously'}")
