"""``imagebench import-scores``: HPSv3 scores a lab computed elsewhere, validated and recorded
in ``hps_scores`` under a scorer name of its own (never mixed with the built-in scorer)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from schemas import lake as lake_schemas
from schemas.settings import Settings
from tasks.scores.suite import Suite

REQUIRED = ("model_id", "prompt_id", "mu")
OPTIONAL = ("sigma", "image_sha256")
SCORER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
RESERVED_SCORERS = ("hpsv3",)


class ImportFileError(ValueError):
    """A scores or verdicts file is unusable; the message names the file, the rows and the problem."""


ScoresFileError = ImportFileError  # its older name (a verdicts file's errors are the same class)


@dataclass
class ImportSummary:
    rows_per_model: dict[str, int]
    aggregated: list[dict] = field(default_factory=list)
    note: str = ""


def _read_any(path: Path, what: str) -> pa.Table:
    """``what``: the kind of file the user gave (scores, verdicts), for the message."""
    import polars as pl

    if not path.is_file():
        raise ScoresFileError(f"{path}: {what} file not found")
    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            df = pl.read_parquet(path)
        elif path.suffix.lower() == ".csv":
            df = pl.read_csv(path, infer_schema_length=0)  # all strings: we parse and report ourselves
        else:
            raise ScoresFileError(f"{path}: unsupported extension {path.suffix!r}; use .csv or .parquet")
    except ScoresFileError:
        raise
    except Exception as exc:
        raise ScoresFileError(f"{path}: cannot read: {exc}") from None
    return df.to_arrow()


def _read_columns(path: Path, required: tuple[str, ...], optional: tuple[str, ...], what: str) -> tuple[int, dict[str, list]]:
    """(row count, column -> values) after checking the header: missing or unknown columns and an
    empty file are errors naming the file."""
    table = _read_any(path, what)
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise ScoresFileError(f"{path}: missing required column(s) {missing}; have {table.column_names}")
    unknown_cols = [c for c in table.column_names if c not in required + optional]
    if unknown_cols:
        raise ScoresFileError(f"{path}: unknown column(s) {unknown_cols}; allowed {list(required + optional)}")
    if table.num_rows == 0:
        raise ScoresFileError(f"{path}: no rows")
    return table.num_rows, {c: table[c].to_pylist() for c in table.column_names}


def _row_number(path: Path, index: int) -> int:
    return index + 2 if path.suffix.lower() == ".csv" else index + 1  # CSV: the header is line 1


def _raise_problems(path: Path, problems: list[str]) -> None:
    if problems:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise ScoresFileError(f"{path}: {len(problems)} invalid row(s), nothing imported:\n  {shown}{more}")


def _float(value: object, path: Path, row: int, column: str, problems: list[str]) -> float | None:
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        problems.append(f"{path}: row {row}: {column}={value!r} is not a number")
        return None
    if not math.isfinite(x):
        problems.append(f"{path}: row {row}: {column}={value!r} is not finite")
        return None
    return x


def _parse_rows(path: Path, suite: Suite, required: tuple[str, ...], optional: tuple[str, ...],
                row_values: Callable[[dict[str, list], int, int, list[str]], dict | None],
                what: str = "scores") -> dict[str, list[dict]]:
    """Every row of an import file, by model: a valid model id, a prompt of the suite, its own
    values (``row_values(cols, index, row, problems)``: a dict, or None once it has added the
    row's problem), and no second row for the same model and prompt. All problems are collected;
    the file then fails once, with the full list."""
    from tasks.store.storage import InvalidModelId, validate_model_id

    n_rows, cols = _read_columns(path, required, optional, what)
    problems: list[str] = []
    seen: dict[tuple[str, str], int] = {}
    by_model: dict[str, list[dict]] = {}
    for i in range(n_rows):
        row = _row_number(path, i)
        model_id = str(cols["model_id"][i] or "").strip()
        prompt_id = str(cols["prompt_id"][i] or "").strip()
        try:
            validate_model_id(model_id)
        except InvalidModelId as exc:
            problems.append(f"{path}: row {row}: {exc}")
            continue
        if prompt_id not in suite.by_id:
            problems.append(f"{path}: row {row}: prompt_id {prompt_id!r} is not in suite {suite.version}")
            continue
        values = row_values(cols, i, row, problems)
        if values is None:
            continue
        key = (model_id, prompt_id)
        if key in seen:
            problems.append(f"{path}: row {row}: duplicate of row {seen[key]} ({model_id}, {prompt_id})")
            continue
        seen[key] = row
        by_model.setdefault(model_id, []).append({"prompt_id": prompt_id, **values})
    _raise_problems(path, problems)
    return by_model


def parse_scores(path: Path, suite: Suite) -> dict[str, list[dict]]:
    """Validate every row of a scores file; collect all problems and fail once with the full list."""

    def values(cols: dict[str, list], i: int, row: int, problems: list[str]) -> dict | None:
        mu = _float(cols["mu"][i], path, row, "mu", problems)
        if mu is None:
            if not any(p.startswith(f"{path}: row {row}: mu") for p in problems):
                problems.append(f"{path}: row {row}: mu is empty")
            return None
        sigma = _float(cols["sigma"][i], path, row, "sigma", problems) if "sigma" in cols else None
        sha = cols["image_sha256"][i] if "image_sha256" in cols else None
        sha = str(sha).strip().lower() if sha not in (None, "") else None
        if sha is not None and not SHA256_RE.fullmatch(sha):
            problems.append(f"{path}: row {row}: image_sha256 {sha!r} is not a sha256 hex digest")
            return None
        return {"mu": mu, "sigma": sigma, "image_sha256": sha}

    return _parse_rows(path, suite, REQUIRED, OPTIONAL, values)


def import_scores_file(settings: Settings, suite: Suite, path: Path, scorer_name: str) -> ImportSummary:
    from tasks.lake.tables import Lake
    from tasks.runs import pinned, run_ids, units_aggregate
    from tasks.scores.reference import ReferenceError as RefError

    # fullmatch: re.match with "$" would accept a trailing newline ("lab-x\n").
    if not isinstance(scorer_name, str) or not SCORER_NAME_RE.fullmatch(scorer_name) or scorer_name in RESERVED_SCORERS:
        raise ScoresFileError(
            f"--scorer {scorer_name!r}: use a name of letters, digits, '.', '_' or '-', other than "
            f"{RESERVED_SCORERS} (reserved for scores computed here)"
        )
    by_model = parse_scores(Path(path), suite)
    identity = pinned.imported_identity(scorer_name)
    now = run_ids.utcnow()
    lake = Lake(settings.lake_dir)
    models = sorted(by_model)
    # One read of the models' partitions and one Great Expectations check of every partition to
    # be written (_check_all), then one atomic write per model.
    existing = units_aggregate.split_by_model(units_aggregate.read_models(lake, "hps_scores", models), models)
    tables: dict[str, pa.Table] = {}
    for model_id in models:
        rows = by_model[model_id]
        n = len(rows)
        new = pa.Table.from_pydict(
            {
                "model_id": [model_id] * n,
                "prompt_id": [r["prompt_id"] for r in rows],
                "suite_version": [suite.version] * n,
                "image_sha256": [r["image_sha256"] for r in rows],
                "scorer_name": [scorer_name] * n,
                "scorer_id": [identity.scorer_id] * n,
                "checkpoint_sha256": [None] * n,
                "mu": [r["mu"] for r in rows],
                "sigma": [r["sigma"] for r in rows],
                "source": ["import"] * n,
                "uncalibrated": [False] * n,
                "scored_at": [now] * n,
                "runtime": [None] * n,  # computed elsewhere: its runtime is not known here
            },
            schema=lake_schemas.HPS_SCORES,
        )
        old = existing[model_id]
        keep = old.filter(pc.fill_null(pc.not_equal(old["scorer_id"], identity.scorer_id), True))
        tables[model_id] = pa.concat_tables([keep, new]).cast(lake_schemas.HPS_SCORES)
    _check_all(Path(path), "hps_scores", tables)  # all validated before any is written
    # An import is the model's full set under this scorer name: replaces earlier imports.
    units_aggregate.for_each_model(lambda m: lake.write_partition("hps_scores", m, tables[m]), models)
    summary = ImportSummary(rows_per_model={m: len(by_model[m]) for m in models})
    try:
        reference = pinned.load_verified_reference(settings, suite, identity.scorer_id)
    except RefError as exc:
        summary.note = (
            f"scores recorded; no EPS yet: {str(exc).rstrip('. ')}. Build a reference from imported scores with "
            f"`imagebench reference build --version V --baseline FILE --scorer {scorer_name}`."
        )
        return summary
    known = {"hps_scores": pa.concat_tables([tables[m] for m in models])}  # what the lake now holds: not read back
    summary.aggregated = units_aggregate.aggregate_models(settings, suite, reference, models, run_ids.new_run_id(), known=known)
    return summary


def _check_all(path: Path, suite_name: str, tables: dict[str, pa.Table]) -> None:
    """Every model's new partition checked by the table's Great Expectations suite, in one call
    (GE costs about half a second per call, whatever the rows); a failure names the file.

    Each expectation of these suites is per row, or a uniqueness whose key includes model_id,
    so the check of the partitions put end to end is the check of each partition."""
    from tasks.lake.validation import ValidationFailed, require_valid

    if not tables:
        return
    try:
        require_valid(suite_name, pa.concat_tables(list(tables.values())))
    except ValidationFailed as exc:
        raise ScoresFileError(f"{path}: nothing imported: the {suite_name} rows to write fail their checks: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# import-verdicts
# ---------------------------------------------------------------------------------------------

VERDICT_REQUIRED = ("model_id", "prompt_id", "verdict", "judge")
VERDICT_OPTIONAL = ("rationale",)
IMPORTABLE_VERDICTS = ("PASS", "FAIL", "ERROR", "UNPARSABLE")


def parse_verdicts(path: Path, suite: Suite) -> dict[str, list[dict]]:
    """Validate every row of a verdicts file; collect all problems and fail once."""

    def values(cols: dict[str, list], i: int, row: int, problems: list[str]) -> dict | None:
        verdict = str(cols["verdict"][i] or "").strip().upper()
        judge = str(cols["judge"][i] or "").strip()
        if verdict not in IMPORTABLE_VERDICTS:
            problems.append(f"{path}: row {row}: verdict {cols['verdict'][i]!r} is not one of {list(IMPORTABLE_VERDICTS)}")
            return None
        if not SCORER_NAME_RE.fullmatch(judge):
            problems.append(f"{path}: row {row}: judge {judge!r} is not a valid judge name")
            return None
        rationale = cols["rationale"][i] if "rationale" in cols else None
        return {"verdict": verdict, "judge": judge, "rationale": rationale or None}

    return _parse_rows(path, suite, VERDICT_REQUIRED, VERDICT_OPTIONAL, values, what="verdicts")


def import_verdicts_file(settings: Settings, suite: Suite, path: Path) -> ImportSummary:
    """Record verdicts produced elsewhere (source "import"); they count for the model's current
    images. Models already scored against the reference in force are re-aggregated."""
    import hashlib
    import json

    from tasks.lake.tables import Lake
    from tasks.runs import pinned, run_ids, units_aggregate
    from tasks.scores.reference import ReferenceError as RefError

    by_model = parse_verdicts(Path(path), suite)
    now = run_ids.utcnow()
    lake = Lake(settings.lake_dir)
    sampling = json.dumps({"source": "import"}, sort_keys=True)
    question_sha = {p.prompt_id: hashlib.sha256(p.question.encode()).hexdigest() for p in suite.prompts}
    models = sorted(by_model)
    existing = units_aggregate.split_by_model(units_aggregate.read_models(lake, "verdicts", models), models)
    tables: dict[str, pa.Table] = {}
    for model_id in models:
        rows = by_model[model_id]
        records = []
        for r in rows:
            q_sha = question_sha[r["prompt_id"]]
            identity = hashlib.sha256(
                json.dumps([model_id, r["prompt_id"], q_sha, r["judge"], "import"]).encode()
            ).hexdigest()
            records.append(
                {
                    "model_id": model_id, "prompt_id": r["prompt_id"], "suite_version": suite.version,
                    "image_sha256": None, "question_sha256": q_sha, "verdict": r["verdict"],
                    "reason": "imported" if r["verdict"] in ("ERROR", "UNPARSABLE") else None,
                    "judge": r["judge"], "judge_model": r["judge"], "template_sha256": "import",
                    "sampling": sampling, "identity": identity, "rationale": r["rationale"],
                    "source": "import", "decided_at": now,
                }
            )
        new = pa.Table.from_pylist(records, schema=lake_schemas.VERDICTS)
        old = existing[model_id]
        replaced = {r["prompt_id"] for r in rows}
        keep = old.filter(pa.array([p not in replaced for p in old["prompt_id"].to_pylist()], pa.bool_()))
        tables[model_id] = pa.concat_tables([keep, new]).cast(lake_schemas.VERDICTS)
    _check_all(Path(path), "verdicts", tables)  # all validated before any is written
    units_aggregate.for_each_model(lambda m: lake.write_partition("verdicts", m, tables[m]), models)
    summary = ImportSummary(rows_per_model={m: len(by_model[m]) for m in models})
    # Only the imported models' results are read: the cost of an import does not grow with the lake.
    results = units_aggregate.read_models(lake, "model_scores", models)
    scored = set(results["model_id"].to_pylist())
    todo = [m for m in models if m in scored]
    if not todo:
        summary.note = "verdicts recorded; Capability follows when the models are scored (`imagebench score`)."
        return summary
    try:
        reference = pinned.load_verified_reference(settings, suite, None)
    except RefError as exc:
        summary.note = f"verdicts recorded; Capability not recomputed: {exc}"
        return summary
    # What the lake now holds, not read back: the verdicts just written, the results just read.
    known = {"verdicts": pa.concat_tables([tables[m] for m in todo]), "model_scores": results}
    summary.aggregated = units_aggregate.aggregate_models(settings, suite, reference, todo, run_ids.new_run_id(), known=known)
    return summary
