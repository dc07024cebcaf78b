"""Layers shared by TESLA and the baselines, written to export to small, portable FlatBuffers.

Every layer uses only operations that lower to TFLite builtins available in the Arduino TFLite
Micro library (FULLY_CONNECTED, MUL, ADD, SUB, SUM, MEAN, SOFTMAX, TRANSPOSE, RESHAPE, RSQRT):
in particular attention is expressed without BATCH_MATMUL, which Keras MultiHeadAttention emits
and the device library lacks. For TESLA's z <= 11 tokens the broadcast form costs the same
multiply-adds as a batched matmul.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import numpy.typing as npt
from keras import ops

__all__ = [
    "BinnedEmbedding",
    "DecomposedLinear",
    "DistillingLayer",
    "EncoderBlock",
    "FeatureAggregator",
    "InstanceDenorm",
    "InstanceNorm",
    "LearnedPositions",
    "Patching",
    "ProbSparseSelfAttention",
    "Projection",
    "Regroup",
    "Scale",
    "SequenceSelfAttention",
    "SinusoidalPositions",
    "TimeMix",
    "TokenLayerNorm",
    "TokenSelfAttention",
    "device_elu",
    "matmul_last",
    "moving_average_matrix",
    "patch_matrix",
    "sinusoidal_table",
    "sum_axis2",
    "window_input",
]


@keras.saving.register_keras_serializable(package="tesla")
class Scale(keras.layers.Layer):
    """Multiply by a fixed constant: the normalisation that lives inside the exported graph."""

    def __init__(self, factor: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.factor = float(factor)

    def call(self, inputs: Any) -> Any:
        return inputs * self.factor

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


@keras.saving.register_keras_serializable(package="tesla")
class BinnedEmbedding(keras.layers.Layer):
    """TESLA's multi-view embedding followed by learnable binning, in its folded form.

    Paper (Eq. 1-4): e_i = x_i·W_local + S·W_global for each of the N positions, then
    ē_j = Σ_{i∈bin j} w_i·e_i + b_j. Binning is linear and the global view is shared by every
    token, so ē_j = (Σ_{i∈j} w_i x_i)·W_local + (Σ_{i∈j} w_i)·(S·W_global) + b_j: two small
    matmuls over the window ([N, z] and [N·C, d]) instead of materialising [N, d] embeddings.
    With C channels (issue 8's covariates) each channel has its own local and global view and
    the position weights are shared. Input [B, N] or [B, N, C]; output [B, z, d].
    """

    def __init__(
        self,
        membership: Any,
        d_model: int,
        channels: int = 1,
        use_global: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.membership = np.asarray(membership, dtype="float32")  # [N, z] 0/1
        self.window_length, self.bins = self.membership.shape
        self.d_model = int(d_model)
        self.channels = int(channels)
        self.use_global = bool(use_global)

    def build(self, input_shape: Any) -> None:
        n, z, d, c = self.window_length, self.bins, self.d_model, self.channels
        # Position weights start at 1/|bin|: every token starts as its bin's mean reading.
        initial = (self.membership / self.membership.sum(axis=0)).sum(axis=1)
        self.position_weight = self.add_weight(
            name="position_weight",
            shape=(n,),
            initializer=keras.initializers.Constant(initial.astype("float32")),
        )
        self.w_local = self.add_weight(name="w_local", shape=(c, d), initializer="glorot_uniform")
        if self.use_global:
            self.w_global = self.add_weight(
                name="w_global",
                shape=(n * c, d),
                initializer=keras.initializers.RandomNormal(stddev=(n * c) ** -0.5),
            )
        self.bin_bias = self.add_weight(name="bin_bias", shape=(z, d), initializer="zeros")
        self._membership = ops.convert_to_tensor(self.membership)

    def call(self, inputs: Any) -> Any:
        n, z, c = self.window_length, self.bins, self.channels
        x = ops.reshape(inputs, (-1, n, c))  # [B, N, C]
        binning = self._membership * self.position_weight[:, None]  # [N, z]
        per_channel = ops.reshape(ops.transpose(x, (0, 2, 1)), (-1, n))  # [B*C, N]
        binned = ops.reshape(ops.matmul(per_channel, binning), (-1, c, z))  # [B, C, z]
        tokens = matmul_last(ops.transpose(binned, (0, 2, 1)), self.w_local)  # [B, z, d]
        tokens = tokens + self.bin_bias[None, :, :]
        if self.use_global:
            global_view = ops.matmul(ops.reshape(x, (-1, n * c)), self.w_global)  # [B, d]
            weight_per_bin = ops.sum(binning, axis=0)  # [z]
            tokens = tokens + weight_per_bin[None, :, None] * global_view[:, None, :]
        return tokens

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "membership": self.membership.tolist(),
            "d_model": self.d_model,
            "channels": self.channels,
            "use_global": self.use_global,
        }


@keras.saving.register_keras_serializable(package="tesla")
class TokenSelfAttention(keras.layers.Layer):
    """Standard multi-head self-attention over a few tokens, without BATCH_MATMUL.

    scores[b,i,j,h] = Σ_k q[b,i,k]·k[b,j,k]·H[k,h] / sqrt(d_head), where H is the 0/1
    head-membership matrix, so per-head dot products become a broadcast MUL and one
    FULLY_CONNECTED; softmax over j; the weighted sum of values is again MUL + SUM.
    Input and output [B, z, d]. The gateway's LiteRT graph uses :meth:`_gateway_mix`, the same
    function laid out for large batches: ``portable`` selects the form when the graph is traced.
    """

    def __init__(self, d_model: int, heads: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if d_model % heads:
            raise ValueError(f"d_model={d_model} must be divisible by heads={heads}")
        self.d_model = int(d_model)
        self.heads = int(heads)
        # True: trace the device-portable form. The exporter switches it off while tracing the
        # gateway's float graph (see training.export.gateway_graph); the maths is the same.
        self.portable = True

    def build(self, input_shape: Any) -> None:
        d = self.d_model
        self.query = Projection(d, name="query")
        self.key = Projection(d, name="key")
        self.value = Projection(d, name="value")
        self.output_dense = Projection(d, name="output")
        for layer in (self.query, self.key, self.value, self.output_dense):
            layer.build((None, d))
        head_of = np.arange(d) // (d // self.heads)
        heads = (head_of[:, None] == np.arange(self.heads)[None, :]).astype("float32")  # [d, h]
        self._score_matrix = ops.convert_to_tensor(
            (heads / np.sqrt(d // self.heads)).astype("float32")
        )
        self._spread_matrix = ops.convert_to_tensor(heads.T.copy())  # [h, d]

    def call(self, tokens: Any) -> Any:
        q = self.query(tokens)  # [B, z, d]
        k = self.key(tokens)
        v = self.value(tokens)
        mixed = self._portable_mix(q, k, v) if self.portable else self._gateway_mix(q, k, v)
        return self.output_dense(mixed)

    def _gateway_mix(self, q: Any, k: Any, v: Any) -> Any:
        """Attention laid out for LiteRT at large batch: the batch axis last.

        Per window the work is tiny (9 × 9 token pairs, heads of 4 features), so in the usual
        [B, ...] layout every operator works on rows of 4 to 16 values, which XNNPACK runs far
        below its speed. With q, k and v transposed to [tokens, features, B], every product,
        head sum and softmax step runs over rows of B windows, and broadcasting happens only on
        outer axes. Measured under LiteRT (XNNPACK, 1 thread, z = 9, d = 16, 256 windows per
        invoke): 0.83 µs per window, against 1.7 µs for the same maths in [B, ...] layout and
        3.5 µs with BATCH_MATMUL over B·h tiny matrices and SOFTMAX over rows of 9. Same
        function as the other forms (tested to float tolerance).
        """
        z, d, h = q.shape[1], self.d_model, self.heads
        d_head = d // h

        def batch_last(x: Any) -> Any:
            return ops.transpose(x, (1, 2, 0))  # [B, z, d] -> [z, d, B]

        q = batch_last(q * np.float32(d_head**-0.5))
        k, v = batch_last(k), batch_last(v)
        products = ops.reshape(k, (z, 1, d, -1)) * ops.reshape(q, (1, z, d, -1))  # [j, i, d, B]
        scores = ops.sum(ops.reshape(products, (z, z, h, d_head, -1)), axis=3)  # [j, i, h, B]
        exponent = ops.exp(scores - ops.max(scores, axis=0, keepdims=True))  # softmax over keys j
        attention = exponent / ops.sum(exponent, axis=0, keepdims=True)
        weighted = ops.reshape(attention, (z, z, h, 1, -1)) * ops.reshape(v, (z, 1, h, d_head, -1))
        mixed = ops.reshape(ops.sum(weighted, axis=0), (z, d, -1))  # [i, d, B]
        return ops.transpose(mixed, (2, 0, 1))  # [B, i, d]

    def _portable_mix(self, q: Any, k: Any, v: Any) -> Any:
        """Attention with MUL/SUM/FULLY_CONNECTED only: what the device library can run."""
        products = q[:, :, None, :] * k[:, None, :, :]  # [B, z_i, z_j, d]
        scores = matmul_last(products, self._score_matrix)  # [B, z_i, z_j, h]
        scores = ops.transpose(scores, (0, 1, 3, 2))  # [B, z_i, h, z_j]
        attention = ops.softmax(scores, axis=-1)
        attention = ops.transpose(attention, (0, 1, 3, 2))  # [B, z_i, z_j, h]
        spread = matmul_last(attention, self._spread_matrix)  # [B, z_i, z_j, d]
        return ops.sum(spread * v[:, None, :, :], axis=2)  # [B, z_i, d]

    def _batched_mix(self, q: Any, k: Any, v: Any) -> Any:
        """The same attention with batched matmuls (BATCH_MATMUL): 1.4x faster under LiteRT."""
        z, h = q.shape[1], self.heads
        d_head = self.d_model // h

        def split(x: Any, order: tuple[int, ...]) -> Any:
            return ops.transpose(ops.reshape(x, (-1, z, h, d_head)), order)

        scores = ops.matmul(split(q, (0, 2, 1, 3)), split(k, (0, 2, 3, 1)))  # [B, h, z_i, z_j]
        attention = ops.softmax(scores * np.float32(d_head**-0.5), axis=-1)
        mixed = ops.matmul(attention, split(v, (0, 2, 1, 3)))  # [B, h, z_i, d_head]
        return ops.reshape(ops.transpose(mixed, (0, 2, 1, 3)), (-1, z, self.d_model))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "d_model": self.d_model, "heads": self.heads}


@keras.saving.register_keras_serializable(package="tesla")
class TokenLayerNorm(keras.layers.Layer):
    """LayerNorm over the feature axis, computed in two well-conditioned stages.

    LayerNorm is invariant to the scale of its input, so (x - mean) / sqrt(var + eps) equals
    c' / sqrt(mean(c'^2) + eps') with c' = (x - mean) / mad, mad = mean|x - mean| (the mean
    absolute deviation). In float the two are the same function (tested to 1e-5). Quantised to
    int8 they are not: the direct form squares deviations on a scale set by the largest token,
    so small variances round to zero and the int8 model was useless (test RMSE 35 µg/m³ against
    4.7 in float). After dividing by the mad every token's deviations are of order one, and
    each intermediate tensor keeps its precision. The division is written as
    rsqrt(mad)·rsqrt(mad) so the graph needs only SUB, ABS, MEAN, RSQRT and MUL.
    """

    def __init__(self, epsilon: float = 1e-6, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)
        # False while the exporter traces the gateway's float graph (training.export): the
        # same function on [tokens, features, B], where every step runs over rows of B
        # windows (measured with the aggregator's form: the default graph 1.85-1.91 -> 1.66-1.73
        # µs per window at 128 windows per invoke).
        self.portable = True

    def build(self, input_shape: Any) -> None:
        features = int(input_shape[-1])
        self.gamma = self.add_weight(name="gamma", shape=(features,), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(features,), initializer="zeros")

    def call(self, inputs: Any) -> Any:
        if self.portable or len(inputs.shape) != 3:
            return self._normalise(inputs, -1) * self.gamma + self.beta
        batch_last = ops.transpose(inputs, (1, 2, 0))  # [B, L, d] -> [L, d, B]
        normalised = self._normalise(batch_last, 1) * self.gamma[:, None] + self.beta[:, None]
        return ops.transpose(normalised, (2, 0, 1))

    def _normalise(self, inputs: Any, axis: int) -> Any:
        centred = inputs - ops.mean(inputs, axis=axis, keepdims=True)
        inverse_root_mad = ops.rsqrt(ops.mean(ops.abs(centred), axis=axis, keepdims=True) + 1e-12)
        unit = centred * inverse_root_mad * inverse_root_mad  # deviations of order one
        variance = ops.mean(unit * unit, axis=axis, keepdims=True)
        return unit * ops.rsqrt(variance + self.epsilon)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "epsilon": self.epsilon}


@keras.saving.register_keras_serializable(package="tesla")
class FeatureAggregator(keras.layers.Layer):
    """TESLA's aggregator (Eq. 5 with the erratum): W_agg1 [d, 1] per token, then W_agg2 [z, 1].

    Input [B, z, d], output [B, 1].
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.portable = True  # False while the exporter traces the gateway's float graph

    def build(self, input_shape: Any) -> None:
        tokens, features = int(input_shape[-2]), int(input_shape[-1])
        self.per_token = Projection(1, name="w_agg1")
        self.per_token.build((None, features))
        self.across_tokens = Projection(1, name="w_agg2")
        self.across_tokens.build((None, tokens))
        self.tokens = tokens

    def call(self, inputs: Any) -> Any:
        if not self.portable:  # the gateway's graph: over rows of B windows (see TokenLayerNorm)
            batch_last = ops.transpose(inputs, (1, 2, 0))  # [z, d, B]
            per_token = ops.sum(batch_last * self.per_token.kernel[None], axis=1)  # [z, B]
            per_token = per_token + self.per_token.bias
            collapsed = ops.sum(per_token * self.across_tokens.kernel, axis=0)  # [B]
            return ops.reshape(collapsed + self.across_tokens.bias, (-1, 1))
        collapsed = ops.reshape(self.per_token(inputs), (-1, self.tokens))  # [B, z]
        return self.across_tokens(collapsed)  # [B, 1]


