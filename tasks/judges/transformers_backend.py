"""Judge backend: a local Qwen2-VL-family VLM with transformers 5 (for users without a server).

- The model is loaded once per process (:func:`load_local_vlm` is cached on model, device, dtype).
- Inputs are built here, like ``tasks/hpsv3/model.py`` does (transformers 5 cannot build
  ``Qwen2VLProcessor`` without torchvision): pixels from ``tasks.hpsv3.preprocess`` (smart_resize
  within the model's processor bounds, capped at :data:`JUDGE_MAX_PIXELS`), text from the
  tokenizer's chat template with the image pad expanded to the image's token count.
- Generation is greedy (``do_sample=False``) and batched: concurrent :meth:`ask` calls are
  gathered into batches of up to ``endpoint.concurrency`` requests, left-padded, and run in a
  worker thread so the event loop keeps serving the HTTP judges meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from schemas.judges import Endpoint

from .base import Judge, JudgeAnswer, JudgeError, JudgeInputError, JudgeRequest, JudgeUnavailable, read_image

SUPPORTED_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
IMAGE_PAD = "<|image_pad|>"
JUDGE_MAX_PIXELS = 1024 * 28 * 28  # about 1024 visual tokens per image


@dataclass
class LocalVLM:
    model: Any
    tokenizer: Any
    chat_template: str
    vision: Any  # tasks.hpsv3.preprocess.VisionPreprocessConfig
    device: Any
    dtype: Any
    name_or_path: str
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def _resolve_model_dir(model: str) -> Path:
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=model))
    except Exception as exc:
        raise JudgeUnavailable(
            f"transformers judge model {model!r}: not a local directory, and fetching it from the Hugging Face hub "
            f"failed ({type(exc).__name__}: {exc})",
            retryable=False,
            judge_down=True,
        ) from exc


@functools.lru_cache(maxsize=2)
def load_local_vlm(model: str, device: str = "auto", dtype: str = "auto") -> LocalVLM:
    """Load (once per process) a Qwen2-VL-family model dir or HF id for generation."""
    import json

    import torch
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from tasks.hpsv3.model import load_chat_template, resolve_device, resolve_dtype
    from tasks.hpsv3.preprocess import VisionPreprocessConfig

    model_dir = _resolve_model_dir(model)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise JudgeUnavailable(
            f"transformers judge model {model!r}: no config.json in {model_dir}", retryable=False, judge_down=True
        )
    model_type = json.loads(config_path.read_text(encoding="utf-8")).get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise JudgeUnavailable(
            f"transformers judge model {model!r} is a {model_type!r}; supported: {list(SUPPORTED_MODEL_TYPES)} (Qwen2-VL family)",
            retryable=False,
            judge_down=True,
        )
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), padding_side="left")
    tokenizer.padding_side = "left"  # generation continues from the last position of every row
    if tokenizer.pad_token_id is None:
        raise JudgeUnavailable(
            f"transformers judge model {model!r}: tokenizer has no pad token", retryable=False, judge_down=True
        )
    chat_template = load_chat_template(model_dir, tokenizer)
    vision = VisionPreprocessConfig.from_preprocessor_config(model_dir)
    vision = dataclasses.replace(
        vision,
        min_pixels=vision.processor_min_pixels,
        max_pixels=max(vision.processor_min_pixels, min(vision.processor_max_pixels, JUDGE_MAX_PIXELS)),
    )
    # use_safetensors=True: weights from *.safetensors only, never a pickled pytorch_model.bin.
    vlm = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=dt, use_safetensors=True).to(dev).eval()
    torch.set_grad_enabled(False)
    return LocalVLM(vlm, tokenizer, chat_template, vision, dev, dt, str(model))


def _encode(vlm: LocalVLM, request: JudgeRequest) -> tuple[str, Any, tuple[int, int, int]]:
    from tasks.hpsv3.preprocess import load_image, patchify, resize_for_hpsv3

    with_pad = request.template.render(request.prompt, request.question)
    if IMAGE_PAD in with_pad or "<|vision_start|>" in with_pad:
        raise JudgeInputError("prompt or question contains reserved image token text")
    image = resize_for_hpsv3(load_image(request.image_path), vlm.vision)
    pixel_values, grid = patchify(image, vlm.vision)
    n_tokens = grid[0] * grid[1] * grid[2] // (vlm.vision.merge_size**2)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": with_pad}]}]
    text = vlm.tokenizer.apply_chat_template(
        messages, chat_template=vlm.chat_template, tokenize=False, add_generation_prompt=True
    )
    if text.count(IMAGE_PAD) != 1:
        raise JudgeInputError(f"chat template produced {text.count(IMAGE_PAD)} image pads, expected 1")
    return text.replace(IMAGE_PAD, IMAGE_PAD * n_tokens), pixel_values, grid


def _generate(
    vlm: LocalVLM, encoded: Sequence[tuple[str, Any, tuple[int, int, int]]], max_new_tokens: int
) -> list[tuple[str, int, int]]:
    import numpy as np
    import torch

    tok = vlm.tokenizer
    enc = tok([e[0] for e in encoded], padding=True, return_tensors="pt", add_special_tokens=True)
    pixel_values = torch.from_numpy(np.concatenate([e[1] for e in encoded])).to(vlm.device, vlm.dtype)
    grid = torch.tensor([e[2] for e in encoded], dtype=torch.long, device=vlm.device)
    with vlm.lock, torch.no_grad():
        out = vlm.model.generate(
            input_ids=enc["input_ids"].to(vlm.device),
            attention_mask=enc["attention_mask"].to(vlm.device),
            pixel_values=pixel_values,
            image_grid_thw=grid,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
    length = enc["input_ids"].shape[1]
    eos = {tok.eos_token_id, tok.pad_token_id} - {None}
    results = []
    for row in range(out.shape[0]):
        new = out[row, length:].tolist()
        n = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
        results.append((tok.decode(new[:n], skip_special_tokens=True), int(enc["attention_mask"][row].sum()), n))
    return results


def _generate_oom_safe(vlm: LocalVLM, encoded: Sequence[Any], max_new_tokens: int) -> list[tuple[str, int, int]]:
    """On CUDA out-of-memory, split the batch in halves (down to single items)."""
    import torch

    try:
        return _generate(vlm, encoded, max_new_tokens)
    except torch.cuda.OutOfMemoryError:
        if len(encoded) <= 1:
            raise
        torch.cuda.empty_cache()
        half = len(encoded) // 2
        return _generate_oom_safe(vlm, encoded[:half], max_new_tokens) + _generate_oom_safe(
            vlm, encoded[half:], max_new_tokens
        )


def generate_batch(
    vlm: LocalVLM, requests: Sequence[JudgeRequest], max_new_tokens: int
) -> list[tuple[str, int, int] | JudgeError]:
    """Greedy generation for a batch, in input order: ``(text, prompt_tokens, completion_tokens)``
    per request, or the JudgeInputError of a request whose inputs cannot be built."""
    encoded: list[Any] = []
    for r in requests:
        try:
            encoded.append(_encode(vlm, r))
        except JudgeInputError as exc:
            encoded.append(exc)
        except (OSError, ValueError) as exc:  # undecodable image, aspect ratio the processor refuses
            encoded.append(JudgeInputError(f"image {r.image_path}: {exc}"))
    ok = [i for i, e in enumerate(encoded) if not isinstance(e, JudgeError)]
    results: list[Any] = list(encoded)
    if ok:
        for i, out in zip(ok, _generate_oom_safe(vlm, [encoded[i] for i in ok], max_new_tokens), strict=True):
            results[i] = out
    return results


class TransformersJudge(Judge):
    backend = "transformers"

    def __init__(self, name: str, endpoint: Endpoint, *, device: str = "auto", dtype: str = "auto") -> None:
        super().__init__(name, endpoint)
        self.device, self.dtype = device, dtype
        self._pending: list[tuple[JudgeRequest, asyncio.Future]] = []
        self._worker: asyncio.Task | None = None

    @property
    def endpoint_label(self) -> str:
        return "local:transformers"

    def _vlm(self) -> LocalVLM:
        return load_local_vlm(self.endpoint.model, self.device, self.dtype)

    async def ask(self, request: JudgeRequest) -> JudgeAnswer:
        # Same input checks as the HTTP judge (sha256, decodable, side limit); nothing runs otherwise.
        await asyncio.to_thread(
            read_image, request.image_path, request.image_sha256, self.name, self.endpoint.max_image_side
        )
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append((request, fut))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # let the requests gathered in this loop iteration queue up
        try:
            vlm = await asyncio.to_thread(self._vlm)
        except Exception as exc:
            err = (
                exc
                if isinstance(exc, JudgeUnavailable)
                else JudgeUnavailable(
                    f"transformers judge '{self.name}': cannot load {self.endpoint.model!r}: {type(exc).__name__}: {exc}",
                    retryable=False,
                    judge_down=True,
                )
            )
            pending, self._pending = self._pending, []
            for _, fut in pending:
                if not fut.done():
                    fut.set_exception(err)
            return
        while self._pending:
            n = self.endpoint.concurrency
            batch, self._pending = self._pending[:n], self._pending[n:]
            t0 = time.perf_counter()
            try:
                results = await asyncio.wait_for(
                    asyncio.to_thread(generate_batch, vlm, [r for r, _ in batch], self.endpoint.max_tokens),
                    self.endpoint.timeout_s * len(batch),
                )
            except asyncio.TimeoutError:
                err: JudgeError = JudgeUnavailable(f"transformers judge '{self.name}': generation timed out")
                results = [err] * len(batch)
            except Exception as exc:  # e.g. OOM on a single item
                err = JudgeUnavailable(
                    f"transformers judge '{self.name}': {type(exc).__name__}: {exc}", retryable=False
                )
                results = [err] * len(batch)
            latency = time.perf_counter() - t0  # the batch's wall time: what each request waited
            for (_, fut), res in zip(batch, results, strict=True):
                if fut.done():
                    continue
                if isinstance(res, JudgeError):
                    fut.set_exception(res)
                else:
                    text, prompt_tokens, completion_tokens = res
                    fut.set_result(JudgeAnswer(text, vlm.name_or_path, latency, prompt_tokens, completion_tokens))
