"""Generate tests/tasks/hpsv3/official_outputs.json: mu/sigma from the OFFICIAL HPSv3 code.

Run by the tests on the machine under test (tests/tasks/hpsv3/official_runtime.py builds the
official runtime in its own venv under build/ and drives both steps); by hand:

    # 1. with the repo's venv: tiny base model + checkpoint (seed 0) + the test images as PNG
    .venv/bin/python bench/hpsv3_official_reference.py prepare /tmp/hpsv3-official
    # 2. in the official runtime (built by `.venv/bin/python -m tests.tasks.hpsv3.official_runtime`)
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
    build/hpsv3-official/<key>/venv/bin/python bench/hpsv3_official_reference.py official \\
        /tmp/hpsv3-official --hpsv3-src build/hpsv3-official/<key>/src --dtypes float32

`.venv/bin/python -m tests.tasks.hpsv3.official_runtime --write-fixture` does both and rewrites
the committed float32 fixture tests/tasks/hpsv3/official_outputs.json (float32 holds across
machines to 3.6e-7; bfloat16 does not, so the bf16 reference is made where the test runs).

The official code is used as published, with three documented departures, all outside the
arithmetic of the model:
- only the needed definitions are executed from the official files (``Qwen2VLRewardModelBT``,
  ``HPSv3RewardInferencer``, ``process_vision_info`` and helpers, the instruction text), read with
  ``ast``: importing the modules would pull in deepspeed/trl/peft/torchvision/pandas, used only
  for training and video;
- ``create_model_and_processor`` is replayed step by step (processor with right padding and
  ``<|Reward|>``, ``resize_token_embeddings``, ``model.to(bfloat16)``, ``rm_head.to(float32)``,
  ``load_state_dict(strict=True)``), but the model is built from its config rather than
  ``from_pretrained`` (the tiny base directory holds no weights; every weight comes from the
  checkpoint either way). Attention is "sdpa": flash-attention is not installed (as on CPU);
- ``rm_head`` runs under ``torch.autocast(device_type="cuda", dtype=float32)``, which does nothing
  on CPU, so a bfloat16 run crashes there (float32 weights, bfloat16 input). A forward pre-hook
  casts its input to float32: exactly what that autocast does on CUDA for ``nn.Linear``.
"""

from __future__ import annotations

import __future__
import argparse
import ast
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tasks.hpsv3.cpu is standard library only: the official runtime imports it too
from tasks.hpsv3.cpu import PINNED_CPU_CAPABILITY, PINNED_CPU_ENV, cpu_facts  # noqa: E402

