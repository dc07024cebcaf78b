"""NLinear (Zeng et al. 2023): subtract the newest reading, map linearly, add it back.

The subtraction makes the linear map see shapes rather than levels, which helps when the level
drifts between training and test. With C channels every channel loses its own newest value and
the raw channel's newest value is added back to the output. [B, N(, C)] -> [B, 1].
"""

from __future__ import annotations

from typing import Literal

import keras
from pydantic import BaseModel, ConfigDict

from training.models.layers.core import Projection, Scale, window_input

__all__ = ["NLinearConfig", "build_nlinear"]


class NLinearConfig(BaseModel):
    """NLinear has no hyper-parameters beyond the window the trainer chooses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["nlinear"] = "nlinear"


def build_nlinear(
    config: NLinearConfig, window_length: int, channels: int, input_scale: float
) -> keras.Model:
    """Build the Keras model; ``input_scale`` divides raw inputs and multiplies the output."""
    inputs = window_input(window_length, channels)
    scaled = Scale(1.0 / input_scale, name="normalise")(inputs)
    series = keras.layers.Reshape((window_length, channels), name="as_channels")(scaled)
    last = keras.layers.Cropping1D((window_length - 1, 0), name="newest")(series)  # [B, 1, C]
    shapes = keras.layers.Subtract(name="subtract_newest")([series, last])  # [B, N, C]
    flat = keras.layers.Reshape((window_length * channels,), name="flatten")(shapes)
    output = Projection(1, name="linear")(flat)  # [B, 1]
    newest_raw = keras.layers.Reshape((channels,), name="newest_flat")(last)  # [B, C]
    if channels > 1:
        newest_raw = keras.layers.Cropping1D((0, channels - 1), name="newest_raw")(
            keras.layers.Reshape((channels, 1))(newest_raw)
        )
        newest_raw = keras.layers.Reshape((1,))(newest_raw)  # [B, 1]
    restored = keras.layers.Add(name="add_newest")([output, newest_raw])  # [B, 1]
    calibrated = Scale(input_scale, name="denormalise")(restored)
    return keras.Model(inputs, calibrated, name=config.kind)
