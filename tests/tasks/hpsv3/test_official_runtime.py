"""Without the package index the official HPSv3 runtime cannot be built, and the bf16 parity check
says so instead of passing: the build error names the cause, and nothing is marked ready for reuse."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from . import official_runtime
from .official_runtime import OfficialRuntimeUnavailable, ensure_official_runtime


def test_an_unreachable_package_index_is_a_named_failure_not_a_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing listens on port 9 (discard); no config file may add another index or local wheels.
    for name in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    monkeypatch.setattr(official_runtime, "INSTALL_TIMEOUT_S", 120)

    with pytest.raises(OfficialRuntimeUnavailable, match="the package index must be reachable") as failure:
        ensure_official_runtime(tmp_path)

    assert "installing the official runtime failed" in str(failure.value)
    assert not list(tmp_path.glob("*/ready")), "a failed build must not be reused as ready"
