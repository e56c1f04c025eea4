"""Trials as published: each task is shown three times. Trial 0 in the stored order; trials 1 and 2
in permutations seeded by the task id (sha256 of ``"<task_id>/<trial>"``), so every run, ours or
anyone's, shows the same orders. Positions are 1-based; ``order[i]`` is the stored position of the
image shown in slot ``i + 1``. Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from schemas.vab import MAX_IMAGES, MIN_IMAGES, TRIALS


def _check_n(n: int) -> None:
    if not isinstance(n, int) or not MIN_IMAGES <= n <= MAX_IMAGES:
        raise ValueError(f"a task has {MIN_IMAGES} to {MAX_IMAGES} images, got {n!r}")


def permutation(task_id: str, n: int, trial: int) -> list[int]:
    """The stored positions (1-based) in the order shown in ``trial`` of the task."""
    _check_n(n)
    if trial not in range(TRIALS):
        raise ValueError(f"task {task_id!r}: trial must be 0..{TRIALS - 1}, got {trial!r}")
    order = list(range(1, n + 1))
    if trial == 0:
        return order
    seed = int.from_bytes(hashlib.sha256(f"{task_id}/{trial}".encode()).digest()[:8], "big")
    random.Random(seed).shuffle(order)  # Random(int).shuffle is stable across Python versions
    return order


def trial_orders(task_id: str, n: int) -> list[list[int]]:
    """The orders of trials 0, 1, 2."""
    return [permutation(task_id, n, t) for t in range(TRIALS)]


def check_order(order: Sequence[int], n: int, where: str = "order") -> list[int]:
    """``order`` must be a permutation of 1..n; returns it as a list of ints."""
    got = [int(x) for x in order]
    if sorted(got) != list(range(1, n + 1)):
        raise ValueError(f"{where}: {' '.join(map(str, got)) or '(empty)'} is not a permutation of 1..{n}")
    return got


def map_back(order: Sequence[int], shown_position: int) -> int:
    """The stored position of the image a judge named at ``shown_position`` (1-based) of ``order``."""
    n = len(order)
    if not isinstance(shown_position, int) or not 1 <= shown_position <= n:
        raise ValueError(f"shown position {shown_position!r} is out of range 1..{n}")
    return int(order[shown_position - 1])


def map_forward(order: Sequence[int], stored_position: int) -> int:
    """The slot (1-based) where the image at ``stored_position`` is shown in ``order``."""
    try:
        return list(order).index(stored_position) + 1
    except ValueError:
        raise ValueError(f"stored position {stored_position!r} is not in order {list(order)}") from None
