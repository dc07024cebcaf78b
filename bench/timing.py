"""Repeatable timing: run a callable until enough time has passed, keep the best of rounds."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["best_rate"]


def best_rate(work: Callable[[], None], items_per_call: int, *, rounds: int = 3,
              min_seconds: float = 0.25) -> float:  # fmt: skip
    """Items per second: the best round, each round at least ``min_seconds`` long.

    The best round is the one least disturbed by the rest of the machine, which is what a
    ratio between two such measurements needs.
    """
    work()  # warm-up: allocation, caches, lazy initialisation
    best = 0.0
    for _ in range(rounds):
        calls = 0
        start = time.perf_counter()
        elapsed = 0.0
        while elapsed < min_seconds:
            work()
            calls += 1
            elapsed = time.perf_counter() - start
        best = max(best, calls * items_per_call / elapsed)
    return best
