"""Prediction intervals in the manifest: conformal half-widths per bin of the calibrated value.

Training fits them (training/conformal.py, training/cross_conformal.py); the gateway publishes
``interval(v)`` with each calibrated value (daemon/ticker.py), bounds outputs with it
(models/plausibility.py) and, beside a reference, adapts the level along the quantile table
(monitor/coverage.py).
"""

from __future__ import annotations

import bisect
import itertools
import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["IntervalMethod", "PredictionIntervals", "UnitCoverage"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


IntervalMethod = Literal["split_conformal_binned", "cross_unit_conformal_binned"]


class UnitCoverage(_Strict):
    """How the intervals covered one unit's pairs with a reference (training/cross_conformal.py).

    A ``train`` or ``validation`` unit is scored with intervals fitted *without* its residuals
    (leave-one-unit-out over the calibration units: what a unit nobody calibrated on sees); the
    ``test`` unit with the intervals as published."""

    sensor: str
    role: Literal["train", "validation", "test"]
    n: int = Field(ge=0, description="Pairs (windows) of the unit scored.")
    coverage: float = Field(ge=0, le=1, description="Share of references inside the interval.")
    mean_width: float = Field(ge=0, description="Mean of high - low, in the feature's unit.")


class PredictionIntervals(_Strict):
    """Conformal prediction intervals, one half-width per concentration bin.

    Bins split the *calibrated* value (known at serving time) at ``edges``; a value ``v`` falls
    in bin ``bisect_right(edges, v)`` and its interval is ``[max(0, v - w), v + w]`` with that
    bin's half-width ``w``. Concentrations are never negative, so clipping the low end at 0
    cannot lose coverage (a negative ``v`` keeps ``low = v``: the interval always holds the
    value it is published with).

    ``split_conformal_binned``: ``w`` is the ``ceil((n + 1) * level)``-th smallest absolute
    residual of the bin's ``n`` pairs of one validation sensor (training/conformal.py).
    ``cross_unit_conformal_binned``: ``w`` is the level quantile of the residuals of every
    ``calibration_sensors`` unit, each predicted by a model that never trained on it and each
    unit weighing the same (training/cross_conformal.py): unit-to-unit differences are in it.
    """

    method: IntervalMethod = "split_conformal_binned"
    level: float = Field(gt=0, lt=1, description="Nominal coverage, e.g. 0.9.")
    # bounds far above what training writes (<= 4 edges, 9 levels): a manifest that arrives
    # with a table of millions is refused, not held per model and searched per reading
    edges: list[float] = Field(
        max_length=255, description="Ascending calibrated values between bins."
    )
    half_widths: list[float] = Field(min_length=1, description="Per bin, in the feature's unit.")
    counts: list[Annotated[int, Field(ge=0)]] = Field(
        min_length=1, description="Calibration pairs per bin."
    )
    calibration_sensor: str = Field(description="Sensor whose residuals set the widths.")
    calibration_sensors: list[str] = Field(
        default_factory=list,
        description=(
            "cross_unit_conformal_binned: every unit whose out-of-unit residuals set the widths "
            "(calibration_sensor is then the validation sensor among them); empty otherwise."
        ),
    )
    quantile_levels: list[float] = Field(
        default_factory=list,
        max_length=99,
        description=(
            "Levels of quantile_half_widths, ascending: what a sensor beside a reference adapts "
            "its interval along (adaptive conformal inference, tesla_gateway/monitor/coverage.py)."
        ),
    )
    quantile_half_widths: list[list[float]] = Field(
        default_factory=list,
        description="Per quantile level, the half-width of every bin (non-decreasing in level).",
    )
    unit_coverage: list[UnitCoverage] = Field(
        default_factory=list,
        description="Measured coverage and width per unit (absent in older manifests).",
    )

    @field_validator("edges")
    @classmethod
    def _ascending(cls, value: list[float]) -> list[float]:
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError(f"edges must be strictly ascending, got {value}")
        return value

    @model_validator(mode="after")
    def _one_width_per_bin(self) -> PredictionIntervals:
        bins = len(self.edges) + 1
        if len(self.half_widths) != bins or len(self.counts) != bins:
            raise ValueError(
                f"{bins} bins need {bins} half_widths and counts, got "
                f"{len(self.half_widths)} and {len(self.counts)}"
            )
        if any(not math.isfinite(w) or w < 0 for w in self.half_widths):
            raise ValueError(f"half_widths must be finite and >= 0, got {self.half_widths}")
        self._check_quantiles(bins)
        return self

    def _check_quantiles(self, bins: int) -> None:
        levels, table = self.quantile_levels, self.quantile_half_widths
        if len(table) != len(levels) or any(len(row) != bins for row in table):
            raise ValueError(
                f"quantile_half_widths needs one row of {bins} widths per quantile level "
                f"({len(levels)} levels)"
            )
        if any(not 0 < q < 1 for q in levels) or any(b <= a for a, b in itertools.pairwise(levels)):
            raise ValueError(f"quantile_levels must ascend within (0, 1), got {levels}")
        # every row, the first and last included (a single row has no pair to compare)
        finite = all(math.isfinite(w) and w >= 0 for row in table for w in row)
        pairs = (zip(lower, upper, strict=True) for lower, upper in itertools.pairwise(table))
        if not finite or any(w > v for pair in pairs for w, v in pair):
            raise ValueError("quantile_half_widths must be finite, >= 0 and grow with level")

    def half_width_at(self, value: float, level: float) -> float | None:
        """The half-width for ``value`` at another coverage ``level``, interpolated linearly
        between the quantile table's levels and clamped to its ends; None without a table."""
        if not self.quantile_levels:
            return None
        column = bisect.bisect_right(self.edges, value)
        levels = self.quantile_levels
        widths = [row[column] for row in self.quantile_half_widths]
        if level <= levels[0]:
            return widths[0]
        if level >= levels[-1]:
            return widths[-1]
        upper = bisect.bisect_right(levels, level)
        share = (level - levels[upper - 1]) / (levels[upper] - levels[upper - 1])
        return widths[upper - 1] + share * (widths[upper] - widths[upper - 1])

    def interval(self, value: float) -> tuple[float, float]:
        """``(low, high)`` around a calibrated value: one bisection over a few edges."""
        width = self.half_widths[bisect.bisect_right(self.edges, value)]
        return min(value, max(0.0, value - width)), value + width
