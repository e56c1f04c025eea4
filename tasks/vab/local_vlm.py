"""A set of images to the local transformers judge (tasks/judges/transformers_backend.py): one chat
turn with every image of the trial, in the shown order, laid out as the prompt version says
(tasks.vab.prompts.message_parts). Same loading
(once per process), pixel pipeline and greedy decoding as the single-image judge; the model lock
serialises generation with the other users of the same model.
"""

from __future__ import annotations

from typing import Any

from tasks.judges.base import JudgeInputError, JudgeUnavailable, read_image
from tasks.judges.transformers_backend import IMAGE_PAD, TransformersJudge


def ask_local_set(judge: TransformersJudge, item: Any, parts: list) -> str:
    """Greedy answer of the judge's local VLM to the message ``parts`` (text, and image slots
    0-based in the shown order: tasks.vab.prompts.message_parts) about ``item``'s images."""
    import numpy as np
    import torch

    from tasks.hpsv3.preprocess import load_image, patchify, resize_for_hpsv3

    for path, sha in zip(item.image_paths, item.image_sha256, strict=True):  # sha256 and side checks
        read_image(path, sha, judge.name, judge.endpoint.max_image_side)
    try:
        vlm = judge._vlm()
    except JudgeUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - a model that cannot load takes the judge out
        raise JudgeUnavailable(
            f"transformers judge '{judge.name}': cannot load {judge.endpoint.model!r}: {type(exc).__name__}: {exc}",
            retryable=False, judge_down=True,
        ) from exc
    pixels, grids, n_tokens = [], [], []
    for path in item.image_paths:
        try:
            pv, grid = patchify(resize_for_hpsv3(load_image(path), vlm.vision), vlm.vision)
        except (OSError, ValueError) as exc:
            raise JudgeInputError(f"image {path}: {exc}") from exc
        pixels.append(pv)
        grids.append(grid)
        n_tokens.append(grid[0] * grid[1] * grid[2] // (vlm.vision.merge_size**2))
    slots = [p for p in parts if not isinstance(p, str)]
    if slots != list(range(item.n)):  # the pixels are concatenated in shown order
        raise JudgeInputError(f"message names image slots {slots}, expected 0..{item.n - 1} in order")
    content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in parts]
    prompt = vlm.tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], chat_template=vlm.chat_template, tokenize=False, add_generation_prompt=True
    )
    parts = prompt.split(IMAGE_PAD)
    if len(parts) != item.n + 1:
        raise JudgeInputError(f"chat template produced {len(parts) - 1} image pads, expected {item.n}")
    prompt = parts[0] + "".join(IMAGE_PAD * k + rest for k, rest in zip(n_tokens, parts[1:], strict=True))
    tok = vlm.tokenizer
    enc = tok([prompt], return_tensors="pt", add_special_tokens=True)
    with vlm.lock, torch.no_grad():
        out = vlm.model.generate(
            input_ids=enc["input_ids"].to(vlm.device),
            attention_mask=enc["attention_mask"].to(vlm.device),
            pixel_values=torch.from_numpy(np.concatenate(pixels)).to(vlm.device, vlm.dtype),
            image_grid_thw=torch.tensor(grids, dtype=torch.long, device=vlm.device),
            max_new_tokens=judge.endpoint.max_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
    new = out[0, enc["input_ids"].shape[1]:].tolist()
    eos = {tok.eos_token_id, tok.pad_token_id} - {None}
    n = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
    return tok.decode(new[:n], skip_special_tokens=True)
