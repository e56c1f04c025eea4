"""HPSv3 reward-model scorer.

- ``preprocess``: image preprocessing (numpy + PIL only; importing it never imports torch);
- ``model``: the reward model on transformers 5, strict checkpoint loading, tokenisation;
- ``scorer``: ``HPSv3Scorer.load(...).score(images, prompts)`` and the scorer identity;
- ``tiny``: a tiny base model + random checkpoints for tests and demos.

``from tasks.hpsv3 import HPSv3Scorer`` works and imports torch only at that moment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .scorer import HPSv3Scorer

__all__ = ["HPSv3Scorer"]


def __getattr__(name: str) -> Any:
    if name == "HPSv3Scorer":
        from .scorer import HPSv3Scorer

        return HPSv3Scorer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