SEED = 0
BATCHES = {"batch6": 6, "batch1": 1}  # all six images in one padded batch; each image alone
# bfloat16 results depend on the CPU kernels (ATen, oneDNN and MKL each pick theirs from the CPU;
# official bf16 moves by up to 7.3e-3 between machines), so both sides run the AVX2 kernels, which
# any x86-64 machine of the last decade has (PINNED_CPU_ENV, set before torch is imported).


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- step 1: the repo's venv -------------------------------------------------------------------
def prepare(out: Path) -> None:
    from tasks.hpsv3.tiny import write_tiny_base_model, write_tiny_checkpoint
    from tests.tasks.hpsv3.official_parity import parity_cases

    base = write_tiny_base_model(out / "tiny-qwen2vl")
    checkpoint = write_tiny_checkpoint(base, out / "HPSv3-tiny.safetensors", seed=SEED)
    (out / "images").mkdir(parents=True, exist_ok=True)
    cases = []
    for i, (png, prompt) in enumerate(parity_cases()):
        path = out / "images" / f"{i:02d}.png"
        path.write_bytes(png)
        cases.append({"image": path.name, "image_sha256": _sha256(path), "prompt": prompt})
    inputs = {
        "seed": SEED,
        "tokenizer_json_sha256": _sha256(base / "tokenizer.json"),
        "config_json_sha256": _sha256(base / "config.json"),
        "checkpoint_sha256": _sha256(checkpoint),
        "cases": cases,
    }
    (out / "inputs.json").write_text(json.dumps(inputs, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")


# --- step 2: the official runtime ----------------------------------------------------------------
def _exec_official(path: Path, names: set[str], namespace: dict[str, Any]) -> None:
    """Execute only the named top-level defs/assignments of an official source file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    body = [
        node
        for node in tree.body
        if (isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names)
        or (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in node.targets))
    ]
    found = {n.name if not isinstance(n, ast.Assign) else n.targets[0].id for n in body}  # type: ignore[union-attr]
    if found != names:
        raise SystemExit(f"{path}: not found: {sorted(names - found)}")
    code = compile(ast.Module(body=body, type_ignores=[]), str(path), "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)


def official_namespace(src: Path) -> dict[str, Any]:
    """The official definitions needed for inference, executed from the unpacked package ``src``
    (also used by bench/gpu_official.py)."""
    import math
    import os
    from collections.abc import Mapping
    from typing import List, Optional

    import requests
    import torch
    from PIL import Image
    from torch import nn
    from transformers import Qwen2VLForConditionalGeneration

    pkg = src / "hpsv3"
    ns: dict[str, Any] = {
        "math": math, "os": os, "torch": torch, "nn": nn, "Image": Image, "requests": requests,
        "Mapping": Mapping, "Optional": Optional, "List": List,
        "Qwen2VLForConditionalGeneration": Qwen2VLForConditionalGeneration,
    }  # fmt: skip
    _exec_official(
        pkg / "dataset" / "utils.py",
        {"IMAGE_FACTOR", "MIN_PIXELS", "MAX_PIXELS", "MAX_RATIO", "round_by_factor", "ceil_by_factor",
         "floor_by_factor", "smart_resize", "fetch_image", "extract_vision_info", "process_vision_info"},
        ns,
    )  # fmt: skip
    _exec_official(
        pkg / "dataset" / "data_collator_qwen.py",
        {"INSTRUCTION", "prompt_with_special_token", "prompt_without_special_token"},
        ns,
    )
    _exec_official(pkg / "model" / "qwen2vl_trainer.py", {"Qwen2VLRewardModelBT"}, ns)
    _exec_official(pkg / "inference.py", {"HPSv3RewardInferencer"}, ns)
    return ns


def build_official_inferencer(
    ns: dict[str, Any], base: Path, dtype: Any, device: str, attn: str, load_weights: Callable[[Any], None]
) -> Any:
    """``create_model_and_processor`` (train.py) with HPSv3_7B.yaml, step by step, the module tree
    built directly on ``device``; ``load_weights(model)`` stands for ``load_state_dict``."""
    import torch
    from transformers import AutoConfig, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(base), padding_side="right")
    processor.tokenizer.add_special_tokens({"additional_special_tokens": ["<|Reward|>"]})
    special_ids = processor.tokenizer.convert_tokens_to_ids(["<|Reward|>"])
    config = AutoConfig.from_pretrained(str(base))
    with torch.device(device):
        model = ns["Qwen2VLRewardModelBT"]._from_config(
            config, torch_dtype=dtype, attn_implementation=attn, output_dim=2, reward_token="special",
            special_token_ids=special_ids, rm_head_type="ranknet", rm_head_kwargs=None,
        )  # fmt: skip
        model.config.use_cache = False
        model.resize_token_embeddings(len(processor.tokenizer))
    if dtype == torch.bfloat16:  # training_args.bf16
        model.to(torch.bfloat16)
    model.rm_head.to(torch.float32)
    model.config.tokenizer_padding_side = processor.tokenizer.padding_side
    model.config.pad_token_id = processor.tokenizer.pad_token_id
    load_weights(model)
    model.eval()
    if device == "cpu":  # the CUDA-only autocast around rm_head, done by hand (module docstring)
        model.rm_head.register_forward_pre_hook(lambda _m, args: tuple(a.float() for a in args))
    inferencer = object.__new__(ns["HPSv3RewardInferencer"])
    inferencer.model, inferencer.processor, inferencer.device = model, processor, device
    inferencer.use_special_tokens = True
    return inferencer


def official(out: Path, src: Path, dtypes: tuple[str, ...] = ("bfloat16", "float32")) -> dict[str, Any]:
    import os

    import safetensors.torch
    import torch
    import transformers

    wrong = {k: os.environ.get(k) for k, v in PINNED_CPU_ENV.items() if os.environ.get(k) != v}
    if wrong or torch.backends.cpu.get_cpu_capability() != PINNED_CPU_CAPABILITY:
        raise SystemExit(f"run with {PINNED_CPU_ENV} on a CPU with {PINNED_CPU_CAPABILITY} (got {wrong})")
    ns = official_namespace(src)

    inputs = json.loads((out / "inputs.json").read_text(encoding="utf-8"))
    base, checkpoint = out / "tiny-qwen2vl", out / "HPSv3-tiny.safetensors"
    if _sha256(checkpoint) != inputs["checkpoint_sha256"]:
        raise SystemExit("checkpoint changed since prepare")
    paths = [str(out / "images" / c["image"]) for c in inputs["cases"]]
    prompts = [c["prompt"] for c in inputs["cases"]]
    state_dict = safetensors.torch.load_file(str(checkpoint), device="cpu")

    def build(dtype: torch.dtype) -> Any:
        # Attention is "sdpa": flash-attention is not installed (as on CPU).
        return build_official_inferencer(
            ns, base, dtype, "cpu", "sdpa", lambda model: model.load_state_dict(state_dict, strict=True)
        )

    runs: dict[str, Any] = {}
    for dtype_name in dtypes:
        inferencer = build(getattr(torch, dtype_name))
        runs[dtype_name] = {}
        for label, size in BATCHES.items():
            rows = []
            with torch.inference_mode():
                for start in range(0, len(paths), size):
                    out_t = inferencer.reward(paths[start : start + size], prompts[start : start + size])
                    rows += out_t.float().tolist()
            runs[dtype_name][label] = rows
    return {
        "generated_by": "bench/hpsv3_official_reference.py",
        "official": "hpsv3 1.0.0 (HPSv3RewardInferencer.reward, config HPSv3_7B.yaml)",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "device": "cpu",
        "cpu_env": PINNED_CPU_ENV,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "attention": "sdpa",
        "machine": cpu_facts(),
        "torch_threads": torch.get_num_threads(),
        "batches": BATCHES,
        "inputs": inputs,
        "mu_sigma": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["prepare", "official"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--hpsv3-src", type=Path, help="the unpacked hpsv3 1.0.0 wheel (step official)")
    parser.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated (step official)")
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.out)
    else:
        if args.hpsv3_src is None:
            parser.error("official needs --hpsv3-src")
        print(json.dumps(official(args.out, args.hpsv3_src, tuple(args.dtypes.split(","))), indent=1))


if __name__ == "__main__":
    main()
