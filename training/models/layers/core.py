"""Building blocks every model shares: constant scaling, projections and FULLY_CONNECTED sums."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

__all__ = ["Projection", "Scale", "device_elu", "matmul_last", "sum_axis2", "window_input"]


@keras.saving.register_keras_serializable(package="tesla")
class Scale(keras.layers.Layer):
    """Multiply by a fixed constant: the normalisation that lives inside the exported graph.

    ``factor`` is one number, or one per input channel (last axis) so that PM, humidity and
    temperature each enter the model on their own scale (one MUL by a constant vector).
    """

    def __init__(self, factor: float | Sequence[float], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.factor: float | list[float] = (
            float(factor) if isinstance(factor, int | float) else [float(f) for f in factor]
        )

    def call(self, inputs: Any) -> Any:
        if isinstance(self.factor, float):
            return inputs * self.factor
        return inputs * ops.convert_to_tensor(self.factor, dtype=inputs.dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "factor": self.factor}


def matmul_last(x: Any, weight: Any) -> Any:
    """x [..., k] @ weight [k, m] as a 2-D matmul, so the converter emits FULLY_CONNECTED."""
    flat = ops.reshape(x, (-1, x.shape[-1]))
    return ops.reshape(ops.matmul(flat, weight), (-1, *x.shape[1:-1], weight.shape[-1]))


@keras.saving.register_keras_serializable(package="tesla")
class Projection(keras.layers.Layer):
    """A dense map on the last axis via a 2-D matmul: static shapes, one FULLY_CONNECTED op."""

    def __init__(self, units: int, activation: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.units = int(units)
        self.activation = keras.activations.get(activation)
        self._activation_name = activation

    def build(self, input_shape: Any) -> None:
        self.kernel = self.add_weight(
            name="kernel", shape=(int(input_shape[-1]), self.units), initializer="glorot_uniform"
        )
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros")

    def call(self, inputs: Any) -> Any:
        return self.activation(matmul_last(inputs, self.kernel) + self.bias)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units, "activation": self._activation_name}


def sum_axis2(x: Any, weight: float = 1.0) -> Any:
    """weight·Σ over axis 2 of [B, L, M, k] -> [B, L, k], as a FULLY_CONNECTED with constants.

    The 16-bit SUM and MEAN kernels accumulate in 16 bits and overflow when M is more than a
    handful (measured: a 24-token attention output was off by its own magnitude); the 16x8
    FULLY_CONNECTED accumulates in 64 bits.
    """
    length = int(x.shape[2])
    ones = ops.full((length, 1), weight, dtype="float32")
    moved = ops.transpose(x, (0, 1, 3, 2))  # [B, L, k, M]
    return ops.squeeze(matmul_last(moved, ones), axis=-1)  # [B, L, k]


def device_elu(x: Any) -> Any:
    """ELU(x) = relu(x) + e^min(x, 0) - 1, with e^m = σ(m) / (1 - σ(m)) for m <= 0.

    The same function in float; written this way because neither ELU nor EXP has a 16-bit
    kernel in TFLite Micro, while LOGISTIC, RSQRT and MUL do (division as rsqrt squared).
    """
    negative = ops.minimum(x, 0.0)
    odds = ops.sigmoid(negative)
    inverse_root = ops.rsqrt(1.0 - odds)
    return ops.relu(x) + odds * inverse_root * inverse_root - 1.0


def window_input(window_length: int, channels: int) -> Any:
    """The model input every builder shares: [B, N] for one channel, [B, N, C] for several."""
    shape = (window_length,) if channels == 1 else (window_length, channels)
    return keras.Input(shape=shape, name="window")
