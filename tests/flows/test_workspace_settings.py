"""The demo's settings live in the workspace (<home>/imagebench.yaml) and every later command in
that workspace finds them without exporting anything (issue 8, item 5)."""

from __future__ import annotations

import pytest

_KEYS = ("IMAGEBENCH_HOME", "IMAGEBENCH_CONFIG", "IMAGEBENCH_REFERENCE_DIR", "IMAGEBENCH_REFERENCE_VERSION",
         "IMAGEBENCH_HPSV3_BASE_MODEL", "IMAGEBENCH_HPSV3_CHECKPOINT")


def _plain_env(monkeypatch) -> None:
    for key in _KEYS:
        monkeypatch.delenv(key, raising=False)


def test_demo_settings_are_found_from_a_plain_environment(tmp_path, monkeypatch, tiny_model):
    from flows.demo import write_workspace_settings
    from schemas.settings import load_settings

    base, ckpt = tiny_model
    _plain_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "data"  # the default workspace ./data
    demo = load_settings(home=home, reference_dir=home / "reference", reference_version="demo",
                         hpsv3_base_model=str(base), hpsv3_checkpoint=str(ckpt))
    path = write_workspace_settings(demo)
    assert path == home / "imagebench.yaml"

    for env_home in (None, str(home)):  # the default cwd ./data, or IMAGEBENCH_HOME alone
        if env_home:
            monkeypatch.chdir("/")
            monkeypatch.setenv("IMAGEBENCH_HOME", env_home)
        s = load_settings()
        assert s.reference_version == "demo"
        assert s.reference_dir == (home / "reference").resolve()
        assert (s.hpsv3_base_model, s.hpsv3_checkpoint) == (str(base.resolve()), str(ckpt.resolve()))

    # Below env vars and IMAGEBENCH_CONFIG, above the defaults.
    monkeypatch.setenv("IMAGEBENCH_REFERENCE_VERSION", "v9")
    assert load_settings().reference_version == "v9"
    monkeypatch.delenv("IMAGEBENCH_REFERENCE_VERSION")
    config = tmp_path / "ops.yaml"
    config.write_text("reference_version: v7\n")
    monkeypatch.setenv("IMAGEBENCH_CONFIG", str(config))
    assert load_settings().reference_version == "v7"
    assert load_settings().hpsv3_checkpoint == str(ckpt.resolve())
    # Another workspace is not affected; a broken file is one clear error naming it.
    monkeypatch.delenv("IMAGEBENCH_CONFIG")
    monkeypatch.setenv("IMAGEBENCH_HOME", str(tmp_path / "other"))
    assert load_settings().reference_version == "v1"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "imagebench.yaml").write_text("- not\n- a mapping\n")
    with pytest.raises(ValueError, match="other/imagebench.yaml"):
        load_settings()
