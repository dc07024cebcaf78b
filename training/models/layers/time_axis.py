"""The baselines' blocks along the time axis: moving average, patches, positions."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import numpy.typing as npt
from keras import ops

from training.models.layers.core import matmul_last

__all__ = [
    "DecomposedLinear",
    "LearnedPositions",
    "Patching",
    "Regroup",
    "SinusoidalPositions",
    "TimeMix",
    "moving_average_matrix",
    "patch_matrix",
    "sinusoidal_table",
]


def moving_average_matrix(window_length: int, kernel: int) -> npt.NDArray[np.float32]:
    """[N, N] matrix A with (x @ A)[t] = mean of x over a ``kernel`` window centred on t.

    The ends are padded by repeating the first and last reading ((kernel - 1) / 2 copies each),
    as DLinear's series decomposition does, so the trend has the input's length.
    """
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"moving-average kernel must be a positive odd number, got {kernel}")
    half = (kernel - 1) // 2
    matrix = np.zeros((window_length, window_length), dtype=np.float64)
    for out in range(window_length):
        for padded in range(out, out + kernel):
            matrix[min(max(padded - half, 0), window_length - 1), out] += 1.0 / kernel
    return matrix.astype(np.float32)


def patch_matrix(
    window_length: int, patch_length: int, stride: int
) -> tuple[npt.NDArray[np.float32], int]:
    """0/1 matrix [N, P·patches] that cuts a window into PatchTST's patches, and their count.

    The end is padded with ``stride`` copies of the newest reading before cutting, as PatchTST
    does, so patches = (N - P) // S + 2. Patching becomes one constant FULLY_CONNECTED.
    """
    if patch_length < 1 or stride < 1:
        raise ValueError("patch length and stride must be at least 1")
    padded = window_length + stride
    if patch_length > padded:
        raise ValueError(
            f"patch length {patch_length} exceeds the padded window ({padded}): use a shorter patch"
        )
    count = (padded - patch_length) // stride + 1
    matrix = np.zeros((window_length, count * patch_length), dtype=np.float32)
    for patch in range(count):
        for offset in range(patch_length):
            source = min(patch * stride + offset, window_length - 1)
            matrix[source, patch * patch_length + offset] = 1.0
    return matrix, count


def sinusoidal_table(length: int, width: int) -> npt.NDArray[np.float32]:
    """The fixed positional encoding of 'Attention is all you need': sin on even, cos on odd."""
    position = np.arange(length, dtype=np.float64)[:, None]
    rate = np.exp(-np.log(10000.0) * (np.arange(0, width, 2, dtype=np.float64) / width))
    table = np.zeros((length, width), dtype=np.float64)
    table[:, 0::2] = np.sin(position * rate)
    table[:, 1::2] = np.cos(position * rate[: width // 2])
    return table.astype(np.float32)


@keras.saving.register_keras_serializable(package="tesla")
class TimeMix(keras.layers.Layer):
    """A fixed linear map along the time axis: [B, N, C] -> [B, M, C] via a constant [N, M].

    Used for DLinear's moving average; one constant FULLY_CONNECTED on the device.
    """

    def __init__(self, matrix: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.matrix = np.asarray(matrix, dtype="float32")  # [N, M]

    def build(self, input_shape: Any) -> None:
        self._matrix = ops.convert_to_tensor(self.matrix)

    def call(self, inputs: Any) -> Any:
        series = ops.transpose(inputs, (0, 2, 1))  # [B, C, N]
        return ops.transpose(matmul_last(series, self._matrix), (0, 2, 1))  # [B, M, C]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "matrix": self.matrix.tolist()}


@keras.saving.register_keras_serializable(package="tesla")
class DecomposedLinear(keras.layers.Layer):
    """DLinear's head: W_s·(x - A x) + W_t·(A x) + b, with A a constant moving average.

    Computed as one map x·W with W = W_s + A (W_t - W_s), the same function and gradients.
    In the frozen graph W is a constant expression, so the device gets one FULLY_CONNECTED
    with well-conditioned 8-bit weights. The literal form (moving average, subtraction, two
    maps) was measured to quantise badly: W_s and W_t grow large opposite parts that cancel,
    and their 8-bit rounding did not (16-bit device graph 4.0 µg/m³ RMS from float against a
    bound of 2.3). Input [B, N, C], output [B, 1].
    """

    def __init__(self, matrix: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.matrix = np.asarray(matrix, dtype="float32")  # [N, N]: trend = A^T x per channel

    def build(self, input_shape: Any) -> None:
        length, channels = int(input_shape[-2]), int(input_shape[-1])
        self.seasonal = self.add_weight(
            name="seasonal", shape=(length, channels), initializer="glorot_uniform"
        )
        self.trend = self.add_weight(
            name="trend", shape=(length, channels), initializer="glorot_uniform"
        )
        self.bias = self.add_weight(name="bias", shape=(1,), initializer="zeros")
        self._matrix = ops.convert_to_tensor(self.matrix)
        self.length, self.channels = length, channels

    def call(self, inputs: Any) -> Any:
        weight = self.seasonal + ops.matmul(self._matrix, self.trend - self.seasonal)  # [N, C]
        flat = ops.reshape(inputs, (-1, self.length * self.channels))  # [B, N·C]
        return ops.matmul(flat, ops.reshape(weight, (-1, 1))) + self.bias  # [B, 1]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "matrix": self.matrix.tolist()}


@keras.saving.register_keras_serializable(package="tesla")
class Patching(keras.layers.Layer):
    """Cut each channel's series into PatchTST patches: [B, C, N] -> [B·C, patches, P]."""

    def __init__(self, window_length: int, patch_length: int, stride: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.window_length = int(window_length)
        self.patch_length = int(patch_length)
        self.stride = int(stride)
        self.selection, self.patches = patch_matrix(window_length, patch_length, stride)

    def build(self, input_shape: Any) -> None:
        self._selection = ops.convert_to_tensor(self.selection)

    def call(self, inputs: Any) -> Any:
        series = ops.reshape(inputs, (-1, self.window_length))  # [B·C, N]
        cut = ops.matmul(series, self._selection)  # [B·C, patches·P]
        return ops.reshape(cut, (-1, self.patches, self.patch_length))  # [B·C, patches, P]

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "window_length": self.window_length,
            "patch_length": self.patch_length,
            "stride": self.stride,
        }


