"""Split conformal prediction intervals, conditioned on the level, and how well they cover.

Fit on one held-out sensor (the validation sensor: not trained on), used on every other.

* **Bins.** The calibrated value ``ŷ`` (what the gateway knows when it publishes) is cut into
  equal-count bins at quantiles of the validation predictions: ``k = min(MAX_BINS, n //
  MIN_PER_BIN)`` bins (at least one), so every bin holds at least :data:`MIN_PER_BIN` pairs.
  The error of a PM calibration grows with the concentration; one width for all levels would
  be too wide at clean air and too narrow in episodes.
* **Width.** In each bin of ``n`` pairs the half-width is the ``⌈(n + 1)·level⌉``-th smallest
  absolute residual ``|y − ŷ|``: the finite-sample split conformal quantile, which covers a new
  exchangeable pair of that bin with probability at least ``level`` (Mondrian / group-
  conditional conformal prediction; Vovk et al., *Algorithmic Learning in a Random World*, 2005;
  Angelopoulos & Bates, *A Gentle Introduction to Conformal Prediction*, arXiv:2107.07511).
  With ``n ≥ MIN_PER_BIN = 100`` that rank is at most ``n`` for any level up to 0.99.

Consecutive windows of one sensor are not independent, and the validation sensor also chose the
early-stopping epoch: the guarantee is nominal, which is why ``evaluate`` measures coverage on
the test sensor.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.manifest import PredictionIntervals
from training.errors import DataError

__all__ = [
    "DEFAULT_LEVEL",
    "MAX_BINS",
    "MIN_PER_BIN",
    "IntervalScores",
    "bin_pairs",
    "conformal_rank",
    "finite_pairs",
    "fit_intervals",
    "score_intervals",
]

DEFAULT_LEVEL = 0.9
MAX_BINS = 5
MIN_PER_BIN = 100
Array = npt.NDArray[np.floating]
Float64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class IntervalScores:
    """Measured coverage and width of the intervals on pairs with a reference."""

    level: float
    coverage: float
    mean_width: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def conformal_rank(n: int, level: float) -> int:
    """1-based rank of the finite-sample conformal quantile among ``n`` sorted scores."""
    return math.ceil((n + 1) * level)


def finite_pairs(predicted: Array, reference: Array) -> tuple[Float64, Float64]:
    """The pairs whose prediction and reference are both finite, flattened to float64."""
    predicted = np.asarray(predicted, dtype=np.float64).reshape(-1)
    reference = np.asarray(reference, dtype=np.float64).reshape(-1)
    keep = np.isfinite(predicted) & np.isfinite(reference)
    return predicted[keep], reference[keep]


def bin_pairs(predicted: Array) -> tuple[Array, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(edges, bin of every pair, pairs per bin)``: equal-count bins of the predictions, as
    many as keep :data:`MIN_PER_BIN` pairs in each (at most :data:`MAX_BINS`, at least one)."""
    n = len(predicted)
    for bins in range(max(1, min(MAX_BINS, n // MIN_PER_BIN)), 0, -1):
        edges = np.unique(np.quantile(predicted, np.arange(1, bins) / bins))
        which = np.searchsorted(edges, predicted, side="right")
        counts = np.bincount(which, minlength=len(edges) + 1)
        if counts.min() >= MIN_PER_BIN:  # ties in the predictions can starve a bin: fewer bins
            break
    return edges, which, counts


def fit_intervals(
    predicted: Array, reference: Array, *, sensor: str, level: float = DEFAULT_LEVEL
) -> PredictionIntervals:
    """Binned split conformal intervals from one held-out sensor's predictions."""
    predicted, reference = finite_pairs(predicted, reference)
    n = len(predicted)
    if conformal_rank(n, level) > n or n < MIN_PER_BIN:
        raise DataError(
            f"{n} validation pairs cannot set a {level:.0%} interval: need at least {MIN_PER_BIN}"
        )
    edges, which, counts = bin_pairs(predicted)
    residuals = np.abs(reference - predicted)
    widths = [
        float(np.sort(residuals[which == index])[conformal_rank(int(count), level) - 1])
        for index, count in enumerate(counts)
    ]
    return PredictionIntervals(
        level=level,
        edges=edges.tolist(),
        half_widths=widths,
        counts=counts.tolist(),
        calibration_sensor=sensor,
    )


def score_intervals(
    intervals: PredictionIntervals, predicted: Array, reference: Array
) -> IntervalScores:
    """Share of references inside their interval, and the intervals' mean width."""
    predicted, reference = finite_pairs(predicted, reference)
    if len(predicted) == 0:
        return IntervalScores(level=intervals.level, coverage=math.nan, mean_width=math.nan, n=0)
    width = np.asarray(intervals.half_widths)[
        np.searchsorted(np.asarray(intervals.edges), predicted, side="right")
    ]
    low = np.minimum(predicted, np.maximum(0.0, predicted - width))  # as the gateway does
    high = predicted + width
    inside = (reference >= low) & (reference <= high)
    return IntervalScores(
        level=intervals.level,
        coverage=float(inside.mean()),
        mean_width=float(np.mean(high - low)),
        n=len(predicted),
    )
