"""PatchTST (Nie et al. 2023): uniform patches of the window as tokens.

Each channel's window is padded at the end with ``stride`` copies of its newest reading and cut
into patches of ``patch_length`` every ``stride`` periods (N = 360, 16/8: 45 patches); a linear
patch embedding P -> d plus a learned positional embedding makes the tokens; a transformer
encoder mixes them; a flatten head maps all channels' tokens to the value. Channels share the
patch embedding and encoder (channel independence). Optional instance normalisation (RevIN
without the affine part) removes each window's level before and restores it after.
[B, N(, C)] -> [B, 1].

Differences from the authors' code: LayerNorm instead of BatchNorm in the encoder (the same
encoder block as the other baselines), ReLU instead of GELU (no GELU on the device), no dropout,
and the patching is a constant 0/1 matrix multiply (one FULLY_CONNECTED on the device).
"""

from __future__ import annotations

from typing import Literal

import keras
from pydantic import Field

from training.models._encoder import EncoderSettings, encoder_stack
from training.models.layers.core import Projection, Scale, window_input
from training.models.layers.norm import InstanceDenorm, InstanceNorm
from training.models.layers.time_axis import LearnedPositions, Patching, Regroup

__all__ = ["PatchTSTConfig", "build_patchtst"]


class PatchTSTConfig(EncoderSettings):
    """Patch 16, stride 8 (the paper's default); width 16 with 4 heads, one layer."""

    kind: Literal["patchtst"] = "patchtst"
    d_model: int = Field(default=16, ge=1, description="Token width d.")
    heads: int = Field(default=4, ge=1, description="Attention heads; must divide d_model.")
    ffn_width: int = Field(default=32, ge=1, description="Hidden width of each layer's FFN.")
    patch_length: int = Field(default=16, ge=1, description="Periods per patch P.")
    stride: int = Field(default=8, ge=1, description="Periods between patch starts S.")
    instance_norm: bool = Field(
        default=False,
        description=(
            "RevIN-style per-window normalisation. Off by default: calibration needs the level "
            "the normalisation removes, and the model must then rebuild it from the statistics."
        ),
    )


def build_patchtst(
    config: PatchTSTConfig, window_length: int, channels: int, input_scale: float
) -> keras.Model:
    """Build the Keras model; ``input_scale`` divides raw inputs and multiplies the output."""
    inputs = window_input(window_length, channels)
    scaled = Scale(1.0 / input_scale, name="normalise")(inputs)
    series = keras.layers.Reshape((window_length, channels), name="as_channels")(scaled)
    if config.instance_norm:
        series, mean, inverse_std = InstanceNorm(name="instance_norm")(series)  # [B, N, C]
    per_channel = keras.layers.Permute((2, 1), name="channels_first")(series)  # [B, C, N]
    patching = Patching(window_length, config.patch_length, config.stride, name="patching")
    patches = patching(per_channel)  # [B·C, patches, P]
    tokens = Projection(config.d_model, name="patch_embedding")(patches)  # [B·C, patches, d]
    tokens = LearnedPositions(name="positions")(tokens)
    tokens = encoder_stack(tokens, config, "encoder")  # [B·C, patches, d]
    flat = Regroup((channels * patching.patches * config.d_model,), name="flatten")(tokens)
    output = Projection(1, name="head")(flat)  # [B, 1]
    if config.instance_norm:
        output = InstanceDenorm(name="instance_denorm")([output, mean, inverse_std])
    calibrated = Scale(input_scale, name="denormalise")(output)
    return keras.Model(inputs, calibrated, name=config.kind)
