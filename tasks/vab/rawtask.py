"""One VAB task as a source gives it (our JSONL manifest, the official release, the lake's labels),
before tasks.vab.sets validates it: the shape both the readers and the importer share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RawTask:
    """One task as read from a source, before validation. ``images`` are (name, loader) pairs:
    the loader returns the image bytes (read late, one image at a time)."""

    where: str  # how to name it before its task id is known ("line 3")
    task_id: Any
    domain: Any
    substyle: Any
    images: list[tuple[str, Callable[[], bytes]]]
    best: Any
    worst: Any
    expert_labels: Any = None
    extra: dict = field(default_factory=dict)
    labels: Any = None  # the release's letters (stored order)
