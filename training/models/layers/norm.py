"""Normalisation and aggregation: token LayerNorm, TESLA's aggregator, instance norm."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from training.models.layers.core import Projection

__all__ = [
    "FLAT_TOKEN_MAD",
    "FeatureAggregator",
    "InstanceDenorm",
    "InstanceNorm",
    "TokenLayerNorm",
]

# Below this mean absolute deviation a token counts as flat while training (TokenLayerNorm).
FLAT_TOKEN_MAD = 1e-6


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

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        flat_guard = bool(training)
        if self.portable or len(inputs.shape) != 3:
            return self._normalise(inputs, -1, flat_guard) * self.gamma + self.beta
        batch_last = ops.transpose(inputs, (1, 2, 0))  # [B, L, d] -> [L, d, B]
        normalised = self._normalise(batch_last, 1, flat_guard)
        return ops.transpose(normalised * self.gamma[:, None] + self.beta[:, None], (2, 0, 1))

    def _normalise(self, inputs: Any, axis: int, flat_guard: bool) -> Any:
        centred = inputs - ops.mean(inputs, axis=axis, keepdims=True)
        mad = ops.mean(ops.abs(centred), axis=axis, keepdims=True)
        inverse_root_mad = ops.rsqrt(mad + 1e-12)
        unit = centred * inverse_root_mad * inverse_root_mad  # deviations of order one
        if flat_guard:
            # A flat token (an all-zero window at initialisation, when every bias is zero) has
            # no direction to normalise. Its output is zero either way, but its gradient through
            # 1/mad reached 1e31 and overflowed Adam's second moment: NaN from the first batch.
            # Training gives it zero gradient too; inference (and every exported graph) keeps
            # the plain form, the same function for any token that is not flat.
            unit = ops.where(mad > FLAT_TOKEN_MAD, unit, ops.zeros_like(unit))
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
