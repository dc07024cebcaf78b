"""The calibrations practitioners use, fitted in closed form and built as tiny window graphs.

Every fit reads only the newest period of the window, so it calibrates from a sensor's first
period and its graph takes the same window ``[B, N]`` / ``[B, N, C]`` the gateway and the node
already feed TESLA:

* ``linear``: ``a·raw + b`` (OLS on the training sensors; the guard's own linear fit).
* ``multilinear``: ``a·raw + c·rh + d·temp_c + b`` with whichever covariates the data have.
* ``growth``: ``a·raw / (1 + k·h²/(1 − h)) + b`` with ``h = rh/100`` (clipped to
  ``[0, GROWTH_RH_MAX]``): the hygroscopic growth correction practitioners fit; ``k`` is chosen
  on the training sensors by a grid search, then the line by OLS.

The graphs use only FULLY_CONNECTED, MUL, ADD, SUB, MINIMUM, MAXIMUM, RSQRT and slicing, which
the Arduino TFLite Micro library runs with 16-bit activations (division as ``rsqrt(x)²``, as in
training/models/layers/core.device_elu). Each channel enters divided by its own scale and the
weights are folded so the int8 weights are of comparable size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import keras
import numpy as np
import numpy.typing as npt
from keras import ops

from training.data import WindowSet
from training.errors import DataError
from training.models.layers.core import Projection, Scale, window_input
from training.reference_calibrations import current_channel

__all__ = [
    "CLASSICAL_KINDS",
    "GROWTH_RH_MAX",
    "ClassicalFit",
    "ClassicalKind",
    "NewestPeriod",
    "fit_classical",
]

ClassicalKind = Literal["linear", "multilinear", "growth"]
CLASSICAL_KINDS: tuple[ClassicalKind, ...] = ("linear", "multilinear", "growth")
GROWTH_RH_MAX = 0.95  # the growth term diverges at saturation; fog is not modelled
GROWTH_K_GRID = np.concatenate([np.linspace(0.0, 1.0, 201), np.linspace(1.02, 5.0, 200)])
FloatArray = npt.NDArray[np.float64]


@keras.saving.register_keras_serializable(package="tesla")
class NewestPeriod(keras.layers.Layer):
    """``[B, N]`` -> ``[B, 1]`` or ``[B, N, C]`` -> ``[B, C]``: the newest period (one slice)."""

    def call(self, inputs: Any) -> Any:
        if len(inputs.shape) == 2:
            return inputs[:, -1:]
        return inputs[:, -1, :]


@dataclass(frozen=True)
class ClassicalFit:
    """A fitted classical calibration: ``weights`` per channel (µg/m³ per channel unit), the
    intercept and, for ``growth``, ``k``."""

    kind: ClassicalKind
    channels: tuple[str, ...]
    weights: tuple[float, ...]
    intercept: float
    k: float | None = None
    scales: tuple[float, ...] = field(default=())

    @property
    def architecture(self) -> str:
        return f"classical-{self.kind}"

    @property
    def parameters(self) -> int:
        return len(self.weights) + 1 + (self.k is not None)

    def hyperparameters(self) -> dict[str, float | int | str | bool]:
        """The manifest's ``hyperparameters``: the coefficients, named by channel."""
        named: dict[str, float | int | str | bool] = {
            f"weight_{channel}": weight  # growth: one weight, on the corrected reading
            for channel, weight in zip(self.channels, self.weights, strict=False)
        }
        named["intercept"] = self.intercept
        if self.k is not None:
            named["growth_k"] = self.k
        return named

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> ClassicalFit:
        return cls(
            kind=payload["kind"],
            channels=tuple(payload["channels"]),
            weights=tuple(float(w) for w in payload["weights"]),
            intercept=float(payload["intercept"]),
            k=None if payload.get("k") is None else float(payload["k"]),
            scales=tuple(float(s) for s in payload.get("scales", ())),
        )

    def predict(self, windows: WindowSet) -> FloatArray:
        """The calibrated newest period of every window (windows must hold ``channels``)."""
        return self.predict_values({c: current_channel(windows, c) for c in self.channels})

    def predict_values(self, values: dict[str, FloatArray]) -> FloatArray:
        columns = [np.asarray(values[c], dtype=np.float64) for c in self.channels]
        if self.kind == "growth":
            columns[0] = columns[0] / growth_divisor(columns[1], self.k or 0.0)
            columns = columns[:1]
        prediction = np.full(columns[0].shape, self.intercept)
        for weight, column in zip(self.weights, columns, strict=True):
            prediction += weight * column
        return prediction

    def keras_model(self, window_length: int) -> keras.Model:
        """The graph the model directory carries: the window in, the calibrated value out."""
        inputs = window_input(window_length, len(self.channels))
        newest = NewestPeriod(name="newest_period")(inputs)  # [B, C]
        scales = self.scales or (1.0,) * len(self.channels)
        scaled = Scale([1.0 / s for s in scales], name="normalise")(newest)
        output_scale = scales[0]
        if self.kind == "growth":
            raw = scaled[:, :1]
            humidity = ops.clip(scaled[:, 1:2] * (scales[1] / 100.0), 0.0, GROWTH_RH_MAX)
            root = ops.rsqrt(1.0 - humidity)
            inverse_dry = root * root  # 1 / (1 - h)
            divisor = 1.0 + (self.k or 0.0) * humidity * humidity * inverse_dry
            shrink = ops.rsqrt(divisor)
            features = raw * shrink * shrink  # raw / divisor
            folded = [self.weights[0]]  # the reading and the output share one scale
        else:
            features = scaled
            folded = [w * s / output_scale for w, s in zip(self.weights, scales, strict=True)]
        projection = Projection(1, name="calibration")
        line = projection(features)
        projection.kernel.assign(np.asarray(folded, dtype=np.float32).reshape(-1, 1))
        projection.bias.assign(np.asarray([self.intercept / output_scale], dtype=np.float32))
        calibrated = Scale(output_scale, name="denormalise")(line)
        return keras.Model(inputs, calibrated, name=self.architecture)


