"""Repeatable timing: the implementation lives in :mod:`training.bench.timing` (one for both)."""

from __future__ import annotations

from training.bench.timing import best_rate, best_rates_interleaved

__all__ = ["best_rate", "best_rates_interleaved"]
