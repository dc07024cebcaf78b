"""Repeatable timing: run a callable until enough time has passed, keep the best of rounds.

One implementation for ``make bench`` (bench/) and the training benchmark's latency column.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["best_rate", "best_rates_interleaved"]


def _round_rate(work: Callable[[], None], items_per_call: int, min_seconds: float) -> float:
    """Items per second over one round of at least ``min_seconds``."""
    calls = 0
    start = time.perf_counter()
    elapsed = 0.0
    while elapsed < min_seconds:
        work()
        calls += 1
        elapsed = time.perf_counter() - start
    return calls * items_per_call / elapsed


def best_rate(work: Callable[[], None], items_per_call: int, *, rounds: int = 3,
              min_seconds: float = 0.25) -> float:  # fmt: skip
    """Items per second: the best round, each round at least ``min_seconds`` long.

    The best round is the one least disturbed by the rest of the machine, which is what a
    ratio between two such measurements needs.
    """
    return best_rates_interleaved([work], items_per_call, rounds=rounds, min_seconds=min_seconds)[0]


def best_rates_interleaved(works: list[Callable[[], None]], items_per_call: int, *,
                           rounds: int = 8, min_seconds: float = 0.15) -> list[float]:  # fmt: skip
    """:func:`best_rate` for several callables whose ratio matters, their rounds alternated.

    Measuring one callable's rounds and then the other's lets a change in the machine's state
    (clock ramp, a neighbour's burst) land on one side only; alternating puts both sides
    through the same conditions.
    """
    for work in works:
        work()  # warm-up: allocation, caches, lazy initialisation
    best = [0.0] * len(works)
    order = list(enumerate(works))
    for round_index in range(rounds):
        for position, work in order if round_index % 2 == 0 else order[::-1]:  # A B, B A, ...
            best[position] = max(best[position], _round_rate(work, items_per_call, min_seconds))
    return best
