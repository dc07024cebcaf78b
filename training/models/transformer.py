"""Vanilla Transformer encoder over the N readings as tokens (Vaswani et al. 2017).

Each reading (with its C channels) is a token: value embedding (a dense map C -> d) plus the
fixed sinusoidal positional encoding, then encoder layers with full self-attention, then a
head over the flattened tokens (or their mean). [B, N(, C)] -> [B, 1].

Cost: attention materialises [L, L, d] products, so memory and multiply-adds grow as N²·d —
at N = 360 and d = 8 that is 1.04 M products per layer per window, and the 16-bit device
graph needs about 2 MB for that one tensor: more than the nRF52840's 256 KB of RAM, so at the
paper's N the device export fails at TFLite Micro's allocation (the float export works). The
defaults are small for that reason. Differences from the original: no dropout (few epochs,
deterministic tests), ReLU in the FFN (no GELU on the device), encoder only (one output value).
"""

from __future__ import annotations

from typing import Literal

import keras
from pydantic import Field

from training.models._encoder import EncoderSettings, encoder_stack, flatten_head
from training.models.layers.core import Projection, Scale, window_input
from training.models.layers.time_axis import SinusoidalPositions

__all__ = ["TransformerConfig", "build_transformer"]


class TransformerConfig(EncoderSettings):
    """Small by default (d = 8, 2 heads, 1 layer): the cost is N²·d per layer."""

    kind: Literal["transformer"] = "transformer"
    head: Literal["flatten", "mean"] = Field(
        default="flatten", description="Flatten the N tokens into the head, or average them."
    )


def build_transformer(
    config: TransformerConfig, window_length: int, channels: int, input_scale: float
) -> keras.Model:
    """Build the Keras model; ``input_scale`` divides raw inputs and multiplies the output."""
    inputs = window_input(window_length, channels)
    scaled = Scale(1.0 / input_scale, name="normalise")(inputs)
    series = keras.layers.Reshape((window_length, channels), name="as_channels")(scaled)
    tokens = Projection(config.d_model, name="value_embedding")(series)  # [B, N, d]
    tokens = SinusoidalPositions(name="positions")(tokens)  # [B, N, d]
    tokens = encoder_stack(tokens, config, "encoder")  # [B, N, d]
    if config.head == "flatten":
        output = flatten_head(tokens, window_length, config.d_model)  # [B, 1]
    else:
        pooled = keras.layers.GlobalAveragePooling1D(name="mean_tokens")(tokens)  # [B, d]
        output = Projection(1, name="head")(pooled)  # [B, 1]
    calibrated = Scale(input_scale, name="denormalise")(output)
    return keras.Model(inputs, calibrated, name=config.kind)
