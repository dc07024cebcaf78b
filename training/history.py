"""Short histories: a sensor that has only its newest ``K`` of a window's ``N`` periods.

The gateway calibrates a new sensor from its first closed period, its window's missing oldest
periods filled by the contract's edge padding (:func:`tesla_gateway.contract.series.pad_history`).
Training learns such windows by truncating a share of its windows to a random ``K`` (log-uniform
in ``1 .. N``: as many windows of 1-10 periods as of 36-360), and scores them by truncating every
window of a set to the same ``K``: the per-history curve of the manifest and of
``evaluate --history-periods``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.manifest import ErrorMetrics, HistoryIntervals, HistoryPoint
from tesla_gateway.contract.series import pad_history
from training.conformal import fit_intervals
from training.data import WindowSet
from training.errors import DataError
from training.metrics import error_metrics

__all__ = [
    "CHUNK",
    "YOUNG_SENSOR_FRACTION",
    "Predict",
    "calibrates_from",
    "history_curve",
    "history_fields",
    "history_intervals",
    "history_points",
    "predict_truncated",
    "sample_history",
    "truncate",
]

CHUNK = 4096
Predict = Callable[[npt.NDArray[np.float32]], npt.ArrayLike]

Float32Array = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]

# Spans whose period counts join the log-spaced points when they fit in the window: the
# horizons people ask about (a quarter hour, an hour, three hours, a day, a week).
_SPANS_S = (900, 3600, 3 * 3600, 6 * 3600, 86_400, 2 * 86_400, 7 * 86_400)
_LOG_POINTS = 10
# A model calibrates from the shortest history from which, on the validation sensor, it is never
# worse than the linear calibration by more than this share (issue 27's bar for one period).
LINEAR_TOLERANCE = 0.02
# Share of training windows truncated to a random history that made the committed defaults
# calibrate from one period (docs/benchmarks/partial-history/): what the defaults train with, and
# what fine-tuning one and retraining a champion that calibrates young sensors keep.
YOUNG_SENSOR_FRACTION = 0.5


def sample_history(rng: np.random.Generator, count: int, n: int, fraction: float) -> IntArray:
    """Per window, the periods of history it keeps: ``N`` for ``1 - fraction`` of them, and a
    log-uniform ``K`` in ``1 .. N`` for the rest."""
    if not 0.0 <= fraction <= 1.0:
        raise DataError(f"the truncated fraction must lie in [0, 1], got {fraction}")
    history = np.full(count, n, dtype=np.int64)
    truncated = rng.random(count) < fraction
    draws = np.exp(rng.uniform(0.0, np.log(n + 1), size=int(truncated.sum())))
    history[truncated] = np.clip(np.floor(draws), 1, n).astype(np.int64)
    return history


def truncate(x: Float32Array, history: npt.ArrayLike) -> Float32Array:
    """Training windows (``[B, N]`` or ``[B, N, C]``) as a sensor with ``history`` periods sees
    them: the contract's edge padding on the time axis (axis 1)."""
    return pad_history(np.asarray(x, dtype=np.float32), history, axis=1)


def history_points(n: int, period_seconds: int) -> tuple[int, ...]:
    """The history lengths a curve is measured at: log-spaced from 1 to ``N``, plus the periods
    of a quarter hour, an hour, three and six hours, a day, two days and a week where they fit."""
    if n < 1 or period_seconds < 1:
        raise DataError(f"need N >= 1 and a positive period, got {n} and {period_seconds}")
    spans = {span // period_seconds for span in _SPANS_S if span % period_seconds == 0}
    spans = {k for k in spans if 1 <= k <= n}
    logs = {int(np.rint(k)) for k in np.geomspace(1, n, num=min(_LOG_POINTS, n))}
    # a log point next to a span's (within 25 %) adds nothing but clutter
    logs = {k for k in logs if not any(0.8 < k / span < 1.25 for span in spans)}
    return tuple(sorted(spans | logs | {1, n}))


def predict_truncated(
    predict: Predict, windows: WindowSet, points: Sequence[int]
) -> dict[int, npt.NDArray[np.float64]]:
    """Per history length ``K`` in ``points``, the model's output for every window of the set
    truncated to its newest ``K`` periods (each chunk of windows is gathered once)."""
    outputs: dict[int, list[npt.NDArray[np.float64]]] = {k: [] for k in points}
    for start in range(0, len(windows), CHUNK):
        x, _ = windows.gather(np.arange(start, min(start + CHUNK, len(windows))))
        for k in points:
            predicted = np.asarray(predict(truncate(x, k)), dtype=np.float64).reshape(-1)
            outputs[k].append(predicted)
    return {
        k: np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)
        for k, parts in outputs.items()
    }


def history_curve(
    predicted: dict[int, npt.NDArray[np.float64]],
    reference: npt.NDArray[np.floating],
    linear: npt.NDArray[np.floating] | None = None,
) -> list[HistoryPoint]:
    """The error per history length, beside the linear fit's on the same windows."""
    linear_scores: ErrorMetrics | None = (
        None if linear is None else error_metrics(np.asarray(linear), np.asarray(reference))
    )
    return [
        HistoryPoint(
            periods=k,
            model=error_metrics(values, np.asarray(reference)),
            linear=linear_scores,
        )
        for k, values in sorted(predicted.items())
    ]


def history_intervals(
    predicted: dict[int, npt.NDArray[np.float64]],
    reference: npt.NDArray[np.floating],
    *,
    window_length: int,
    sensor: str,
    level: float,
) -> list[HistoryIntervals]:
    """Conformal intervals per history bucket: one bucket from each measured ``K < N`` up to
    the next, fitted on the windows truncated to that ``K`` (the bucket's shortest history)."""
    return [
        HistoryIntervals(
            min_periods=k,
            intervals=fit_intervals(values, np.asarray(reference), sensor=sensor, level=level),
        )
        for k, values in sorted(predicted.items())
        if k < window_length
    ]


def calibrates_from(curve: Sequence[HistoryPoint], tolerance: float = LINEAR_TOLERANCE) -> int:
    """The manifest's ``min_history_periods``: the shortest measured history from which every
    longer one scores within ``tolerance`` of linear (the whole window when none does; a curve
    without linear scores calibrates from its shortest point)."""
    start = curve[-1].periods
    for point in reversed(curve):
        if point.linear is not None and point.model.rmse > (1 + tolerance) * point.linear.rmse:
            break
        start = point.periods
    return start


def history_fields(
    predict: Predict,
    validation: WindowSet,
    linear: npt.NDArray[np.floating],
    *,
    period_seconds: int,
    sensor: str,
    level: float,
) -> dict[str, Any]:
    """The manifest's short-history fields from a model's outputs on the validation sensor's
    windows truncated to each history length: ``min_history_periods`` (:func:`calibrates_from`),
    ``history_curve`` (beside ``linear``, the linear fit's output on the same windows) and
    ``history_intervals``."""
    n = validation.window_length
    predicted = predict_truncated(predict, validation, history_points(n, period_seconds))
    reference = validation.targets()
    curve = history_curve(predicted, reference, linear)
    return {
        "min_history_periods": calibrates_from(curve),
        "history_curve": curve,
        "history_intervals": history_intervals(
            predicted, reference, window_length=n, sensor=sensor, level=level
        ),
    }
