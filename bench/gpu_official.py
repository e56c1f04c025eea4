"""The official HPSv3 code (hpsv3 1.0.0) on the same device, in the same run as bench/gpu_hpsv3.py.

The official code pins transformers 4.45.2 and imagebench runs on transformers 5, so it cannot run
in the benchmark's process: ``gpu_hpsv3.py --official`` starts this file as a worker under the
Python of a second environment (``--official-python``: torch with CUDA, transformers 4.45.2,
safetensors, pillow, numpy, requests), after its own model is freed from the GPU, and reads back
one JSON file. Nothing of the official package is imported by imagebench; it is not a dependency.

How the official code is run (as in bench/hpsv3_official_reference.py, whose loader it reuses):
- the package comes from ``--official-wheel``: the published wheel (unzipped into a temporary
  directory: it is pure Python, so that is what ``pip install --no-deps --target`` would do, with
  no network), the sdist, or an unpacked source directory;
- only the needed definitions are executed from its files (``Qwen2VLRewardModelBT``,
  ``HPSv3RewardInferencer``, ``process_vision_info``, the instruction): importing the package
  pulls in deepspeed/trl/peft, used only for training;
- ``create_model_and_processor`` is replayed step by step on the benchmark's base directory (the
  full-size Qwen2-VL-7B config, the tiny tokenizer), built directly on the device; instead of
  ``load_state_dict`` every parameter gets the SAME random values as imagebench's model (same
  seed per parameter, same rule: :func:`init_values`, keyed by imagebench's parameter order), so
  both score the same network and their mu can be compared;
- timed: ``HPSv3RewardInferencer.reward(paths, prompts)`` (the official end-to-end call: image
  decode and resize, the processor, the forward) and the forward alone (``model(**batch)`` on a
  batch made by its ``prepare_batch`` beforehand), under ``torch.inference_mode()``, as the
  benchmark times imagebench.
"""

from __future__ import annotations

import gc
import json
import math
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SEED_STRIDE = 1_000_003


# --- shared with gpu_hpsv3.py: the random weights ------------------------------------------------
def init_rule(name: str, shape: tuple[int, ...]) -> str:
    """How a parameter is drawn (activations O(1), distinct scores): see :func:`init_values`."""
    if len(shape) == 1:
        return "norm" if name.endswith("weight") else "bias"
    return "embed" if name.endswith("embed_tokens.weight") else "matrix"


