"""The demo's models (tasks/demo.py): each one a distinct model (issue 8, item 12)."""

from __future__ import annotations

import hashlib

from tasks.demo import BASELINE_FIELD, CONTENDERS, DEMO_PHOTOS, load_photo, render_model
from tests.flows.conftest import SUITE_FILE


def test_no_two_demo_models_share_an_image():
    """demo-pristine was demo-baseline-a byte for byte. (demo-patchy is pristine photos with gaps
    by design: what it shows is coverage, so it is left out.)"""
    from tasks.suite import load_suite

    prompts = [(p.prompt_id, p.prompt) for p in load_suite(SUITE_FILE).prompts[:4]]
    photos = [load_photo(name) for name in DEMO_PHOTOS[:4]]
    seen: dict[str, str] = {}
    for model in [m for m in BASELINE_FIELD + CONTENDERS if not (m.missing_every or m.corrupt_prompts)]:
        for key, data in render_model(model, prompts, photos).items():
            digest = hashlib.sha256(data).hexdigest()
            assert digest not in seen, f"{key} is byte-identical to {seen.get(digest)}"
            seen[digest] = key
