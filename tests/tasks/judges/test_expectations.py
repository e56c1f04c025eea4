"""expectations/judge_calls.json and expectations/verdicts.json hold on what the router writes
(every state), and catch a broken table."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tasks.lake import validation
from tasks.judges import judge_items
from tests.fake_openai import Reply
from tests.tasks.judges.helpers import FAST, Script, config, endpoint, make_routing

pytestmark = pytest.mark.slow  # imports Great Expectations


@pytest.fixture
def judge_suites(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tuple(n for n in ("judge_calls", "verdicts") if n not in validation.SUITE_NAMES)
    if missing:  # until tasks/lake/validation.py lists them
        monkeypatch.setattr(validation, "SUITE_NAMES", validation.SUITE_NAMES + missing)


def test_router_tables_pass_their_expectation_suites(judge_suites, servers, make_item) -> None:
    srv = servers(responder=Script({
        "fox": [Reply(status=429, headers={"Retry-After": "0"}), Reply(text="ok\nVERDICT: PASS")],
        "cat": [Reply(text="no\nVERDICT: FAIL")],
        "vase": [Reply(status=500)],
        "owl": [Reply(text="hmm")],
    }))  # fmt: skip
    items = [make_item(p) for p in ("a fox", "a cat", "a vase", "an owl")]
    calls, verdicts = judge_items(
        items, make_routing("alpha", None), config(alpha=endpoint(srv, max_retries=1)), retry=FAST
    )
    assert sorted(verdicts.column("verdict").to_pylist()) == ["ERROR", "FAIL", "PASS", "UNPARSABLE"]
    assert validation.require_valid("judge_calls", calls).success
    assert validation.require_valid("verdicts", verdicts).success

    bad = verdicts.set_column(
        verdicts.schema.get_field_index("reason"), "reason", pa.array([None] * verdicts.num_rows, pa.string())
    )
    report = validation.validate_table("verdicts", bad)
    assert not report.success and any(f.column == "reason" for f in report.failures)
    dup = pa.concat_tables([verdicts, verdicts])
    assert not validation.validate_table("verdicts", dup).success
