"""Interval coverage of one co-located sensor, and its interval adapted online (pure).

Beside a reference every paired period says whether the published interval held the reference.
:class:`AdaptiveInterval` keeps the rolling coverage and width of the published intervals and
runs adaptive conformal inference (ACI; Gibbs & Candès, *Adaptive Conformal Inference Under
Distribution Shift*, NeurIPS 2021) on the sensor's own pairs::

    alpha_{t+1} = alpha_t + gamma * (alpha - err_t)

with ``alpha = 1 - level`` the manifest's miscoverage and ``err_t = 1`` when the reference lay
outside the *adapted* interval of pair ``t``. A unit whose errors are larger than the units the
intervals were calibrated on misses more often, so ``alpha_t`` falls and its interval widens
until its long-run coverage is ``level`` (G&C's bound: the miscoverage over T pairs is within
``(max(alpha_1, 1 - alpha_1) + gamma) / (gamma T)`` of ``alpha``). The adapted half-width at
level ``1 - alpha_t`` is read from the manifest's quantile table for the value's bin
(:meth:`PredictionIntervals.half_width_at`, clamped to the table's 0.5-0.99 levels); a manifest
without a table (or a sensor served by another model than the feature's primary) scales the
published half-width by the ratio of normal quantiles.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import NormalDist

from tesla_gateway.contract.calibrated import CalibratedReading
from tesla_gateway.contract.manifest import PredictionIntervals
from tesla_gateway.monitor.drift import DriftConfig

__all__ = ["AdaptiveInterval", "CoverageFigures", "adapted_half_width", "observe_interval"]

_NORMAL = NormalDist()
_EXTREME = 1e-6  # normal-quantile levels are kept inside (0, 1) by this much


@dataclass(frozen=True, slots=True)
class CoverageFigures:
    """Coverage and mean width of the published and of the adapted intervals over the recent
    pairs (NaN while there are none), and the adapted level now."""

    pairs: int
    level: float
    coverage: float
    mean_width: float
    adapted_level: float
    adapted_coverage: float
    adapted_mean_width: float

    def as_dict(self) -> dict[str, object]:
        def clean(value: float) -> float | None:
            return round(value, 4) if math.isfinite(value) else None

        return {
            "pairs": self.pairs,
            "level": self.level,
            "coverage": clean(self.coverage),
            "mean_width": clean(self.mean_width),
            "adapted_level": clean(self.adapted_level),
            "adapted_coverage": clean(self.adapted_coverage),
            "adapted_mean_width": clean(self.adapted_mean_width),
        }


def adapted_half_width(
    value: float,
    level: float,
    *,
    published_half_width: float,
    published_level: float,
    intervals: PredictionIntervals | None = None,
) -> float:
    """The half-width around ``value`` at coverage ``level``: the manifest's quantile table
    when ``intervals`` has one, else the published half-width scaled by the ratio of normal
    quantiles (a Gaussian error's interval grows so with its level)."""
    if intervals is not None:
        width = intervals.half_width_at(value, level)
        if width is not None:
            return width
    return published_half_width * _normal_quantile(level) / _normal_quantile(published_level)


def _normal_quantile(level: float) -> float:
    """Quantile of ``|Z|`` at ``level``: the half-width of a centred normal interval."""
    share = min(1.0 - _EXTREME, max(_EXTREME, (1.0 + level) / 2.0))
    return _NORMAL.inv_cdf(share)


class AdaptiveInterval:
    """ACI state of one (sensor, feature) beside a reference, over the last ``window`` pairs."""

    def __init__(self, level: float, *, gamma: float, window: int) -> None:
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must lie in (0, 1), got {level}")
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.level = level
        self.gamma = gamma
        self.alpha = 1.0 - level  # what ACI steers toward
        self.alpha_t = self.alpha
        self._published: deque[tuple[bool, float]] = deque(maxlen=window)
        self._adapted: deque[tuple[bool, float]] = deque(maxlen=window)

    @property
    def adapted_level(self) -> float:
        """``1 - alpha_t`` clipped to [0, 1]: the level the adapted interval is drawn at."""
        return min(1.0, max(0.0, 1.0 - self.alpha_t))

    def update(
        self,
        value: float,
        reference: float,
        published: tuple[float, float],
        intervals: PredictionIntervals | None = None,
    ) -> None:
        """One pair: score the published interval ``(low, high)`` and the adapted one, then
        step ``alpha_t``. ``intervals``: the serving model's, for its quantile table."""
        if not (math.isfinite(value) and math.isfinite(reference)):
            return
        low, high = published
        self._published.append((low <= reference <= high, high - low))
        if self.alpha_t <= 0.0:  # G&C: the whole line, which always covers
            low, high, covered = -math.inf, math.inf, True
        else:
            width = adapted_half_width(
                value,
                self.adapted_level,
                published_half_width=high - value,
                published_level=self.level,
                intervals=intervals,
            )
            low, high = min(value, max(0.0, value - width)), value + width
            covered = low <= reference <= high
        self._adapted.append((covered, high - low))
        self.alpha_t += self.gamma * (self.alpha - (0.0 if covered else 1.0))

    def reset(self) -> None:
        """A new model: its intervals start again at their own level."""
        self.alpha_t = self.alpha
        self._published.clear()
        self._adapted.clear()

    def figures(self) -> CoverageFigures:
        return CoverageFigures(
            pairs=len(self._published),
            level=self.level,
            coverage=_share(self._published),
            mean_width=_mean_width(self._published),
            adapted_level=self.adapted_level,
            adapted_coverage=_share(self._adapted),
            adapted_mean_width=_mean_width(self._adapted),
        )


def _share(rows: deque[tuple[bool, float]]) -> float:
    return sum(covered for covered, _ in rows) / len(rows) if rows else math.nan


def _mean_width(rows: deque[tuple[bool, float]]) -> float:
    finite = [width for _, width in rows if math.isfinite(width)]
    return sum(finite) / len(finite) if finite else math.nan


def observe_interval(
    state: AdaptiveInterval | None,
    reading: CalibratedReading,
    reference: float,
    table: PredictionIntervals | None,
    config: DriftConfig,
) -> AdaptiveInterval | None:
    """A co-located reading's pair: ``state`` stepped (made at its first pair with an interval,
    made anew when the published level changes); None while no reading had an interval."""
    interval = reading.interval
    if interval is None or reading.calibrated is None:
        return state
    if state is None or state.level != interval.level:
        state = AdaptiveInterval(
            interval.level, gamma=config.interval_gamma, window=config.window_pairs
        )
    state.update(reading.calibrated, reference, (interval.low, interval.high), table)
    return state