# --- Blocks added for the baselines (issue 4). The layers above are TESLA's and unchanged. ---


# Sparsity margins above 1/gain count as a full "ranks above". The 16-bit device graph resolves
# the gained margins to about gain·range(M)/32768, which must stay well below the ramp's width 1.
RANK_RAMP_GAIN = 1e3


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


@keras.saving.register_keras_serializable(package="tesla")
class InstanceNorm(keras.layers.Layer):
    """Instance normalisation (RevIN without the affine part, as PatchTST and iTransformer use).

    Each series of a window is centred on its own mean and divided by its own spread; the
    statistics are returned so :class:`InstanceDenorm` can put the output back on the window's
    level. Input [B, N, C]; outputs [B, N, C], mean [B, 1, C], 1/std [B, 1, C].
    """

    def __init__(self, epsilon: float = 1e-5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)

    def call(self, inputs: Any) -> Any:
        mean = ops.mean(inputs, axis=1, keepdims=True)  # [B, 1, C]
        centred = inputs - mean
        inverse_std = ops.rsqrt(ops.mean(centred * centred, axis=1, keepdims=True) + self.epsilon)
        return centred * inverse_std, mean, inverse_std

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "epsilon": self.epsilon}


@keras.saving.register_keras_serializable(package="tesla")
class InstanceDenorm(keras.layers.Layer):
    """Undo :class:`InstanceNorm` for the raw channel: y·std + mean, with std = rsqrt(1/std)².

    Inputs: y [B, 1], mean [B, 1, C], 1/std [B, 1, C]; output [B, 1].
    """

    def call(self, inputs: Any) -> Any:
        output, mean, inverse_std = inputs
        root = ops.rsqrt(inverse_std[:, 0, :1])  # [B, 1]
        return output * root * root + mean[:, 0, :1]


