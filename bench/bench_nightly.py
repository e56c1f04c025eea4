"""(e) Nightly-flow overhead with many models: per image, the time the run spends outside model
inference (and judging), and how it grows with the number of models; and the Prefect task count
per run, which should follow the number of HPSv3 batches, not the number of images.

For each size N (full: 5, 20, 50 models; ``--quick``: 2, 4), a fresh workspace (the same frozen
reference as (b)/(c), copied) with N models x 192 small PNGs (every suite prompt), then ONE
``imagebench nightly`` in a fresh subprocess, as production runs it: Python imports and the
embedded Prefect API's start-up are paid once per run. One more run at the smallest N with
IMAGEBENCH_TASK_BATCH_SIZE halved shows the task count following the batches.

Judging: no endpoints file (IMAGEBENCH_JUDGES_CONFIG unset), so only the built-in Tesseract OCR
judge could answer, on the 15 Text Rendering prompts of each model. On 2 cores that costs ~10 s of
CPU per model (4 Tesseract readings per image), competing with inference for the same cores, so
the benchmark points IMAGEBENCH_TESSERACT at a path that does not exist: every judge item is
still planned, batched into Prefect judge tasks and recorded (ERROR: "tesseract not found", no
retry), which keeps the judge path's bookkeeping in the measurement at almost no CPU.

Measured per run:
- from the run record the nightly wrote (``Lake(home/"lake").read_runs()``): total_s (flow start
  to record), the stage busy times (ingest_s, hpsv3_s, judge_s, commit_s, catalog_s), prefect_tasks,
  hps_images_scored, judge_items;
- inference seconds measured in the subprocess itself: this file, run as
  ``bench_nightly.py --exec OUT.json imagebench nightly ...``, wraps ``HPSv3Scorer.score`` (through
  an import hook, so nothing is imported earlier than the command would) and writes at exit the
  start/end of every call. ``score`` runs under the per-process GPU semaphore (1 slot), so the
  sum of these calls is the time the device slot was busy. The record's ``hpsv3_s`` is reported
  next to it: it is measured around the whole task body, semaphore wait included;
- the Prefect task runs of the nightly flow run, counted in the workspace's Prefect database
  (``$IMAGEBENCH_HOME/prefect/prefect.db``), by task name.

Overhead = total_s - inference - judge_s, per image (N x 192) and split by when the device slot
was idle: before the first inference call, between calls, after the last one.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # this file also runs as the command's wrapper (--exec), which imports nothing more
    from harness import Context, Report

IMAGE_SIDE = 64  # px, the ingest minimum; HPSv3 resizes everything to ~448x448, so inference work is the same
FULL_SIZES = (5, 20, 50)
QUICK_SIZES = (2, 4)
NO_TESSERACT = "/nonexistent/bench-no-tesseract"  # IMAGEBENCH_TESSERACT: the OCR judge answers ERROR at once
DEFAULT_TASK_BATCH = 64  # IMAGEBENCH_TASK_BATCH_SIZE default (schemas.settings)
DEFAULT_JUDGE_TASK = 64  # IMAGEBENCH_JUDGE_TASK_SIZE default


# --------------------------------------------------------------------------------------------
# The subprocess side: `bench_nightly.py --exec OUT.json imagebench ARGS...`
# --------------------------------------------------------------------------------------------


def _exec_main(argv: list[str]) -> int:
    """Run the `imagebench` CLI in this process (the console script's entry point), timing every
    ``HPSv3Scorer.score`` call; at exit write the calls, process start/exit times and VmHWM."""
    import atexit
    import importlib.abc
    import importlib.machinery

    if len(argv) < 2 or argv[1] != "imagebench":
        print("usage: bench_nightly.py --exec OUT.json imagebench [ARGS...]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    t_start = time.time()
    calls: list[tuple[float, float, int]] = []  # (epoch start, epoch end, images)
    lock = threading.Lock()

    def patch(cls) -> None:
        orig = cls.score

        def score(self, images, prompts, *args, **kwargs):
            t0 = time.time()
            try:
                return orig(self, images, prompts, *args, **kwargs)
            finally:
                t1 = time.time()
                with lock:
                    calls.append((t0, t1, len(images)))

        cls.score = score

    class Hook(importlib.abc.MetaPathFinder):
        """Patches tasks.hpsv3.scorer right after the command imports it (not before)."""

        def find_spec(self, name, path, target=None):
            if name != "tasks.hpsv3.scorer":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            exec_orig = spec.loader.exec_module

            def exec_module(module):
                exec_orig(module)
                patch(module.HPSv3Scorer)

            spec.loader.exec_module = exec_module
            return spec

    def write() -> None:
        status = {}
        try:
            with open("/proc/self/status") as fh:
                for line in fh:
                    k, _, v = line.partition(":")
                    if k in ("VmHWM", "VmRSS"):
                        status[k] = int(v.split()[0])
        except OSError:
            pass
        with lock:
            data = {"t_start": t_start, "t_exit": time.time(), "calls": sorted(calls), **status}
        out.write_text(json.dumps(data))

    sys.path.insert(0, os.environ.get("BENCH_SRC") or str(Path(__file__).resolve().parents[1]))
    sys.meta_path.insert(0, Hook())
    atexit.register(write)  # registered first, so it runs last: after Prefect's own exit handlers
    sys.argv = argv[1:]
    from flows.cli import main as cli_main

    return cli_main()


# --------------------------------------------------------------------------------------------
# The benchmark side
# --------------------------------------------------------------------------------------------


def _task_counts(db: Path, flow_name: str = "nightly") -> dict[str, dict[str, int]]:
    """task name (without Prefect's "-<3 hex>" suffix) -> {state type: count} for the latest run
    of ``flow_name`` in the Prefect SQLite database."""
    import re
    import sqlite3

    if not db.is_file():
        return {}
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = con.execute(
            "SELECT fr.id FROM flow_run fr JOIN flow f ON f.id = fr.flow_id WHERE f.name = ? "
            "ORDER BY fr.start_time DESC LIMIT 1", (flow_name,)
        ).fetchone()
        if row is None:
            return {}
        rows = con.execute("SELECT name, state_type FROM task_run WHERE flow_run_id = ?", (row[0],)).fetchall()
    except sqlite3.Error:
        return {}
    finally:
        con.close()
    out: dict[str, dict[str, int]] = {}
    for name, state in rows:
        key = re.sub(r"-[0-9a-f]{3}$", "", name)
        out.setdefault(key, {}).setdefault(str(state), 0)
        out[key][str(state)] += 1
    return out


def _idle_split(calls: list[list[float]], flow_t0: float, flow_t1: float) -> dict:
    """Device-slot time line of one run: busy (sum of score calls), idle before the first call,
    between calls, and after the last, in seconds; epoch times."""
    if not calls:
        return {"busy_s": 0.0, "before_s": flow_t1 - flow_t0, "between_s": 0.0, "after_s": 0.0, "calls": 0}
    calls = sorted(calls)
    busy = sum(b - a for a, b, _ in calls)
    window = max(b for _, b, _ in calls) - calls[0][0]
    gaps = []
    end = calls[0][1]
    for a, b, _ in calls[1:]:
        gaps.append(max(0.0, a - end))
        end = max(end, b)
    return {
        "busy_s": busy,
        "before_s": calls[0][0] - flow_t0,
        "between_s": max(0.0, window - busy),
        "after_s": flow_t1 - max(b for _, b, _ in calls),
        "calls": len(calls),
        "gaps_s": gaps,
        "median_gap_s": sorted(gaps)[len(gaps) // 2] if gaps else 0.0,
        "max_gap_s": max(gaps) if gaps else 0.0,
        "first_call_s": calls[0][1] - calls[0][0],
    }


def _first_last(durations: list[float]) -> dict:
    """Median duration of the first k and the last k tasks (start order), k = min(10, n // 3): a
    per-model cost that grows with the models already done shows as last > first."""
    n = len(durations)
    k = min(10, n // 3)
    if k < 1:
        return {"n": n, "k": 0}
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"n": n, "k": k, "first_s": med(durations[:k]), "last_s": med(durations[-k:])}


def _one_run(work: Path, tiny, ref_ws, n_models: int, task_batch: int, log, label: str) -> dict:
    from common import PY, Workspace, hps_task_stats, run_measured, suite_prompts, task_run_spans
    from tasks.lake.tables import Lake

    all_ids, eligible, _ = suite_prompts()
    ws = Workspace.create(work / f"nightly-{label}", tiny, reference_from=ref_ws)
    t = time.perf_counter()
    for k in range(n_models):
        ws.put_model(f"m{k:03d}", all_ids, seed=1000 + k, side=IMAGE_SIDE)
    setup_s = time.perf_counter() - t
    env = ws.env() | {"IMAGEBENCH_TESSERACT": NO_TESSERACT}
    if task_batch != DEFAULT_TASK_BATCH:
        env["IMAGEBENCH_TASK_BATCH_SIZE"] = str(task_batch)
    env.pop("IMAGEBENCH_JUDGES_CONFIG", None)
    trace = (ws.root / "exec.json").resolve()  # the command runs in the source tree
    cmd = [PY, str(Path(__file__).resolve()), "--exec", str(trace), "imagebench", "nightly", "--format", "json"]
    res = run_measured(cmd, env, timeout=3600).check()
    info = json.loads(trace.read_text())
    runs = [r for r in Lake(ws.home / "lake").read_runs().to_pylist() if r["flow"] == "nightly"]
    if len(runs) != 1:
        raise RuntimeError(f"expected one nightly run record in {ws.home / 'lake'}, found {len(runs)}")
    rec = runs[0]
    if rec["status"] != "completed":
        raise RuntimeError(f"nightly run {rec['run_id']} {rec['status']}: {rec['error']}")
    counts = _task_counts(ws.prefect_db())
    spans = task_run_spans(ws.prefect_db(), "nightly")
    flow_t0 = rec["started_at"].timestamp()
    flow_t1 = rec["finished_at"].timestamp()
    calls = info["calls"]
    split = _idle_split(calls, flow_t0, flow_t1)
    images = n_models * len(all_ids)
    inference = split["busy_s"]
    overhead = rec["total_s"] - inference - rec["judge_s"]
    ingest_spans = sorted(s for name, v in spans.items() if name.startswith("ingest") for s in v)
    hps_spans = sorted(s for name, v in spans.items() if name.startswith("hpsv3-batch") for s in v)
    hps_batches = sum(1 for name, v in spans.items() if name.startswith("hpsv3-batch") for _ in v)
    per_model = {k: _first_last([b - a for a, b in sorted(spans.get(k, []))]) for k in ("ingest", "commit-model")}
    judge_per_model = math.ceil((rec["judge_items"] / n_models) / DEFAULT_JUDGE_TASK) if n_models else 0
    out = {
        "label": label,
        "models": n_models,
        "task_batch": task_batch,
        "images": images,
        "images_hps": rec["hps_images_scored"],
        "images_ok": rec["images_ok"],
        "images_quarantined": rec["images_quarantined"],
        "judge_items": rec["judge_items"],
        "setup_s": setup_s,
        "wall_s": res.wall_s,
        "cpu_s": res.cpu_s,
        "others": res.others,
        "peak_kib": max(info.get("VmHWM", 0), res.main_hwm_kib()),
        "total_s": rec["total_s"],
        "startup_s": flow_t0 - info["t_start"],  # Python start to flow start: imports, Prefect API start, flow run
        "teardown_s": info["t_exit"] - flow_t1,  # record written to process exit: output, Prefect shutdown
        "stage_s": {s: rec[f"{s}_s"] for s in ("ingest", "hpsv3", "judge", "commit", "catalog")},
        "inference_s": inference,
        "inference_calls": len(calls),
        "inference_images": sum(n for _, _, n in calls),
        "overhead_s": overhead,
        "overhead_ms_per_image": 1000 * overhead / images,
        "inference_ms_per_image": 1000 * inference / images,
        "wall_ms_per_image": 1000 * res.wall_s / images,
        "idle": split,
        "first_ingest_start_s": ingest_spans[0][0] - flow_t0 if ingest_spans else None,
        "last_ingest_end_s": max(b for _, b in ingest_spans) - flow_t0 if ingest_spans else None,
        "first_hps_start_s": hps_spans[0][0] - flow_t0 if hps_spans else None,
        "first_inference_s": calls[0][0] - flow_t0 if calls else None,
        "brief_overhead_s": rec["total_s"] - rec["hpsv3_s"] - rec["judge_s"],  # with the record's hpsv3_s
        "hps": hps_task_stats(spans),
        "per_model": per_model,  # ingest / commit task seconds: median of the first vs the last models, in start order
        "overhead_per_inference": overhead / inference if inference else float("nan"),
        "prefect_tasks_record": rec["prefect_tasks"],
        "prefect_tasks_db": sum(sum(v.values()) for v in counts.values()),
        "task_counts": counts,
        "hps_batches_db": hps_batches,
        "hps_batches_expected": n_models * math.ceil(len(eligible) / task_batch),
        "judge_tasks_per_model": judge_per_model,
        "tasks_formula": 1 + n_models * (2 + judge_per_model) + n_models * math.ceil(len(eligible) / task_batch),
    }
    log(
        f"(e) nightly, {n_models} models x {len(all_ids)} images, task batch {task_batch}: {res.wall_s:.0f}s wall, "
        f"flow {rec['total_s']:.0f}s, inference {inference:.0f}s, overhead {out['overhead_ms_per_image']:.1f} ms/image, "
        f"{rec['prefect_tasks']} Prefect tasks (other processes used {res.others:.0%} of the CPU)"
    )
    import shutil

    shutil.rmtree(ws.root, ignore_errors=True)  # thousands of images: do not keep them
    return out


def run(work: Path, quick: bool, log, tiny, ref_ws) -> dict:
    sizes = QUICK_SIZES if quick else FULL_SIZES
    env_sizes = os.environ.get("BENCH_NIGHTLY_SIZES")  # e.g. "5,20,30": override (say so in RESULTS)
    if env_sizes:
        sizes = tuple(int(x) for x in env_sizes.split(",") if x.strip())
    saved = work.parent / "nightly-runs.jsonl"  # each run as it finishes (bench/_work/ is git-ignored, kept)

    def one(n: int, task_batch: int, label: str) -> dict:
        r = _one_run(work, tiny, ref_ws, n, task_batch, log, label)
        with open(saved, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(r, default=str) + "\n")
        return r

    runs = [one(n, DEFAULT_TASK_BATCH, f"{n}") for n in sizes]
    half = DEFAULT_TASK_BATCH // 2
    halved = one(sizes[0], half, f"{sizes[0]}-b{half}")
    small, big = runs[0], runs[-1]
    out = {
        "quick": quick,
        "sizes": list(sizes),
        "runs": runs,
        "halved": halved,
        "ratio": big["overhead_ms_per_image"] / small["overhead_ms_per_image"],
        "ratio_wall": big["wall_ms_per_image"] / small["wall_ms_per_image"],
        "others_max": max(r["others"] for r in [*runs, halved]),
        "image_side": IMAGE_SIDE,
    }
    # Marginal overhead per extra image between consecutive sizes: the per-image cost with the
    # fixed costs taken out; if the pipeline had a per-model cost growing with N, this would grow.
    out["marginal_ms"] = [
        1000 * (b["overhead_s"] - a["overhead_s"]) / (b["images"] - a["images"]) for a, b in zip(runs, runs[1:])
    ]
    out["marginal_ratio"] = (out["marginal_ms"][-1] / out["marginal_ms"][0]) if len(out["marginal_ms"]) > 1 and out["marginal_ms"][0] > 0 else None
    # Fixed + per-image least squares fit of the overhead.
    xs = [r["images"] for r in runs]
    ys = [r["overhead_s"] for r in runs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else float("nan")
    out["fit_fixed_s"] = my - slope * mx
    out["fit_ms_per_image"] = 1000 * slope
    out["tasks_match"] = all(r["prefect_tasks_record"] == r["prefect_tasks_db"] == r["tasks_formula"] for r in [*runs, halved])
    return out


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def svg_plot(res: dict) -> str:
    """Overhead and inference per image (ms) vs number of models, as a small stand-alone SVG."""
    from harness import svg_lines

    runs = res["runs"]
    series = [
        ("overhead", "#d62728", [r["overhead_ms_per_image"] for r in runs]),
        ("inference", "#1f77b4", [r["inference_ms_per_image"] for r in runs]),
        ("whole command", "#7f7f7f", [r["wall_ms_per_image"] for r in runs]),
    ]
    return svg_lines("imagebench nightly: ms per image vs number of models (192 images each)", "models in the run",
                     "ms per image", [r["models"] for r in runs], series)


def markdown(res: dict, plot: str | None = None) -> list[str]:
    from harness import disturbed_note

    runs, halved = res["runs"], res["halved"]
    small, big = runs[0], runs[-1]
    lines = [
        *disturbed_note(res["others_max"]),
        f"One `imagebench nightly` per size, each in a fresh subprocess and a fresh workspace (same frozen reference, "
        f"copied), over N models x 192 {res['image_side']}x{res['image_side']} PNGs (every suite prompt; 165 EPS-eligible "
        "go through HPSv3), tiny HPSv3 model on CPU, default settings (4 task threads, 1 GPU slot, "
        f"IMAGEBENCH_TASK_BATCH_SIZE {DEFAULT_TASK_BATCH}, batch 8). No judge endpoints; the built-in OCR judge is pointed at "
        "a missing Tesseract (`IMAGEBENCH_TESSERACT`), so the judge path plans, batches and records every item (ERROR) "
        "without spending CPU on OCR: judge_s is near 0. **Inference** = time inside `HPSv3Scorer.score` calls, timed in "
        "the subprocess (they hold the 1-slot GPU semaphore, so they never overlap); **overhead** = flow total_s (run "
        "record) - inference - judge_s, i.e. flow time during which the device slot was idle.",
        "",
        "| models | images | whole command s | flow total_s | inference s | judge_s | **overhead s** | **overhead ms/image** "
        "| overhead / inference | inference ms/image | whole command ms/image | record hpsv3_s | Prefect tasks | CPU used by others |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in [*runs, halved]:
        name = f"{r['models']}" + (f" (task batch {r['task_batch']})" if r is halved else "")
        lines.append(
            f"| {name} | {r['images']:,} | {r['wall_s']:.0f} | {r['total_s']:.0f} | {r['inference_s']:.0f} "
            f"| {r['stage_s']['judge']:.1f} | **{r['overhead_s']:.0f}** | **{r['overhead_ms_per_image']:.1f}** "
            f"| {r['overhead_per_inference']:.2f} | {r['inference_ms_per_image']:.1f} | {r['wall_ms_per_image']:.1f} | {r['stage_s']['hpsv3']:.0f} "
            f"| {r['prefect_tasks_record']} | {r['others']:.0%} |"
        )
    lines += [
        f"| **ratio {big['models']} / {small['models']} models** | {big['images'] / small['images']:.0f}x | | | | | "
        f"| **{res['ratio']:.2f}x** | {big['overhead_per_inference'] / small['overhead_per_inference']:.2f}x "
        f"| {big['inference_ms_per_image'] / small['inference_ms_per_image']:.2f}x "
        f"| {res['ratio_wall']:.2f}x | | | |",
        "",
        "Marginal overhead per extra image between consecutive sizes (the per-image cost with the fixed costs taken "
        "out): " + ", ".join(
            f"{a['models']}->{b['models']} models: **{m:.1f} ms**" for a, b, m in zip(runs, runs[1:], res["marginal_ms"])
        ) + f". Least-squares fit over the sizes: overhead = {res['fit_fixed_s']:.0f} s + {res['fit_ms_per_image']:.1f} ms x images.",
        "",
    ]
    if plot:
        lines += [f"![overhead per image vs models]({plot})", ""]
    lines += [
        "**When the device slot was idle** (seconds of flow time; from the `score` call times and the run record's "
        "start/end), and the stage busy times from the run record (summed over that stage's tasks, which run 4 at "
        "a time beside inference, so they overlap inference and each other):",
        "",
        "| models | idle before 1st inference | ... of which: flow start -> 1st ingest start / -> last ingest end / -> 1st HPSv3 task start / -> 1st `score` call | idle between calls (median / max gap) | idle after last | ingest_s | commit_s | catalog_s | start-up (process start -> flow start) | teardown |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in [*runs, halved]:
        i = r["idle"]
        name = f"{r['models']}" + (f" (batch {r['task_batch']})" if r is halved else "")
        ing = " / ".join("-" if r[k] is None else f"{r[k]:.1f}" for k in (
            "first_ingest_start_s", "last_ingest_end_s", "first_hps_start_s", "first_inference_s"))
        lines.append(
            f"| {name} | {i['before_s']:.1f} | {ing} | {i['between_s']:.1f} ({i.get('median_gap_s', 0):.2f} / {i.get('max_gap_s', 0):.1f}) "
            f"| {i['after_s']:.1f} | {r['stage_s']['ingest']:.1f} | {r['stage_s']['commit']:.1f} "
            f"| {r['stage_s']['catalog']:.1f} | {r['startup_s']:.1f} | {r['teardown_s']:.1f} |"
        )
    lines += [
        "",
        "Per image (ms), same columns: "
        + "; ".join(
            f"{r['models']} models: before {1000 * r['idle']['before_s'] / r['images']:.1f}, between "
            f"{1000 * r['idle']['between_s'] / r['images']:.1f}, after {1000 * r['idle']['after_s'] / r['images']:.1f}, "
            f"ingest busy {1000 * r['stage_s']['ingest'] / r['images']:.1f}, commit busy {1000 * r['stage_s']['commit'] / r['images']:.1f}"
            for r in runs
        )
        + ".",
        "",
        "**Prefect task runs per nightly** (run record `prefect_tasks`, and counted by name in the workspace's Prefect "
        "database after the run) against the formula 1 refresh-catalog + N x (ingest + commit-model + judge-batch "
        f"tasks of {DEFAULT_JUDGE_TASK} items) + HPSv3 batches (N x ceil(165 / task batch)):",
        "",
        "| models | task batch | images | HPSv3 batches (db / expected) | judge tasks per model | tasks: record | tasks: Prefect db | formula | tasks per 100 images |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in [*runs, halved]:
        lines.append(
            f"| {r['models']} | {r['task_batch']} | {r['images']:,} | {r['hps_batches_db']} / {r['hps_batches_expected']} "
            f"| {r['judge_tasks_per_model']} | {r['prefect_tasks_record']} | {r['prefect_tasks_db']} | {r['tasks_formula']} "
            f"| {100 * r['prefect_tasks_record'] / r['images']:.2f} |"
        )
    lines += [
        "",
        "Per-model stages, first vs last models of each run (median task seconds of the first k and the last k "
        "models in start order, k = min(10, N/3); a cost that grew with the models already in the lake would show as "
        "last > first): " + "; ".join(
            f"{r['models']} models: ingest {r['per_model']['ingest']['first_s']:.2f} -> {r['per_model']['ingest']['last_s']:.2f} s, "
            f"commit {r['per_model']['commit-model']['first_s']:.2f} -> {r['per_model']['commit-model']['last_s']:.2f} s"
            for r in runs if r.get("per_model", {}).get("commit-model", {}).get("k")
        ) + ".",
        "",
        "By name in the largest run: " + ", ".join(
            f"`{k}` {sum(v.values())}" + ("" if set(v) == {"COMPLETED"} else f" ({v})") for k, v in sorted(big["task_counts"].items())
        ) + ".",
    ]
    return lines


def notes(res: dict) -> list[str]:
    """What the numbers say: the verdict, what dominates, the record's hpsv3_s, the task counts."""
    runs, halved = res["runs"], res["halved"]
    small, big = runs[0], runs[-1]
    i = big["idle"]
    ov = big["overhead_s"] or float("nan")
    ms = lambda s, r=big: 1000 * s / r["images"]  # noqa: E731
    if res["ratio"] <= 1.05:
        verdict = (f"**Overhead per image does not grow with the number of models**: {small['overhead_ms_per_image']:.0f} ms "
                   f"at {small['models']} models, {big['overhead_ms_per_image']:.0f} ms at {big['models']} "
                   f"(**{res['ratio']:.2f}x**): the fixed costs spread over more images.")
    else:
        verdict = (f"**Overhead per image grows with the number of models**: {small['overhead_ms_per_image']:.0f} ms at "
                   f"{small['models']} models, {big['overhead_ms_per_image']:.0f} ms at {big['models']} (**{res['ratio']:.2f}x**).")
    marg = res["marginal_ms"]
    if len(marg) > 1:
        verdict += (" The marginal cost of one more image (fixed costs taken out) is "
                    + " then ".join(f"{m:.1f} ms" for m in marg) + " between consecutive sizes")
        mid = runs[-2]
        slow = big["inference_ms_per_image"] / mid["inference_ms_per_image"]  # contention proxy between the two runs
        grow = marg[-1] / max(marg[0], 1e-9)
        if grow <= 1.25:
            verdict += ": flat, so nothing in the run costs more per model as models are added."
        elif grow <= 1.25 * slow:
            verdict += (f": it rises {grow:.1f}x, but inference itself ran {slow:.2f}x slower per image in the "
                        f"{big['models']}-model run than in the {mid['models']}-model one (other processes used "
                        f"{big['others']:.0%} vs {mid['others']:.0%} of the CPU), so the rise follows the machine's load.")
        else:
            verdict += (f": it rises {grow:.1f}x, more than the slowdown of inference itself between those runs "
                        f"({slow:.2f}x): something costs more per model as models are added (see the per-model stage "
                        "times below).")
    pm = big.get("per_model", {})
    if all(pm.get(k, {}).get("k") for k in ("ingest", "commit-model")):
        growth = {k: pm[k]["last_s"] / pm[k]["first_s"] for k in ("ingest", "commit-model") if pm[k]["first_s"] > 0}
        worst = max(growth.values(), default=1.0)
        verdict += (f" Within the {big['models']}-model run, the last models' ingest and commit tasks took "
                    + " and ".join(f"{g:.2f}x" for g in growth.values()) + " as long as the first models' "
                    + ("(no growth with the models already in the lake)." if worst <= 1.25
                       else "(**they grow with the models already in the lake**)."))
    notes = ["", verdict, ""]
    setup = big["first_ingest_start_s"] or 0
    idle = (i["before_s"] + i["between_s"] + i["after_s"]) or float("nan")
    ingest_idle = (big["first_hps_start_s"] or 0) - setup
    load = (big["first_inference_s"] or 0) - (big["first_hps_start_s"] or 0)
    notes.append(
        f"What dominates, at {big['models']} models ({ov:.0f} s of overhead, {big['overhead_ms_per_image']:.0f} ms/image): "
        f"the device slot idle **before the first inference call, {i['before_s']:.0f} s ({i['before_s'] / idle:.0%} of the "
        f"{idle:.0f} s it was idle; judging, {big['stage_s']['judge']:.0f} s, ran beside inference)**: "
        f"{setup:.0f} s of flow set-up before the first ingest task starts (suite and reference checks, discovery, "
        f"locks, task submission), **{ingest_idle:.0f} s of ingest before the first HPSv3 task starts "
        f"({ms(ingest_idle):.1f} ms per image)**, then {load:.0f} s in that first task before its `score` call "
        "(importing torch/transformers and loading the scorer, once per process). Between inference calls the slot is "
        f"idle only {i['between_s']:.1f} s in all (median gap {1000 * i.get('median_gap_s', 0):.0f} ms: the next batch "
        f"is already waiting on the GPU semaphore), and {i['after_s']:.0f} s after the last call (last commit, catalog "
        f"refresh, run record). Outside the flow, each command also pays {big['startup_s']:.0f} s of start-up (Python "
        f"imports, the embedded Prefect API) before the flow starts, once per run."
    )
    if big["first_hps_start_s"] is not None and big["last_ingest_end_s"] is not None and big["models"] > 4:
        lag = big["first_hps_start_s"] - big["last_ingest_end_s"]
        span = big["last_ingest_end_s"] - (big["first_ingest_start_s"] or 0)
        if lag > -0.25 * span:
            notes += [
                "",
                f"**The device waits for every model to be ingested.** At {big['models']} models the ingest tasks ran "
                f"from {big['first_ingest_start_s']:.0f} s to {big['last_ingest_end_s']:.0f} s into the flow, and the first "
                f"HPSv3 task started at {big['first_hps_start_s']:.0f} s, when the last ingest tasks were already running: "
                "inference did not overlap the ingest phase, although "
                "the flow means ingest of the next model to overlap inference of the previous one. `_score_models` "
                "(flows/pipeline.py) submits all N ingest tasks at once to the thread task runner (4 threads, a FIFO "
                "queue) and submits a model's `hpsv3-batch` tasks only after its ingest returns, so they queue behind "
                "every remaining ingest task. This idle time grows linearly with the number of models: it is a "
                "constant cost per image that no number of models amortises (not a growth per image). Not changed here "
                "(bench only); see the report.",
            ]
    ratio_h = big["stage_s"]["hpsv3"] / big["inference_s"] if big["inference_s"] else float("nan")
    notes += [
        "",
        f"The run record's `hpsv3_s` is **{ratio_h:.1f}x** the time actually spent in `score` at {big['models']} models "
        f"({big['stage_s']['hpsv3']:.0f} s vs {big['inference_s']:.0f} s; the flow lasted {big['total_s']:.0f} s): it is "
        "timed around the whole task body (`_timed(work.score_hps_batch, ...)`), which includes waiting for the "
        "per-process GPU semaphore while up to 3 other HPSv3 tasks hold the task runner's threads. `total_s - hpsv3_s - "
        f"judge_s` is therefore negative ({big['brief_overhead_s']:.0f} s) and cannot be used as the overhead; this "
        "section times the `score` calls in the command's process instead.",
        "",
        f"**Prefect tasks follow batches, not images**: every run has exactly 1 + N x (ingest + commit + "
        f"{big['judge_tasks_per_model']} judge tasks) + HPSv3 batches task runs (record, Prefect database and formula "
        f"agree: {'yes' if res['tasks_match'] else 'NO'}); halving IMAGEBENCH_TASK_BATCH_SIZE to {halved['task_batch']} "
        f"at {halved['models']} models doubles the HPSv3 batches ({small['hps_batches_db']} -> {halved['hps_batches_db']}) "
        f"and the task count moves by exactly that ({small['prefect_tasks_record']} -> {halved['prefect_tasks_record']}) "
        "for the same images. The judge tasks per model follow IMAGEBENCH_JUDGE_TASK_SIZE (192 items / 64).",
        "",
        f"Context: images here are {res['image_side']} px PNGs, so ingest (read, sha256, decode, validate) is as cheap "
        "as it gets; real 1024 px images cost more per image in ingest, which here is exactly the stage the device "
        "waits for. Each size is one run on a shared machine (CPU used by other processes per run in the first table).",
    ]
    return notes

SVG = "nightly-overhead.svg"  # the plot, written next to the results file


def report(ctx: Context) -> Report:
    from harness import Report, summary_row

    t = time.perf_counter()
    res = run(ctx.work, ctx.quick, ctx.log, ctx.tiny, ctx.ref_ws)
    res["duration_s"] = time.perf_counter() - t
    small, big = res["runs"][0], res["runs"][-1]
    tasks_ok = "tasks = record = db = formula" if res["tasks_match"] else "**task counts disagree**"
    summary = summary_row(
        f"(e) `imagebench nightly` overhead per image (flow time outside inference + judging), "
        f"{big['models']} / {small['models']} models",
        f"**{res['ratio']:.2f}x** ({small['overhead_ms_per_image']:.0f} -> {big['overhead_ms_per_image']:.0f} ms/image); "
        f"Prefect tasks {small['prefect_tasks_record']} -> {big['prefect_tasks_record']} for {small['images']:,} -> "
        f"{big['images']:,} images, 1 + {2 + big['judge_tasks_per_model']} per model + HPSv3 batches ({tasks_ok})",
        "<= ~1 (not growing per image); tasks follow batches", ctx.measured)
    plot = None
    if ctx.write and ctx.results is not None:
        svg = ctx.results.parent / SVG
        svg.write_text(svg_plot(res), encoding="utf-8")
        plot = os.path.relpath(svg, ctx.results.parent)
    return Report({"e": res}, markdown(res, plot) + notes(res), summary, f"overhead per image ratio {res['ratio']:.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--exec":
        raise SystemExit(_exec_main(sys.argv[2:]))
    print(__doc__)
    print("Run through bench/run_bench.py --only e (see bench/README.md).")
    raise SystemExit(2)
