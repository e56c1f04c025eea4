"""Subprocess for benchmark (c): load the HPSv3 scorer, then score N (image path, prompt) pairs in
ONE ``HPSv3Scorer.score`` call, and print the process's memory as JSON on the last stdout line.

Run by bench_memory.py; by hand:
    .venv/bin/python bench/mem_worker.py --base DIR --checkpoint FILE --pairs pairs.jsonl --n 2000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.environ.get("BENCH_SRC") or str(Path(__file__).resolve().parents[1]))


def status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--pairs", required=True, help="JSON lines: {\"image\": path, \"prompt\": text}")
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()

    from tasks.hpsv3.scorer import HPSv3Scorer

    pairs = [json.loads(line) for line in Path(args.pairs).read_text().splitlines() if line.strip()][: args.n]
    if len(pairs) < args.n:
        raise SystemExit(f"only {len(pairs)} pairs in {args.pairs}, need {args.n}")
    images = [p["image"] for p in pairs]  # paths: the scorer opens each file when its batch comes up
    prompts = [p["prompt"] for p in pairs]

    scorer = HPSv3Scorer.load(args.base, args.checkpoint, device="cpu", dtype="float32")
    scorer.score(images[:1], prompts[:1], batch_size=1)  # warm-up
    after_load = status_kib("VmHWM")
    trace: list[tuple[int, int]] = []  # (images done, VmRSS KiB) every 10%
    hwm_steps: list[tuple[int, int]] = []  # (images done, VmHWM KiB) whenever the peak rose
    done = [0]
    hwm = [after_load]
    step = max(1, args.n // 10)

    def progress(k: int) -> None:
        before = done[0]
        done[0] += k
        if done[0] // step != before // step:
            trace.append((done[0], status_kib("VmRSS")))
        now = status_kib("VmHWM")
        if now > hwm[0] + 1024:
            hwm_steps.append((done[0], now))
            hwm[0] = now

    t0 = time.perf_counter()
    out = scorer.score(images, prompts, batch_size=args.batch_size, progress=progress)
    wall = time.perf_counter() - t0
    assert out.shape == (args.n, 2)
    print(
        json.dumps(
            {
                "n": args.n,
                "after_load_hwm_kib": after_load,
                "final_hwm_kib": status_kib("VmHWM"),
                "final_rss_kib": status_kib("VmRSS"),
                "score_wall_s": wall,
                "rss_trace": trace,
                "hwm_steps": hwm_steps,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
