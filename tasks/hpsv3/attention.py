"""Attention called exactly as transformers 4.45 called it for Qwen2-VL (the official HPSv3 runtime).

Same maths, different calls, different bits: in bfloat16 the CPU (and CUDA) kernels behind
``scaled_dot_product_attention`` are chosen by the tensors' rank, the mask and the flags, and two
kernels round differently. transformers 5 calls the vision attention per image with 4-D
``[1, heads, L, d]`` tensors and no mask, and the text attention with grouped-query heads left
unexpanded (``enable_gqa``) and an explicit ``scale``. 4.45 (measured against hpsv3 1.0.0 on a
tiny checkpoint, docs/HPSV3.md) calls:

- vision, "sdpa": once for the whole batch with 3-D ``[heads, L, d]`` tensors and a boolean
  ``[1, L, L]`` block-diagonal mask (one block per image); "flash_attention_2":
  ``flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len)`` on ``[L, heads, d]``.
  In bfloat16 both calls are needed for the official bits: per-image 3-D calls still differ by
  5e-3 in mu on a six-image batch. In float32 every call agrees to float32 rounding (2.5e-7), so
  float32 keeps transformers 5's per-image 4-D call: the 3-D call and the whole-batch mask
  (O(batch^2) work) make the CPU vision attention ~8x slower;
- text, "sdpa": key/value heads expanded with ``repeat_kv``, no ``scale`` argument, ``is_causal``
  when there is no mask, else an additive float mask (0 / dtype min) and contiguous q/k/v on CUDA;
  "flash_attention_2": transformers' flash-attention path with the padding mask.

The official ``train.py`` picks "flash_attention_2" whenever ``flash_attn`` imports, else "sdpa";
:func:`choose_attention` applies that rule on CUDA (flash-attention has no CPU kernels).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

AttentionImpl = Literal["sdpa", "flash_attention_2"]
# Registered with transformers' attention and mask interfaces for the text model.
TEXT_SDPA_445 = "imagebench_sdpa_445"


def choose_attention(device: torch.device) -> AttentionImpl:
    """The official rule (hpsv3 train.py): flash-attention 2 when installed, else SDPA."""
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def block_diagonal_mask(cu_seqlens: torch.Tensor, length: int, device: torch.device) -> torch.Tensor:
    """Boolean ``[1, L, L]``: True inside each image's block (4.45 VisionSdpaAttention)."""
    mask = torch.zeros([1, length, length], device=device, dtype=torch.bool)
    bounds = cu_seqlens.tolist()
    for start, stop in zip(bounds[:-1], bounds[1:]):
        mask[..., start:stop, start:stop] = True
    return mask


class OfficialVisionAttention(nn.Module):
    """Replaces transformers 5's ``VisionAttention`` in every vision block, reusing its ``qkv`` and
    ``proj`` (same state-dict keys); the rotary step is transformers 5's, which already matches."""

    def __init__(self, original: nn.Module, impl: AttentionImpl) -> None:
        super().__init__()
        self.qkv = original.qkv
        self.proj = original.proj
        self.num_heads = int(original.num_heads)
        self.impl = impl

    def forward(
        self,
        hidden_states: torch.Tensor,
        cu_seqlens: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb_vision

        if position_embeddings is None:
            raise ValueError("vision attention needs position_embeddings")
        length = hidden_states.shape[0]
        q, k, v = self.qkv(hidden_states).reshape(length, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)  # [L, heads, d]
        if self.impl == "flash_attention_2":
            from flash_attn import flash_attn_varlen_func

            max_len = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
            out = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len)
        elif q.dtype == torch.float32:
            # float32: transformers 5's per-image 4-D call. Agrees with the official float32 run
            # to 2.5e-7 either way, and the 3-D call is ~8x slower on CPU (math kernel).
            bounds = cu_seqlens.tolist()
            outs = [
                F.scaled_dot_product_attention(
                    q[a:b].transpose(0, 1)[None], k[a:b].transpose(0, 1)[None], v[a:b].transpose(0, 1)[None],
                    dropout_p=0.0, scale=q.shape[-1] ** -0.5,
                )[0].transpose(0, 1)
                for a, b in zip(bounds[:-1], bounds[1:])
            ]  # fmt: skip
            out = torch.cat(outs)
        else:
            mask = block_diagonal_mask(cu_seqlens, length, q.device)
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), mask, dropout_p=0.0
            ).transpose(0, 1)
        return self.proj(out.reshape(length, -1))


def _repeat_kv(hidden: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, kv_heads, length, dim = hidden.shape
    if n_rep == 1:
        return hidden
    return hidden[:, :, None, :, :].expand(batch, kv_heads, n_rep, length, dim).reshape(batch, kv_heads * n_rep, length, dim)


def text_sdpa_445(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """4.45 ``Qwen2VLSdpaAttention``'s call; returns ``[B, L, heads, d]`` as transformers 5 expects."""
    n_rep = int(getattr(module, "num_key_value_groups", 1))
    key, value = _repeat_kv(key, n_rep), _repeat_kv(value, n_rep)
    mask = attention_mask
    if mask is not None:
        if mask.dtype == torch.bool:  # 4.45's additive mask: 0 where attended, dtype min elsewhere
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                ~mask, torch.finfo(query.dtype).min
            )
        mask = mask[:, :, :, : key.shape[-2]]
        if query.device.type == "cuda":
            query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
    is_causal = mask is None and query.shape[2] > 1
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, is_causal=is_causal)
    return out.transpose(1, 2).contiguous(), None


def register_text_sdpa_445() -> None:
    """Make ``TEXT_SDPA_445`` a valid ``attn_implementation`` (idempotent; masks as "sdpa")."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(TEXT_SDPA_445, text_sdpa_445)
    ALL_MASK_ATTENTION_FUNCTIONS.register(TEXT_SDPA_445, sdpa_mask)


def install_official_attention(model: nn.Module, impl: AttentionImpl) -> None:
    """Swap the vision attention modules (call before ``to_empty``: no weights move) and point the
    text model at the 4.45 call for ``impl``."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import VisionAttention

    swapped = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, VisionAttention):
            parent_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent_name), attr, OfficialVisionAttention(module, impl))
            swapped += 1
    if swapped == 0:  # a transformers upgrade renamed the class: fail rather than run its own call
        raise RuntimeError("no Qwen2-VL VisionAttention module found to replace")
    if impl == "sdpa":
        register_text_sdpa_445()
        text_impl = TEXT_SDPA_445
    else:
        text_impl = impl
    text_model = model.get_submodule("vlm.model.language_model")
    text_model.config._attn_implementation = text_impl
