"""Blinding of shape (issue 27 item 7): tools whose images have different aspect ratios were told
apart by their letterbox bands alone (a warning). A study whose images are of mixed aspect now
opens only after a decision in study.yaml (`blinding: {shape: letterbox|crop, aspect: "W:H"}`),
recorded in the pre-registration with the blinding report's figure: how many tools the shape of
the picture inside the canvas alone tells apart."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from PIL import Image

from tasks.beauty.study import StudyError, open_study
from tasks.beauty.store import PanelStore
from tasks.panel.blind import BACKGROUND
from tests.panel.conftest import beauty_prompt_ids, make_settings, write_study

SHAPES = {"wide-tool": (160, 90), "tall-tool": (96, 128), "square-tool": (100, 100)}


def _workspace(tmp_path, shapes=SHAPES):
    """Each tool's images at its own aspect (16:9, 3:4, 1:1), as generators give them."""
    for t, (tool, size) in enumerate(shapes.items()):
        folder = tmp_path / "objects" / "models" / tool
        folder.mkdir(parents=True)
        for k, pid in enumerate(beauty_prompt_ids()):
            im = Image.new("RGB", size, (40 + 20 * t, 30 + 15 * k, 200))
            im.paste((250, 240, 10), (2, 2, size[0] // 3, size[1] // 3))
            out = io.BytesIO()
            im.save(out, "PNG")
            (folder / f"{pid}.png").write_bytes(out.getvalue())
    return make_settings(tmp_path)


def _study(settings, study_id: str, blinding: dict | None) -> None:
    write_study(settings, study_id, [("j1", "photographers")], tools=tuple(SHAPES), memo=False, blinding=blinding)


def _served(d) -> list[Image.Image]:
    out = []
    for p in sorted((d / "images").iterdir()):
        with Image.open(p) as im:
            out.append(im.convert("RGB"))
    return out


def _grey(px) -> bool:
    return all(abs(a - b) <= 6 for a, b in zip(px, BACKGROUND))


def test_mixed_aspects_need_a_decision_before_the_open(tmp_path):
    settings = _workspace(tmp_path)
    _study(settings, "no-decision", None)
    with pytest.raises(StudyError) as info:
        open_study(settings, "no-decision")
    msg = str(info.value)
    assert "cannot open" in msg and "blinding:" in msg and "letterbox" in msg and "crop" in msg
    assert "3 of 3 tools" in msg  # what letterboxing on today's square would leave
    for tool, aspect in (("wide-tool", "16:9"), ("tall-tool", "3:4"), ("square-tool", "1:1")):
        assert f"{tool}: {aspect}" in msg, msg
    d = tmp_path / "studies" / "no-decision"
    assert not (d / "preregistration.json").exists() and not (d / "images").exists()
    assert PanelStore.find(d) is None and not (d / "panel-store.json").exists()


@pytest.mark.parametrize("aspect", ["0:1", "1:9", "banana", "16/9", 43])
def test_an_impossible_aspect_is_refused_at_the_door(tmp_path, aspect):
    from tasks.beauty.study import load_definition

    settings = _workspace(tmp_path)
    _study(settings, "bad-aspect", {"shape": "crop", "aspect": aspect})
    with pytest.raises(StudyError, match=r"study.yaml: blinding.aspect"):
        load_definition(tmp_path / "studies" / "bad-aspect" / "study.yaml")
    _study(settings, "bad-shape", {"shape": "stretch", "aspect": "1:1"})
    with pytest.raises(StudyError, match=r"study.yaml: blinding.shape"):
        load_definition(tmp_path / "studies" / "bad-shape" / "study.yaml")


def test_crop_serves_one_shape_and_no_tool_is_told_apart_by_it(tmp_path):
    settings = _workspace(tmp_path)
    _study(settings, "cropped", {"shape": "crop", "aspect": "4:3"})
    opened = open_study(settings, "cropped")
    images = _served(opened.study_dir)
    assert len(images) == 30 and {im.size for im in images} == {(1024, 768)}
    # No band: the picture fills the canvas to every edge (the sources have no grey).
    for im in images:
        w, h = im.size
        assert not any(_grey(im.getpixel(xy)) for xy in ((w // 2, 2), (w // 2, h - 3), (2, h // 2), (w - 3, h // 2)))
    plan = json.loads((opened.study_dir / "preregistration.json").read_text())
    assert plan["blinding"] == {"shape": "crop", "aspect": "4:3", "canvas": "1024x768", "decided": True, "tools": 3,
                                "picture_shapes": 1, "tools_told_apart_by_shape": 0, "told_apart_by_shape": []}
    text = "\n".join(opened.blinding_report)
    assert "shape: crop to 4:3 (1024x768, " in text and "tells apart 0 of 3 tools" in text
    assert "letterbox bands show" not in text


def test_letterbox_keeps_each_picture_whole_and_records_what_its_bands_tell(tmp_path):
    settings = _workspace(tmp_path)
    _study(settings, "boxed", {"shape": "letterbox", "aspect": "1:1"})
    opened = open_study(settings, "boxed")
    images = _served(opened.study_dir)
    assert {im.size for im in images} == {(1024, 1024)}
    bands = {(_grey(im.getpixel((512, 3))), _grey(im.getpixel((3, 512)))) for im in images}
    assert bands == {(True, False), (False, True), (False, False)}  # wide: top and bottom; tall: the sides; square: none
    plan = json.loads((opened.study_dir / "preregistration.json").read_text())
    assert plan["blinding"] == {"shape": "letterbox", "aspect": "1:1", "canvas": "1024x1024", "decided": True, "tools": 3,
                                "picture_shapes": 3, "tools_told_apart_by_shape": 3,
                                "told_apart_by_shape": ["square-tool", "tall-tool", "wide-tool"]}
    text = "\n".join(opened.blinding_report)
    assert "shape: letterbox to 1:1 (1024x1024, " in text and "tells apart 3 of 3 tools" in text


def test_tools_sharing_their_aspects_are_not_told_apart_by_shape(tmp_path):
    """Mixed aspects, but every tool has both: a decision is still needed, and the figure is 0."""
    from tests.panel.conftest import TOOLS, write_tool_images  # PNGs at 96x128 and JPEGs at 128x96, in each tool

    settings = make_settings(tmp_path)
    for tool in TOOLS:
        write_tool_images(tmp_path / "objects", tool, beauty_prompt_ids())
    write_study(settings, "shared-aspects", [("j1", "photographers")], memo=False, blinding=None)
    with pytest.raises(StudyError, match="0 of 2 tools"):
        open_study(settings, "shared-aspects")
    path = tmp_path / "studies" / "shared-aspects" / "study.yaml"
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "blinding": {"shape": "letterbox", "aspect": "1:1"}}))
    opened = open_study(settings, "shared-aspects")
    plan = json.loads((opened.study_dir / "preregistration.json").read_text())
    assert plan["blinding"]["tools_told_apart_by_shape"] == 0 and plan["blinding"]["picture_shapes"] == 2


def test_one_aspect_needs_no_decision_and_says_so(tmp_path):
    settings = _workspace(tmp_path, {"one-a": (120, 90), "one-b": (240, 180)})  # both 4:3
    write_study(settings, "same-shape", [("j1", "photographers")], tools=("one-a", "one-b"), memo=False, blinding=None)
    opened = open_study(settings, "same-shape")
    plan = json.loads((opened.study_dir / "preregistration.json").read_text())
    assert plan["blinding"] == {"shape": "letterbox", "aspect": "1:1", "canvas": "1024x1024", "decided": False, "tools": 2,
                                "picture_shapes": 1, "tools_told_apart_by_shape": 0, "told_apart_by_shape": []}
