"""Routing and endpoints files: validated on load, with errors naming the file and the entry."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from schemas.suite import CATEGORIES
from tasks.judges import JudgesConfigError, load_judges_config, load_routing, routing_judges

REPO = Path(__file__).resolve().parents[3]


def _routes(**over):
    routes = {c: {"preferred": "qwen3-vl", "fallback": "gemma"} for c in CATEGORIES}
    routes.update(over)
    return routes


def _write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_published_routing_and_example_endpoints_load_together() -> None:
    judges = load_judges_config(REPO / "judges.example.yaml")
    routing = load_routing(REPO / "reference" / "judges-routing-v1.yaml", judges, "judges.example.yaml")
    assert routing.version == "v1"
    assert routing.routes["Text Rendering"].preferred == "ocr"
    assert set(routing_judges(routing)) <= set(judges.judges) | {"ocr"}
    for name, ep in judges.judges.items():
        assert ep.api_key_env is None or ep.api_key_env.isupper(), name


def test_unknown_category_names_the_file_and_category(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "routing.yaml", {"version": "x", "routes": _routes(**{"Typography": {"preferred": "ocr"}})}
    )
    with pytest.raises(JudgesConfigError) as err:
        load_routing(path)
    assert str(path) in str(err.value) and "Typography" in str(err.value)


def test_missing_category_is_an_error(tmp_path: Path) -> None:
    routes = _routes()
    del routes["Truthfulness"]
    path = _write(tmp_path / "routing.yaml", {"version": "x", "routes": routes})
    with pytest.raises(JudgesConfigError, match="Truthfulness"):
        load_routing(path)


def test_unknown_judge_names_file_category_and_judge(tmp_path: Path) -> None:
    judges = _write(tmp_path / "judges.yaml", {"judges": {
        "qwen3-vl": {"backend": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "q"},
        "gemma": {"backend": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "g"},
    }})  # fmt: skip
    routing = _write(
        tmp_path / "routing.yaml",
        {"version": "x", "routes": _routes(**{"Human Realism": {"preferred": "qwen3-vl", "fallback": "gemmma"}})},
    )
    with pytest.raises(JudgesConfigError) as err:
        load_routing(routing, load_judges_config(judges), str(judges))
    msg = str(err.value)
    assert (
        str(routing) in msg and "gemmma" in msg and "Human Realism" in msg and "fallback" in msg and str(judges) in msg
    )


def test_no_endpoints_at_all_is_the_demo_case(tmp_path: Path) -> None:
    """With nothing configured, routes to absent judges are allowed (their items are not judged)."""
    routing = _write(tmp_path / "routing.yaml", {"version": "x", "routes": _routes()})
    assert load_routing(routing, load_judges_config(None)).version == "x"


@pytest.mark.parametrize(
    "route, match",
    [
        ({"preferred": "Qwen VL"}, "not a valid judge name"),
        ({"preferred": "gemma", "fallback": "gemma"}, "is the preferred judge"),
        ({"preferred": "ocr", "ocr_evidence": True}, "ocr_evidence needs a VLM"),
        ({"preferred": "gemma", "template": "verdict-v9"}, "unknown judge template 'verdict-v9'"),
        ({"preferred": "gemma", "colour": "red"}, "colour"),
    ],
)
def test_bad_routes_are_clear_errors(tmp_path: Path, route, match) -> None:
    path = _write(tmp_path / "routing.yaml", {"version": "x", "routes": _routes(**{"Truthfulness": route})})
    with pytest.raises(JudgesConfigError, match=match) as err:
        load_routing(path)
    assert str(path) in str(err.value)


def test_bad_endpoints_are_clear_errors(tmp_path: Path) -> None:
    for data, match in [
        ({"judges": {"qwen": {"backend": "openai", "model": "q"}}}, "needs base_url"),
        ({"judges": {"Bad Name": {"backend": "ocr", "model": "tesseract"}}}, "invalid judge names"),
        ({"judges": {"q": {"backend": "grpc", "model": "q"}}}, "backend"),
        (
            {"judges": {"q": {"backend": "openai", "model": "q", "base_url": "http://x/v1", "api_key": "sk-1"}}},
            "api_key",
        ),
    ]:
        path = _write(tmp_path / "judges.yaml", data)
        with pytest.raises(JudgesConfigError, match=match) as err:
            load_judges_config(path)
        assert str(path) in str(err.value)
    (tmp_path / "broken.yaml").write_text("judges: [unclosed", encoding="utf-8")
    with pytest.raises(JudgesConfigError, match="not valid YAML"):
        load_judges_config(tmp_path / "broken.yaml")
    with pytest.raises(JudgesConfigError, match="not found"):
        load_judges_config(tmp_path / "nope.yaml")