def growth_divisor(rh_percent: FloatArray, k: float) -> FloatArray:
    """``1 + k·h²/(1 − h)`` with ``h = rh/100`` clipped to ``[0, GROWTH_RH_MAX]``."""
    h = np.clip(np.asarray(rh_percent, dtype=np.float64) / 100.0, 0.0, GROWTH_RH_MAX)
    return 1.0 + k * h * h / (1.0 - h)


def _channel_scale(values: FloatArray) -> float:
    return max(1.0, float(np.percentile(np.abs(values), 99)))


def _ols(columns: list[FloatArray], target: FloatArray) -> tuple[tuple[float, ...], float, float]:
    design = np.column_stack([*columns, np.ones_like(target)])
    solution, *_ = np.linalg.lstsq(design, target, rcond=None)
    residual = float(np.sum((design @ solution - target) ** 2))
    return tuple(float(w) for w in solution[:-1]), float(solution[-1]), residual


def fit_classical(kind: ClassicalKind, train: WindowSet, channels: tuple[str, ...]) -> ClassicalFit:
    """Fit one classical calibration on the training windows' newest period.

    ``channels`` are the reading first, then the covariates it uses (``growth``: ``rh``).
    """
    values = {c: current_channel(train, c) for c in channels}
    target = np.asarray(train.targets(), dtype=np.float64)
    keep = np.isfinite(target) & np.all([np.isfinite(v) for v in values.values()], axis=0)
    if keep.sum() < len(channels) + 2:
        raise DataError(f"{int(keep.sum())} training windows cannot fit a {kind} calibration")
    values = {c: v[keep] for c, v in values.items()}
    target = target[keep]
    scales = tuple(_channel_scale(values[c]) for c in channels)
    if kind == "growth":
        if channels[1:] != ("rh",):
            raise DataError(f"the growth calibration reads raw and rh, not {channels}")
        best: tuple[float, tuple[float, ...], float] | None = None
        best_residual = np.inf
        for k in GROWTH_K_GRID:
            weights, intercept, residual = _ols(
                [values["raw"] / growth_divisor(values["rh"], float(k))], target
            )
            if residual < best_residual:
                best, best_residual = (float(k), weights, intercept), residual
        assert best is not None
        k, weights, intercept = best
        return ClassicalFit(kind, channels, weights, intercept, k=k, scales=scales)
    weights, intercept, _ = _ols([values[c] for c in channels], target)
    return ClassicalFit(kind, channels, weights, intercept, scales=scales)
