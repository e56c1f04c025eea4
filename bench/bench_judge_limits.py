"""(k) Judges at the rate a paid API allows (issue 25 item 1): achieved / allowed requests per minute.

A fake paid API (tests/fake_openai.py with ``ServerLimits``) allows 4 requests in flight and
:data:`RPM` requests per minute (a bucket of :data:`BURST` requests refilled at RPM/60 per second:
one request of tolerance) and answers 429 with a ``Retry-After`` beyond either; each answer takes
:data:`LATENCY_S` (4 in flight could carry 4/0.5 = 8 requests/s: the per-minute limit binds).
The real commands run against it, cold subprocesses on a workspace with the tiny HPSv3 model:

- Capability judging: ``imagebench score --model M`` on :data:`N_IMAGES` images outside Text
  Rendering (every one a request to the routing's ``qwen3-vl``), in judge tasks of 16 (several
  Prefect tasks at once, each with its own judge and client);
- ``imagebench vab run`` on a collection of N_IMAGES / 3 three-image tasks (3 trials each: the
  same number of requests), in batches of 4 (several at once), nothing cached.

Each on the embedded API (``judge_limits: auto``: this machine's lock files, the default) and on
Prefect's global concurrency and rate limits (``judge_limits: prefect``; the same limits a Prefect
server's workers share). Measured from the server's arrival times: achieved rate = (accepted
requests - 1) / (last arrival - first arrival); the ratio to RPM/60 is the result (target >= 0.9),
with the requests refused (target 0), the most in flight (<= 4) and the verdicts / answers kept
(every one).

    .venv/bin/python bench/run_bench.py --only k [--quick]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from common import SRC, SUITE_FILE, Workspace, image_bytes, run_imagebench
from harness import Context, Report, interleave, summary_row, table

sys.path.insert(0, str(SRC))

RPM = 240  # 4 requests per second
BURST = 2  # one request of tolerance: 0.25 s
LATENCY_S = 0.5
N_IMAGES = 120
MODEL = "bench-judged"
SETS = "bench-limits"
VARIANTS = ("capability", "vab")
SCOPES = ("auto", "prefect")


def _paid_api():
    from tests.fake_openai import FakeOpenAI, Reply, ServerLimits

    def answer(req) -> Reply:
        content = req.body["messages"][-1]["content"]
        shown = sum(p.get("type") == "image_url" for p in content)
        if shown > 1:  # a VAB trial (3 images)
            return Reply(text="The first one.\nBEST: 1\nWORST: 2", delay_s=LATENCY_S)
        return Reply(text="Looked at it.\nVERDICT: PASS", delay_s=LATENCY_S)

    return FakeOpenAI("fake-qwen", answer, limits=ServerLimits(max_in_flight=4, requests_per_minute=RPM, burst=BURST))


def _judges_file(path: Path, paid_url: str, spare_url: str) -> Path:
    path.write_text(json.dumps({"judges": {
        "qwen3-vl": {"backend": "openai", "base_url": paid_url, "model": "fake-qwen", "concurrency": 4,
                     "requests_per_minute": RPM, "max_retries": 4},
        "gemma": {"backend": "openai", "base_url": spare_url, "model": "fake-qwen", "concurrency": 4},
    }}))
    return path


def _vab_manifest(folder: Path, tasks: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for t in range(tasks):
        names = [f"t{t:03d}-{i}.png" for i in range(3)]
        for i, name in enumerate(names):
            (folder / name).write_bytes(image_bytes(50_000 + 3 * t + i, 64, 64))
        lines.append(json.dumps({"task_id": f"bench-{t:03d}", "domain": "photography", "images": names, "best": 1, "worst": 3}))
    manifest = folder / "manifest.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def _measure(srv) -> dict:
    accepted = [r.t for r in srv.accepted]
    span = accepted[-1] - accepted[0] if len(accepted) > 1 else float("nan")
    achieved = (len(accepted) - 1) / span if span > 0 else float("nan")
    return {"requests": len(srv.completions), "accepted": len(accepted), "refused": srv.refused,
            "max_in_flight": srv.max_in_flight, "achieved_per_s": achieved, "span_s": span,
            "ratio": achieved / (RPM / 60.0)}


def _kept(ws: Workspace, variant: str) -> int:
    """Verdicts (Capability) or ok answers (VAB) the lake holds from the judge."""
    from tasks.lake.tables import Lake

    lake = Lake(ws.home / "lake")
    if variant == "capability":
        rows = lake.read("verdicts", [MODEL]).to_pylist()
        return sum(r["judge"] == "qwen3-vl" and r["verdict"] in ("PASS", "FAIL") for r in rows)
    from tasks.vab.tables import read_partition

    return sum(r["judge"] == "qwen3-vl" and r["state"] == "ok" for r in read_partition(lake, "vab_trials", SETS).to_pylist())


def _run_one(ctx: Context, variant: str, scope: str, r: int, n: int) -> dict:
    from tests.fake_openai import FakeOpenAI, Reply

    root = ctx.work / f"k-{variant}-{scope}-{r}"
    ws = Workspace.create(root, ctx.tiny, reference_from=ctx.ref_ws)
    with _paid_api() as srv, FakeOpenAI("fake-qwen", lambda q: Reply()) as spare:
        env = ws.env() | {"IMAGEBENCH_JUDGES_CONFIG": str(_judges_file(root / "judges.yaml", srv.base_url, spare.base_url)),
                          "IMAGEBENCH_JUDGE_LIMITS": scope, "IMAGEBENCH_JUDGE_TASK_SIZE": "16"}
        if variant == "capability":
            from tasks.scores.suite import load_suite

            ids = [p.prompt_id for p in load_suite(SUITE_FILE).prompts if p.category != "Text Rendering"][:n]
            ws.put_model(MODEL, ids, seed=17, side=64)
            run_imagebench(["score", "--model", MODEL, "--format", "json"], env).check()
        else:
            manifest = _vab_manifest(root / "sets", n // 3)
            run_imagebench(["vab", "import-sets", str(manifest), "--name", SETS], env).check()
            run_imagebench(["vab", "run", "--sets", SETS, "--judge", "qwen3-vl", "--batch-size", "4", "--no-cache"], env).check()
        out = _measure(srv) | {"expected": n, "kept": _kept(ws, variant)}
    ctx.log(f"(k) {variant} on {scope}: {out['accepted']} requests at {out['achieved_per_s']:.2f}/s of {RPM / 60:.0f}/s allowed "
            f"({out['ratio']:.3f}), refused {out['refused']}, max in flight {out['max_in_flight']}, kept {out['kept']}/{n}")
    return out


def report(ctx: Context) -> Report:
    n = 60 if ctx.quick else N_IMAGES
    rounds = 1 if ctx.quick else 2
    runs = {"n": 0}

    def one(variant: str, scope: str) -> dict:
        runs["n"] += 1
        return _run_one(ctx, variant, scope, runs["n"], n)

    variants = {f"{v}/{s}": (lambda v=v, s=s: one(v, s)) for v in VARIANTS for s in SCOPES}
    samples = interleave(variants, rounds, "rotate")
    rows, res = [], {"rpm": RPM, "burst": BURST, "latency_s": LATENCY_S, "requests": n, "samples": samples.as_dict()}
    for name in samples.variants:
        variant, scope = name.split("/")
        ratio = samples.spread(name, "ratio")
        refused = int(max(samples.of(name, "refused")))
        in_flight = int(max(samples.of(name, "max_in_flight")))
        kept = int(min(samples.of(name, "kept")))
        res[name] = {"ratio": ratio.as_dict(), "refused_max": refused, "max_in_flight": in_flight, "kept_min": kept}
        rows.append([("Capability judging (`imagebench score`)" if variant == "capability" else "`imagebench vab run`"),
                     "this machine's lock files (auto, embedded API)" if scope == "auto" else "Prefect's global limits",
                     f"{samples.median(name, 'achieved_per_s'):.2f} / {RPM / 60:.0f}", ratio.fmt(3), refused, in_flight,
                     f"{kept} / {n}"])
    body = [
        f"A fake paid API allowing **4 requests in flight and {RPM} per minute** (a bucket of {BURST} requests "
        f"refilled at {RPM // 60}/s) and answering 429 beyond either; each answer takes {LATENCY_S * 1000:.0f} ms. "
        f"{n} requests per run (cold commands on the tiny model), {rounds} round(s), variants interleaved. "
        "Achieved rate from the server's arrival times of accepted requests: (n - 1) / (last - first).",
        "",
        *table(["run", "limits shared through", "achieved / allowed requests/s (median)", "ratio (median, range)",
                "429s (max)", "most in flight", "verdicts / answers kept (min)"], rows),
        "",
        "The lock files hold the limits for every process of the machine at the rate allowed: a request takes "
        "its turn from the bucket when it is sent. Prefect's global limits hold them for every worker of a "
        "server; their cost is a call to the API for each request's turn (made while the request holds its "
        "in-flight slot), so their rate falls when the API answers slowly (docs/JUDGES.md \"Limits\"). The "
        f"answers take {LATENCY_S * 1000:.0f} ms, so {RPM / 60 * LATENCY_S:.0f} requests in flight carry the "
        "allowed rate: the in-flight bound is what the tests stress (tests/tasks/judges/test_limits.py, "
        "tests/flows/test_judge_limits.py, tests/vab/test_judge_limits.py).",
    ]
    cap, vab = samples.spread("capability/auto", "ratio"), samples.spread("vab/auto", "ratio")
    pc, pv = samples.median("capability/prefect", "ratio"), samples.median("vab/prefect", "ratio")
    refused = int(max(max(samples.of(v, "refused")) for v in samples.variants))
    in_flight = int(max(max(samples.of(v, "max_in_flight")) for v in samples.variants))
    summary = summary_row(
        "(k) judges at a paid API's rate: achieved / allowed requests per minute",
        f"Capability **{cap.median:.2f}x**, `vab run` **{vab.median:.2f}x** (lock files); Prefect's global limits "
        f"{pc:.2f}x / {pv:.2f}x; 429s {refused}, most in flight {in_flight} of 4",
        ">= 0.9; no 429, <= 4 in flight, every verdict kept", ctx.measured)
    return Report({"k": res}, body, summary)


if __name__ == "__main__":  # pragma: no cover - run through run_bench.py
    raise SystemExit("run: .venv/bin/python bench/run_bench.py --only k [--quick]")
