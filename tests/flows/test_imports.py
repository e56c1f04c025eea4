"""import-scores / import-verdicts of many models in one file (tasks/lake/imports.py, units_aggregate.aggregate_models):
one Great Expectations check per table instead of one per model, the same lake rows as the
per-model path, and nothing written when any row anywhere is bad."""

from __future__ import annotations

import csv
import functools
import random
from pathlib import Path

import pytest

from tests.flows.conftest import PROMPT_IDS, SUITE_FILE, eligible_ids

SCORER = "lab-x"
SKIP = {"scored_at", "decided_at", "run_id"}  # when a row was written, not what it says


def _csv(path: Path, columns: tuple[str, ...], rows: list[tuple]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(columns)
        w.writerows(rows)
    return path


def _lab_files(folder: Path, models: list[str], seed: int = 7) -> tuple[Path, Path]:
    """Scores and verdicts of ``models``: each a random subset of the prompts (lost and missing
    images), verdicts PASS / FAIL / ERROR, some prompts judged but not scored."""
    scores, verdicts = [], []
    for m in models:
        rng = random.Random(f"{seed}:{m}")
        for p in PROMPT_IDS:
            if rng.random() < 0.85:
                scores.append((m, p, f"{rng.gauss(0.2, 1.0):.6f}"))
            if rng.random() < 0.7:
                verdicts.append((m, p, rng.choice(["PASS", "PASS", "FAIL", "ERROR"]), "lab-judge"))
    folder.mkdir(parents=True, exist_ok=True)
    return (_csv(folder / "scores.csv", ("model_id", "prompt_id", "mu"), scores),
            _csv(folder / "verdicts.csv", ("model_id", "prompt_id", "verdict", "judge"), verdicts))


@pytest.fixture()
def lab(workspace, tmp_path):
    """A workspace whose reference "t1" was built from scores imported under ``lab-x`` (the
    reference file written directly: no Prefect flow needed). Returns (settings, suite)."""
    from schemas.settings import load_settings
    from tasks.lake.imports import import_scores_file
    from tasks.runs import pinned, run_ids, units_aggregate
    from tasks.scores.reference import build_reference

    settings = load_settings()
    suite = pinned.load_pinned_suite(settings)
    base = ["base-1", "base-2"]
    rows = [(m, p, f"{0.5 * i:.1f}") for i, m in enumerate(base) for p in eligible_ids()]
    import_scores_file(settings, suite, _csv(tmp_path / "base.csv", ("model_id", "prompt_id", "mu"), rows), SCORER)
    identity = pinned.imported_identity(SCORER)
    build_reference(
        version=settings.reference_version, baseline_models=base, scores=units_aggregate.current_scores(settings, base, identity),
        suite=suite, scorer=identity, reference_dir=settings.reference_dir, created_at=run_ids.utcnow().isoformat(),
    )
    return settings, suite


def _rows(settings, table: str, models: list[str]) -> dict[str, list[dict]]:
    from tasks.lake.tables import Lake

    out: dict[str, list[dict]] = {}
    for r in Lake(settings.lake_dir).read(table, models).to_pylist():
        out.setdefault(r["model_id"], []).append({k: v for k, v in r.items() if k not in SKIP})
    return {m: sorted(v, key=repr) for m, v in out.items()}


def _count_ge_calls(monkeypatch) -> list[tuple[str, int]]:
    """Spy on Great Expectations runs (the real check still runs): (suite, rows) per call."""
    import tasks.lake.validation as validation

    calls: list[tuple[str, int]] = []
    real = validation.validate_table

    def spy(suite_name, df):
        report = real(suite_name, df)
        calls.append((suite_name, report.rows))
        return report

    monkeypatch.setattr(validation, "validate_table", spy)
    return calls


def test_many_models_one_file_same_rows_as_one_model_at_a_time(lab, tmp_path, monkeypatch, tiny_model):
    from schemas.settings import load_settings
    from tasks.lake.imports import import_scores_file, import_verdicts_file
    from tasks.runs import pinned, units_aggregate
    from tests.flows.conftest import use_workspace

    settings, suite = lab
    models = [f"lab-{i:02d}" for i in range(30)]
    scores, verdicts = _lab_files(tmp_path / "all", models)
    monkeypatch.setattr(units_aggregate, "_BOOTSTRAP_CHUNK", 7)  # several bootstrap chunks, the last one short
    calls = _count_ge_calls(monkeypatch)
    s = import_scores_file(settings, suite, scores, SCORER)
    v = import_verdicts_file(settings, suite, verdicts)
    # One check per table written, whatever the number of models (was one per model and table);
    # eps_reference is the check of the reference file each command loads.
    assert [name for name, _ in calls if name != "eps_reference"] == ["hps_scores", "model_scores", "verdicts", "model_scores"]
    assert [r["model_id"] for r in s.aggregated] == models == [r["model_id"] for r in v.aggregated]
    batch = {t: _rows(settings, t, models) for t in ("hps_scores", "verdicts", "model_scores")}
    assert len(batch["model_scores"]) == 30 and all(len(r) == 1 for r in batch["model_scores"].values())

    # The per-model path on the same lake: a model aggregated alone gives the same row (models
    # at the bootstrap chunks' edges and in the short last chunk; 0-2 are checked below).
    reference = pinned.load_verified_reference(settings, suite, None)
    for m in (models[6], models[7], models[29]):
        alone = units_aggregate.aggregate_model(settings, suite, reference, m, "alone", None)
        assert {k: x for k, x in alone.items() if k not in SKIP} == batch["model_scores"][m][0]

    # One file per model (3 of them, in a second workspace with the same reference): same rows.
    use_workspace(tmp_path / "second", monkeypatch, tiny_model, reference_from=settings.reference_dir)
    second = load_settings()
    for m in models[:3]:
        s1, v1 = _lab_files(tmp_path / "one" / m, [m])
        import_scores_file(second, suite, s1, SCORER)
        import_verdicts_file(second, suite, v1)
    for t in ("hps_scores", "verdicts", "model_scores"):
        assert _rows(second, t, models[:3]) == {m: batch[t][m] for m in models[:3]}, t


@pytest.mark.parametrize("kind", ["scores", "verdicts"])
def test_one_bad_row_anywhere_writes_nothing(lab, tmp_path, kind):
    """A row that parses but fails the table's Great Expectations suite (mu out of range, an
    upper-case judge name) in the last of 30 models: nothing written, the file named."""
    from tasks.lake.imports import (
        ScoresFileError,
        import_scores_file,
        import_verdicts_file,
    )

    settings, suite = lab
    models = [f"lab-{i:02d}" for i in range(30)]
    scores, verdicts = _lab_files(tmp_path / "all", models)
    if kind == "verdicts":
        import_scores_file(settings, suite, scores, SCORER)
    path = scores if kind == "scores" else verdicts
    lines = path.read_text().splitlines()
    last = lines[-1].split(",")
    if kind == "scores":
        last[2] = "5000"
    else:
        last[3] = "Lab-Judge"
    path.write_text("\n".join(lines[:-1] + [",".join(last)]) + "\n")
    lake = settings.lake_dir
    before = {p: p.read_bytes() for p in sorted(lake.rglob("*.parquet"))}
    with pytest.raises(ScoresFileError) as err:
        if kind == "scores":
            import_scores_file(settings, suite, path, SCORER)
        else:
            import_verdicts_file(settings, suite, path)
    assert str(path) in str(err.value) and "nothing imported" in str(err.value)
    assert ("5000" if kind == "scores" else "Lab-Judge") in str(err.value)
    assert {p: p.read_bytes() for p in sorted(lake.rglob("*.parquet"))} == before


def test_split_by_model_keeps_each_models_rows_in_order():
    """Contiguous rows (as Lake.read gives them) are sliced; interleaved ones are still split
    right, in their original order; a model without rows gets an empty table."""
    import pyarrow as pa

    from tasks.runs.units_aggregate import split_by_model

    chunks = [pa.table({"model_id": ["a", "a"], "x": [1, 2]}), pa.table({"model_id": ["b"], "x": [3]})]
    together = pa.concat_tables(chunks)
    got = split_by_model(together, ["a", "b", "c"])
    assert {m: t["x"].to_pylist() for m, t in got.items()} == {"a": [1, 2], "b": [3], "c": []}
    interleaved = pa.table({"model_id": ["a", "b", "a", "c", "b"], "x": [1, 2, 3, 4, 5]})
    got = split_by_model(interleaved, ["b", "a"])
    assert {m: t["x"].to_pylist() for m, t in got.items()} == {"b": [2, 5], "a": [1, 3]}
    assert split_by_model(interleaved.slice(0, 0), ["a"])["a"].num_rows == 0


def test_cli_import_of_many_models_prints_one_line_not_a_table(workspace, tmp_path):
    """Up to IMPORT_TABLE_MAX models: one table row each; more: one summary line."""
    from flows.cli.imports import IMPORT_TABLE_MAX
    from tests.flows.test_cli import invoke

    models = [f"m{i:03d}" for i in range(IMPORT_TABLE_MAX + 1)]
    path = _csv(tmp_path / "s.csv", ("model_id", "prompt_id", "mu"), [(m, p, "0.5") for m in models for p in PROMPT_IDS[:2]])
    r = invoke("import-scores", str(path), "--scorer", SCORER)
    assert r.exit_code == 0, r.output
    assert f"{len(models)} models, {2 * len(models)} rows imported" in r.output
    assert "m050" not in r.output
    r = invoke("import-scores", str(_csv(tmp_path / "one.csv", ("model_id", "prompt_id", "mu"), [("solo", PROMPT_IDS[0], "1")])),
               "--scorer", SCORER)
    assert r.exit_code == 0 and "solo" in r.output


# --- the rows of one file, parsed alone: every bad row named by file and line, all in one error,
# nothing returned; good rows by model, in order.

SHA = "ab" * 32
P0, P1, P2 = PROMPT_IDS[:3]


@functools.cache
def _suite():
    from tasks.scores.suite import load_suite

    return load_suite(SUITE_FILE)


def _problems(parse, path: Path) -> list[str]:
    from tasks.lake.imports import ScoresFileError

    with pytest.raises(ScoresFileError) as err:
        parse(path, _suite())
    head, *lines = str(err.value).splitlines()
    assert head == f"{path}: {len(lines)} invalid row(s), nothing imported:"
    return [line.strip().removeprefix(f"{path}: ") for line in lines]


def test_scores_rows_by_model_and_every_bad_row_named(tmp_path):
    from tasks.lake.imports import parse_scores

    cols = ("model_id", "prompt_id", "mu", "sigma", "image_sha256")
    good = _csv(tmp_path / "good.csv", cols, [("m1", P0, "0.5", "", SHA.upper()), ("m2", P0, "-1", "0.1", ""),
                                              ("m1", P1, "2", "", "")])
    assert parse_scores(good, _suite()) == {
        "m1": [{"prompt_id": P0, "mu": 0.5, "sigma": None, "image_sha256": SHA},
               {"prompt_id": P1, "mu": 2.0, "sigma": None, "image_sha256": None}],
        "m2": [{"prompt_id": P0, "mu": -1.0, "sigma": 0.1, "image_sha256": None}],
    }
    bad = _csv(tmp_path / "bad.csv", cols, [
        ("m1", P0, "1", "", ""),        # row 2: fine
        ("../x", P0, "1", "", ""),      # row 3
        ("m1", "nope-01", "1", "", ""),  # row 4
        ("m1", P1, "", "", ""),         # row 5
        ("m1", P1, "abc", "", ""),      # row 6
        ("m1", P1, "inf", "", ""),      # row 7
        ("m1", P1, "1", "", "xyz"),     # row 8
        ("m1", P0, "2", "", ""),        # row 9: a second row for (m1, P0)
        ("m1", P2, "1", "nan", ""),     # row 10
    ])
    problems = _problems(parse_scores, bad)
    assert [p.split(":")[0] for p in problems] == [f"row {r}" for r in (3, 4, 5, 6, 7, 8, 9, 10)]
    assert "../x" in problems[0]
    assert problems[1:] == [
        f"row 4: prompt_id 'nope-01' is not in suite {_suite().version}",
        "row 5: mu is empty",
        "row 6: mu='abc' is not a number",
        "row 7: mu='inf' is not finite",
        "row 8: image_sha256 'xyz' is not a sha256 hex digest",
        f"row 9: duplicate of row 2 (m1, {P0})",
        "row 10: sigma='nan' is not finite",
    ]


def test_verdict_rows_by_model_and_every_bad_row_named(tmp_path):
    from tasks.lake.imports import parse_verdicts

    cols = ("model_id", "prompt_id", "verdict", "judge", "rationale")
    good = _csv(tmp_path / "good.csv", cols, [("m1", P0, "pass", "qwen-vl", "fine"), ("m1", P1, "FAIL", "lab.j-2", "")])
    assert parse_verdicts(good, _suite()) == {"m1": [
        {"prompt_id": P0, "verdict": "PASS", "judge": "qwen-vl", "rationale": "fine"},
        {"prompt_id": P1, "verdict": "FAIL", "judge": "lab.j-2", "rationale": None},
    ]}
    bad = _csv(tmp_path / "bad.csv", cols, [
        ("m1", P0, "PASS", "j", ""),     # row 2: fine
        ("", P0, "PASS", "j", ""),       # row 3
        ("m1", "nope-01", "PASS", "j", ""),  # row 4
        ("m1", P1, "MAYBE", "j", ""),    # row 5
        ("m1", P1, "PASS", "bad judge", ""),  # row 6
        ("m1", P0, "FAIL", "j", ""),     # row 7: a second row for (m1, P0)
    ])
    problems = _problems(parse_verdicts, bad)
    assert [p.split(":")[0] for p in problems] == [f"row {r}" for r in (3, 4, 5, 6, 7)]
    assert problems[1:] == [
        f"row 4: prompt_id 'nope-01' is not in suite {_suite().version}",
        "row 5: verdict 'MAYBE' is not one of ['PASS', 'FAIL', 'ERROR', 'UNPARSABLE']",
        "row 6: judge 'bad judge' is not a valid judge name",
        f"row 7: duplicate of row 2 (m1, {P0})",
    ]
