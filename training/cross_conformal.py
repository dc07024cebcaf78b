"""Conformal intervals across units: every unit's residuals from a model that never saw it.

Split conformal on one validation sensor (training/conformal.py) holds on that sensor and is too
narrow on others: the unit-to-unit differences, the largest source of error on a new unit, are
not in one unit's residuals (issue 28: 77-91 % on the defaults' test sensors). Here the widths
come from several units' *out-of-unit* residuals: each training sensor predicted by a fold
retrained without it on as many units as the exported model, for its kept epochs
(training/pool_folds.py), the validation sensor by the exported model (cross-conformal over
sensors; Vovk 2015, Barber et al. 2021's jackknife+ / CV+ with the sensor as the left-out
block).

* **Bins** as split conformal: equal-count bins of the pooled predictions (at least
  :data:`~training.conformal.MIN_PER_BIN` pairs each, at most
  :data:`~training.conformal.MAX_BINS`).
* **Width.** Each unit weighs the same (each pair ``1 / n_unit``): a new unit is one draw of a
  unit, whose pairs are then drawn; a unit with more hours must not set the width alone. In each
  bin the half-width is the smallest absolute residual whose weighted share reaches
  ``level · (n + 1) / n`` (the finite-sample rank of split conformal, as a weighted share).
* **A quantile table** at :data:`QUANTILE_LEVELS` (and the level itself) per bin lets a sensor
  beside a reference adapt its level online (tesla_gateway/monitor/coverage.py); the
  short-history buckets go without (``quantile_levels=()``: a young sensor's adapted interval
  scales as a normal error's), which keeps the manifest small.
* **Per-unit figures.** Each calibration unit is scored with intervals fitted on the *other*
  units (leave-one-unit-out: what a unit nobody calibrated on sees); the test unit with the
  intervals as published.

Folds trained on one sensor fewer than the exported model were worse than it and set widths
that leaned wide; folds of as many sensors and epochs are its peers (docs/benchmarks/intervals/).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.manifest import PredictionIntervals, UnitCoverage
from tesla_gateway.monitor.coverage import AdaptiveInterval
from training.conformal import (
    DEFAULT_LEVEL,
    MIN_PER_BIN,
    bin_pairs,
    finite_pairs,
    score_intervals,
)
from training.errors import DataError

__all__ = [
    "QUANTILE_LEVELS",
    "UnitResiduals",
    "fit_cross_unit",
    "held_out_coverage",
    "replay_adaptive",
    "unit_scores",
    "weighted_quantile",
]

QUANTILE_LEVELS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.975, 0.99)
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class UnitResiduals:
    """One unit's predictions (by a model that never trained on it) and references."""

    sensor: str
    role: str  # "train", "validation" or "test"
    predicted: FloatArray
    reference: FloatArray

    def finite(self) -> UnitResiduals:
        return UnitResiduals(self.sensor, self.role, *finite_pairs(self.predicted, self.reference))


def weighted_quantile(scores: FloatArray, weights: FloatArray, share: float) -> float:
    """Smallest score whose weighted cumulative share reaches ``share`` (the largest above 1)."""
    order = np.argsort(scores, kind="stable")
    cumulative = np.cumsum(weights[order]) / weights.sum()
    index = int(np.searchsorted(cumulative, min(share, 1.0) - 1e-12, side="left"))
    return float(scores[order][min(index, len(scores) - 1)])


