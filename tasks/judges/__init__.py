"""VLM/OCR judges: routing, backends (lazy registry), the verdict protocol, and the router that
writes ``judge_calls`` and ``verdicts`` rows. See docs/JUDGES.md.

Importing this package is cheap: backends (httpx, torch/transformers, Tesseract) load on use.
"""

from __future__ import annotations

from .base import (
    Judge,
    JudgeAnswer,
    JudgeBadResponse,
    JudgeError,
    JudgeIdentity,
    JudgeInputError,
    JudgeModelMismatch,
    JudgeRequest,
    JudgesConfigError,
    JudgeUnavailable,
)
from .config import (
    check_routing_against,
    load_judges_config,
    load_routing,
    parse_judges_config,
    parse_routing,
    routing_judges,
)
from .protocol import ERROR, FAIL, PASS, UNPARSABLE, canonical_json, load_template, parse_verdict, verdict_identity
from .registry import BACKENDS, BUILTIN_JUDGES, backend_class, create_judge, register_backend

__all__ = [
    "BACKENDS",
    "BUILTIN_JUDGES",
    "ERROR",
    "FAIL",
    "PASS",
    "UNPARSABLE",
    "Judge",
    "JudgeAnswer",
    "JudgeBadResponse",
    "JudgeError",
    "JudgeIdentity",
    "JudgeInputError",
    "JudgeItem",
    "JudgeModelMismatch",
    "JudgeRequest",
    "JudgeRun",
    "JudgeUnavailable",
    "JudgesConfigError",
    "RetryPolicy",
    "backend_class",
    "canonical_json",
    "check_judges",
    "check_routing_against",
    "create_judge",
    "judge_items",
    "load_judges_config",
    "load_routing",
    "load_template",
    "make_items",
    "parse_judges_config",
    "parse_routing",
    "parse_verdict",
    "register_backend",
    "routing_judges",
    "settled_identities",
    "verdict_identity",
]

_LAZY = {
    "JudgeItem": "router",
    "JudgeRun": "router",
    "RetryPolicy": "router",
    "judge_items": "router",
    "make_items": "router",
    "settled_identities": "router",
    "check_judges": "check",
}


def __getattr__(name: str):  # router pulls in pyarrow; check pulls in httpx: load them on use
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
