"""Model construction, strict checkpoint loading, official forward semantics."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tasks.hpsv3.model import (
    REWARD_TOKEN,
    CheckpointLayoutError,
    ModelSourceNotFoundError,
    build_config,
    build_reward_model_meta,
    collate,
    expected_checkpoint_layout,
    internal_to_official,
    load_checkpoint_strict,
    load_hpsv3,
    load_tokenizer,
    materialize_,
    official_to_internal,
    read_base_config,
)
from tasks.hpsv3.tiny import random_official_state_dict, write_tiny_checkpoint

from .conftest import make_image


def _write(tensors: dict[str, torch.Tensor], path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


# --- layout ---------------------------------------------------------------------------------
def test_key_mapping_round_trip(tiny_layout: dict[str, tuple[int, ...]]) -> None:
    prefixes = {k.split(".")[0] for k in tiny_layout}
    assert prefixes == {"model", "visual", "lm_head", "rm_head"}
    assert "model.embed_tokens.weight" in tiny_layout and "visual.patch_embed.proj.weight" in tiny_layout
    for key in tiny_layout:
        internal = official_to_internal(key)
        assert internal is not None and internal_to_official(internal) == key
    assert official_to_internal("model.layers.0.mlp.up_proj.weight") == "vlm.model.language_model.layers.0.mlp.up_proj.weight"
    assert official_to_internal("visual.merger.mlp.0.bias") == "vlm.model.visual.merger.mlp.0.bias"
    assert official_to_internal("nonsense.weight") is None


def test_vocab_is_len_tokenizer_after_reward_token(tiny_base: Path, tiny_layout: dict) -> None:
    tokenizer = load_tokenizer(tiny_base)
    base_vocab = read_base_config(tiny_base)["vocab_size"]
    assert tiny_layout["model.embed_tokens.weight"][0] == len(tokenizer) < base_vocab  # shrunk like 152064 -> 151658
    assert tiny_layout["lm_head.weight"][0] == len(tokenizer)
    assert tokenizer.convert_tokens_to_ids(REWARD_TOKEN) == len(tokenizer) - 1
    assert tiny_layout["rm_head.0.weight"] == (1024, read_base_config(tiny_base)["hidden_size"])
    assert tiny_layout["rm_head.5.weight"] == (2, 16)


def test_checkpoint_bytes_are_deterministic(tiny_base: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    again = write_tiny_checkpoint(tiny_base, tmp_path / "again.safetensors", seed=0)
    other = write_tiny_checkpoint(tiny_base, tmp_path / "other.safetensors", seed=1)
    sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert sha(again) == sha(tiny_checkpoint) != sha(other)


def _load(tiny_base: Path, ckpt: Path):
    return load_hpsv3(str(tiny_base), str(ckpt), device="cpu", dtype="float32")


def test_transformers5_named_checkpoint_is_refused(tiny_base: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    renamed = {}
    for key, value in load_file(str(tiny_checkpoint)).items():
        if key.startswith("model."):
            key = "model.language_model." + key[len("model.") :]
        elif key.startswith("visual."):
            key = "model.visual." + key[len("visual.") :]
        renamed[key] = value
    with pytest.raises(CheckpointLayoutError) as err:
        _load(tiny_base, _write(renamed, tmp_path / "v5.safetensors"))
    msg = str(err.value)
    assert "missing keys" in msg and "unexpected keys" in msg and "transformers-5 layout" in msg
    assert "model.embed_tokens.weight" in msg and "model.language_model." in msg and "model.visual." in msg
    assert "... and" in msg  # long lists are cut, with a count


def test_missing_key_is_named(tiny_base: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    tensors = load_file(str(tiny_checkpoint))
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    with pytest.raises(CheckpointLayoutError, match=r"missing keys \(1\):\n    model\.layers\.1\.self_attn\.k_proj\.bias"):
        _load(tiny_base, _write(tensors, tmp_path / "missing.safetensors"))


def test_extra_key_is_named(tiny_base: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    tensors = load_file(str(tiny_checkpoint))
    tensors["rm_head.7.weight"] = torch.zeros(2, 2)
    with pytest.raises(CheckpointLayoutError, match=r"unexpected keys \(1\):\n    rm_head\.7\.weight"):
        _load(tiny_base, _write(tensors, tmp_path / "extra.safetensors"))


def test_wrong_shape_is_named(tiny_base: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    tensors = load_file(str(tiny_checkpoint))
    emb = tensors["model.embed_tokens.weight"]
    tensors["model.embed_tokens.weight"] = torch.cat([emb, emb[:1]])  # e.g. embeddings not resized
    with pytest.raises(CheckpointLayoutError, match=r"shape mismatches \(1\):\n    model\.embed_tokens\.weight"):
        _load(tiny_base, _write(tensors, tmp_path / "shape.safetensors"))


def test_only_safetensors_accepted(tiny_base: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    pickle_path = tmp_path / "HPSv3.pth"
    torch.save({"x": torch.zeros(1)}, pickle_path)
    with pytest.raises(CheckpointLayoutError, match="only .safetensors"):
        _load(tiny_base, pickle_path)
    fake = tmp_path / "fake.safetensors"
    fake.write_bytes(pickle_path.read_bytes())
    with pytest.raises(CheckpointLayoutError, match="not a readable safetensors"):
        _load(tiny_base, fake)


def test_missing_sources_name_the_path(tiny_base: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelSourceNotFoundError, match="no-such-dir"):
        _load(tmp_path / "no-such-dir", tiny_checkpoint)
    with pytest.raises(ModelSourceNotFoundError, match="nope.safetensors"):
        _load(tiny_base, tmp_path / "nope.safetensors")


def test_base_dir_without_weights_loads_and_every_weight_comes_from_checkpoint(
    tiny_base: Path, tiny_checkpoint: Path
) -> None:
    assert not [p for p in tiny_base.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".pth")]
    loaded = _load(tiny_base, tiny_checkpoint)
    model = loaded.model
    assert not model.training and model.vlm.config._attn_implementation == "sdpa"
    assert all(p.dtype == torch.float32 for p in model.rm_head.parameters())
    assert all(p.device.type == "cpu" for p in model.parameters())
    ckpt = load_file(str(tiny_checkpoint))
    state = model.state_dict()
    assert len(state) == len(ckpt)
    for key, value in ckpt.items():
        torch.testing.assert_close(state[official_to_internal(key)], value.float(), rtol=0, atol=0)
    for name, buf in model.named_buffers():  # rotary buffers are computed, never garbage
        assert torch.isfinite(buf).all() and buf.abs().max() <= 1.0 and buf.max() > 0, name


def test_meta_build_allocates_nothing(tiny_base: Path) -> None:
    tokenizer = load_tokenizer(tiny_base)
    config = build_config(read_base_config(tiny_base), tokenizer)
    model = build_reward_model_meta(config, tokenizer.convert_tokens_to_ids(REWARD_TOKEN), torch.bfloat16)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert model.vlm.lm_head.weight.dtype == torch.bfloat16 and model.rm_head[0].weight.dtype == torch.float32
    materialize_(model, torch.device("cpu"))
    assert model.vlm.lm_head.weight.dtype == torch.bfloat16 and model.rm_head[0].weight.dtype == torch.float32
    expected = expected_checkpoint_layout(model)
    assert set(expected) == set(random_official_state_dict(expected))


# --- forward semantics -----------------------------------------------------------------------
def _encode(scorer, images, prompts):
    return scorer.prepare(images, prompts)


def _mu(scorer, items) -> np.ndarray:
    return scorer.run_batch(items)[:, 0]


def test_batch_equals_one_by_one_and_scores_differ(scorer, sample_images, sample_prompts) -> None:
    items = _encode(scorer, sample_images, sample_prompts)
    batch = _mu(scorer, items)
    singles = np.array([_mu(scorer, [it])[0] for it in items])
    np.testing.assert_allclose(batch, singles, rtol=0, atol=1e-5)
    assert np.ptp(singles) > 1e-3  # the random model really looks at its inputs


def test_padding_and_order_do_not_change_mu(scorer, sample_images, sample_prompts) -> None:
    items = _encode(scorer, sample_images, sample_prompts)
    lengths = [len(it.input_ids) for it in items]
    assert len(set(lengths)) > 1  # rows really are padded
    reference = _mu(scorer, items)
    order = [3, 0, 5, 2, 4, 1]
    permuted = _mu(scorer, [items[i] for i in order])
    np.testing.assert_allclose(permuted, reference[order], rtol=0, atol=1e-5)
    # the shortest item padded much further (next to a long prompt) keeps its score
    long_item = _encode(scorer, [sample_images[0]], ["very long prompt " * 60])[0]
    shortest = int(np.argmin(lengths))
    padded = _mu(scorer, [items[shortest], long_item])[0]
    np.testing.assert_allclose(padded, reference[shortest], rtol=0, atol=1e-5)


def test_image_and_prompt_both_matter(scorer, sample_images, sample_prompts) -> None:
    a = _mu(scorer, _encode(scorer, [sample_images[0]], [sample_prompts[0]]))[0]
    b = _mu(scorer, _encode(scorer, [sample_images[1]], [sample_prompts[0]]))[0]
    c = _mu(scorer, _encode(scorer, [sample_images[0]], [sample_prompts[1]]))[0]
    assert abs(a - b) > 1e-4 and abs(a - c) > 1e-4


def test_exactly_one_reward_token_per_row(scorer, sample_images, sample_prompts) -> None:
    items = _encode(scorer, sample_images[:2], sample_prompts[:2])
    batch = collate(items, scorer.loaded.tokenizer.pad_token_id)
    reward_id = scorer.loaded.reward_token_id
    no_reward = batch["input_ids"].clone()
    no_reward[no_reward == reward_id] = scorer.loaded.tokenizer.pad_token_id
    with torch.inference_mode(), pytest.raises(ValueError, match="exactly one"):
        scorer.model(**(batch | {"input_ids": no_reward}))
    two = batch["input_ids"].clone()
    two[0, 1] = reward_id
    with torch.inference_mode(), pytest.raises(ValueError, match=r"exactly one .* counts \[2, 1\]"):
        scorer.model(**(batch | {"input_ids": two}))


def test_text_positions_are_plain_1d(scorer, sample_images, sample_prompts) -> None:
    """The official call: position_ids=None -> 0..L-1 on all three M-RoPE axes (no 3-D image
    positions). Passing those positions explicitly must give the same mu; 3-D positions must not."""
    items = _encode(scorer, sample_images[:1], sample_prompts[:1])
    batch = collate(items, scorer.loaded.tokenizer.pad_token_id)
    model = scorer.model
    inner = model.vlm.model
    text = inner.language_model
    with torch.inference_mode():
        mu = model(**batch)[0, 0]
        embeds = text.embed_tokens(batch["input_ids"])
        image_embeds = inner.visual(batch["pixel_values"], grid_thw=batch["image_grid_thw"]).pooler_output
        mask = (batch["input_ids"] == model.image_token_id).unsqueeze(-1).expand_as(embeds)
        embeds = embeds.masked_scatter(mask, image_embeds)
        length = embeds.shape[1]
        pos = (batch["input_ids"] == model.reward_token_id).int().argmax()

        def head(position_ids: torch.Tensor) -> torch.Tensor:
            hidden = text(inputs_embeds=embeds, attention_mask=batch["attention_mask"], position_ids=position_ids)
            return model.rm_head(hidden.last_hidden_state[0, pos].float())[0]

        plain = torch.arange(length).view(1, 1, -1).expand(3, 1, -1)
        torch.testing.assert_close(head(plain), mu, rtol=0, atol=1e-6)
        mm_type = (batch["input_ids"] == model.image_token_id).int()
        rope_3d, _ = inner.get_rope_index(
            batch["input_ids"], image_grid_thw=batch["image_grid_thw"], attention_mask=batch["attention_mask"],
            mm_token_type_ids=mm_type,
        )
        assert abs(float(head(rope_3d) - mu)) > 1e-5  # the 3-D positions (the known drift) differ


def test_official_rope_arithmetic(scorer) -> None:
    """rope_mode='official' reproduces transformers 4.45 after model.to(bfloat16): text inv_freq
    rounded to bf16; vision angles and cos/sin computed in bf16 (torch.outer on bf16 buffers)."""
    model = scorer.model
    text_rope = model.vlm.model.language_model.rotary_emb
    vision_rope = model.vlm.model.visual.rotary_pos_emb
    head_dim = 32 // 2
    exact = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    torch.testing.assert_close(text_rope.inv_freq, exact.to(torch.bfloat16).float(), rtol=0, atol=0)
    assert not torch.equal(text_rope.inv_freq, exact)

    vdim = 32 // 2 // 2  # (embed_dim / heads) / 2
    vexact = 1.0 / (10000.0 ** (torch.arange(0, vdim, 2, dtype=torch.float) / vdim))
    # 4.45: seq = arange(max_grid, dtype=bf16); freqs = outer(seq, inv_bf16); cos = freqs.cos() (bf16)
    seq = torch.arange(300, dtype=torch.bfloat16)
    full = torch.outer(seq, vexact.to(torch.bfloat16))
    pos = torch.tensor([[0, 0], [5, 7], [33, 2], [257, 299]])
    ref = full[pos].flatten(1)  # [h freqs, w freqs]
    cos, sin = vision_rope(torch.zeros(1), pos)
    torch.testing.assert_close(cos, torch.cat([ref, ref], -1).cos().float(), rtol=0, atol=0)
    torch.testing.assert_close(sin, torch.cat([ref, ref], -1).sin().float(), rtol=0, atol=0)


def test_float32_rope_mode_differs(tiny_base: Path, tiny_checkpoint: Path, scorer, sample_images, sample_prompts) -> None:
    exact = load_hpsv3(str(tiny_base), str(tiny_checkpoint), device="cpu", dtype="float32", rope_mode="float32")
    items = _encode(scorer, sample_images[:2], sample_prompts[:2])
    batch = collate(items, scorer.loaded.tokenizer.pad_token_id)
    with torch.inference_mode():
        official, float32 = scorer.model(**batch), exact.model(**batch)
    assert not torch.equal(official, float32)


def test_bfloat16_model_runs(tiny_base: Path, tiny_checkpoint: Path, scorer, sample_images, sample_prompts) -> None:
    bf16 = load_hpsv3(str(tiny_base), str(tiny_checkpoint), device="cpu", dtype="bfloat16")
    assert bf16.model.vlm.lm_head.weight.dtype == torch.bfloat16
    assert bf16.model.rm_head[0].weight.dtype == torch.float32
    items = _encode(scorer, sample_images[:2], sample_prompts[:2])
    with torch.inference_mode():
        out = bf16.model(**collate(items, bf16.tokenizer.pad_token_id))
    assert out.dtype == torch.float32 and out.shape == (2, 2)
    np.testing.assert_allclose(out[:, 0].numpy(), _mu(scorer, items), atol=0.1)


def test_make_image_helper_is_deterministic() -> None:
    assert np.array_equal(np.asarray(make_image(1, (30, 20))), np.asarray(make_image(1, (30, 20))))


def test_hf_ids_fetch_only_small_files(tiny_base: Path, tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    calls: dict[str, dict] = {}

    def fake_snapshot_download(repo_id: str, allow_patterns: list[str], **kw):
        calls["snapshot"] = {"repo_id": repo_id, "allow_patterns": allow_patterns}
        return str(tiny_base)

    def fake_hf_hub_download(repo_id: str, filename: str, **kw):
        calls["file"] = {"repo_id": repo_id, "filename": filename}
        return str(tiny_checkpoint)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hf_hub_download)
    loaded = load_hpsv3("Qwen/Qwen2-VL-7B-Instruct", "MizzenAI/HPSv3", device="cpu", dtype="float32")
    assert loaded.base_dir == tiny_base and loaded.checkpoint_path == tiny_checkpoint
    assert calls["file"] == {"repo_id": "MizzenAI/HPSv3", "filename": "HPSv3.safetensors"}
    patterns = calls["snapshot"]["allow_patterns"]
    assert calls["snapshot"]["repo_id"] == "Qwen/Qwen2-VL-7B-Instruct"
    assert {"config.json", "preprocessor_config.json", "tokenizer.json", "chat_template.json"} <= set(patterns)
    assert not [p for p in patterns if "safetensors" in p or ".bin" in p or "*" in p]


def test_unreachable_hf_ids_name_the_id(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    code = (
        "from tasks.hpsv3.model import resolve_base_model, resolve_checkpoint, ModelSourceNotFoundError\n"
        "for f, name in [(resolve_base_model, 'Qwen/Qwen2-VL-7B-Instruct'), (resolve_checkpoint, 'MizzenAI/HPSv3')]:\n"
        "    try:\n"
        "        f(name)\n"
        "    except ModelSourceNotFoundError as e:\n"
        "        assert repr(name) in str(e), str(e)\n"
        "    else:\n"
        "        raise SystemExit('no error')\n"
    )
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    root = Path(__file__).resolve().parents[3]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_layout_is_checked_before_any_weight_is_touched(tiny_base: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    tokenizer = load_tokenizer(tiny_base)
    config = build_config(read_base_config(tiny_base), tokenizer)
    model = materialize_(
        build_reward_model_meta(config, tokenizer.convert_tokens_to_ids(REWARD_TOKEN), torch.float32), torch.device("cpu")
    )
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(7.0)
    tensors = load_file(str(tiny_checkpoint))
    tensors["visual.merger.mlp.2.bias"] = torch.zeros(3)  # one bad shape, sorted after most keys
    with pytest.raises(CheckpointLayoutError, match="visual.merger.mlp.2.bias"):
        load_checkpoint_strict(model, _write(tensors, tmp_path / "bad.safetensors"))
    assert all(bool((p == 7.0).all()) for p in model.parameters())
    load_checkpoint_strict(model, tiny_checkpoint)
    assert not bool((model.rm_head[0].weight == 7.0).any())
