"""Judge backends by name, imported only when used (lm-evaluation-harness style).

``BACKENDS`` maps an ``Endpoint.backend`` value to a ``"module:Class"`` string; the module is
imported on the first :func:`backend_class` call for that name, so a deployment with only HTTP
judges never imports torch/transformers, and the OCR judge needs nothing but Tesseract.
"""

from __future__ import annotations

import importlib
from typing import Any

from schemas.judges import Endpoint, JudgesConfig

from .base import Judge

BACKENDS: dict[str, str] = {
    "openai": "tasks.judges.openai_compat:OpenAIJudge",
    "transformers": "tasks.judges.transformers_backend:TransformersJudge",
    "ocr": "tasks.judges.ocr:OCRJudge",
}
# Judges that exist without an endpoints entry (when Tesseract is installed).
BUILTIN_JUDGES: tuple[str, ...] = ("ocr",)


def register_backend(name: str, target: str) -> None:
    """Add a backend: ``target`` is ``"module:Class"`` of a :class:`~tasks.judges.base.Judge`
    subclass. (Endpoints can only name the backends their schema allows.)"""
    if ":" not in target:
        raise ValueError(f"backend target must be 'module:Class', got {target!r}")
    BACKENDS[name] = target


def backend_class(backend: str) -> type[Judge]:
    try:
        target = BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown judge backend {backend!r}; known: {sorted(BACKENDS)}") from None
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, Judge)):
        raise TypeError(f"{target} is not a Judge subclass")
    return cls


def create_judge(name: str, endpoint: Endpoint, **options: Any) -> Judge:
    """An instance of the endpoint's backend (no network, no model load: those happen on use)."""
    return backend_class(endpoint.backend)(name, endpoint, **options)


def builtin_endpoint(name: str) -> Endpoint:
    if name == "ocr":
        from .ocr import builtin_ocr_endpoint

        return builtin_ocr_endpoint()
    raise KeyError(name)


def configured_endpoints(judges_config: JudgesConfig | None) -> dict[str, Endpoint]:
    """The endpoints config plus the built-in judges it does not override."""
    endpoints = dict(judges_config.judges) if judges_config else {}
    for name in BUILTIN_JUDGES:
        endpoints.setdefault(name, builtin_endpoint(name))
    return endpoints
