"""Load and check the two judge files.

- The routing (``reference/judges-routing-<version>.yaml``) is part of the benchmark definition:
  category -> preferred judge, fallback judge, template version. Checked on load: known
  categories (all of them), valid judge names, existing templates, no route whose fallback is its
  preferred judge, OCR evidence only beside another judge.
- The endpoints (``IMAGEBENCH_JUDGES_CONFIG``, see ``judges.example.yaml``) are deployment
  settings: judge name -> backend, URL, model, key variable, concurrency, timeout.
- Together (:func:`check_routing_against`): every judge the routing names must be configured or
  built in (``ocr``) — except when no endpoint is configured at all (the offline demo), where
  routes to absent judges leave their items "not judged".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from schemas.judges import JUDGE_NAME_RE, JudgesConfig, Routing

from .base import JudgesConfigError
from .protocol import load_template, template_names
from .registry import BUILTIN_JUDGES


def _read_yaml(path: Path, what: str) -> Any:
    path = Path(path)
    if not path.is_file():
        raise JudgesConfigError(f"{path}: {what} file not found")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise JudgesConfigError(f"{path}: not valid YAML: {exc}") from exc


def _pydantic_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()))
        msg = err.get("msg", "")
        msg = msg.removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def parse_routing(data: Any, source: str = "<routing>") -> Routing:
    if not isinstance(data, dict):
        raise JudgesConfigError(f"{source}: expected a mapping with version/routes, got {type(data).__name__}")
    try:
        routing = Routing.model_validate(data)
    except ValidationError as exc:
        raise JudgesConfigError(f"{source}: invalid routing: {_pydantic_message(exc)}") from exc
    for category, route in routing.routes.items():
        for role, name in (("preferred", route.preferred), ("fallback", route.fallback)):
            if name is not None and not JUDGE_NAME_RE.fullmatch(name):
                raise JudgesConfigError(
                    f"{source}: category {category!r}: {role} judge {name!r} is not a valid judge name ({JUDGE_NAME_RE.pattern})"
                )
        if route.fallback is not None and route.fallback == route.preferred:
            raise JudgesConfigError(
                f"{source}: category {category!r}: fallback {route.fallback!r} is the preferred judge"
            )
        if route.ocr_evidence and route.preferred == "ocr":
            raise JudgesConfigError(
                f"{source}: category {category!r}: ocr_evidence needs a VLM as preferred judge, not 'ocr' itself"
            )
        try:
            load_template(route.template)
        except ValueError:
            raise JudgesConfigError(
                f"{source}: category {category!r}: unknown judge template {route.template!r}; known: {template_names()}"
            ) from None
    return routing


def parse_judges_config(data: Any, source: str = "<judges>") -> JudgesConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise JudgesConfigError(f"{source}: expected a mapping with a 'judges' key, got {type(data).__name__}")
    try:
        return JudgesConfig.model_validate(data)
    except ValidationError as exc:
        raise JudgesConfigError(f"{source}: invalid judges config: {_pydantic_message(exc)}") from exc


def check_routing_against(
    routing: Routing,
    judges_config: JudgesConfig | None,
    routing_source: str = "<routing>",
    judges_source: str = "<judges>",
) -> None:
    """Every judge the routing names must be configured (or built in). With no endpoint
    configured at all (the demo), nothing is required: absent judges leave items not judged."""
    configured = set(judges_config.judges) if judges_config else set()
    if not configured:
        return
    known = configured | set(BUILTIN_JUDGES)
    for category, route in routing.routes.items():
        for role, name in (("preferred", route.preferred), ("fallback", route.fallback)):
            if name is not None and name not in known:
                raise JudgesConfigError(
                    f"{routing_source}: category {category!r} names unknown judge {name!r} ({role}): "
                    f"{judges_source} configures {sorted(configured)}; built in: {list(BUILTIN_JUDGES)}"
                )


def load_judges_config(path: str | Path | None) -> JudgesConfig:
    """The endpoints file; ``None`` gives an empty config (built-in judges only)."""
    if path is None:
        return JudgesConfig()
    return parse_judges_config(_read_yaml(Path(path), "judges config"), str(path))


def load_routing(
    path: str | Path,
    judges_config: JudgesConfig | None = None,
    judges_source: str = "judges config",
) -> Routing:
    """The routing file, checked; with ``judges_config`` also checked against the endpoints."""
    routing = parse_routing(_read_yaml(Path(path), "judge routing"), str(path))
    if judges_config is not None:
        check_routing_against(routing, judges_config, str(path), judges_source)
    return routing


def routing_judges(routing: Routing) -> list[str]:
    """Every judge name the routing uses, sorted."""
    names = {r.preferred for r in routing.routes.values()} | {r.fallback for r in routing.routes.values() if r.fallback}
    names |= {"ocr" for r in routing.routes.values() if r.ocr_evidence}
    return sorted(names)
