"""Capability per group (category, subcategory, tag, difficulty) that adds up to the headline.

The headline is ``100 * PASS / (PASS + FAIL)`` over the whole suite, where a missing or
quarantined image is a FAIL (docs/STATISTICS.md). A breakdown that showed "-" for a group whose
only decided prompts are such FAILs hid them: demo-patchy's 37.0 (10 PASS of 27 decided) could
not be traced from its categories. Here every group carries its PASS, judge FAIL, no-image FAIL
and undecided counts; summed over the groups they are the model's, and a group's Capability is
its own PASS / decided whenever the headline is a figure at all (some judge decided something),
so ``sum(PASS) / sum(decided)`` over the groups is the headline. A group's EPS
(:func:`group_eps`) follows the headline's rule: lost images count 0 beside a scored prompt, and a
group with no eligible prompt scored has no EPS (absent, never 0). Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from tasks.scores import stats

NO_IMAGE_STATES = ("missing", "quarantined")


@dataclass(frozen=True)
class GroupCapability:
    """One group's share of a model's Capability."""

    group: Hashable
    prompts: int
    passed: int
    failed_by_judge: int  # FAIL verdicts on ok images
    failed_no_image: int  # missing or quarantined images: FAIL by rule, no judge involved
    undecided: int  # ERROR, UNPARSABLE or not judged (ok images without PASS/FAIL)
    capability: float | None  # 100 * passed / decided; None: no figure (see module doc)

    @property
    def failed(self) -> int:
        return self.failed_by_judge + self.failed_no_image

    @property
    def decided(self) -> int:
        return self.passed + self.failed

    @property
    def judged(self) -> int:
        """Decided by a judge (the rest of the decided are images that never came)."""
        return self.passed + self.failed_by_judge

    @property
    def coverage(self) -> float:
        return self.decided / self.prompts if self.prompts else math.nan


def _counts(group: Hashable, states: Sequence[str], verdicts: Sequence[str | None], headline: bool) -> GroupCapability:
    passed = sum(1 for s, v in zip(states, verdicts) if s == "ok" and v == "PASS")
    by_judge = sum(1 for s, v in zip(states, verdicts) if s == "ok" and v == "FAIL")
    no_image = sum(1 for s in states if s in NO_IMAGE_STATES)
    decided = passed + by_judge + no_image
    return GroupCapability(
        group=group, prompts=len(states), passed=passed, failed_by_judge=by_judge, failed_no_image=no_image,
        undecided=len(states) - decided, capability=100.0 * passed / decided if headline and decided else None,
    )


def capability_by_group(
    image_states: Sequence[str], verdicts: Sequence[str | None], groups: Sequence[Hashable]
) -> tuple[list[GroupCapability], GroupCapability]:
    """(one entry per group in order of first appearance, the model's total). ``verdicts`` as
    judged or effective (a missing/quarantined image counts as FAIL either way), one per prompt
    of the suite, in the order of ``image_states`` and ``groups``. The total's Capability is the
    headline (:func:`tasks.scores.stats.capability`). Raises ``ValueError`` on a length mismatch, an
    unknown state or verdict, or no prompts."""
    states, gs = list(image_states), list(groups)
    effective = stats.effective_verdicts(states, verdicts)  # checks states and verdicts
    if not (len(states) == len(gs)):
        raise ValueError(f"{len(states)} image states but {len(gs)} group labels")
    if not states:
        raise ValueError("no prompts: Capability is undefined over zero prompts")
    headline = stats.capability(effective, judged=stats.judge_decided(states, effective))
    defined = not math.isnan(headline.capability)
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(gs):
        members.setdefault(g, []).append(i)
    rows = [_counts(g, [states[i] for i in idx], [effective[i] for i in idx], defined) for g, idx in members.items()]
    total = _counts("all", states, effective, defined)
    # The invariant this module exists for: the groups recombine to the headline.
    assert total.decided == headline.decided and total.passed == headline.passed
    return rows, total


def group_eps(contributions: Sequence[float], scored: Sequence[bool], eligible_members: Sequence[int]) -> float | None:
    """EPS of one group: ``100 * mean`` of the EPS contributions of its eligible prompts (indices
    ``eligible_members`` into ``contributions`` and ``scored``; a lost image contributes 0), or None
    when the group has no eligible prompt or none of them was scored (``scored[i]``: prompt ``i``
    has a mu). The same rule as the model's EPS (tasks/scores/eps.py), per group."""
    members = list(eligible_members)
    if not any(scored[i] for i in members):
        return None
    return 100.0 * math.fsum(float(contributions[i]) for i in members) / len(members)
