"""Rolling error of calibrated vs reference, and drift events with hysteresis (pure).

For a sensor co-located with a reference station, every paired period with a calibrated value
feeds :class:`RollingError`: the RMSE and MAE of the calibrated and of the raw values against the
reference over the last ``window_pairs`` pairs, and the residual RMSE of the best straight line
from raw to reference over the same pairs (the one-line fit every practitioner has).
:class:`DriftDetector` raises a drift when the calibrated RMSE, over at least ``min_pairs`` pairs,
exceeds the threshold, and clears it only once it falls below ``clear_fraction`` times the
threshold (hysteresis: no flapping at the edge). :class:`HarmDetector` flags a model that makes
the sensor worse than its raw readings or that line.

The threshold is the smaller of ``rmse_abs`` (µg/m³) and ``rmse_ratio`` times the model's test
RMSE from its manifest, each ignored when 0; with both 0, errors are tracked and published but no
drift is ever raised.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Self

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "DriftChange",
    "DriftConfig",
    "DriftDetector",
    "ErrorFigures",
    "HarmDetector",
    "RollingError",
    "drift_threshold",
    "linear_residual_rmse",
]


class DriftConfig(BaseModel):
    """``[drift]``: rolling error against a co-located reference and when it is drift."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_pairs: int = Field(
        default=360, ge=2, le=1_000_000, description="Recent pairs the rolling error covers."
    )
    min_pairs: int = Field(
        default=60, ge=1, description="Pairs needed before a drift can be raised or cleared."
    )
    rmse_abs: float = Field(
        default=0.0,
        ge=0,
        description="Drift when the rolling RMSE exceeds this (µg/m³); 0: not used.",
    )
    rmse_ratio: float = Field(
        default=2.0,
        ge=0,
        description=(
            "Drift when the rolling RMSE exceeds this times the model's test RMSE (manifest); "
            "0: not used."
        ),
    )
    clear_fraction: float = Field(
        default=0.8,
        gt=0,
        lt=1,
        description="A drift clears once the RMSE falls below this fraction of the threshold.",
    )
    harm_margin: float = Field(
        default=0.2,
        ge=0,
        description=(
            "Flag 'harm' when the model's rolling RMSE exceeds the raw readings' or the linear "
            "fit's by more than this fraction (over at least min_pairs pairs). An RMSE over n "
            "pairs is uncertain by about 1/sqrt(2n) of itself (9 % at 60, 4 % at 360): the "
            "margin keeps a model that is merely as good as a line from being flagged."
        ),
    )

    interval_gamma: float = Field(
        default=0.005,
        ge=0,
        le=0.5,
        description=(
            "Step of adaptive conformal inference for a co-located sensor's interval "
            "(monitor/coverage.py; Gibbs & Candès' 0.005): larger adapts faster and wobbles "
            "more; 0 keeps the model's level (coverage is still measured)."
        ),
    )

    @model_validator(mode="after")
    def _min_within_window(self) -> Self:
        if self.min_pairs > self.window_pairs:
            raise ValueError(
                f"min_pairs ({self.min_pairs}) cannot exceed window_pairs ({self.window_pairs})"
            )
        return self


@dataclass(frozen=True, slots=True)
class ErrorFigures:
    """Errors over the recent pairs, in the feature's unit; NaN while there are none."""

    pairs: int
    rmse: float
    mae: float
    raw_rmse: float
    raw_mae: float
    linear_rmse: float = math.nan  # the straight line raw -> reference fitted on these pairs

    def as_dict(self) -> dict[str, object]:
        def clean(value: float) -> float | None:
            return round(value, 4) if math.isfinite(value) else None

        return {
            "pairs": self.pairs,
            "rmse": clean(self.rmse),
            "mae": clean(self.mae),
            "raw_rmse": clean(self.raw_rmse),
            "raw_mae": clean(self.raw_mae),
            "linear_rmse": clean(self.linear_rmse),
        }


