"""The OCR judge: Tesseract on rendered text images, the normalisation rules, OCR as a routed
judge (alone, with a VLM fallback, or as required evidence beside a VLM), and the offline demo."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont

from tasks.judges import judge_items, load_routing
from tasks.judges.ocr import find_strings, normalize_words, required_strings, tesseract_version
from tasks.judges.protocol import load_template
from tasks.judges.router import JudgeItem
from tests.fake_openai import Reply
from tests.tasks.judges.helpers import FAST, config, endpoint, make_routing

REPO = Path(__file__).resolve().parents[3]
needs_tesseract = pytest.mark.skipif(
    tesseract_version() is None, reason="tesseract-ocr is not installed (apt-get install tesseract-ocr)"
)
DEJAVU = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf")
PROMPT = 'A glass jar of honey with a kraft-paper label that reads "WILDFLOWER HONEY" in bold black capitals.'


def _font(size: int):
    if DEJAVU.is_file():
        return ImageFont.truetype(str(DEJAVU), size)
    return ImageFont.load_default(size=size)


def render(path: Path, lines: list[str], fg="black", bg=(235, 225, 205), size=(640, 0)) -> Path:
    img = Image.new("RGB", (size[0], size[1] or 60 + 70 * len(lines)), bg)
    draw = ImageDraw.Draw(img)
    y = 30
    for line in lines:
        draw.text((30, y), line, font=_font(44), fill=fg)
        y += 70
    img.save(path, format="PNG")
    return path


def text_item(
    path: Path, prompt: str = PROMPT, prompt_id: str | None = None, category: str = "Text Rendering"
) -> JudgeItem:
    return JudgeItem(
        model_id="model-a",
        prompt_id=prompt_id or path.stem,
        suite_version="test-v1",
        category=category,
        image_path=path,
        image_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        prompt=prompt,
        question="Does the label read exactly 'WILDFLOWER HONEY'?",
    )


# --- rules (no Tesseract needed) ----------------------------------------------------------------
def test_required_strings_are_the_double_quoted_strings_of_the_prompt() -> None:
    assert required_strings(PROMPT) == ["WILDFLOWER HONEY"]
    assert required_strings('three lines: "ESPRESSO 2.50", "LATTE 3.20" and "CROISSANT 2.80".') == [
        "ESPRESSO 2.50", "LATTE 3.20", "CROISSANT 2.80"
    ]  # fmt: skip
    assert required_strings("a sign reading \u201cOPEN\u201d") == ["OPEN"]
    assert required_strings("a fox in the snow, it's cold") == []
    assert required_strings('a dot " · " alone') == []  # nothing readable to check


def test_normalisation_is_strict_but_sane() -> None:
    assert normalize_words("  Wildflower\n HONEY. ") == ["wildflower", "honey"]  # case, line breaks, edge punctuation
    assert normalize_words("Product of France · 75 cl") == ["product", "of", "france", "75", "cl"]  # symbol-only words
    assert normalize_words("ESPRESSO 2.50") == ["espresso", "2.50"]  # inner punctuation kept
    assert normalize_words("12\u201318 OCTOBER") == ["12-18", "october"]  # typographic dash
    assert normalize_words("\u00bd mile") == ["1/2", "mile"]  # NFKC + fraction slash
    assert normalize_words("Ch\u00e2teau Class\u00e9") == ["chateau", "classe"]  # accents folded
    found, missing = find_strings(
        ["ESPRESSO 2.50", "FRESH EGGS", "Happy Birthday, Mia!"], ["espresso 250", "FRESH EGG", "happy birthday mia"]
    )
    assert found == ["Happy Birthday, Mia!"] and missing == ["ESPRESSO 2.50", "FRESH EGGS"]
    assert find_strings(["OPEN 24 HOURS"], ["OPEN 24", "HOURS"])[1] == ["OPEN 24 HOURS"]  # words must be in one reading
    assert find_strings(["OPEN 24 HOURS"], ["we are OPEN\n24 HOURS a day"])[0] == ["OPEN 24 HOURS"]  # across lines


# --- Tesseract ------------------------------------------------------------------------------------
@needs_tesseract
def test_ocr_passes_the_right_text_and_fails_a_misspelling(tmp_path: Path) -> None:
    good = text_item(render(tmp_path / "good.png", ["WILDFLOWER HONEY"]))
    typo = text_item(render(tmp_path / "typo.png", ["WILDFLOWR HONEY"]))
    dark = text_item(render(tmp_path / "dark.png", ["WILDFLOWER", "HONEY"], fg="white", bg=(25, 30, 40)))
    routing = make_routing("alpha", None, Text_Rendering={"preferred": "ocr"})
    calls, verdicts = judge_items([good, typo, dark], routing, None, retry=FAST)
    v = {r["prompt_id"]: r for r in verdicts.to_pylist()}
    assert v["good"]["verdict"] == "PASS" and v["typo"]["verdict"] == "FAIL" and v["dark"]["verdict"] == "PASS"
    assert v["good"]["judge"] == "ocr" and v["good"]["judge_model"].startswith("tesseract ")
    assert v["good"]["template_sha256"] == load_template("ocr-v1").sha256
    assert 'Found: "WILDFLOWER HONEY"' in v["good"]["rationale"]
    assert 'Missing: "WILDFLOWER HONEY"' in v["typo"]["rationale"] and "WILDFLOWR" in v["typo"]["rationale"]
    for c in calls.to_pylist():
        assert c["judge"] == "ocr" and c["raw_text"].rstrip().splitlines()[-1] in ("VERDICT: PASS", "VERDICT: FAIL")
        assert c["endpoint"] == "local" and c["latency_s"] > 0 and c["outcome"] in ("PASS", "FAIL")


@needs_tesseract
def test_every_quoted_string_is_required(tmp_path: Path) -> None:
    prompt = 'A chalkboard with three lines: "ESPRESSO 2.50", "LATTE 3.20" and "CROISSANT 2.80".'
    full = text_item(render(tmp_path / "full.png", ["ESPRESSO 2.50", "LATTE 3.20", "CROISSANT 2.80"]), prompt)
    short = text_item(render(tmp_path / "short.png", ["ESPRESSO 2.50", "LATTE 3.20"]), prompt)
    wrong_price = text_item(render(tmp_path / "price.png", ["ESPRESSO 2.50", "LATTE 3.50", "CROISSANT 2.80"]), prompt)
    _, verdicts = judge_items([full, short, wrong_price], make_routing("ocr", None), None, retry=FAST)
    v = {r["prompt_id"]: r for r in verdicts.to_pylist()}
    assert (v["full"]["verdict"], v["short"]["verdict"], v["price"]["verdict"]) == ("PASS", "FAIL", "FAIL")
    assert 'Missing: "CROISSANT 2.80"' in v["short"]["rationale"] and 'Missing: "LATTE 3.20"' in v["price"]["rationale"]


@needs_tesseract
def test_no_quoted_string_is_an_error_that_the_fallback_judges(tmp_path: Path, servers) -> None:
    path = render(tmp_path / "plain.png", ["HELLO"])
    item = text_item(path, "A poster that says hello in big letters.")
    _, verdicts = judge_items([item], make_routing("ocr", None), None, retry=FAST)
    v = verdicts.to_pylist()[0]
    assert v["verdict"] == "ERROR" and "no exact text to check" in v["reason"]

    vlm = servers(responder=lambda r: Reply(text="It says hello.\nVERDICT: PASS"))
    calls, verdicts = judge_items([item], make_routing("ocr", "alpha"), config(alpha=endpoint(vlm)), retry=FAST)
    assert [(c["judge"], c["outcome"]) for c in calls.to_pylist()] == [("ocr", "ERROR"), ("alpha", "PASS")]
    assert verdicts.to_pylist()[0]["judge"] == "alpha"


@needs_tesseract
def test_ocr_as_required_evidence_beside_a_vlm(tmp_path: Path, servers) -> None:
    vlm = servers(responder=lambda r: Reply(text="The label looks right.\nVERDICT: PASS"))
    good = text_item(render(tmp_path / "good.png", ["WILDFLOWER HONEY"]), category="Graphical Design")
    typo = text_item(render(tmp_path / "typo.png", ["WILDFLOWR HONEY"]), category="Graphical Design")
    routing = make_routing("beta", None, Graphical_Design={"preferred": "alpha", "ocr_evidence": True})
    calls, verdicts = judge_items([good, typo], routing, config(alpha=endpoint(vlm), beta=endpoint(vlm)), retry=FAST)
    v = {r["prompt_id"]: r for r in verdicts.to_pylist()}
    assert v["good"]["verdict"] == "PASS" and v["typo"]["verdict"] == "FAIL"  # the VLM said PASS to both
    assert v["good"]["judge"] == "alpha+ocr" and "+tesseract" in v["good"]["judge_model"]
    assert "OCR evidence" in v["good"]["rationale"]
    assert sorted(c["judge"] for c in calls.to_pylist()) == ["alpha", "alpha", "ocr", "ocr"]


@needs_tesseract
def test_offline_demo_judges_text_rendering_for_real(tmp_path: Path) -> None:
    """Published routing, no endpoints at all: OCR judges Text Rendering, the rest is not judged."""
    routing = load_routing(REPO / "reference" / "judges-routing-v1.yaml")
    text = text_item(render(tmp_path / "tr.png", ["WILDFLOWER HONEY"]), prompt_id="tr-menus-labels-01")
    other = text_item(render(tmp_path / "sr.png", ["A FOX"]), prompt_id="sr-1", category="Spatial Reasoning")
    run = judge_items([text, other], routing, None)
    assert [(v["prompt_id"], v["judge"], v["verdict"]) for v in run.verdicts.to_pylist()] == [
        ("tr-menus-labels-01", "ocr", "PASS")
    ]
    assert [r[:2] for r in run.not_judged] == [("model-a", "sr-1")] and "qwen3-vl" in run.not_judged[0][2]


def test_without_tesseract_the_builtin_ocr_judge_is_absent(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("tasks.judges.ocr.TESSERACT_CMD", str(tmp_path / "no-tesseract"))
    item = text_item(render(tmp_path / "x.png", ["HI"]), '"HI"')
    run = judge_items([item], make_routing("ocr", None), None, retry=FAST)
    assert run.verdicts.num_rows == 0 and "tesseract not found" in run.not_judged[0][2]
