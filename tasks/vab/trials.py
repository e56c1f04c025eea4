"""Trials: each task is shown three times, in orders fixed by the collection's *trial scheme*
(recorded in its pin; schemas.vab.TRIAL_SCHEMES):

- ``vab-official-v1`` (every collection pinned since): the orders of the authors' eval.py. Trial 0
  is the stored order; then one ``random.Random(task_id)`` (a str seed) shuffles ``[0..n-1]`` again
  and again, each shuffle kept when it is not already among the kept orders, or always when n = 2,
  until there are 3. Same task id, same three orders as the authors' runs.
- ``imagebench-sha256-v1`` (collections pinned before): trials 1 and 2 each shuffled by
  ``random.Random(int(sha256("<task_id>/<trial>")[:8 bytes]))``; orders may repeat.

Positions are 1-based; ``order[i]`` is the stored position of the image shown in slot ``i + 1``
(the official 0-based permutation ``perm`` is ``[p - 1 for p in order]``). Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from schemas.vab import MAX_IMAGES, MIN_IMAGES, TRIAL_SCHEME_LEGACY, TRIAL_SCHEME_OFFICIAL, TRIAL_SCHEMES, TRIALS


def _check_n(n: int) -> None:
    if not isinstance(n, int) or not MIN_IMAGES <= n <= MAX_IMAGES:
        raise ValueError(f"a task has {MIN_IMAGES} to {MAX_IMAGES} images, got {n!r}")


def official_orders(task_id: str, n: int) -> list[list[int]]:
    """The three orders (1-based) eval.py shows task ``task_id`` of ``n`` images in."""
    _check_n(n)
    kept = [list(range(n))]
    rng = random.Random(task_id)  # str seed: stable across Python 3 versions (sha512 of the text)
    while len(kept) < TRIALS:
        candidate = list(range(n))
        rng.shuffle(candidate)
        if n == 2 or candidate not in kept:  # 2 images have only 2 orders: repeats are allowed
            kept.append(candidate)
    return [[p + 1 for p in perm] for perm in kept]


def permutation(task_id: str, n: int, trial: int, scheme: str = TRIAL_SCHEME_OFFICIAL) -> list[int]:
    """The stored positions (1-based) in the order shown in ``trial`` of the task."""
    _check_n(n)
    if scheme not in TRIAL_SCHEMES:
        raise ValueError(f"unknown trial scheme {scheme!r}; schemes: {', '.join(TRIAL_SCHEMES)}")
    if scheme == TRIAL_SCHEME_OFFICIAL:
        if trial not in range(TRIALS):
            raise ValueError(f"task {task_id!r}: trial must be 0..{TRIALS - 1}, got {trial!r}")
        return official_orders(task_id, n)[trial]
    if trial not in range(TRIALS):
        raise ValueError(f"task {task_id!r}: trial must be 0..{TRIALS - 1}, got {trial!r}")
    order = list(range(1, n + 1))
    if trial == 0:
        return order
    seed = int.from_bytes(hashlib.sha256(f"{task_id}/{trial}".encode()).digest()[:8], "big")
    random.Random(seed).shuffle(order)  # Random(int).shuffle is stable across Python versions
    return order


def trial_orders(task_id: str, n: int, scheme: str = TRIAL_SCHEME_OFFICIAL) -> list[list[int]]:
    """The orders of trials 0, 1, 2 under ``scheme``."""
    if scheme == TRIAL_SCHEME_OFFICIAL:
        return official_orders(task_id, n)
    return [permutation(task_id, n, t, TRIAL_SCHEME_LEGACY) for t in range(TRIALS)]


def repeated_orders(orders: Sequence[Sequence[int]]) -> bool:
    """True when a task of 3+ images is shown twice in the same order (never under either
    scheme's official rule; refused on import: a repeated order hides position bias)."""
    return len(orders[0]) > 2 and len({tuple(o) for o in orders}) < len(orders)


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
