"""A lab's import at scale: `imagebench import-scores` + `imagebench import-verdicts` of N models
(192 scores and 192 verdicts each, one file per command holding all models), the real commands
in subprocesses, against a frozen reference built from imported scores as a lab would build it.

    .venv/bin/python bench/bench_import.py                       # new code, 1,000 models
    .venv/bin/python bench/bench_import.py --src /tmp/old        # + the old code at --old-models (100)
    git -C /work/main archive 48e4bca | tar -x -C /tmp/old       # (how the old tree is made)

Per workspace (fresh, as bench/common.py makes them: suite pinned, tiny-model settings), not
timed: `import-scores` of a baseline field of 3 models under scorer `lab-bench`, then
`imagebench reference build --version bench --baseline FILE --scorer lab-bench`, so the import
computes EPS and Capability exactly as a lab sees them. Timed: the two import commands, whole
(Python start-up, validation, Parquet writes, aggregation, catalog refresh; cold: no warm server).
Reported: seconds, ms per imported row (scores + verdicts rows), and the ratio old/new per row
at the same N.

Same N, old and new: the lakes they leave are compared row for row (hps_scores, verdicts,
model_scores; timestamps and run ids aside), so the speed-up is not bought with other results.

One command per model: after the big import, ``--per-model`` single-model imports (scores +
verdicts of one new model) run on the full lake, and the same on a lake holding only the
baseline field: the ratio says whether one command's cost grows with the lake's size.

Nothing here asserts on time; every ratio is measured in one run (see bench/README.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    PY,
    SRC,
    SUITE_FILE,
    CpuMeter,
    RunResult,
    TinyModel,
    Workspace,
    machine_info,
    run_imagebench,
    run_measured,
    source_info,
)
from harness import Context, Report, summary_row  # noqa: E402

SCORER = "lab-bench"
BASELINE = ("base-0", "base-1", "base-2")
SEED = 20261126


def suite_prompts() -> tuple[list[str], list[str]]:
    """(all prompt ids, EPS-eligible ids) of the pinned suite, in suite order."""
    rows = [json.loads(line) for line in SUITE_FILE.read_text().splitlines() if line.strip()]
    return [r["prompt_id"] for r in rows], [r["prompt_id"] for r in rows if r.get("eps_eligible", True)]


def _write_csv(path: Path, header: list[str], rows) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def make_files(folder: Path, models: list[str], prompts: list[str], seed: int) -> tuple[Path, Path, int]:
    """scores.csv + verdicts.csv for ``models`` (every prompt each; fixed seed per model, so a
    model's rows are the same whatever N). Returns the paths and the row count of each."""
    scores, verdicts = [], []
    for m in models:
        rng = random.Random(f"{seed}:{m}")
        skill = rng.gauss(0.0, 0.5)
        for p in prompts:
            scores.append((m, p, f"{rng.gauss(skill, 1.0):.5f}", f"{abs(rng.gauss(0.5, 0.1)):.5f}"))
            u = rng.random()
            verdict = "ERROR" if u < 0.01 else ("PASS" if u < 0.5 + skill / 4 else "FAIL")
            verdicts.append((m, p, verdict, "lab-judge"))
    s = _write_csv(folder / "scores.csv", ["model_id", "prompt_id", "mu", "sigma"], scores)
    v = _write_csv(folder / "verdicts.csv", ["model_id", "prompt_id", "verdict", "judge"], verdicts)
    return s, v, len(scores)


def _env(ws: Workspace, src: Path) -> dict[str, str]:
    env = ws.env()
    env["PYTHONPATH"] = str(src)  # the tree under test, ahead of the editable install
    env["BENCH_SRC"] = str(src)
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "600"  # a shared, loaded machine: slow, not broken
    return env  # IMAGEBENCH_WARM=off (Workspace.env): every command cold, start-up included


def _run(args: list[str], env: dict[str, str]) -> RunResult:
    return run_imagebench(args, env, timeout=3600).check()


def prepare(root: Path, tiny: TinyModel, src: Path, prompts: list[str], eligible: list[str]) -> tuple[Workspace, dict]:
    """A workspace with a frozen reference `bench` built from imported baseline scores."""
    ws = Workspace.create(root, tiny)
    env = _env(ws, src)
    base = root / "baseline.csv"
    rows = []
    for i, m in enumerate(BASELINE):
        rng = random.Random(f"{SEED}:{m}")
        rows += [(m, p, f"{rng.gauss(0.1 * i, 1.0):.5f}") for p in eligible]
    _write_csv(base, ["model_id", "prompt_id", "mu"], rows)
    (root / "baseline.txt").write_text("\n".join(BASELINE) + "\n")
    _run(["import-scores", str(base), "--scorer", SCORER], env)
    _run(["reference", "build", "--version", "bench", "--baseline", str(root / "baseline.txt"), "--scorer", SCORER], env)
    return ws, env


def _run_phased(args: list[str], env: dict[str, str], out: Path) -> tuple[RunResult, dict]:
    """The command in a process of its own through bench/import_phases.py: its wall time, and
    where the time went inside it (the wrapper costs a few perf_counter calls)."""
    res = run_measured([PY, str(Path(__file__).resolve().parent / "import_phases.py"), str(out), *args], env,
                       cwd=Path(env["BENCH_SRC"]), timeout=3600).check()
    return res, json.loads(out.read_text())


def timed_import(env: dict[str, str], scores: Path, verdicts: Path, rows: int) -> dict:
    s, s_phases = _run_phased(["import-scores", str(scores), "--scorer", SCORER], env, scores.parent / "phases-s.json")
    v, v_phases = _run_phased(["import-verdicts", str(verdicts)], env, verdicts.parent / "phases-v.json")
    total = s.wall_s + v.wall_s
    return {
        "scores_s": s.wall_s,
        "verdicts_s": v.wall_s,
        "total_s": total,
        "cpu_s": s.cpu_s + v.cpu_s,  # user + sys of both commands: what a load on the machine does not inflate
        "rows": 2 * rows,
        "ms_per_row": 1000 * total / (2 * rows),
        "peak_rss_mib": max(s.main_hwm_kib(), v.main_hwm_kib()) / 1024,
        "others_cpu": max(s.others, v.others),
        "phases": {"import-scores": s_phases, "import-verdicts": v_phases},
    }


def parquet_floor(scores: Path, verdicts: Path, folder: Path) -> dict:
    """The floor: the same rows (the lake's columns, types and zstd) written to Parquet ONCE with
    pyarrow, one file per table, from the same CSV files: read, build the tables, write, fsync.
    No validation, no per-model files, no aggregation, no catalog: what no import can beat."""
    import hashlib
    import time

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    from schemas.lake import HPS_SCORES, VERDICTS

    t0, c0 = time.perf_counter(), time.process_time()
    sc = pcsv.read_csv(scores)
    n = sc.num_rows
    now = pa.scalar(__import__("datetime").datetime.now(__import__("datetime").timezone.utc), HPS_SCORES.field("scored_at").type)
    hps = pa.table({
        "model_id": sc["model_id"], "prompt_id": sc["prompt_id"], "suite_version": pa.array(["v"] * n),
        "image_sha256": pa.nulls(n, pa.string()), "scorer_name": pa.array([SCORER] * n),
        "scorer_id": pa.array(["0" * 16] * n), "checkpoint_sha256": pa.nulls(n, pa.string()),
        "mu": sc["mu"], "sigma": sc["sigma"], "source": pa.array(["import"] * n), "uncalibrated": pa.array([False] * n),
        "scored_at": pa.array([now.as_py()] * n, HPS_SCORES.field("scored_at").type), "runtime": pa.nulls(n, pa.string()),
    }).cast(HPS_SCORES)
    vc = pcsv.read_csv(verdicts)
    m = vc.num_rows
    ident = [hashlib.sha256(f"{a}{b}{c}".encode()).hexdigest() for a, b, c in zip(
        vc["model_id"].to_pylist(), vc["prompt_id"].to_pylist(), vc["judge"].to_pylist())]
    ver = pa.table({
        "model_id": vc["model_id"], "prompt_id": vc["prompt_id"], "suite_version": pa.array(["v"] * m),
        "image_sha256": pa.nulls(m, pa.string()), "question_sha256": pa.array(["0" * 64] * m), "verdict": vc["verdict"],
        "reason": pc.if_else(pc.equal(vc["verdict"], "ERROR"), "imported", pa.scalar(None, pa.string())),
        "judge": vc["judge"], "judge_model": vc["judge"], "template_sha256": pa.array(["import"] * m),
        "sampling": pa.array(["{}"] * m), "identity": pa.array(ident), "rationale": pa.nulls(m, pa.string()),
        "source": pa.array(["import"] * m), "decided_at": pa.array([now.as_py()] * m, VERDICTS.field("decided_at").type),
    }).cast(VERDICTS)
    for name, table in (("hps_scores", hps), ("verdicts", ver)):
        path = folder / f"floor-{name}.parquet"
        pq.write_table(table, path, compression="zstd")
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return {"s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "rows": n + m}


def refresh_seconds(env: dict[str, str]) -> float:
    """One catalog refresh of the lake as it is (what each import command ends with)."""
    code = (
        "import time; from schemas.settings import load_settings; from tasks.runs import pinned, units_aggregate; "
        "s = load_settings(); suite = pinned.load_pinned_suite(s); t = time.perf_counter(); "
        "units_aggregate.refresh(s, suite); print(time.perf_counter() - t)"
    )
    r = run_measured([PY, "-c", code], env).check()
    return float(r.stdout.strip().splitlines()[-1])


def per_model_commands(ws: Workspace, env: dict[str, str], folder: Path, prompts: list[str], k: int, tag: str) -> dict:
    """``k`` single-model imports (scores, then verdicts) of new models: median seconds each."""
    s_times, v_times = [], []
    for i in range(k):
        m = f"single-{tag}-{i}"
        sub = folder / m
        sub.mkdir(parents=True, exist_ok=True)
        s, v, _ = make_files(sub, [m], prompts, SEED)
        s_times.append(_run(["import-scores", str(s), "--scorer", SCORER], env).wall_s)
        v_times.append(_run(["import-verdicts", str(v)], env).wall_s)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"scores_s": med(s_times), "verdicts_s": med(v_times), "runs": k}


def lake_rows(home: Path) -> dict[str, list[tuple]]:
    """The lake's rows of the three tables an import writes, without timestamps, run ids and the
    reference file's sha256 (each workspace builds its own reference: same mu, its own build time)."""
    from tasks.lake.tables import Lake

    lake = Lake(home / "lake")
    skip = {"scored_at", "decided_at", "run_id", "reference_sha256"}
    out = {}
    for table in ("hps_scores", "verdicts", "model_scores"):
        t = lake.read(table)
        cols = [c for c in t.column_names if c not in skip]
        out[table] = sorted(zip(*(t[c].to_pylist() for c in cols)), key=repr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=1000, help="models in the big import (new code)")
    ap.add_argument("--old-models", type=int, default=100, help="models for the old-vs-new comparison")
    ap.add_argument("--src", type=Path, help="source tree of the old code (git archive of the baseline commit)")
    ap.add_argument("--per-model", type=int, default=3, help="single-model commands on the full and the small lake")
    ap.add_argument("--workdir", type=Path, help="keep workspaces here (default: a temporary directory)")
    ap.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = ap.parse_args()
    results = run(args)
    if args.json:
        print(json.dumps(results, indent=1, default=str))
    else:
        big = results["new"]
        print(f"{args.models} models: {big['total_s']:.1f} s ({big['ms_per_row']:.3f} ms/row); "
              f"other processes used {100 * results['others_cpu_whole_run']:.0f}% of the CPU over the run")
    return 0


def run(args) -> dict:
    """Everything main() measures; ``args`` has models, old_models, src, per_model, workdir."""
    prompts, eligible = suite_prompts()
    results: dict = {"machine": machine_info(), "source": source_info(), "seed": SEED, "prompts": len(prompts),
                     "old_models_n": args.old_models}
    meter = CpuMeter()
    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        root = args.workdir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        tiny = TinyModel.write(root / "tiny")
        new_src = SRC

        def one(src: Path, n: int, tag: str) -> tuple[dict, Workspace, dict]:
            ws, env = prepare(root / tag, tiny, src, prompts, eligible)
            files = root / f"files-{n}"
            files.mkdir(exist_ok=True)
            if not (files / "scores.csv").is_file():
                make_files(files, [f"lab-model-{i:05d}" for i in range(n)], prompts, SEED)
            rows = n * len(prompts)
            res = timed_import(env, files / "scores.csv", files / "verdicts.csv", rows)
            res.update(models=n, src=str(src))
            print(f"[{tag}] {n} models: import-scores {res['scores_s']:.1f} s + import-verdicts "
                  f"{res['verdicts_s']:.1f} s = {res['total_s']:.1f} s, {res['ms_per_row']:.3f} ms/row "
                  f"(other processes {100 * res['others_cpu']:.0f}% CPU)", flush=True)
            return res, ws, env

        same_n = bool(args.src) and args.old_models == args.models
        if args.src:
            old, old_ws, _ = one(args.src.resolve(), args.old_models, "old")
            # At the big run's N, the new code's run right after the old one IS the big run.
            new_small, new_ws, new_env = one(new_src, args.old_models, "new" if same_n else "new-small")
            results["old"] = old
            results["new_same_n"] = new_small
            results["ratio_old_over_new_per_row"] = old["ms_per_row"] / new_small["ms_per_row"]
            results["ratio_new_over_old"] = new_small["total_s"] / old["total_s"]
            a, b = lake_rows(old_ws.home), lake_rows(new_ws.home)
            results["same_rows_as_old"] = {t: a[t] == b[t] for t in a}
            results["rows_compared"] = {t: len(a[t]) for t in a}
            print(f"old/new per row at {args.old_models} models: {results['ratio_old_over_new_per_row']:.1f}x; "
                  f"same lake rows: {results['same_rows_as_old']}", flush=True)
        if same_n:
            big, big_ws, big_env = new_small, new_ws, new_env
        else:
            big, big_ws, big_env = one(new_src, args.models, "new")
        results["new"] = big
        results["under_60s"] = big["total_s"] < 60.0
        files = root / f"files-{args.models}"
        results["floor"] = parquet_floor(files / "scores.csv", files / "verdicts.csv", files)
        results["ratio_new_over_floor"] = big["total_s"] / results["floor"]["s"]
        print(f"floor (the same rows to Parquet once with pyarrow): {results['floor']['s']:.1f} s; "
              f"now / floor {results['ratio_new_over_floor']:.1f}x", flush=True)
        results["refresh_s_full_lake"] = refresh_seconds(big_env)
        print(f"catalog refresh on the {args.models}-model lake: {results['refresh_s_full_lake']:.1f} s (each command ends with one)")
        if args.per_model:
            small_ws, small_env = prepare(root / "small", tiny, new_src, prompts, eligible)
            on_full = per_model_commands(big_ws, big_env, root / "single-full", prompts, args.per_model, "full")
            on_small = per_model_commands(small_ws, small_env, root / "single-small", prompts, args.per_model, "small")
            results["one_model_per_command"] = {
                "full_lake": on_full, "small_lake": on_small,
                "growth": (on_full["scores_s"] + on_full["verdicts_s"]) / (on_small["scores_s"] + on_small["verdicts_s"]),
            }
            print(f"one model per command: {on_full['scores_s']:.1f} + {on_full['verdicts_s']:.1f} s on the "
                  f"{args.models}-model lake vs {on_small['scores_s']:.1f} + {on_small['verdicts_s']:.1f} s on a "
                  f"3-model lake ({results['one_model_per_command']['growth']:.2f}x)", flush=True)
    results["others_cpu_whole_run"] = meter.others()
    return results


def markdown(res: dict) -> list[str]:
    new = res["new"]
    lines = [f"Synthetic lab files (fixed seed): {new['models']:,} models x {res['prompts']} prompts, one scores CSV "
             f"and one verdicts CSV, brought in with the real `imagebench import-scores` and `imagebench "
             f"import-verdicts` commands (cold, each in its own process; a frozen reference built from imported "
             f"scores, so EPS and Capability are computed as a lab sees them).", "",
             "| code | models | import-scores s | import-verdicts s | total s | CPU s (user+sys) | ms per row | CPU used by others |",
             "|---|---|---|---|---|---|---|---|"]
    rows = [("before (baseline tree)", res.get("old")), ("now", res.get("new_same_n"))]
    rows += [] if res.get("new_same_n") == new else [("now", new)]
    for name, r in rows:
        if r:
            lines.append(f"| {name} | {r['models']:,} | {r['scores_s']:.1f} | {r['verdicts_s']:.1f} | **{r['total_s']:.1f}** "
                         f"| {r.get('cpu_s', float('nan')):.1f} | {r['ms_per_row']:.3f} | {r['others_cpu']:.0%} |")
    if "ratio_old_over_new_per_row" in res:
        same = all(res["same_rows_as_old"].values())
        lines += ["", f"Per row, before / now at {res['old_models_n']} models: **{res['ratio_old_over_new_per_row']:.1f}x**; "
                  f"the two lakes hold {'the same' if same else '**different**'} rows "
                  f"({', '.join(f'{t} {n:,}' for t, n in res['rows_compared'].items())}; timestamps, run ids and the "
                  "reference file's own hash aside)."]
    floor = res.get("floor")
    if floor:
        vs_old = (f"now / before **{res['ratio_new_over_old']:.2f}x** wall, "
                  f"{res['new_same_n']['cpu_s'] / res['old']['cpu_s']:.2f}x CPU at {res['old_models_n']:,} models (same run); "
                  if "ratio_new_over_old" in res else "")
        lines += ["", f"Ratios: {vs_old}now / floor **{res['ratio_new_over_floor']:.1f}x** wall "
                  f"({new['cpu_s'] / floor['cpu_s']:.1f}x CPU), the floor being the same "
                  f"{floor['rows']:,} rows read from the same CSVs and written to Parquet once with pyarrow (one zstd file "
                  f"per table, fsynced; no validation, per-model files, aggregation or catalog): {floor['s']:.1f} s, "
                  f"{floor['cpu_s']:.1f} CPU s."]
    lines += _phase_lines(res)
    lines += ["", f"Catalog refresh on the {new['models']:,}-model lake (every command ends with one): "
              f"{res['refresh_s_full_lake']:.1f} s."]
    one = res.get("one_model_per_command")
    if one:
        lines.append(f"One model per command (a lab importing as results arrive): {one['full_lake']['scores_s']:.1f} + "
                     f"{one['full_lake']['verdicts_s']:.1f} s on the {new['models']:,}-model lake vs "
                     f"{one['small_lake']['scores_s']:.1f} + {one['small_lake']['verdicts_s']:.1f} s on a 3-model lake "
                     f"(**{one['growth']:.2f}x**: nothing grows with the lake; the time is the command's start-up).")
    return lines


def _phase_lines(res: dict) -> list[str]:
    """Where the time went, per command: wall seconds inside each part (bench/import_phases.py)."""
    runs = [(name, r) for name, r in (("before", res.get("old")), ("now", res["new"])) if r and r.get("phases")]
    if not runs:
        return []
    labels = ["read the file", "parse + check rows", "validation (all Great Expectations calls)",
              "write partitions (8 threads)", "aggregate (EPS, Capability, intervals)", "read partitions back",
              "bootstrap", "catalog refresh"]
    head = " | ".join(f"{name}: {cmd}" for name, r in runs for cmd in ("import-scores", "import-verdicts"))
    lines = ["", f"**Where the time goes** (wall seconds inside each part, {runs[-1][1]['models']:,} models; "
             "the parts nest: bootstrap and a read-back are inside aggregate, whose own model_scores write is in the "
             "writes; fsync is thread-seconds on 8 writer threads):", "",
             f"| part | {head} |", "|---|" + "---|" * (2 * len(runs))]
    for label in labels + ["os.fsync (thread-seconds)", "module imports before the command", "whole command"]:
        cells = []
        for _, r in runs:
            for cmd in ("import-scores", "import-verdicts"):
                ph = r["phases"][cmd]
                value = {"os.fsync (thread-seconds)": ph.get("fsync_thread_s"), "module imports before the command": ph.get("start_s"),
                         "whole command": ph.get("total_s")}.get(label, ph["phases"].get(label))
                cells.append("-" if value is None else f"{value:.1f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def report(ctx: Context) -> Report:
    from types import SimpleNamespace

    res = run(SimpleNamespace(models=200 if ctx.quick else 1000, old_models=200 if ctx.quick else 1000, src=ctx.baseline_src,
                              per_model=1 if ctx.quick else 3, workdir=ctx.work / "import"))
    new = res["new"]
    before = f"; now / before **{res['ratio_new_over_old']:.2f}x**" if "ratio_new_over_old" in res else ""
    summary = summary_row(f"(h) import {new['models']:,} models' scores + verdicts (CLI)",
                          f"**{new['total_s']:.0f} s**{before}; now / pyarrow floor {res['ratio_new_over_floor']:.0f}x",
                          "< 60 s (was 1,120 s)", ctx.measured)
    return Report({"h": res}, markdown(res), summary)


if __name__ == "__main__":
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    sys.exit(main())
