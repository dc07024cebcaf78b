"""iTransformer (Liu et al. 2024): each channel's whole window is one token.

The window of each channel (N readings) is embedded to d by one dense map, attention mixes the
C channel tokens, an FFN refines each, and a projection d -> 1 gives each channel's output; the
raw channel's output is the calibrated value. [B, N(, C)] -> [B, 1].

With one channel there is one token: attention over a single token is just its value
projection, so the model reduces to an MLP over the window — the paper notes iTransformer is
weak for a single univariate sensor, and this is why. Implemented faithfully anyway; it gains
meaning with covariate channels (RH, temperature). Differences from the authors' code: ReLU
FFN (no GELU on the device), no dropout, instance normalisation optional (off by default, as
for PatchTST: the level is what a calibration must keep).
"""

from __future__ import annotations

from typing import Literal

import keras
from pydantic import Field

from training.models._encoder import EncoderSettings, encoder_stack
from training.models.layers.core import Projection, Scale, window_input
from training.models.layers.norm import InstanceDenorm, InstanceNorm

__all__ = ["ITransformerConfig", "build_itransformer"]


class ITransformerConfig(EncoderSettings):
    """Width 16 with 4 heads, one layer: C tokens are cheap, so the width can be larger."""

    kind: Literal["itransformer"] = "itransformer"
    d_model: int = Field(default=16, ge=1, description="Token width d.")
    heads: int = Field(default=4, ge=1, description="Attention heads; must divide d_model.")
    ffn_width: int = Field(default=32, ge=1, description="Hidden width of each layer's FFN.")
    instance_norm: bool = Field(
        default=False, description="Per-window normalisation of each channel (RevIN-style)."
    )


def build_itransformer(
    config: ITransformerConfig, window_length: int, channels: int, input_scale: float
) -> keras.Model:
    """Build the Keras model; ``input_scale`` divides raw inputs and multiplies the output."""
    inputs = window_input(window_length, channels)
    scaled = Scale(1.0 / input_scale, name="normalise")(inputs)
    series = keras.layers.Reshape((window_length, channels), name="as_channels")(scaled)
    if config.instance_norm:
        series, mean, inverse_std = InstanceNorm(name="instance_norm")(series)  # [B, N, C]
    variates = keras.layers.Permute((2, 1), name="channels_first")(series)  # [B, C, N]
    tokens = Projection(config.d_model, name="series_embedding")(variates)  # [B, C, d]
    tokens = encoder_stack(tokens, config, "encoder")  # [B, C, d]
    per_channel = Projection(1, name="projection")(tokens)  # [B, C, 1]
    raw_channel = keras.layers.Cropping1D((0, channels - 1), name="raw_channel")(per_channel)
    output = keras.layers.Reshape((1,), name="output")(raw_channel)  # [B, 1]
    if config.instance_norm:
        output = InstanceDenorm(name="instance_denorm")([output, mean, inverse_std])
    calibrated = Scale(input_scale, name="denormalise")(output)
    return keras.Model(inputs, calibrated, name=config.kind)