def _device_trace(layer: TokenSelfAttention, tokens: Any, training: bool | None) -> bool:
    """Whether to trace the portable form: only for the batch-1 device graph.

    The exporter's integer conversion traces a fixed batch of 1; everything else (training,
    ``predict`` over thousands of windows, the gateway's float graph) gets batched matmuls,
    which at N = 360 avoid [B, 360, 360, d] intermediates (4 GB at B = 1024, d = 8).
    Eager calls with one window also take the portable form; the maths is the same.
    """
    return layer.portable and not training and tokens.shape[0] == 1


@keras.saving.register_keras_serializable(package="tesla")
class SequenceSelfAttention(TokenSelfAttention):
    """:class:`TokenSelfAttention` for long token sequences (tens to hundreds of tokens).

    The same function. The portable (device) form sums over keys with a FULLY_CONNECTED
    (:func:`sum_axis2`) so the 16-bit graph stays exact; every other graph (training, predict,
    the gateway's float graph) uses the parent's batched-matmul form, which does not
    materialise [B, L, L, d] products (see :func:`_device_trace`). TESLA's few tokens keep the
    parent layer untouched. Memory and multiply-adds grow as L²·d. Input and output [B, L, d].
    """

    def build(self, input_shape: Any) -> None:
        if int(input_shape[-2]) != 1:
            super().build(input_shape)
            return
        # One token attends only to itself with weight 1: queries and keys would be unused.
        self.value = Projection(self.d_model, name="value")
        self.output_dense = Projection(self.d_model, name="output")
        for layer in (self.value, self.output_dense):
            layer.build((None, self.d_model))

    def call(self, tokens: Any, training: bool | None = None) -> Any:
        v = self.value(tokens)  # [B, L, d]
        if tokens.shape[1] == 1:
            return self.output_dense(v)  # one token attends only to itself, with weight 1
        q = self.query(tokens)  # [B, L, d]
        k = self.key(tokens)
        mixed = (
            self._portable_mix(q, k, v)
            if _device_trace(self, tokens, training)
            else self._batched_mix(q, k, v)
        )
        return self.output_dense(mixed)  # [B, L, d]

    def _portable_mix(self, q: Any, k: Any, v: Any) -> Any:
        products = q[:, :, None, :] * k[:, None, :, :]  # [B, L_q, L_k, d]
        scores = matmul_last(products, self._score_matrix)  # [B, L_q, L_k, h]
        attention = ops.softmax(ops.transpose(scores, (0, 1, 3, 2)), axis=-1)  # [B, L_q, h, L_k]
        spread = matmul_last(ops.transpose(attention, (0, 1, 3, 2)), self._spread_matrix)
        return sum_axis2(spread * v[:, None, :, :])  # [B, L_q, d]


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
class ProbSparseSelfAttention(TokenSelfAttention):
    """Informer's ProbSparse self-attention, written so it exports to builtins.

    Informer ranks queries by the sparsity measure M(q) = max_j s_qj - mean_j s_qj, gives the
    top u = factor·ceil(ln L) queries full attention and every other query the mean of V.
    Two changes, both documented in ``training.models.informer``: M is measured on all keys
    (the paper's Eq. 4 definition) rather than a random sample of them, and the top-u set is
    found by counting, for each query, how many queries score higher (GREATER with
    ``selection='exact'``, which has no 16-bit kernel, or a saturating ramp), because TOPK_V2
    is not in the device library. Every query's attention is therefore computed and the lazy
    ones are replaced by mean(V): the same output as Informer, without its FLOP saving.
    Like :class:`SequenceSelfAttention`, only the batch-1 device graph uses the portable form;
    everything else uses batched matmuls. Input and output [B, L, d].
    """

    def __init__(
        self, d_model: int, heads: int, factor: int = 5, selection: str = "exact", **kwargs: Any
    ) -> None:
        super().__init__(d_model, heads, **kwargs)
        if selection not in {"ramp", "exact"}:
            raise ValueError(f"selection must be 'ramp' or 'exact', got {selection!r}")
        self.factor = int(factor)
        self.selection = selection

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        self.length = int(input_shape[-2])
        self.active_queries = min(self.length, self.factor * int(np.ceil(np.log(self.length))))

    def call(self, tokens: Any, training: bool | None = None) -> Any:
        q = self.query(tokens)  # [B, L, d]
        k = self.key(tokens)
        v = self.value(tokens)
        if _device_trace(self, tokens, training):
            return self.output_dense(self._portable_sparse(q, k, v))  # [B, L, d]
        return self.output_dense(self._batched_sparse(q, k, v))

    def _rank_to_active(self, sparsity: Any, axis: int) -> Any:
        """1 for the top-u queries by ``sparsity`` (queries along ``axis``), else 0."""
        ahead = ops.expand_dims(sparsity, axis)  # other queries q' along ``axis``
        behind = ops.expand_dims(sparsity, axis + 1)  # this query q along ``axis + 1``
        if self.selection == "exact":
            beaten_by = ops.cast(ops.greater(ahead - behind, 0.0), "float32")
            rank = ops.sum(beaten_by, axis=axis + 1)
            return ops.cast(ops.less(rank, float(self.active_queries)), "float32")
        # Scale before subtracting: a constant MUL after the SUB made the quantiser give the
        # difference the product's coarse 16-bit scale (measured: every rank wrong).
        ahead = ahead * RANK_RAMP_GAIN
        behind = behind * RANK_RAMP_GAIN
        beaten_by = ops.minimum(ops.relu(ahead - behind), 1.0)  # 1: q' ranks above q
        rank = sum_axis2(beaten_by) if axis == 1 else ops.sum(beaten_by, axis=axis + 1)
        # rank is an integer except at near-ties; u - 1/2 - rank is then at least 1/2 away.
        return ops.minimum(ops.relu((self.active_queries - 0.5 - rank) * 2.0), 1.0)

    def _portable_sparse(self, q: Any, k: Any, v: Any) -> Any:
        products = q[:, :, None, :] * k[:, None, :, :]  # [B, L_q, L_k, d]
        scores = matmul_last(products, self._score_matrix)  # [B, L_q, L_k, h]
        attention = ops.softmax(ops.transpose(scores, (0, 1, 3, 2)), axis=-1)  # [B, L_q, h, L_k]
        spread = matmul_last(ops.transpose(attention, (0, 1, 3, 2)), self._spread_matrix)
        full = sum_axis2(spread * v[:, None, :, :])  # [B, L_q, d]
        if self.active_queries >= self.length:
            return full  # short windows: every query is active
        mean_score = sum_axis2(scores, 1.0 / self.length)  # [B, L_q, h]
        # Max over keys as a pooling window: TFLite Micro's REDUCE_MAX has no 16-bit kernel.
        pooled = ops.max_pool(scores, (1, self.length), strides=(1, self.length))  # [B, L_q, 1, h]
        sparsity = ops.squeeze(pooled, axis=2) - mean_score  # [B, L_q, h]
        active = self._rank_to_active(sparsity, axis=1)  # [B, L_q, h]
        active = matmul_last(active, self._spread_matrix)  # [B, L_q, d]
        lazy = ops.mean(v, axis=1, keepdims=True)  # [B, 1, d]
        return lazy + active * (full - lazy)

    def _batched_sparse(self, q: Any, k: Any, v: Any) -> Any:
        length, h = self.length, self.heads
        d_head = self.d_model // h

        def split(x: Any, order: tuple[int, ...]) -> Any:
            return ops.transpose(ops.reshape(x, (-1, length, h, d_head)), order)

        scores = ops.matmul(split(q, (0, 2, 1, 3)), split(k, (0, 2, 3, 1)))  # [B, h, L_q, L_k]
        scores = scores * np.float32(d_head**-0.5)
        values = split(v, (0, 2, 1, 3))  # [B, h, L, d_head]
        mixed = ops.matmul(ops.softmax(scores, axis=-1), values)  # [B, h, L_q, d_head]
        if self.active_queries < length:
            sparsity = ops.max(scores, axis=-1) - ops.mean(scores, axis=-1)  # [B, h, L_q]
            active = self._rank_to_active(sparsity, axis=2)[..., None]  # [B, h, L_q, 1]
            lazy = ops.mean(values, axis=2, keepdims=True)  # [B, h, 1, d_head]
            mixed = lazy + active * (mixed - lazy)
        return ops.reshape(ops.transpose(mixed, (0, 2, 1, 3)), (-1, length, self.d_model))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "factor": self.factor, "selection": self.selection}


