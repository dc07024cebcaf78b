"""Accuracy metrics and the linear reference calibration every model is compared against."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.manifest import ErrorMetrics

__all__ = ["LinearCalibration", "error_metrics"]

Array = npt.NDArray[np.floating]


def error_metrics(predicted: Array, reference: Array) -> ErrorMetrics:
    """RMSE and MAE over the pairs where both values exist.

    ``n`` is part of the score: over no pair RMSE and MAE are 0 and mean nothing, and two
    scores compare only over the same ``n`` (the harm guard refuses a model scored over fewer
    windows than the raw readings; ``train`` refuses one that predicts NaN at all).
    """
    predicted = np.asarray(predicted, dtype=np.float64).reshape(-1)
    reference = np.asarray(reference, dtype=np.float64).reshape(-1)
    keep = np.isfinite(predicted) & np.isfinite(reference)
    if not keep.any():
        return ErrorMetrics(rmse=0.0, mae=0.0, n=0)
    error = predicted[keep] - reference[keep]
    return ErrorMetrics(
        rmse=float(np.sqrt(np.mean(error**2))), mae=float(np.mean(np.abs(error))), n=int(keep.sum())
    )


@dataclass(frozen=True)
class LinearCalibration:
    """Ordinary least squares on the current reading: what practitioners use today."""

    slope: float
    intercept: float

    @classmethod
    def fit(cls, current_raw: Array, reference: Array) -> LinearCalibration:
        x = np.asarray(current_raw, dtype=np.float64)
        y = np.asarray(reference, dtype=np.float64)
        slope, intercept = np.polyfit(x, y, 1)
        return cls(slope=float(slope), intercept=float(intercept))

    def predict(self, current_raw: Array) -> Array:
        return self.slope * np.asarray(current_raw, dtype=np.float64) + self.intercept
