"""tasks/scores/breakdown.py: per-group Capability that recombines to the headline (issue 15, item 6)."""

from __future__ import annotations

import math

import pytest

from tasks.scores import stats
from tasks.scores.breakdown import capability_by_group


def test_groups_recombine_to_the_headline_with_missing_and_quarantined_images():
    states = ["ok", "ok", "quarantined", "ok", "missing", "missing", "ok", "ok"]
    verdicts = ["PASS", "FAIL", None, "ERROR", None, None, None, "PASS"]
    groups = ["text", "text", "text", "space", "space", "faces", "faces", "faces"]
    rows, total = capability_by_group(states, verdicts, groups)
    by = {g.group: g for g in rows}
    headline = stats.capability(stats.effective_verdicts(states, verdicts),
                                judged=stats.judge_decided(states, verdicts))
    assert (total.passed, total.decided, total.capability) == (headline.passed, headline.decided, headline.capability)
    assert total.capability == pytest.approx(100 * 2 / 6)
    # "space": its only decided prompt is a missing image: 0.0 of 1, not "not judged".
    assert (by["space"].capability, by["space"].failed_no_image, by["space"].undecided) == (0.0, 1, 1)
    assert (by["text"].passed, by["text"].failed_by_judge, by["text"].failed_no_image) == (1, 1, 1)
    assert sum(g.passed for g in rows) / sum(g.decided for g in rows) * 100 == pytest.approx(total.capability)
    assert sum(g.prompts for g in rows) == len(states) and [g.group for g in rows] == ["text", "space", "faces"]


def test_a_model_no_judge_decided_has_no_figure_anywhere():
    rows, total = capability_by_group(["missing", "ok", "quarantined"], [None, None, None], ["a", "a", "b"])
    assert total.capability is None and all(g.capability is None for g in rows)
    assert math.isnan(stats.capability(["FAIL", None, "FAIL"], judged=[False, False, False]).capability)
    assert total.decided == 2 and total.judged == 0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="group labels"):
        capability_by_group(["ok"], ["PASS"], ["a", "b"])
    with pytest.raises(ValueError, match="'pass'"):
        capability_by_group(["ok"], ["pass"], ["a"])
