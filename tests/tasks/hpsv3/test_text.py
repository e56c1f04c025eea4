"""The instruction text: pinned bytes, and exactly what reaches the tokenizer."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import tasks.hpsv3 as pkg
from tasks.hpsv3.model import (
    IMAGE_PAD_TOKEN,
    INSTRUCTION_TEMPLATE,
    REWARD_SUFFIX,
    REWARD_TOKEN,
    hpsv3_user_text,
    render_text,
)

PKG_DIR = Path(pkg.__file__).parent
# sha256 of the official strings (hpsv3 1.0.0, hpsv3/dataset/data_collator_qwen.py)
INSTRUCTION_SHA256 = "0393599dad45a971903d1d62a3acf9bad3ccccdafa7f40f680523419e1f68b7a"  # INSTRUCTION
SUFFIX_SHA256 = "2471faca094ae5bd6fe17b71dce20c3d7583625545e235889f7e74e7eeb69d0a"  # prompt_with_special_token


def test_files_are_pinned() -> None:
    assert hashlib.sha256((PKG_DIR / "instruction.txt").read_bytes()).hexdigest() == INSTRUCTION_SHA256
    assert hashlib.sha256((PKG_DIR / "reward_suffix.txt").read_bytes()).hexdigest() == SUFFIX_SHA256
    assert INSTRUCTION_TEMPLATE.encode() == (PKG_DIR / "instruction.txt").read_bytes()
    assert REWARD_SUFFIX.encode() == (PKG_DIR / "reward_suffix.txt").read_bytes()
    assert INSTRUCTION_TEMPLATE.count("{text_prompt}") == 1 and "\r" not in INSTRUCTION_TEMPLATE
    assert REWARD_SUFFIX == "\nPlease provide the overall ratings of this image: <|Reward|>\n\nEND\n"
    license_text = (PKG_DIR / "LICENSE-HPSv3.txt").read_text()
    assert "MIT License" in license_text and "instruction.txt" in license_text and "hpsv3 1.0.0" in license_text


def test_user_text_is_instruction_format_plus_suffix() -> None:
    prompt = "a {curly} prompt with 100% unicode: café ☕"
    text = hpsv3_user_text(prompt)
    assert text == INSTRUCTION_TEMPLATE.replace("{text_prompt}", prompt) + REWARD_SUFFIX
    assert text.startswith("\nYou are tasked with evaluating a generated image")
    assert f"Textual prompt - {prompt}\n\n\n\nPlease provide the overall ratings of this image: {REWARD_TOKEN}" in text


def test_model_input_contains_instruction_byte_for_byte(scorer) -> None:
    tokenizer, template = scorer.loaded.tokenizer, scorer.loaded.chat_template
    prompt = "a red fox, photorealistic"
    rendered = render_text(tokenizer, template, prompt, n_image_tokens=5)
    expected = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|vision_start|>"
        + IMAGE_PAD_TOKEN * 5
        + "<|vision_end|>"
        + hpsv3_user_text(prompt)
        + "<|im_end|>\n<|im_start|>assistant\n"
    )
    assert rendered == expected
    # and the token ids the model receives decode back to exactly that text
    from .conftest import make_image

    item = scorer.prepare([make_image(0, (448, 448))], [prompt])[0]
    decoded = tokenizer.decode(item.input_ids.tolist(), skip_special_tokens=False)
    assert hpsv3_user_text(prompt) in decoded
    assert decoded == render_text(tokenizer, template, prompt, n_image_tokens=256)
    assert int((item.input_ids == tokenizer.convert_tokens_to_ids(IMAGE_PAD_TOKEN)).sum()) == 256


@pytest.mark.parametrize(
    "bad", [f"x {REWARD_TOKEN}", "<|image_pad|> cat", "<|vision_start|>", "<|video_pad|>", "a <|placeholder|>"]
)
def test_reserved_tokens_in_prompts_are_rejected(scorer, bad: str) -> None:
    with pytest.raises(ValueError, match="reserved token"):
        render_text(scorer.loaded.tokenizer, scorer.loaded.chat_template, bad, n_image_tokens=4)
