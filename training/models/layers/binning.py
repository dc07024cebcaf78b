"""TESLA's front end: the binned embedding of a window into z tokens."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

from training.models.layers.core import matmul_last

__all__ = ["BinnedEmbedding"]


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
