"""Great Expectations checks of every table before it is published.

Suites live as JSON in ``expectations/<name>.json`` (one per lake table, plus ``eps_reference``
for the prompt table of a reference file). They are loaded into one ephemeral GX context per
process (built on first use: importing GX takes seconds, so nothing here imports it at module
import time), with a pandas data source and a whole-dataframe batch definition per suite.

GX 1.x has no polars support: polars frames and pyarrow tables are converted to pandas first.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = [
    "EXPECTATIONS_DIR",
    "SUITE_NAMES",
    "FailedExpectation",
    "ValidationFailed",
    "ValidationReport",
    "load_suite_config",
    "require_valid",
    "validate_table",
]

EXPECTATIONS_DIR = Path(__file__).resolve().parents[2] / "expectations"
SUITE_NAMES = ("images", "quarantine", "hps_scores", "model_scores", "judge_calls", "verdicts", "eps_reference", "runs",
               "study_answers", "study_rates", "study_index", "study_hypotheses", "study_pixel_metrics",  # docs/BEAUTY.md
               "vab_tasks", "vab_trials")  # docs/VAB.md
SAMPLE = 5  # unexpected values shown per failed expectation

# Quiet GX before it is imported: no usage analytics, no network.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")


@dataclass(frozen=True)
class FailedExpectation:
    expectation: str  # e.g. "expect_column_values_to_be_in_set"
    column: str | None  # column / column list the expectation looks at, when it has one
    kwargs: dict[str, Any]
    unexpected_count: int | None = None
    unexpected_sample: tuple[Any, ...] = ()
    observed: Any = None
    exception: str | None = None  # GX raised while evaluating (e.g. the column does not exist)

    def describe(self) -> str:
        skip = ("batch_id", "column", "column_list", "row_condition", "condition_parser", "column_set")
        args = {k: v for k, v in self.kwargs.items() if k not in skip}
        what = f"{self.expectation}({self.column or ''}"
        if args:
            what += (", " if self.column else "") + ", ".join(f"{k}={_short(v)}" for k, v in args.items())
        what += ")"
        cond = _condition_text(self.kwargs.get("row_condition"))
        if cond:
            what += f" where {cond}"
        if self.exception:
            return f"{what}: error: {self.exception}"
        parts = []
        if self.unexpected_count is not None:
            parts.append(f"{self.unexpected_count} unexpected")
        if self.unexpected_sample:
            parts.append(f"e.g. {_short(list(self.unexpected_sample), 200)}")
        if self.observed is not None and not self.unexpected_sample:
            parts.append(f"observed {_short(self.observed, 200)}")
        return f"{what}: " + (", ".join(parts) if parts else "failed")


def _condition_text(cond: Any) -> str | None:
    if not cond:
        return None
    if isinstance(cond, dict) and cond.get("type") == "comparison":
        col = (cond.get("column") or {}).get("name")
        return f"{col} {cond.get('operator')} {cond.get('parameter')!r}"
    return str(cond)


@dataclass(frozen=True)
class ValidationReport:
    suite: str
    success: bool
    rows: int
    evaluated: int  # expectations run
    failures: tuple[FailedExpectation, ...] = field(default=())

    def summary(self) -> str:
        if self.success:
            return f"suite {self.suite!r}: {self.evaluated} expectations passed on {self.rows} rows"
        lines = [f"suite {self.suite!r}: {len(self.failures)} of {self.evaluated} expectations failed on {self.rows} rows:"]
        lines += [f"  - {f.describe()}" for f in self.failures]
        return "\n".join(lines)


class ValidationFailed(ValueError):
    """A table failed its expectation suite; ``.report`` holds the details."""

    def __init__(self, report: ValidationReport) -> None:
        super().__init__(report.summary())
        self.report = report


def _short(v: Any, limit: int = 80) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def load_suite_config(name: str) -> dict[str, Any]:
    """The JSON of ``expectations/<name>.json``."""
    if name not in SUITE_NAMES:
        raise ValueError(f"unknown expectation suite {name!r}; suites: {list(SUITE_NAMES)}")
    path = EXPECTATIONS_DIR / f"{name}.json"
    data = json.loads(path.read_text())
    if data.get("name") != name:
        raise ValueError(f"{path}: suite name {data.get('name')!r} does not match the file name")
    return data


_lock = threading.RLock()


@lru_cache(maxsize=1)
def _context() -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    # GE logs an INFO line per ephemeral docs site; keep run output to what the user asked for.
    for name in ["great_expectations", *logging.root.manager.loggerDict]:
        if name.startswith("great_expectations"):
            logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.WARNING)
    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    ctx.data_sources.add_pandas("imagebench")
    return ctx


@lru_cache(maxsize=None)
def _validation_definition(name: str) -> Any:
    import great_expectations as gx
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    config = load_suite_config(name)
    expectations = []
    for i, exp in enumerate(config.get("expectations", [])):
        # Build each expectation ourselves: ExpectationSuite(...) logs and *drops* invalid ones.
        try:
            expectations.append(ExpectationConfiguration(**exp).to_domain_obj())
        except Exception as exc:
            raise ValueError(f"expectations/{name}.json: expectation #{i} ({exp.get('type')}) is invalid: {exc}") from exc
    ctx = _context()
    suite = ctx.suites.add(gx.ExpectationSuite(name=name, expectations=expectations, meta=config.get("meta")))
    asset = ctx.data_sources.get("imagebench").add_dataframe_asset(name)
    batch = asset.add_batch_definition_whole_dataframe(f"{name}-whole")
    return ctx.validation_definitions.add(gx.ValidationDefinition(name=f"{name}-validation", data=batch, suite=suite))


def _to_pandas(df: Any) -> Any:
    import pandas as pd

    if isinstance(df, pd.DataFrame):
        return df
    import pyarrow as pa

    if isinstance(df, pa.Table):
        # Same values, one chunk per column: a table put together from 1,000 partitions would
        # otherwise make every GE row filter a take over 1,000 chunks (2.5x slower in all).
        return df.combine_chunks().to_pandas()
    if hasattr(df, "to_pandas"):  # polars.DataFrame
        return df.to_pandas()
    raise TypeError(f"cannot validate a {type(df).__name__}: give a pandas/polars DataFrame or a pyarrow Table")


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _failure(result: Any) -> FailedExpectation:
    cfg = result.expectation_config
    kwargs = dict(cfg.kwargs)
    column = kwargs.get("column") or kwargs.get("column_list")
    if column is None and "column_A" in kwargs:
        column = f"{kwargs['column_A']}, {kwargs['column_B']}"
    res = result.result or {}
    exc_msg = None
    info = result.exception_info or {}
    infos = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    for item in infos:
        if item.get("raised_exception"):
            exc_msg = str(item.get("exception_message") or "").strip().splitlines()[0][:300] if item.get("exception_message") else "raised"
            break
    sample = res.get("partial_unexpected_list") or []
    observed = res.get("observed_value")
    details = res.get("details")
    if isinstance(details, dict) and details.get("mismatched"):
        observed = details["mismatched"]  # e.g. {"unexpected": [...], "missing": [...]} for column sets
    return FailedExpectation(
        expectation=cfg.type,
        column=str(column) if column is not None else None,
        kwargs={k: v for k, v in kwargs.items() if k != "batch_id"},
        unexpected_count=res.get("unexpected_count"),
        unexpected_sample=tuple(_jsonable(v) for v in sample[:SAMPLE]),
        observed=observed,
        exception=exc_msg,
    )


def validate_table(suite_name: str, df: Any) -> ValidationReport:
    """Run suite ``suite_name`` on ``df`` (pandas or polars DataFrame, or pyarrow Table)."""
    frame = _to_pandas(df)
    with _lock:
        vd = _validation_definition(suite_name)
        result = vd.run(
            batch_parameters={"dataframe": frame},
            result_format={"result_format": "SUMMARY", "partial_unexpected_count": SAMPLE},
        )
    failures = tuple(_failure(r) for r in result.results if not r.success)
    return ValidationReport(
        suite=suite_name,
        success=bool(result.success) and not failures,
        rows=len(frame),
        evaluated=len(result.results),
        failures=failures,
    )


def require_valid(suite_name: str, df: Any) -> ValidationReport:
    """:func:`validate_table`, raising :class:`ValidationFailed` (message: the suite and each failed
    expectation with a few unexpected values) unless every expectation passed."""
    report = validate_table(suite_name, df)
    if not report.success:
        raise ValidationFailed(report)
    return report
