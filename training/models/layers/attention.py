"""Self-attention without BATCH_MATMUL: TESLA's token form, long sequences, ProbSparse."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

from training.models.layers.core import Projection, matmul_last, sum_axis2

__all__ = [
    "RANK_RAMP_GAIN",
    "ProbSparseSelfAttention",
    "SequenceSelfAttention",
    "TokenSelfAttention",
]


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


# Sparsity margins above 1/gain count as a full "ranks above". The 16-bit device graph resolves
# the gained margins to about gain·range(M)/32768, which must stay well below the ramp's width 1.
RANK_RAMP_GAIN = 1e3


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
