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
from keras import ops

__all__ = [
    "BinnedEmbedding",
    "FeatureAggregator",
    "Projection",
    "Scale",
    "TokenLayerNorm",
    "TokenSelfAttention",
    "matmul_last",
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
    Input and output [B, z, d].
    """

    def __init__(self, d_model: int, heads: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if d_model % heads:
            raise ValueError(f"d_model={d_model} must be divisible by heads={heads}")
        self.d_model = int(d_model)
        self.heads = int(heads)

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
        products = q[:, :, None, :] * k[:, None, :, :]  # [B, z_i, z_j, d]
        scores = matmul_last(products, self._score_matrix)  # [B, z_i, z_j, h]
        scores = ops.transpose(scores, (0, 1, 3, 2))  # [B, z_i, h, z_j]
        attention = ops.softmax(scores, axis=-1)
        attention = ops.transpose(attention, (0, 1, 3, 2))  # [B, z_i, z_j, h]
        spread = matmul_last(attention, self._spread_matrix)  # [B, z_i, z_j, d]
        mixed = ops.sum(spread * v[:, None, :, :], axis=2)  # [B, z_i, d]
        return self.output_dense(mixed)

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

    def build(self, input_shape: Any) -> None:
        features = int(input_shape[-1])
        self.gamma = self.add_weight(name="gamma", shape=(features,), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(features,), initializer="zeros")

    def call(self, inputs: Any) -> Any:
        centred = inputs - ops.mean(inputs, axis=-1, keepdims=True)
        inverse_root_mad = ops.rsqrt(ops.mean(ops.abs(centred), axis=-1, keepdims=True) + 1e-12)
        unit = centred * inverse_root_mad * inverse_root_mad  # deviations of order one
        variance = ops.mean(unit * unit, axis=-1, keepdims=True)
        return unit * ops.rsqrt(variance + self.epsilon) * self.gamma + self.beta

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "epsilon": self.epsilon}


@keras.saving.register_keras_serializable(package="tesla")
class FeatureAggregator(keras.layers.Layer):
    """TESLA's aggregator (Eq. 5 with the erratum): W_agg1 [d, 1] per token, then W_agg2 [z, 1].

    Input [B, z, d], output [B, 1].
    """

    def build(self, input_shape: Any) -> None:
        tokens, features = int(input_shape[-2]), int(input_shape[-1])
        self.per_token = Projection(1, name="w_agg1")
        self.per_token.build((None, features))
        self.across_tokens = Projection(1, name="w_agg2")
        self.across_tokens.build((None, tokens))
        self.tokens = tokens

    def call(self, inputs: Any) -> Any:
        collapsed = ops.reshape(self.per_token(inputs), (-1, self.tokens))  # [B, z]
        return self.across_tokens(collapsed)  # [B, 1]