@keras.saving.register_keras_serializable(package="tesla")
class EncoderBlock(keras.layers.Layer):
    """A transformer encoder layer, post-norm (the original) or pre-norm.

    'post': x = LN(x + Attn(x)); x = LN(x + FFN(x)). 'pre': x = x + Attn(LN(x));
    x = x + FFN(LN(x)), which keeps a linear path from the readings to the output.

    ``attention`` is 'full' (:class:`SequenceSelfAttention`) or 'probsparse'
    (:class:`ProbSparseSelfAttention`). The FFN uses ReLU: GELU is not in the device library.
    Input and output [B, L, d].
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        ffn_width: int,
        *,
        attention: str = "full",
        factor: int = 5,
        norm_position: str = "post",
        selection: str = "exact",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if attention not in {"full", "probsparse"}:
            raise ValueError(f"attention must be 'full' or 'probsparse', got {attention!r}")
        if norm_position not in {"post", "pre"}:
            raise ValueError(f"norm_position must be 'post' or 'pre', got {norm_position!r}")
        self.norm_position = norm_position
        self.selection = selection
        self.d_model = int(d_model)
        self.heads = int(heads)
        self.ffn_width = int(ffn_width)
        self.attention_kind = attention
        self.factor = int(factor)

    def build(self, input_shape: Any) -> None:
        shape = (None, *tuple(input_shape)[1:])
        if self.attention_kind == "full":
            self.attention: keras.layers.Layer = SequenceSelfAttention(
                self.d_model, self.heads, name="attention"
            )
        else:
            self.attention = ProbSparseSelfAttention(
                self.d_model, self.heads, self.factor, self.selection, name="attention"
            )
        self.attention.build(shape)
        self.norm_attention = TokenLayerNorm(name="norm_attention")
        self.norm_attention.build(shape)
        self.ffn_in = Projection(self.ffn_width, activation="relu", name="ffn_in")
        self.ffn_in.build((None, self.d_model))
        self.ffn_out = Projection(self.d_model, name="ffn_out")
        self.ffn_out.build((None, self.ffn_width))
        self.norm_ffn = TokenLayerNorm(name="norm_ffn")
        self.norm_ffn.build(shape)

    def call(self, tokens: Any) -> Any:
        if self.norm_position == "post":
            attended = self.norm_attention(tokens + self.attention(tokens))  # [B, L, d]
            return self.norm_ffn(attended + self.ffn_out(self.ffn_in(attended)))  # [B, L, d]
        attended = tokens + self.attention(self.norm_attention(tokens))  # [B, L, d]
        return attended + self.ffn_out(self.ffn_in(self.norm_ffn(attended)))  # [B, L, d]

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "heads": self.heads,
            "ffn_width": self.ffn_width,
            "attention": self.attention_kind,
            "factor": self.factor,
            "norm_position": self.norm_position,
            "selection": self.selection,
        }


@keras.saving.register_keras_serializable(package="tesla")
class DistillingLayer(keras.layers.Layer):
    """Informer's distilling step: Conv1d(k=3, circular) + BatchNorm + ELU + MaxPool(3, 2, 1).

    Halves the sequence: [B, L, d] -> [B, floor((L - 1) / 2) + 1, d]. The max-pool's padding
    repeats the edge tokens, which for a maximum is the same as PyTorch's -inf padding.
    """

    def build(self, input_shape: Any) -> None:
        length, width = int(input_shape[-2]), int(input_shape[-1])
        self.conv = keras.layers.Conv1D(width, 3, padding="valid", name="conv")
        self.conv.build((None, length + 2, width))
        self.norm = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name="norm")
        self.norm.build((None, length, width))
        self.pool = keras.layers.MaxPooling1D(pool_size=3, strides=2, padding="valid")

    def call(self, tokens: Any, training: bool | None = None) -> Any:
        circular = ops.concatenate([tokens[:, -1:], tokens, tokens[:, :1]], axis=1)  # [B, L+2, d]
        convolved = self.norm(self.conv(circular), training=training)  # [B, L, d]
        mixed = device_elu(convolved)
        edged = ops.concatenate([mixed[:, :1], mixed, mixed[:, -1:]], axis=1)  # [B, L+2, d]
        return self.pool(edged)  # [B, L', d]
