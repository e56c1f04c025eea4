"""HPSv3 reward model on transformers 5: construction, strict checkpoint loading, tokenisation.

What the official code (hpsv3 1.0.0, transformers 4.45.2) computes, and what this module mirrors:
- ``Qwen2VLRewardModelBT.forward`` embeds the tokens, runs the vision tower, scatters the image
  embeddings into the ``<|Reward|>``-free image-pad positions, and runs the *text* model with
  ``position_ids=None``: plain 1-D positions 0..L-1 on all three M-RoPE axes (Qwen2-VL's 3-D image
  positions are not used). ``rm_head`` runs in float32 and is read at the ``<|Reward|>`` token.
- The official loader calls ``model.to(torch.bfloat16)``, which also rounds the rotary ``inv_freq``
  buffers to bfloat16 (``nn.Module.to`` casts floating buffers; see transformers issue #30709).
  The text RoPE then multiplies positions by the rounded frequencies in float32, and the 4.45
  vision RoPE builds its angles *and* their cos/sin in bfloat16. HPSv3 was trained and published
  with that arithmetic, so ``rope_mode="official"`` (the default) reproduces it on any dtype.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from .attention import AttentionImpl, choose_attention, install_official_attention
from .preprocess import PreprocessedImage, VisionPreprocessConfig

REWARD_TOKEN = "<|Reward|>"
IMAGE_PAD_TOKEN = "<|image_pad|>"
# Text that must never come from a prompt: it would add a reward position or image slots (the
# 4.45 processor also rewrites "<|placeholder|>" into image pads while expanding them).
FORBIDDEN_PROMPT_SUBSTRINGS = (
    REWARD_TOKEN,
    IMAGE_PAD_TOKEN,
    "<|video_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|placeholder|>",
)
CHECKPOINT_FILENAME = "HPSv3.safetensors"
# safetensors header metadata that marks demo/random weights (written by tiny.write_tiny_checkpoint)
UNCALIBRATED_METADATA_KEY = "imagebench.uncalibrated"
RM_HEAD_DROPOUT = 0.05
# Files fetched for an HF base model id: config, tokenizer, processor, chat template. Never weights.
BASE_MODEL_ALLOW_PATTERNS = [
    "config.json",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
    "chat_template.jinja",
]

RopeMode = Literal["official", "float32"]
ROPE_MODES: tuple[RopeMode, ...] = ("official", "float32")


def check_rope_mode(rope_mode: str) -> RopeMode:
    if rope_mode not in ROPE_MODES:
        raise ValueError(f"rotary mode must be one of {', '.join(ROPE_MODES)}, got {rope_mode!r}")
    return rope_mode  # type: ignore[return-value]


class CheckpointLayoutError(ValueError):
    """The checkpoint's keys or shapes are not those of an official HPSv3 checkpoint for this base."""


class ModelSourceNotFoundError(FileNotFoundError):
    """A base model or checkpoint could not be found locally nor fetched."""


# --- instruction text (MIT, from hpsv3 1.0.0; see LICENSE-HPSv3.txt) ---------------------------
def _package_text(name: str) -> str:
    # bytes -> str with no newline translation: the text must stay byte-identical to the official one
    return (resources.files(__package__) / name).read_bytes().decode("utf-8")


INSTRUCTION_TEMPLATE: str = _package_text("instruction.txt")  # keeps "{text_prompt}"
REWARD_SUFFIX: str = _package_text("reward_suffix.txt")


def hpsv3_user_text(prompt: str) -> str:
    """The text block of the user turn, exactly as the official collator builds it."""
    return INSTRUCTION_TEMPLATE.format(text_prompt=prompt) + REWARD_SUFFIX


# --- key mapping: official (transformers 4.45) <-> this module ---------------------------------
# Official: model.* = text model, visual.*, lm_head.*, rm_head.*. Here the transformers-5
# Qwen2VLForConditionalGeneration lives under ``vlm``: vlm.model.language_model.*, vlm.model.visual.*
_KEY_PREFIXES: tuple[tuple[str, str], ...] = (
    ("model.", "vlm.model.language_model."),
    ("visual.", "vlm.model.visual."),
    ("lm_head.", "vlm.lm_head."),
    ("rm_head.", "rm_head."),
)


