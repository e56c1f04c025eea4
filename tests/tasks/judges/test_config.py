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


# ---- api_key_env: only variables that hold API keys (issue 24 item 9) ---------------------------

def _judges_check(tmp_path: Path, base_url: str, key_env: str, env: dict[str, str]):
    """`imagebench judges check` in its own process, both routed judges on ``base_url`` with
    their key in ``key_env``."""
    import os
    import subprocess
    import sys

    endpoint = {"backend": "openai", "base_url": base_url, "model": "fake-qwen", "api_key_env": key_env,
                "max_retries": 0, "timeout_s": 20}
    cfg = _write(tmp_path / "judges.yaml", {"judges": {"qwen3-vl": endpoint, "gemma": endpoint}})
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("IMAGEBENCH_", "AWS_"))}
    full = {**keep, "IMAGEBENCH_HOME": str(tmp_path / "home"), "IMAGEBENCH_JUDGES_CONFIG": str(cfg),
            "IMAGEBENCH_WARM": "off", "COLUMNS": "10000", **env}
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "judges", "check", "--format", "json"], cwd=REPO,
                          env=full, capture_output=True, text=True, timeout=300)
    return cfg, proc


@pytest.mark.parametrize("variable, value", [
    ("AWS_SECRET_ACCESS_KEY", "scanAwsSecret/item9+AccessKey0123456789zz"),
    ("IMAGEBENCH_PANEL_DATABASE", "postgresql://panel:Pan3lPassw0rdItem9@127.0.0.1:5/panel"),
    ("PREFECT_API_KEY", "pnu_item9PrefectCloudKey0123456789"),
    ("DATABASE_PASSWORD", "item9-plain-password-0123"),
])
def test_judges_check_sends_no_credential_that_is_not_an_api_key(tmp_path: Path, variable: str, value: str) -> None:
    """A judges config naming a cloud credential or one of imagebench's own settings is refused
    when it is loaded, in one line naming the file, the judge and the variable: the endpoint (a
    real loopback server recording every header) receives nothing."""
    from tests.fake_openai import FakeOpenAI

    with FakeOpenAI(model="fake-qwen") as srv:
        cfg, proc = _judges_check(tmp_path, srv.base_url, variable, {variable: value})
        seen = list(srv.requests)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert seen == [], [r.headers for r in seen]
    assert value not in out
    lines = [ln for ln in out.splitlines() if variable in ln]
    assert len(lines) == 1 and str(cfg) in lines[0] and "qwen3-vl" in lines[0], out
    assert "_API_KEY" in lines[0]  # says which names are allowed


def test_judges_check_still_sends_an_api_key(tmp_path: Path) -> None:
    from tests.fake_openai import FakeOpenAI

    key = "sk-item9-allowed-judge-key-0123456789"
    with FakeOpenAI(model="fake-qwen", api_key=key) as srv:
        _, proc = _judges_check(tmp_path, srv.base_url, "FAKE_JUDGE_API_KEY", {"FAKE_JUDGE_API_KEY": key})
        seen = list(srv.requests)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert seen and all(r.headers.get("Authorization") == f"Bearer {key}" for r in seen)
    assert key not in proc.stdout + proc.stderr


@pytest.mark.parametrize("name, allowed", [
    ("OPENAI_API_KEY", True), ("OPENROUTER_API_KEY", True), ("AZURE_OPENAI_API_KEY", True), ("GEMINI_API_KEY", True),
    ("AWS_SECRET_ACCESS_KEY", False), ("AWS_BEARER_API_KEY", False), ("IMAGEBENCH_PANEL_DATABASE", False),
    ("IMAGEBENCH_JUDGE_API_KEY", False), ("PREFECT_API_KEY", False), ("HOME", False), ("PGPASSWORD", False),
    ("AZURE_CLIENT_SECRET", False), ("GOOGLE_APPLICATION_CREDENTIALS", False), ("openai_api_key", False),
    ("_API_KEY", False), ("A B_API_KEY", False),
])
def test_api_key_env_names(tmp_path: Path, name: str, allowed: bool) -> None:
    path = _write(tmp_path / "judges.yaml", {"judges": {"gemma": {
        "backend": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "g", "api_key_env": name}}})
    if allowed:
        assert load_judges_config(path).judges["gemma"].api_key_env == name
        return
    with pytest.raises(JudgesConfigError) as err:
        load_judges_config(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "gemma" in msg and repr(name) in msg
