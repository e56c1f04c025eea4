"""The verdict protocol: final-line parser, template hashing, identity, sampling settings."""

from __future__ import annotations

import hashlib
import json
from importlib import resources

import pytest

from tasks.judges.protocol import canonical_json, load_template, parse_verdict, verdict_identity


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The fox is there.\nVERDICT: PASS", "PASS"),
        ("The fox is missing.\nVERDICT: FAIL", "FAIL"),
        ("reasons\nverdict: pass", "PASS"),  # case-insensitive keyword
        ("reasons\nVerdict:Fail", "FAIL"),
        ("reasons\n   VERDICT:   PASS   \n\n  \n", "PASS"),  # surrounding whitespace, trailing blank lines
        ("reasons\n**VERDICT: PASS**", "PASS"),  # markdown bold
        ("reasons\n**VERDICT:** FAIL", "FAIL"),
        ("reasons\nVERDICT: __PASS__", "PASS"),
        ("reasons\n`VERDICT: FAIL`", "FAIL"),
        ("VERDICT: PASS", "PASS"),  # no rationale is still a verdict
        ("reasons\r\nVERDICT: FAIL\r\n", "FAIL"),  # CRLF
    ],
)
def test_parse_verdict_accepts_the_final_line(text: str, expected: str) -> None:
    verdict, _ = parse_verdict(text)
    assert verdict == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n  ",
        None,
        "VERDICT: PASS\nActually, looking again, the fox has five legs.",  # verdict mid-text, more lines after
        "reasons\nVERDICT: PASS.",  # other text on the line (a full stop)
        "reasons\nFinal VERDICT: PASS",
        "reasons\nVERDICT: PASS (confident)",
        "reasons\nVERDICT: YES",
        "reasons\nVERDICT: PASS/FAIL",
        "reasons\nVERDICT PASS",  # no colon
        "reasons\nPASS",
        "reasons\nVERDICT: PASS VERDICT: FAIL",
        "The answer is VERDICT: PASS",
    ],
)
def test_parse_verdict_rejects_anything_else(text) -> None:
    verdict, _ = parse_verdict(text)
    assert verdict == "UNPARSABLE"


def test_parse_verdict_returns_the_rationale_without_the_verdict_line() -> None:
    verdict, rationale = parse_verdict("  The label reads WILDFLOWER HONEY.\nIt is spelled right.\n\nVERDICT: PASS\n")
    assert verdict == "PASS"
    assert rationale == "The label reads WILDFLOWER HONEY.\nIt is spelled right."
    assert "VERDICT" not in rationale


def test_only_the_final_line_counts_even_if_an_earlier_line_disagrees() -> None:
    assert parse_verdict("VERDICT: PASS\nOn reflection no.\nVERDICT: FAIL")[0] == "FAIL"


def test_template_hash_is_the_sha256_of_the_file_bytes() -> None:
    t = load_template("verdict-v1")
    data = (resources.files("tasks.judges") / "templates" / "verdict-v1.txt").read_bytes()
    assert t.sha256 == hashlib.sha256(data).hexdigest()
    rendered = t.render("a red fox {x}", "Is it red?")
    assert "a red fox {x}" in rendered and "Is it red?" in rendered
    assert "{{" not in rendered
    assert "VERDICT: PASS" in rendered and "VERDICT: FAIL" in rendered


def test_unknown_template_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown judge template 'verdict-v9'.*verdict-v1"):
        load_template("verdict-v9")


def test_sampling_json_is_canonical_and_identity_depends_on_every_part() -> None:
    a = canonical_json({"temperature": 0.0, "seed": 0, "max_tokens": 512})
    assert (
        a
        == canonical_json({"max_tokens": 512, "seed": 0, "temperature": 0.0})
        == '{"max_tokens":512,"seed":0,"temperature":0.0}'
    )
    base = dict(
        image_sha256="a" * 64, prompt_id="p1", question="Q?", judge_model="m", template_sha256="t" * 64, sampling=a
    )
    ident = verdict_identity(**base)
    assert len(ident) == 64 and ident == verdict_identity(**base)
    for key, other in [("image_sha256", "b" * 64), ("prompt_id", "p2"), ("question", "Q2?"), ("judge_model", "m2"),
                       ("template_sha256", "u" * 64), ("sampling", json.dumps({"temperature": 0.0}))]:  # fmt: skip
        assert verdict_identity(**{**base, key: other}) != ident, key