@keras.saving.register_keras_serializable(package="tesla")
class Regroup(keras.layers.Layer):
    """Reshape including the batch axis: [B·C, ...] -> [B, *shape] (Keras Reshape keeps B)."""

    def __init__(self, shape: tuple[int, ...], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shape = tuple(int(size) for size in shape)

    def call(self, inputs: Any) -> Any:
        return ops.reshape(inputs, (-1, *self.shape))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "shape": list(self.shape)}


@keras.saving.register_keras_serializable(package="tesla")
class SinusoidalPositions(keras.layers.Layer):
    """Add the fixed sinusoidal positional encoding to tokens [B, L, d] (a constant ADD)."""

    def build(self, input_shape: Any) -> None:
        length, width = int(input_shape[-2]), int(input_shape[-1])
        self._table = ops.convert_to_tensor(sinusoidal_table(length, width)[None, :, :])

    def call(self, inputs: Any) -> Any:
        return inputs + self._table


@keras.saving.register_keras_serializable(package="tesla")
class LearnedPositions(keras.layers.Layer):
    """Add a learned positional embedding [L, d] to tokens [B, L, d] (PatchTST's W_pos)."""

    def build(self, input_shape: Any) -> None:
        length, width = int(input_shape[-2]), int(input_shape[-1])
        self.table = self.add_weight(
            name="table",
            shape=(length, width),
            initializer=keras.initializers.RandomUniform(-0.02, 0.02),
        )

    def call(self, inputs: Any) -> Any:
        return inputs + self.table[None, :, :]
