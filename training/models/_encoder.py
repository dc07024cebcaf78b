"""Pieces the transformer baselines share: the encoder stack and the flatten head."""

from __future__ import annotations

from typing import Any, Literal

import keras
from pydantic import BaseModel, ConfigDict, Field

from training.models.layers.core import Projection
from training.models.layers.encoder import EncoderBlock

__all__ = ["EncoderSettings", "encoder_stack", "flatten_head"]

NormPosition = Literal["post", "pre"]


class EncoderSettings(BaseModel):
    """Width, heads, depth and FFN of a transformer encoder; shared by the baselines' configs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    d_model: int = Field(default=8, ge=1, description="Token width d.")
    heads: int = Field(default=2, ge=1, description="Attention heads; must divide d_model.")
    layers: int = Field(default=1, ge=1, description="Encoder layers.")
    ffn_width: int = Field(default=16, ge=1, description="Hidden width of each layer's FFN.")
    norm_position: NormPosition = Field(
        default="post",
        description="'post' (the original transformer) or 'pre' (LayerNorm inside the residual).",
    )


def encoder_stack(
    tokens: Any, settings: EncoderSettings, prefix: str, attention: str = "full", factor: int = 5
) -> Any:
    """``settings.layers`` encoder blocks over [B, L, d] tokens."""
    for index in range(settings.layers):
        tokens = EncoderBlock(
            settings.d_model,
            settings.heads,
            settings.ffn_width,
            attention=attention,
            factor=factor,
            norm_position=settings.norm_position,
            name=f"{prefix}_{index}",
        )(tokens)
    return tokens


def flatten_head(tokens: Any, tokens_count: int, width: int) -> Any:
    """[B, L, d] -> [B, L·d] -> [B, 1]: the linear head PatchTST and the others use."""
    flat = keras.layers.Reshape((tokens_count * width,), name="flatten")(tokens)
    return Projection(1, name="head")(flat)