def init_values(shape: tuple[int, ...], index: int, rule: str, seed: int, device: Any) -> Any:
    """float32 values of one parameter: norm scales 1 + 0.1 N(0,1), biases 0.1 N(0,1), matrices
    N(0,1)/sqrt(fan_in), embeddings N(0,1); the generator is seeded per parameter index, so the
    values do not depend on the module tree they land in."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed * SEED_STRIDE + index)
    values = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    if rule == "norm":
        return 1.0 + 0.1 * values
    if rule == "bias":
        return 0.1 * values
    if rule == "matrix":
        return values / math.sqrt(math.prod(shape[1:]))
    if rule == "embed":
        return values
    raise ValueError(f"unknown init rule {rule!r}")


# --- host side ---------------------------------------------------------------------------------
def locate_source(wheel: Path, scratch: Path) -> Path:
    """A directory holding ``hpsv3/inference.py``, from a wheel, an sdist or an unpacked tree."""
    if not wheel.exists():
        raise SystemExit(f"--official-wheel {wheel}: no such file or directory")
    if wheel.is_dir():
        root = wheel
    elif wheel.suffix == ".whl":
        root = scratch / "hpsv3-wheel"
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(root)
    elif wheel.name.endswith((".tar.gz", ".tgz")):
        root = scratch / "hpsv3-sdist"
        with tarfile.open(wheel) as tf:
            tf.extractall(root, filter="data")
    else:
        raise SystemExit(f"--official-wheel {wheel}: expected a .whl, a .tar.gz sdist or a directory")
    hits = sorted(p.parent.parent for p in root.glob("**/hpsv3/inference.py"))
    if not hits:
        raise SystemExit(f"--official-wheel {wheel}: no hpsv3/inference.py inside")
    return hits[0]


def install_wheels(wheels: Path, target: Path) -> Path:
    """``pip install --no-index --no-deps --target`` every wheel in ``wheels`` but hpsv3's (the
    official runtime's transformers 4.45.2, tokenizers, huggingface_hub): no network. Put before
    this venv's site-packages on the worker's path, they shadow transformers 5 and reuse its torch."""
    import subprocess

    files = sorted(str(w) for w in wheels.glob("*.whl") if not w.name.startswith("hpsv3-"))
    if not any(Path(f).name.startswith("transformers-4.") for f in files):
        raise SystemExit(f"--official-wheels {wheels}: no transformers-4.*.whl there (the official code pins 4.45.2)")
    import importlib.util

    if importlib.util.find_spec("pip") is None:  # a wheel is a zip laid out for site-packages
        for f in files:
            with zipfile.ZipFile(f) as zf:
                zf.extractall(target)
        return target
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", str(target), *files]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"--official-wheels {wheels}: pip install failed: {proc.stdout.strip().splitlines()[-1:]}")
    return target


def _env(pythonpath: Path | None) -> dict[str, str]:
    import os

    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), env.get("PYTHONPATH")) if p)
    return env


def preflight(python: str, pythonpath: Path | None) -> str | None:
    """Why the official environment cannot run the worker (None if it can): a missing Python,
    transformers 5 where the official code needs 4.45.2, a torch without the needed packages."""
    import subprocess

    def run(probe: str) -> tuple[int, str]:
        proc = subprocess.run([python, "-c", probe], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=_env(pythonpath), timeout=300)  # fmt: skip
        return proc.returncode, (proc.stdout.strip().splitlines() or ["?"])[-1][:200]

    try:  # the version from the package metadata first: no torch import for a quick refusal
        rc, version = run("import importlib.metadata as m; print(m.version('transformers'))")
    except FileNotFoundError:
        return f"--official-python {python}: not found"
    if rc != 0:
        return f"{python} has no transformers: {version}"
    if not version.startswith("4."):
        return (f"{python} has transformers {version}; the official code needs 4.45.2 "
                "(--official-wheels DIR with its wheel, or --official-python of an environment with it)")  # fmt: skip
    rc, last = run("import torch, transformers, safetensors, PIL, requests")
    return None if rc == 0 else f"{python} cannot import the official runtime: {last}"


def run_official(
    python: str, job: dict[str, Any], scratch: Path, timeout_s: float, pythonpath: Path | None = None
) -> dict[str, Any]:
    """Run the worker under ``python`` (``pythonpath`` first on its path) and return its JSON (or
    {"error": ...})."""
    import subprocess

    job_path, out_path = scratch / "official-job.json", scratch / "official-out.json"
    job_path.write_text(json.dumps(job), encoding="utf-8")
    cmd = [python, str(Path(__file__).resolve()), str(job_path), str(out_path)]
    env = _env(pythonpath)
    print(f"official code: {'PYTHONPATH=' + str(pythonpath) + ' ' if pythonpath else ''}{' '.join(cmd)}",
          file=sys.stderr, flush=True)  # fmt: skip
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout_s, env=env)
    except FileNotFoundError:
        return {"error": f"--official-python {python}: not found"}
    except subprocess.TimeoutExpired:
        return {"error": f"official worker timed out after {timeout_s:.0f}s"}
    sys.stderr.write("".join(f"  [official] {line}\n" for line in proc.stdout.splitlines()[-40:]))
    if proc.returncode != 0 or not out_path.is_file():
        last = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
        return {"error": f"official worker exited with {proc.returncode}: {last[0][:300]}"}
    return json.loads(out_path.read_text(encoding="utf-8"))


# --- worker side (runs under the official environment's Python) ----------------------------------
def _load_namespace(src: Path) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    from hpsv3_official_reference import official_namespace

    return official_namespace(src)


def _build(ns: dict[str, Any], job: dict[str, Any], attn: str) -> Any:
    import torch

    sys.path.insert(0, str(HERE))
    from hpsv3_official_reference import build_official_inferencer

    dtype = getattr(torch, job["dtype"])
    plan = {name: (int(k), rule) for name, k, rule in job["init_plan"]}
    seed, device = int(job["seed"]), job["device"]

    def random_weights(model: Any) -> None:
        params = dict(model.named_parameters())
        if set(params) != set(plan):
            missing, extra = sorted(set(plan) - set(params))[:5], sorted(set(params) - set(plan))[:5]
            raise SystemExit(f"official model's parameters differ from imagebench's: missing {missing}, extra {extra}")
        with torch.no_grad():
            for name, param in params.items():
                k, rule = plan[name]
                param.copy_(init_values(tuple(param.shape), k, rule, seed, param.device).to(param.dtype))

    return build_official_inferencer(ns, Path(job["base_dir"]), dtype, device, attn, random_weights)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _measure(inferencer: Any, job: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    device, paths, prompts = job["device"], job["paths"], job["prompts"]
    rows = []
    for bs in job["batch_sizes"]:
        row: dict[str, Any] = {"batch_size": bs}
        sel = [paths[i % len(paths)] for i in range(bs)]
        sel_p = [prompts[i % len(prompts)] for i in range(bs)]
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            with torch.inference_mode():
                batch = inferencer.prepare_batch(sel, sel_p)
                row["seq_len"] = int(batch["input_ids"].shape[1])
                for _ in range(job["warmup"]):
                    inferencer.model(return_dict=True, **batch)
                _sync(device)
                t0 = time.perf_counter()
                for _ in range(job["iters"]):
                    out = inferencer.model(return_dict=True, **batch)["logits"].float().cpu()
                _sync(device)
                dt = time.perf_counter() - t0
                row["forward_images_per_s"] = bs * job["iters"] / dt
                if device.startswith("cuda"):
                    row["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
                del batch, out
                n = max(job["e2e_batches"] * bs, bs)
                e_paths = [paths[i % len(paths)] for i in range(n)]
                e_prompts = [prompts[i % len(prompts)] for i in range(n)]
                inferencer.reward(e_paths[:bs], e_prompts[:bs])  # warm-up
                _sync(device)
                t0 = time.perf_counter()
                mus: list[float] = []
                for s in range(0, n, bs):
                    mus += inferencer.reward(e_paths[s : s + bs], e_prompts[s : s + bs])[:, 0].float().cpu().tolist()
                _sync(device)
                row["e2e_images"] = n
                row["e2e_images_per_s"] = n / (time.perf_counter() - t0)
                row["mu"] = mus[: len(paths)]
        except torch.cuda.OutOfMemoryError:
            row["forward"] = "OOM"
            torch.cuda.empty_cache()
        rows.append(row)
        print(f"official batch {bs}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items() if isinstance(v, float)), flush=True)
    return rows


def worker(job_path: Path, out_path: Path) -> None:
    import torch
    import transformers

    job = json.loads(job_path.read_text(encoding="utf-8"))
    major = int(transformers.__version__.split(".")[0])
    if major >= 5:
        raise SystemExit(
            f"the official code needs transformers 4.45.2, this Python has {transformers.__version__}: "
            "give --official-python of an environment with it"
        )
    if job["device"].startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"CUDA not available to the official environment (torch {torch.__version__})")
    ns = _load_namespace(Path(job["official_src"]))
    results = []
    for attn in job["attn"]:
        t0 = time.perf_counter()
        try:
            inferencer = _build(ns, job, attn)
        except Exception as exc:  # e.g. flash_attn missing from a separate official environment
            results.append({"attn": attn, "error": f"{type(exc).__name__}: {exc}"[:300], "rows": []})
            print(f"official model ({attn}) not built: {results[-1]['error']}", flush=True)
            continue
        print(f"official model built ({attn}) in {time.perf_counter() - t0:.1f}s", flush=True)
        results.append({"attn": attn, "rows": _measure(inferencer, job)})
        del inferencer
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    out_path.write_text(
        json.dumps({
            "source": job.get("source", job["official_src"]), "torch": torch.__version__,
            "transformers": transformers.__version__, "results": results,
        }),
        encoding="utf-8",
    )  # fmt: skip


if __name__ == "__main__":
    worker(Path(sys.argv[1]), Path(sys.argv[2]))
