"""A real CUDA out-of-memory during HPSv3 scoring: the batch is halved and nothing is lost.

    python bench/gpu_oom_check.py [--out result.json]      # needs a CUDA GPU

The tiny HPSv3 model (tasks/hpsv3/tiny.py) scores 24 large images in bfloat16, first one at a
time (the reference scores), then at batch size 24 with the GPU filled by a ballast tensor so
that one image fits and the whole batch does not: the allocator raises a genuine
``torch.cuda.OutOfMemoryError``, ``run_with_oom_backoff`` halves the batch until it fits, and the
scores must equal the one-at-a-time scores (bfloat16 tolerance). The CPU test suite covers the
same path with a simulated OOM (tests/tasks/hpsv3/test_scorer.py); this is the real allocator.
Exit code 0 when the OOM happened, the batch was halved and every score matches.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--images", type=int, default=24)
    ap.add_argument("--side", type=int, default=1024)
    args = ap.parse_args()

    import numpy as np
    import torch
    from PIL import Image

    if not torch.cuda.is_available():
        print("CUDA not available")
        return 2
    from tasks.hpsv3 import scorer as scorer_mod
    from tasks.hpsv3.scorer import HPSv3Scorer
    from tasks.hpsv3.tiny import write_tiny_base_model, write_tiny_checkpoint

    tmp = Path(tempfile.mkdtemp())
    base, ckpt = tmp / "base", tmp / "HPSv3-tiny.safetensors"
    write_tiny_base_model(base)
    write_tiny_checkpoint(base, ckpt, seed=0)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(args.images):
        p = tmp / f"img{i}.png"
        Image.fromarray(rng.integers(0, 255, (args.side, args.side, 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    prompts = [f"a photo number {i} of a red bicycle leaning on a wall" for i in range(args.images)]

    scorer = HPSv3Scorer.load(str(base), str(ckpt), device="cuda", dtype="bfloat16")
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    one_by_one = scorer.score(paths, prompts, batch_size=1)
    per_image = torch.cuda.max_memory_allocated() - baseline  # activations of one image

    torch.cuda.reset_peak_memory_stats()
    scorer.score(paths, prompts, batch_size=args.images)
    whole_batch = torch.cuda.max_memory_allocated() - baseline  # what batch `images` needs

    # Fill the GPU so that one image fits but the whole batch does not.
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    room = per_image + (whole_batch - per_image) // 4
    ballast = torch.empty(max(0, free - room), dtype=torch.uint8, device="cuda")
    ooms = []
    real_release = scorer_mod._release_cuda_memory
    scorer_mod._release_cuda_memory = lambda: (ooms.append(1), real_release())[1]
    sizes = []
    real_runner = scorer.batch_runner

    def runner(chunk):
        sizes.append(len(chunk))
        return real_runner(chunk)

    scorer.batch_runner = runner  # records every attempted sub-batch size
    try:
        batched = scorer.score(paths, prompts, batch_size=args.images)
    finally:
        scorer_mod._release_cuda_memory = real_release
        del ballast
    diff = float(np.max(np.abs(batched[:, 0] - one_by_one[:, 0])))
    result = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "images": args.images,
        "side": args.side,
        "peak_bytes_batch_1": int(per_image),
        "peak_bytes_whole_batch": int(whole_batch),
        "room_left_bytes": int(room),
        "oom_events": len(ooms),
        "attempted_batch_sizes": sizes,
        "max_abs_mu_diff_vs_one_by_one": diff,
        "ok": bool(len(ooms) > 0 and min(sizes) < args.images and diff < 5e-2 and len(batched) == args.images),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
