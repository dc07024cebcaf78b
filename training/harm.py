"""The guard against harm: a model must beat both the raw readings and a linear fit on the
validation sensor (which it was not trained on) before it is exported.

A calibration that makes a sensor worse than doing nothing, or worse than the one-line fit every
practitioner already has, does damage where it is deployed; on a user's own data this happens
(a model trained on other units made the test unit worse than raw, and nothing said so).
"""

from __future__ import annotations

import numpy as np

from tesla_gateway.contract.manifest import TestMetrics
from training.data import WindowSet
from training.errors import HarmfulModelError
from training.metrics import LinearCalibration, error_metrics

__all__ = ["check_not_harmful", "compare_on", "describe"]


def compare_on(windows: WindowSet, predicted: np.ndarray, linear: LinearCalibration) -> TestMetrics:
    """Raw, linear and model scores over the same windows (the validation sensor's)."""
    target = windows.targets()
    current = windows.current_raw()
    return TestMetrics(
        raw=error_metrics(current, target),
        linear=error_metrics(linear.predict(current), target),
        model=error_metrics(predicted, target),
    )


def describe(scores: TestMetrics, unit: str = "µg/m³") -> str:
    """``raw 15.7, linear 3.13, model 2.19 µg/m³ RMSE`` for messages and reports."""
    return (
        f"raw {scores.raw.rmse:.3g}, linear {scores.linear.rmse:.3g}, "
        f"model {scores.model.rmse:.3g} {unit} RMSE"
    )


def check_not_harmful(scores: TestMetrics, sensor: str, *, force: bool) -> None:
    """Raise :class:`HarmfulModelError` when the model loses to raw or linear (unless forced).

    A model without a finite value for some windows the raw readings score on is refused even
    when forced: its RMSE is over fewer windows (over none it is 0) and cannot be compared.
    """
    if scores.model.n < scores.raw.n:
        raise HarmfulModelError(
            f"on validation sensor {sensor} the model gives no finite value (NaN or inf) for "
            f"{scores.raw.n - scores.model.n} of {scores.raw.n} windows: it diverged and "
            "cannot be exported, even with --force; retrain with a lower learning rate"
        )
    worse = [
        label
        for label, baseline in (("the raw readings", scores.raw), ("a linear fit", scores.linear))
        if scores.model.rmse > baseline.rmse
    ]
    if worse and not force:
        raise HarmfulModelError(
            f"on validation sensor {sensor} the model is worse than {' and '.join(worse)} "
            f"({describe(scores)} over {scores.model.n} windows): it would make readings worse; "
            "retrain (more data, other channels) or pass --force to export it anyway"
        )