class RollingError:
    """Errors of the last ``window`` (calibrated, raw) vs reference pairs, in a ring buffer."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        # [calibrated error | raw error | raw | reference, K]
        self._errors: npt.NDArray[np.float64] = np.zeros((4, window))
        self._count = 0
        self._next = 0

    def add(self, calibrated: float, raw: float, reference: float) -> None:
        self._errors[0, self._next] = calibrated - reference
        self._errors[1, self._next] = raw - reference
        self._errors[2, self._next] = raw
        self._errors[3, self._next] = reference
        self._next = (self._next + 1) % self._errors.shape[1]
        self._count = min(self._count + 1, self._errors.shape[1])

    def reset(self) -> None:
        self._count = 0
        self._next = 0

    def __len__(self) -> int:
        return self._count

    def figures(self) -> ErrorFigures:
        if not self._count:
            nan = math.nan
            return ErrorFigures(pairs=0, rmse=nan, mae=nan, raw_rmse=nan, raw_mae=nan)
        errors = self._errors[:2, : self._count]  # order does not matter for these figures
        rmse = np.sqrt(np.mean(errors * errors, axis=1))
        mae = np.mean(np.abs(errors), axis=1)
        return ErrorFigures(
            pairs=self._count,
            rmse=float(rmse[0]),
            mae=float(mae[0]),
            raw_rmse=float(rmse[1]),
            raw_mae=float(mae[1]),
            linear_rmse=linear_residual_rmse(
                self._errors[2, : self._count], self._errors[3, : self._count]
            ),
        )


def linear_residual_rmse(raw: npt.NDArray[np.float64], reference: npt.NDArray[np.float64]) -> float:
    """Residual RMSE of the least-squares line from raw to reference, per degree of freedom.

    Fitted on the very pairs it is scored on, a line is flattered; dividing the squared
    residuals by n - 2 (its two parameters) instead of n removes that, so the comparison with
    the model (which never saw these pairs) is fair. NaN below 3 pairs or for a constant raw.
    """
    n = raw.size
    if n < 3:
        return math.nan
    x = raw - raw.mean()
    y = reference - reference.mean()
    sxx = float(x @ x)
    if not sxx > 1e-12 * max(1.0, float(raw @ raw)):
        return math.nan
    slope = float(x @ y) / sxx
    residual = y - slope * x
    return math.sqrt(max(0.0, float(residual @ residual)) / (n - 2))


def drift_threshold(config: DriftConfig, test_rmse: float | None) -> float | None:
    """The RMSE above which a drift is raised, or None when no threshold applies."""
    candidates: list[float] = []
    if config.rmse_abs > 0:
        candidates.append(config.rmse_abs)
    if config.rmse_ratio > 0 and test_rmse is not None and test_rmse > 0:
        candidates.append(config.rmse_ratio * test_rmse)
    return min(candidates) if candidates else None


class DriftChange(enum.StrEnum):
    RAISED = "raised"
    CLEARED = "cleared"
    CONFIRMED_CLEAR = "confirmed_clear"  # first judgement after start: no drift (state unknown)


class DriftDetector:
    """The drift state of one (sensor, feature), with hysteresis."""

    def __init__(self, config: DriftConfig) -> None:
        self._config = config
        self.active = False
        self.judged = False  # a first judgement (min_pairs reached) was made in this run

    def evaluate(self, figures: ErrorFigures, threshold: float | None) -> DriftChange | None:
        """The state change these figures cause, if any.

        The first judgement of a run is always reported (as RAISED or CONFIRMED_CLEAR), so a
        retained drift message left by an earlier run is corrected.
        """
        if threshold is None or figures.pairs < self._config.min_pairs:
            return None
        first = not self.judged
        self.judged = True
        if not self.active and figures.rmse > threshold:
            self.active = True
            return DriftChange.RAISED
        if self.active and figures.rmse < self._config.clear_fraction * threshold:
            self.active = False
            return DriftChange.CLEARED
        if first and not self.active:
            return DriftChange.CONFIRMED_CLEAR
        return None


class HarmDetector:
    """Whether the model makes this sensor worse than its raw readings or a straight line.

    The guard of ``train``/``export`` (training/harm.py) on the validation sensor, kept in the
    field on each co-located sensor's recorded pairs: raised when the rolling RMSE exceeds
    ``(1 + harm_margin)`` times the better of raw and linear, cleared once it is no higher than
    that baseline (hysteresis of one margin).
    """

    def __init__(self, config: DriftConfig) -> None:
        self._config = config
        self.active = False

    def worse_than(self, figures: ErrorFigures) -> list[str]:
        """The baselines the model loses to now, by the raise rule (empty: none)."""
        factor = 1.0 + self._config.harm_margin
        return [
            name
            for name, baseline in (("raw", figures.raw_rmse), ("linear", figures.linear_rmse))
            if math.isfinite(baseline) and figures.rmse > factor * baseline
        ]

    def evaluate(self, figures: ErrorFigures) -> DriftChange | None:
        """RAISED or CLEARED when the state changes (judged from ``min_pairs`` pairs on)."""
        if figures.pairs < self._config.min_pairs or not math.isfinite(figures.rmse):
            return None
        if not self.active and self.worse_than(figures):
            self.active = True
            return DriftChange.RAISED
        baselines = [b for b in (figures.raw_rmse, figures.linear_rmse) if math.isfinite(b)]
        if self.active and (not baselines or figures.rmse <= min(baselines)):
            self.active = False
            return DriftChange.CLEARED
        return None
