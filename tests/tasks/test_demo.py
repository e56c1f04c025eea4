"""The demo's models (tasks/store/demo.py): each one a distinct model (issue 8, item 12)."""

from __future__ import annotations

import hashlib

from tasks.store.demo import BASELINE_FIELD, CONTENDERS, DEMO_PHOTOS, load_photo, render_model
from tests.flows.conftest import SUITE_FILE


def test_no_two_demo_models_share_an_image():
    """demo-pristine was demo-baseline-a byte for byte. (demo-patchy is pristine photos with gaps
    by design: what it shows is coverage, so it is left out.)"""
    from tasks.scores.suite import load_suite

    prompts = [(p.prompt_id, p.prompt) for p in load_suite(SUITE_FILE).prompts[:4]]
    photos = [load_photo(name) for name in DEMO_PHOTOS[:4]]
    seen: dict[str, str] = {}
    for model in [m for m in BASELINE_FIELD + CONTENDERS if not (m.missing_every or m.corrupt_prompts)]:
        for key, data in render_model(model, prompts, photos).items():
            digest = hashlib.sha256(data).hexdigest()
            assert digest not in seen, f"{key} is byte-identical to {seen.get(digest)}"
            seen[digest] = key



def _text_images(model_ids: list[str], tmp_path) -> dict[tuple[str, str], tuple[object, str]]:
    """(model, prompt id) -> (image file, prompt) for the Text Rendering prompts, rendered exactly
    as seed_store renders them (they are the suite's first prompts, so their indices match)."""
    from tasks.scores.suite import load_suite

    prompts = load_suite(SUITE_FILE).prompts
    n = sum(1 for p in prompts if p.category == "Text Rendering")
    assert all(p.category == "Text Rendering" for p in prompts[:n])
    photos = [load_photo(name) for name in DEMO_PHOTOS]
    out = {}
    for model in (m for m in BASELINE_FIELD + CONTENDERS if m.model_id in model_ids):
        for key, data in render_model(model, [(p.prompt_id, p.prompt) for p in prompts[:n]], photos).items():
            path = tmp_path / key.replace("/", "_")
            path.write_bytes(data)
            pid = key.split("/")[-1].rsplit(".", 1)[0]
            out[(model.model_id, pid)] = (path, next(p.prompt for p in prompts if p.prompt_id == pid))
    return out


def test_the_real_ocr_judge_reads_the_clean_demo_models_text_and_not_the_blurred_one(tmp_path):
    """Issue 15, item 7: tr-signage-01 ("FRESH EGGS") failed for all 8 demo models, because
    Tesseract read nothing from the demo's rendering. Debian's tesseract, as the offline judge
    runs it: the pristine demo model passes every Text Rendering prompt, the blurred one fails."""
    from tasks.judges.ocr import ocr_check, tesseract_version

    assert tesseract_version() is not None, "tesseract-ocr is a system dependency (Makefile system-deps)"
    images = _text_images(["demo-pristine", "demo-blur-r3"], tmp_path)
    verdicts = {key: ocr_check(path, prompt) for key, (path, prompt) in images.items()}
    clean = {pid: v for (m, pid), (v, _why) in verdicts.items() if m == "demo-pristine"}
    assert len(clean) == 15
    assert clean == {pid: "PASS" for pid in clean}, {k: verdicts[("demo-pristine", k)][1] for k, v in clean.items() if v != "PASS"}
    assert verdicts[("demo-blur-r3", "tr-signage-01")][0] == "FAIL"


def test_seeding_a_new_local_store_warns_nothing(tmp_path, caplog):
    """Issue 15, item 10: a first `make demo` printed "local object store ... does not exist:
    treating it as empty" (for the store it was about to fill). Seeding creates it first."""
    import logging

    from tasks.store.demo import seed_store
    from tasks.store.storage import LocalStore

    store = LocalStore(tmp_path / "objects")
    with caplog.at_level(logging.WARNING):
        written = seed_store(store, [("p-01", 'a sign "HI"'), ("p-02", "a cat")], CONTENDERS[:1])
    assert written == {CONTENDERS[0].model_id: 2}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert store.list_models() == [CONTENDERS[0].model_id]