def fit_cross_unit(
    units: Sequence[UnitResiduals],
    *,
    validation_sensor: str,
    level: float = DEFAULT_LEVEL,
    quantile_levels: Sequence[float] = QUANTILE_LEVELS,
) -> PredictionIntervals:
    """Binned conformal intervals from several units' out-of-unit residuals, units weighing
    the same (see the module doc)."""
    kept = [unit.finite() for unit in units]
    kept = [unit for unit in kept if len(unit.predicted) > 0]
    if len(kept) < 2:
        raise DataError(
            f"intervals across units need residuals of at least 2 units, got {len(kept)}"
        )
    predicted = np.concatenate([unit.predicted for unit in kept])
    residual = np.abs(np.concatenate([unit.reference - unit.predicted for unit in kept]))
    weights = np.concatenate(
        [np.full(len(unit.predicted), 1.0 / len(unit.predicted)) for unit in kept]
    )
    if len(predicted) < MIN_PER_BIN:
        raise DataError(
            f"{len(predicted)} pairs cannot set a {level:.0%} interval: need {MIN_PER_BIN}"
        )
    edges, which, counts = bin_pairs(predicted)
    levels = sorted({*quantile_levels, level}) if quantile_levels else [level]

    def widths(at: float) -> list[float]:
        return [
            weighted_quantile(
                residual[which == b], weights[which == b], at * (int(count) + 1) / int(count)
            )
            for b, count in enumerate(counts)
        ]

    table = [widths(q) for q in levels]
    for lower, upper in itertools.pairwise(table):  # ties of shares: keep monotone
        upper[:] = [max(a, b) for a, b in zip(lower, upper, strict=True)]
    return PredictionIntervals(
        method="cross_unit_conformal_binned",
        level=level,
        edges=edges.tolist(),
        half_widths=table[levels.index(level)],
        counts=counts.tolist(),
        calibration_sensor=validation_sensor,
        calibration_sensors=[unit.sensor for unit in kept],
        quantile_levels=levels if quantile_levels else [],
        quantile_half_widths=table if quantile_levels else [],
    )


def unit_scores(intervals: PredictionIntervals, unit: UnitResiduals) -> UnitCoverage:
    """Coverage and mean width of ``intervals`` on one unit's pairs."""
    scores = score_intervals(intervals, unit.predicted, unit.reference)
    return UnitCoverage(
        sensor=unit.sensor,
        role=unit.role,  # type: ignore[arg-type]
        n=scores.n,
        coverage=0.0 if math.isnan(scores.coverage) else scores.coverage,
        mean_width=0.0 if math.isnan(scores.mean_width) else scores.mean_width,
    )


def held_out_coverage_intervals(
    units: Sequence[UnitResiduals], *, validation_sensor: str, level: float = DEFAULT_LEVEL
) -> list[PredictionIntervals]:
    """Per unit, the intervals fitted on all the other units."""
    return [
        fit_cross_unit(
            [other for j, other in enumerate(units) if j != index],
            validation_sensor=validation_sensor,
            level=level,
        )
        for index in range(len(units))
    ]


def replay_adaptive(
    intervals: PredictionIntervals, unit: UnitResiduals, *, gamma: float
) -> UnitCoverage:
    """A unit's pairs, in time order, through the gateway's adaptive conformal inference
    (tesla_gateway/monitor/coverage.py): the coverage and width its adapted interval reaches
    beside a reference."""
    finite = unit.finite()
    state = AdaptiveInterval(intervals.level, gamma=gamma, window=max(1, len(finite.predicted)))
    for value, reference in zip(finite.predicted.tolist(), finite.reference.tolist(), strict=True):
        state.update(value, reference, intervals.interval(value), intervals)
    figures = state.figures()
    return UnitCoverage(
        sensor=unit.sensor,
        role=unit.role,  # type: ignore[arg-type]
        n=figures.pairs,
        coverage=0.0 if math.isnan(figures.adapted_coverage) else figures.adapted_coverage,
        mean_width=0.0 if math.isnan(figures.adapted_mean_width) else figures.adapted_mean_width,
    )


def held_out_coverage(
    units: Sequence[UnitResiduals],
    *,
    validation_sensor: str,
    level: float = DEFAULT_LEVEL,
) -> list[UnitCoverage]:
    """Each unit scored with intervals fitted on all the others (leave-one-unit-out)."""
    fitted = held_out_coverage_intervals(units, validation_sensor=validation_sensor, level=level)
    return [
        unit_scores(intervals, unit.finite()) for intervals, unit in zip(fitted, units, strict=True)
    ]