def official_to_internal(key: str) -> str | None:
    """Official checkpoint key -> this module's state_dict key (None if no prefix matches)."""
    for official, internal in _KEY_PREFIXES:
        if key.startswith(official):
            return internal + key[len(official) :]
    return None


def internal_to_official(key: str) -> str | None:
    """This module's state_dict key -> official checkpoint key (None if no prefix matches)."""
    for official, internal in _KEY_PREFIXES:
        if key.startswith(internal):
            return official + key[len(internal) :]
    return None


# --- model ---------------------------------------------------------------------------------
def make_rm_head(hidden_size: int) -> nn.Sequential:
    """The official "ranknet" head with rm_head_kwargs=None, output_dim=2; float32."""
    return nn.Sequential(
        nn.Linear(hidden_size, 1024, dtype=torch.float32),
        nn.ReLU(),
        nn.Dropout(RM_HEAD_DROPOUT),
        nn.Linear(1024, 16, dtype=torch.float32),
        nn.ReLU(),
        nn.Linear(16, 2, dtype=torch.float32),
    )


class HPSv3RewardModel(nn.Module):
    """Qwen2-VL backbone + float32 ``rm_head``; ``forward`` returns [B, 2] = (mu, sigma)."""

    def __init__(self, vlm: nn.Module, reward_token_id: int, image_token_id: int) -> None:
        super().__init__()
        self.vlm = vlm
        self.rm_head = make_rm_head(vlm.config.text_config.hidden_size)
        self.reward_token_id = int(reward_token_id)
        self.image_token_id = int(image_token_id)
        self.attention_impl = "sdpa"  # set by build_reward_model_meta

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values: torch.Tensor,
        image_grid_thw: torch.Tensor,
    ) -> torch.Tensor:
        reward_mask = input_ids == self.reward_token_id
        per_row = reward_mask.sum(dim=1)
        if bool((per_row != 1).any()):
            raise ValueError(f"each row needs exactly one {REWARD_TOKEN} token, got counts {per_row.tolist()}")
        inner = self.vlm.model
        text_model = inner.language_model
        embeds = text_model.embed_tokens(input_ids)
        visual = inner.visual
        image_embeds = visual(pixel_values.to(visual.dtype), grid_thw=image_grid_thw).pooler_output
        image_mask = input_ids == self.image_token_id
        if int(image_mask.sum()) != image_embeds.shape[0]:
            raise ValueError(
                f"{int(image_mask.sum())} image tokens in the text but {image_embeds.shape[0]} image embeddings"
            )
        embeds = embeds.masked_scatter(
            image_mask.unsqueeze(-1).expand_as(embeds), image_embeds.to(embeds.device, embeds.dtype)
        )
        # Right padding + causal attention: no real token can see a pad (pads come after it), so the
        # padding mask cannot change any token we read. Dropping it lets sdpa take its causal kernel
        # instead of materialising a [B, 1, L, L] mask (4x faster on CPU, same values).
        # flash-attention 2 keeps the mask: 4.45 unpads by it (varlen kernel), as here.
        flash = self.attention_impl == "flash_attention_2"
        text_mask = None if _is_right_padded(attention_mask) and not flash else attention_mask
        # position_ids=None: 1-D positions on all M-RoPE axes, exactly the official call.
        hidden = text_model(
            inputs_embeds=embeds, attention_mask=text_mask, position_ids=None, use_cache=False
        ).last_hidden_state
        positions = reward_mask.int().argmax(dim=1)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        # rm_head is row-wise, so reading the reward position first gives the official values.
        return self.rm_head(hidden[rows, positions].float())


def _is_right_padded(attention_mask: torch.Tensor) -> bool:
    """Every row is 1...1 0...0 with at least one 1."""
    mask = attention_mask.bool()
    return bool(mask[:, 0].all()) and bool((mask[:, 1:] <= mask[:, :-1]).all())


