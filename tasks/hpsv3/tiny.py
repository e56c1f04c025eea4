"""A tiny Qwen2-VL base model directory and random HPSv3-layout checkpoints, for tests and demos.

The directory has the layout of Qwen/Qwen2-VL-7B-Instruct (config.json in the 4.45 flat format,
a real byte-level BPE tokenizer with the Qwen special tokens, a Qwen2-VL chat template,
preprocessor_config.json) and no weight files: every weight comes from the HPSv3 checkpoint.
Scores from these weights mean nothing; a scorer built on them is marked ``uncalibrated``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Mapping

from .preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, QWEN2VL_PROCESSOR_MAX_PIXELS, QWEN2VL_PROCESSOR_MIN_PIXELS

QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Qwen2's pre-tokenisation regex (as in its tokenizer.json).
QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen2-VL-style chat template: default system turn, image as <|vision_start|><|image_pad|><|vision_end|>.
QWEN2VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_ENGLISH = """\
A photograph of a red fox sitting in fresh snow at sunrise, soft golden light, shallow depth of field.
An oil painting of a lighthouse on a rocky coast during a storm, dramatic clouds and crashing waves.
A cute chibi anime cartoon fox, smiling, wagging its tail, with a small cartoon heart above it.
Two cats sleeping on a blue sofa next to a window; rain is falling outside and the room is warm.
A street market in the evening with lanterns, fruit stalls, bicycles and people walking home.
The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore.
A minimalist poster with the word HELLO in bold letters, three circles and a diagonal line.
A bowl of ramen with an egg, green onions and sesame seeds, photographed from above on a wooden table.
An astronaut riding a horse on the moon, highly detailed, cinematic lighting, 4k, trending on artstation.
A child holding a yellow umbrella, standing left of a tall man wearing a black coat and a grey hat.
"""
TINY_BPE_VOCAB = 1024


def _tiny_config(special_ids: Mapping[str, int], vocab_size: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "attention_dropout": 0.0,
        "bos_token_id": special_ids["<|endoftext|>"],
        "eos_token_id": special_ids["<|im_end|>"],
        "vision_start_token_id": special_ids["<|vision_start|>"],
        "vision_end_token_id": special_ids["<|vision_end|>"],
        "vision_token_id": special_ids["<|vision_pad|>"],
        "image_token_id": special_ids["<|image_pad|>"],
        "video_token_id": special_ids["<|video_pad|>"],
        "hidden_act": "silu",
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "max_position_embeddings": 32768,
        "max_window_layers": 2,
        "num_attention_heads": 2,  # head_dim 16 (CPU attention kernels are ~3x slower at 8)
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,  # grouped-query attention, as the 7B (28 heads / 4 kv heads)
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.41.2",
        "use_cache": True,
        "use_sliding_window": False,
        "vision_config": {
            "depth": 2,
            "embed_dim": 32,
            "mlp_ratio": 4,
            "num_heads": 2,  # head_dim 16
            "in_chans": 3,
            "hidden_size": 32,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},  # sums to head_dim/2 = 8
        "vocab_size": vocab_size,
    }


def full_size_qwen2vl_7b_config() -> dict[str, Any]:
    """The public config.json of Qwen/Qwen2-VL-7B-Instruct (for timing runs without the download)."""
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "vision_token_id": 151654,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "hidden_act": "silu",
        "hidden_size": 3584,
        "initializer_range": 0.02,
        "intermediate_size": 18944,
        "max_position_embeddings": 32768,
        "max_window_layers": 28,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.41.2",
        "use_cache": True,
        "use_sliding_window": False,
        "vision_config": {
            "depth": 32,
            "embed_dim": 1280,
            "mlp_ratio": 4,
            "num_heads": 16,
            "in_chans": 3,
            "hidden_size": 3584,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vocab_size": 152064,
    }


def _train_tokenizer() -> Any:
    """Byte-level BPE with Qwen2's normaliser / pre-tokeniser, trained on the instruction + English."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from .model import INSTRUCTION_TEMPLATE, REWARD_SUFFIX

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_BPE_VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    corpus = [INSTRUCTION_TEMPLATE, REWARD_SUFFIX, "You are a helpful assistant.", "user", "assistant", _ENGLISH]
    tok.train_from_iterator(corpus * 4, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIAL_TOKENS])
    return tok


