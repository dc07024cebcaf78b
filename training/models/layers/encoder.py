"""Transformer encoder blocks of the baselines and Informer's distilling step."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from training.models.layers.attention import ProbSparseSelfAttention, SequenceSelfAttention
from training.models.layers.core import Projection, device_elu
from training.models.layers.norm import TokenLayerNorm

__all__ = ["DistillingLayer", "EncoderBlock"]


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