class _OfficialVisionRotary(nn.Module):
    """Vision RoPE with the arithmetic of transformers 4.45 after ``model.to(bfloat16)``: angles
    = bf16(position) * bf16(inv_freq) rounded to bf16, cos/sin evaluated on them in bf16."""

    def __init__(self, inv_freq: torch.Tensor) -> None:
        super().__init__()
        self.inv_freq = nn.Buffer(inv_freq.to(torch.bfloat16).float(), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = position_ids[..., None].to(torch.bfloat16) * self.inv_freq.to(x.device, torch.bfloat16)
        cos, sin = angles.cos().float(), angles.sin().float()  # [N, 2, d/4]
        return self._recompose(cos), self._recompose(sin)

    @staticmethod
    def _recompose(freq: torch.Tensor) -> torch.Tensor:
        # Same layout as transformers' Qwen2VLVisionRotaryEmbedding: [h, w, h, w] along the head dim.
        freq_hw = torch.cat([freq[:, 0], freq[:, 1]], dim=-1)
        return torch.cat([freq_hw, freq_hw], dim=-1)


def build_reward_model_meta(
    config: Any, reward_token_id: int, dtype: torch.dtype, attention: AttentionImpl = "sdpa"
) -> HPSv3RewardModel:
    """The module tree on the meta device: no memory, no random init. Shapes only. Attention is
    called as transformers 4.45 called it (tasks/hpsv3/attention.py)."""
    from transformers import Qwen2VLForConditionalGeneration

    with torch.device("meta"):
        vlm = Qwen2VLForConditionalGeneration._from_config(config, dtype=dtype, attn_implementation=attention)
        model = HPSv3RewardModel(vlm, reward_token_id=reward_token_id, image_token_id=config.image_token_id)
    install_official_attention(model, attention)
    model.attention_impl = attention
    return model


def materialize_(model: HPSv3RewardModel, device: torch.device, rope_mode: RopeMode = "official") -> HPSv3RewardModel:
    """Allocate (uninitialised) storage on ``device`` and compute the rotary buffers. Every weight
    must then come from a checkpoint."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import (
        Qwen2VLRotaryEmbedding,
        Qwen2VLVisionRotaryEmbedding,
    )

    check_rope_mode(rope_mode)
    buffers_before = {name for name, _ in model.named_buffers()}
    model.to_empty(device=device)
    done: set[str] = set()
    for name, module in list(model.named_modules()):
        prefix = f"{name}." if name else ""
        if isinstance(module, Qwen2VLRotaryEmbedding):
            with torch.device("cpu"):
                fresh = Qwen2VLRotaryEmbedding(module.config)
            inv = fresh.inv_freq
            if rope_mode == "official":
                inv = inv.to(torch.bfloat16).float()
            module.inv_freq = inv.to(device)
            module.original_inv_freq = inv.clone().to(device)
            done |= {prefix + "inv_freq", prefix + "original_inv_freq"}
        elif isinstance(module, Qwen2VLVisionRotaryEmbedding):
            with torch.device("cpu"):
                fresh = Qwen2VLVisionRotaryEmbedding(module.config)
            if rope_mode == "official":
                parent_name, _, attr = name.rpartition(".")
                setattr(model.get_submodule(parent_name), attr, _OfficialVisionRotary(fresh.inv_freq).to(device))
            else:
                module.inv_freq = fresh.inv_freq.to(device)
                module.original_inv_freq = fresh.inv_freq.clone().to(device)
            done |= {prefix + "inv_freq", prefix + "original_inv_freq"}
    left = buffers_before - done
    if left:  # a transformers upgrade added a buffer we would leave as uninitialised memory
        raise RuntimeError(f"unhandled buffers after to_empty: {sorted(left)}")
    for module in model.rm_head:
        if isinstance(module, nn.Linear):
            module.float()
    return model.eval()


# --- checkpoint ------------------------------------------------------------------------------
def expected_checkpoint_layout(model: HPSv3RewardModel) -> dict[str, tuple[int, ...]]:
    """Official key -> shape that a checkpoint for this model must hold (works on meta models)."""
    layout: dict[str, tuple[int, ...]] = {}
    for key, tensor in model.state_dict().items():
        official = internal_to_official(key)
        if official is None:
            raise RuntimeError(f"model key {key!r} has no official name")
        layout[official] = tuple(tensor.shape)
    return layout


SAFETENSORS_REQUIRED = "safetensors is required: only .safetensors checkpoints are accepted (never pickle)"


def _require_safetensors(path: Path) -> None:
    if path.suffix != ".safetensors":
        raise CheckpointLayoutError(f"{path}: {SAFETENSORS_REQUIRED}")


def read_checkpoint_header(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Key -> shape from the safetensors header, without reading any tensor data."""
    from safetensors import safe_open

    path = Path(path)
    _require_safetensors(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    except Exception as exc:  # SafetensorError, OSError: not a readable safetensors file (a pickle renamed?)
        raise CheckpointLayoutError(f"{path}: not a readable safetensors file ({exc}); {SAFETENSORS_REQUIRED}") from exc


def checkpoint_is_uncalibrated(path: str | Path) -> bool:
    """True if the checkpoint's safetensors metadata flags it as demo/random weights."""
    from safetensors import safe_open

    path = Path(path)
    _require_safetensors(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
    except Exception as exc:
        raise CheckpointLayoutError(f"{path}: not a readable safetensors file ({exc}); {SAFETENSORS_REQUIRED}") from exc
    return metadata.get(UNCALIBRATED_METADATA_KEY, "").lower() == "true"


def _listing(title: str, keys: Sequence[str], limit: int = 20) -> str:
    shown = "\n".join(f"    {k}" for k in keys[:limit])
    more = f"\n    ... and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"  {title} ({len(keys)}):\n{shown}{more}"


def check_checkpoint_layout(
    expected: Mapping[str, tuple[int, ...]], found: Mapping[str, tuple[int, ...]], source: str
) -> None:
    """Raise CheckpointLayoutError naming missing keys, unexpected keys and shape mismatches."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    mismatched = sorted(
        f"{k}: checkpoint {list(found[k])} != model {list(expected[k])}"
        for k in set(expected) & set(found)
        if tuple(found[k]) != tuple(expected[k])
    )
    if not (missing or unexpected or mismatched):
        return
    parts = [f"{source}: not an official HPSv3 checkpoint layout for this base model"]
    if missing:
        parts.append(_listing("missing keys", missing))
    if unexpected:
        parts.append(_listing("unexpected keys", unexpected))
    if mismatched:
        parts.append(_listing("shape mismatches", mismatched))
    if any(k.startswith(("model.language_model.", "model.visual.")) for k in unexpected):
        parts.append(
            "  hint: keys named model.language_model.* / model.visual.* are the transformers-5 layout; "
            "the official checkpoint uses model.* (text) and visual.*"
        )
    raise CheckpointLayoutError("\n".join(parts))


@torch.no_grad()
def load_checkpoint_strict(model: HPSv3RewardModel, path: str | Path) -> None:
    """Check the header against the model, then copy tensor by tensor (peak: model + one tensor)."""
    from safetensors import safe_open

    path = Path(path)
    check_checkpoint_layout(expected_checkpoint_layout(model), read_checkpoint_header(path), str(path))
    targets = model.state_dict(keep_vars=True)
    with safe_open(str(path), framework="pt", device="cpu") as f:
        for key in f.keys():
            target = targets[official_to_internal(key)]  # type: ignore[index]
            if target.device.type == "meta":
                raise RuntimeError("materialize_() the model before loading weights")
            target.copy_(f.get_tensor(key))


# --- base model and checkpoint resolution -----------------------------------------------------
def _looks_like_path(name: str) -> bool:
    """An HF id is ``name`` or ``owner/name``; anything else is meant as a local path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name or name.endswith(".safetensors")


def resolve_base_model(base_model: str | Path) -> Path:
    """A local HF-layout directory, or an HF id whose config/tokenizer/processor files are fetched
    with snapshot_download (honours HF_HOME / HF_HUB_OFFLINE). Weight files are never needed."""
    path = Path(base_model).expanduser()
    if path.is_dir():
        found = path
    elif path.exists() or _looks_like_path(str(base_model)):
        raise ModelSourceNotFoundError(f"base model directory not found: {base_model}")
    else:
        try:
            from huggingface_hub import snapshot_download

            found = Path(snapshot_download(repo_id=str(base_model), allow_patterns=BASE_MODEL_ALLOW_PATTERNS))
        except Exception as exc:
            raise ModelSourceNotFoundError(
                f"base model {base_model!r}: not a local directory, and fetching it from the Hugging Face hub "
                f"failed ({type(exc).__name__}: {exc})"
            ) from exc
    if not (found / "config.json").is_file():
        raise ModelSourceNotFoundError(f"base model {base_model!r}: no config.json in {found}")
    return found


def resolve_checkpoint(checkpoint: str | Path) -> Path:
    """A local .safetensors file, or an HF repo id holding HPSv3.safetensors."""
    path = Path(checkpoint).expanduser()
    if path.is_file():
        _require_safetensors(path)
        return path
    if path.exists() or _looks_like_path(str(checkpoint)):
        raise ModelSourceNotFoundError(f"checkpoint file not found: {checkpoint}")
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id=str(checkpoint), filename=CHECKPOINT_FILENAME))
    except Exception as exc:
        raise ModelSourceNotFoundError(
            f"checkpoint {checkpoint!r}: not a local file, and downloading {CHECKPOINT_FILENAME} from the Hugging "
            f"Face hub failed ({type(exc).__name__}: {exc})"
        ) from exc


def read_base_config(base_dir: Path) -> dict[str, Any]:
    raw = json.loads((base_dir / "config.json").read_text(encoding="utf-8"))
    if raw.get("model_type") != "qwen2_vl":
        raise ValueError(f"{base_dir}/config.json: model_type {raw.get('model_type')!r}, expected 'qwen2_vl'")
    return raw


# --- tokenizer and text ------------------------------------------------------------------------
def load_tokenizer(base_dir: Path) -> Any:
    """The base tokenizer + ``<|Reward|>`` as an additional special token, right padding."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base_dir), padding_side="right", local_files_only=True)
    tokenizer.add_special_tokens({"additional_special_tokens": [REWARD_TOKEN]})
    tokenizer.padding_side = "right"
    if tokenizer.pad_token_id is None:
        raise ValueError(f"{base_dir}: tokenizer has no pad token")
    return tokenizer


def load_chat_template(base_dir: Path, tokenizer: Any) -> str:
    """The processor's template (chat_template.json / .jinja: what the official processor used),
    else the tokenizer's own."""
    json_path, jinja_path = base_dir / "chat_template.json", base_dir / "chat_template.jinja"
    if json_path.is_file():
        return json.loads(json_path.read_text(encoding="utf-8"))["chat_template"]
    if jinja_path.is_file():
        return jinja_path.read_text(encoding="utf-8")
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and template:
        return template
    raise ValueError(f"{base_dir}: no chat template (chat_template.json, chat_template.jinja or tokenizer_config.json)")


def validate_prompt(prompt: str) -> None:
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    bad = [s for s in FORBIDDEN_PROMPT_SUBSTRINGS if s in prompt]
    if bad:
        raise ValueError(f"prompt contains reserved token text {bad}: {prompt[:80]!r}")


def render_text(tokenizer: Any, chat_template: str, prompt: str, n_image_tokens: int) -> str:
    """Chat-formatted text with the image pad expanded to the image's token count: the exact
    string the official processor tokenises."""
    validate_prompt(prompt)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": hpsv3_user_text(prompt)}]}]
    rendered = tokenizer.apply_chat_template(
        messages, chat_template=chat_template, tokenize=False, add_generation_prompt=True
    )
    if rendered.count(IMAGE_PAD_TOKEN) != 1:
        raise ValueError(f"chat template produced {rendered.count(IMAGE_PAD_TOKEN)} image pads, expected 1")
    return rendered.replace(IMAGE_PAD_TOKEN, IMAGE_PAD_TOKEN * n_image_tokens)


@dataclass(frozen=True)
class EncodedItem:
    input_ids: np.ndarray  # int64 [L], unpadded
    pixel_values: np.ndarray  # float32 [n_patches, patch_dim]
    grid_thw: tuple[int, int, int]


def encode_items(
    tokenizer: Any,
    chat_template: str,
    images: Sequence[PreprocessedImage],
    prompts: Sequence[str],
    reward_token_id: int,
) -> list[EncodedItem]:
    """Tokenise (unpadded) and attach pixels. Batches are padded later, so OOM splitting can re-pad."""
    texts = [render_text(tokenizer, chat_template, p, im.n_image_tokens) for im, p in zip(images, prompts, strict=True)]
    ids_list = tokenizer(texts, add_special_tokens=True, padding=False)["input_ids"] if texts else []
    items = []
    for i, (ids, im) in enumerate(zip(ids_list, images)):
        arr = np.asarray(ids, dtype=np.int64)
        if int((arr == reward_token_id).sum()) != 1:
            raise ValueError(f"item {i}: expected exactly one {REWARD_TOKEN} token after tokenisation")
        items.append(EncodedItem(arr, im.pixel_values, im.grid_thw))
    return items


def collate(items: Sequence[EncodedItem], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad into model inputs (what the tokenizer's padding=True gives with padding_side right)."""
    length = max(len(it.input_ids) for it in items)
    input_ids = np.full((len(items), length), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((len(items), length), dtype=np.int64)
    for row, it in enumerate(items):
        input_ids[row, : len(it.input_ids)] = it.input_ids
        attention_mask[row, : len(it.input_ids)] = 1
    return {
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(attention_mask),
        "pixel_values": torch.from_numpy(np.concatenate([it.pixel_values for it in items])),
        "image_grid_thw": torch.tensor([it.grid_thw for it in items], dtype=torch.long),
    }


# --- everything together -----------------------------------------------------------------------
@dataclass
class LoadedHPSv3:
    model: HPSv3RewardModel
    tokenizer: Any
    chat_template: str
    vision: VisionPreprocessConfig
    base_dir: Path
    checkpoint_path: Path
    base_config: dict[str, Any]
    device: torch.device
    dtype: torch.dtype
    rope_mode: RopeMode = "official"
    # The kernel family the attention calls went to, chosen as the official code chooses it.
    attention_impl: AttentionImpl = "sdpa"

    @property
    def reward_token_id(self) -> int:
        return self.model.reward_token_id


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype in ("float32", "bfloat16", "float16"):
        return getattr(torch, dtype)
    raise ValueError(f"dtype must be auto, float32 or bfloat16, got {dtype!r}")


def build_config(base_config: Mapping[str, Any], tokenizer: Any) -> Any:
    """Qwen2VLConfig from config.json with the vocab resized to len(tokenizer) (the official
    ``resize_token_embeddings(len(tokenizer))`` after adding ``<|Reward|>``)."""
    from transformers import Qwen2VLConfig

    # deepcopy: the config classes edit nested dicts (rope_scaling) in place
    config = Qwen2VLConfig.from_dict(copy.deepcopy(dict(base_config)))
    config.text_config.vocab_size = len(tokenizer)
    config.text_config.use_cache = False
    image_pad_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD_TOKEN)
    if config.image_token_id != image_pad_id:
        raise ValueError(f"config image_token_id {config.image_token_id} != tokenizer id of {IMAGE_PAD_TOKEN} {image_pad_id}")
    return config


def load_hpsv3(
    base_model: str | Path,
    checkpoint: str | Path,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    rope_mode: RopeMode = "official",
) -> LoadedHPSv3:
    """Resolve sources, check the checkpoint layout on a meta model, then allocate and load."""
    base_dir = resolve_base_model(base_model)
    checkpoint_path = resolve_checkpoint(checkpoint)
    base_config = read_base_config(base_dir)
    tokenizer = load_tokenizer(base_dir)
    chat_template = load_chat_template(base_dir, tokenizer)
    vision = VisionPreprocessConfig.from_preprocessor_config(base_dir)
    config = build_config(base_config, tokenizer)
    vc = config.vision_config
    if (vc.patch_size, vc.temporal_patch_size, vc.spatial_merge_size) != (
        vision.patch_size,
        vision.temporal_patch_size,
        vision.merge_size,
    ):
        raise ValueError(f"{base_dir}: preprocessor_config.json patch/temporal/merge sizes disagree with config.json")
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    rope_mode = check_rope_mode(rope_mode)
    reward_id = tokenizer.convert_tokens_to_ids(REWARD_TOKEN)
    attention = choose_attention(torch_device)
    model = build_reward_model_meta(config, reward_id, torch_dtype, attention)
    # Fail on a wrong layout before a single byte of weights is allocated.
    check_checkpoint_layout(expected_checkpoint_layout(model), read_checkpoint_header(checkpoint_path), str(checkpoint_path))
    materialize_(model, torch_device, rope_mode)
    load_checkpoint_strict(model, checkpoint_path)
    return LoadedHPSv3(
        model=model,
        tokenizer=tokenizer,
        chat_template=chat_template,
        vision=vision,
        base_dir=base_dir,
        checkpoint_path=checkpoint_path,
        base_config=base_config,
        device=torch_device,
        dtype=torch_dtype,
        rope_mode=rope_mode,
        attention_impl=attention,
    )