def write_tiny_base_model(directory: str | Path, config: Mapping[str, Any] | None = None) -> Path:
    """Write a tiny Qwen2-VL base model dir (no weights). ``config`` swaps in another architecture
    (e.g. ``full_size_qwen2vl_7b_config()``); its token ids are rewritten to this tokenizer's."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tok = _train_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    special_ids = {t: tok.token_to_id(t) for t in QWEN_SPECIAL_TOKENS}
    n_tokens = tok.get_vocab_size(with_added_tokens=True)
    padded_vocab = -(-n_tokens // 64) * 64  # like the 7B's padded embedding table (152064)

    cfg = _tiny_config(special_ids, padded_vocab)
    if config is not None:
        ids = {k: cfg[k] for k in cfg if k.endswith("token_id")}
        cfg = copy.deepcopy(dict(config)) | ids
        cfg["vocab_size"] = max(int(cfg.get("vocab_size", 0)), padded_vocab)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")

    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 32768,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": list(QWEN_SPECIAL_TOKENS[1:]),
        "errors": "replace",
        "split_special_tokens": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": QWEN2VL_CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    (out / "chat_template.json").write_text(
        json.dumps({"chat_template": QWEN2VL_CHAT_TEMPLATE}, indent=2) + "\n", encoding="utf-8"
    )
    preprocessor = {
        "min_pixels": QWEN2VL_PROCESSOR_MIN_PIXELS,
        "max_pixels": QWEN2VL_PROCESSOR_MAX_PIXELS,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": list(OPENAI_CLIP_MEAN),
        "image_std": list(OPENAI_CLIP_STD),
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
    }
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n", encoding="utf-8")
    return out


def official_layout_for_base(base_dir: str | Path) -> dict[str, tuple[int, ...]]:
    """Official key -> shape of an HPSv3 checkpoint for this base dir (vocab = len(tokenizer))."""
    import torch

    from .model import REWARD_TOKEN, build_config, build_reward_model_meta, expected_checkpoint_layout, load_tokenizer
    from .model import read_base_config

    base = Path(base_dir)
    tokenizer = load_tokenizer(base)
    config = build_config(read_base_config(base), tokenizer)
    model = build_reward_model_meta(config, tokenizer.convert_tokens_to_ids(REWARD_TOKEN), torch.float32)
    return expected_checkpoint_layout(model)


def random_official_state_dict(layout: Mapping[str, tuple[int, ...]], seed: int = 0) -> dict[str, Any]:
    """Deterministic random tensors: backbone in bfloat16 (as published), rm_head in float32.
    Scaled so activations stay O(1) and different images give clearly different scores."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for key in sorted(layout):
        shape = layout[key]
        values = torch.randn(shape, generator=gen, dtype=torch.float32)
        if len(shape) == 1:
            is_norm_weight = key.endswith("weight")  # 1-D weights are norm scales
            values = 1.0 + 0.1 * values if is_norm_weight else 0.1 * values
        elif not key.endswith("embed_tokens.weight"):
            fan_in = 1
            for d in shape[1:]:
                fan_in *= d
            values = values / fan_in**0.5
        dtype = torch.float32 if key.startswith("rm_head.") else torch.bfloat16
        tensors[key] = values.to(dtype).contiguous()
    return tensors


def write_tiny_checkpoint(base_dir: str | Path, out_path: str | Path, seed: int = 0) -> Path:
    """Random weights in the OFFICIAL transformers-4.45 key layout, as safetensors (same seed, same
    bytes), flagged uncalibrated in the header metadata so every scorer built on them says so."""
    from safetensors.torch import save_file

    from .model import UNCALIBRATED_METADATA_KEY

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "pt", UNCALIBRATED_METADATA_KEY: "true", "imagebench.seed": str(seed)}
    save_file(random_official_state_dict(official_layout_for_base(base_dir), seed), str(out), metadata=metadata)
    _canonicalize_safetensors_header(out)
    return out


def _canonicalize_safetensors_header(path: Path) -> None:
    """safetensors writes metadata in hash-map order; rewrite the header JSON with sorted keys
    (same length, space padded as the format allows) so equal inputs give equal bytes."""
    import struct

    with open(path, "r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        canonical = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        if len(canonical) > length:
            raise RuntimeError(f"{path}: canonical header longer than the original")
        f.seek(8)
        f.write(canonical.ljust(length, b" "))
