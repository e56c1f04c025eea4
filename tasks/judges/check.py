"""``imagebench judges check``: which configured judges answer, and with which model.

- ``openai``: ``GET {base_url}/models`` (the configured model must be listed); servers without
  that route get a 1-token chat request whose ``model`` field must be the configured one.
- ``ocr``: the Tesseract version (the built-in judge is always listed).
- ``transformers``: whether the model directory has a loadable Qwen2-VL-family config, a tokenizer
  and weight files (``load_weights=True`` loads the model itself).

Never raises for a judge that is down: each row says what happened.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from schemas.judges import Endpoint, JudgesConfig

from .base import redact
from .registry import BUILTIN_JUDGES, builtin_endpoint, create_judge

CHECK_COLUMNS = ("judge", "backend", "endpoint", "model", "reported_model", "ok", "detail", "latency_s")


def _row(name: str, ep: Endpoint, endpoint: str | None, **kw: Any) -> dict[str, Any]:
    row = {
        "judge": name,
        "backend": ep.backend,
        "endpoint": endpoint,
        "model": ep.model,
        "reported_model": None,
        "ok": False,
        "detail": "",
        "latency_s": None,
    }
    row.update(kw)
    row["detail"] = redact(row["detail"])
    return row


async def _check_openai(name: str, ep: Endpoint) -> dict[str, Any]:
    judge = create_judge(name, ep)
    try:
        result = await judge.probe()  # type: ignore[attr-defined]
    finally:
        await judge.aclose()
    return _row(name, ep, judge.endpoint_label, **result)


def _check_ocr(name: str, ep: Endpoint) -> dict[str, Any]:
    from .ocr import OCRJudge, tesseract_version

    judge = OCRJudge(name, ep)
    t0 = time.perf_counter()
    version = tesseract_version(judge.cmd)
    latency = time.perf_counter() - t0
    if version is None:
        return _row(
            name,
            ep,
            "local",
            detail=f"tesseract not found ({judge.cmd!r}): apt-get install tesseract-ocr",
            latency_s=latency,
        )
    return _row(
        name, ep, "local", reported_model=version, ok=True, detail="tesseract answers (offline)", latency_s=latency
    )


def _check_transformers(name: str, ep: Endpoint, load_weights: bool) -> dict[str, Any]:
    import json

    from .transformers_backend import SUPPORTED_MODEL_TYPES, load_local_vlm

    where = "local:transformers"
    t0 = time.perf_counter()
    try:
        if load_weights:
            vlm = load_local_vlm(ep.model)
            dtype = str(vlm.dtype).removeprefix("torch.")
            detail = f"loaded on {vlm.device} ({dtype})"
            return _row(
                name,
                ep,
                where,
                reported_model=vlm.name_or_path,
                ok=True,
                detail=detail,
                latency_s=time.perf_counter() - t0,
            )
        from transformers import AutoTokenizer

        local = Path(ep.model).expanduser()
        path = local
        if not local.is_dir():
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(repo_id=ep.model, allow_patterns=["*.json", "*.jinja", "*.txt"]))
        model_type = json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            return _row(
                name, ep, where, detail=f"model_type {model_type!r} is not one of {list(SUPPORTED_MODEL_TYPES)}"
            )
        AutoTokenizer.from_pretrained(str(path))
        weights = sorted(p.name for p in path.glob("*.safetensors"))
        if not weights and local.is_dir():
            return _row(name, ep, where, detail=f"{path}: config and tokenizer load, but no *.safetensors weights")
        detail = f"{model_type} config and tokenizer load" + (f"; {len(weights)} weight file(s)" if weights else "")
        return _row(
            name, ep, where, reported_model=ep.model, ok=True, detail=detail, latency_s=time.perf_counter() - t0
        )
    except Exception as exc:
        return _row(name, ep, where, detail=f"{type(exc).__name__}: {exc}", latency_s=time.perf_counter() - t0)


async def _check_all(judges_config: JudgesConfig, load_weights: bool) -> list[dict[str, Any]]:
    endpoints = dict(judges_config.judges)
    for name in BUILTIN_JUDGES:
        endpoints.setdefault(name, builtin_endpoint(name))

    async def one(name: str, ep: Endpoint) -> dict[str, Any]:
        if ep.backend == "openai":
            return await _check_openai(name, ep)
        if ep.backend == "ocr":
            return await asyncio.to_thread(_check_ocr, name, ep)
        return await asyncio.to_thread(_check_transformers, name, ep, load_weights)

    return list(await asyncio.gather(*(one(n, ep) for n, ep in sorted(endpoints.items()))))


def check_judges(judges_config: JudgesConfig | None, *, load_weights: bool = False) -> list[dict[str, Any]]:
    """One row per configured judge (plus the built-in ``ocr``), with the columns of
    :data:`CHECK_COLUMNS`: ``ok`` is True when the judge answers with its configured model."""
    config = judges_config or JudgesConfig()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_check_all(config, load_weights))
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, _check_all(config, load_weights)).result()
