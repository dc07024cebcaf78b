"""Linear (Zeng et al. 2023, "Are Transformers Effective for Time Series Forecasting?").

One dense map from the whole window to the calibrated value: [B, N(, C)] -> [B, 1]. With C
channels the map reads the flattened N·C window. Parameters: N·C + 1.
"""

from __future__ import annotations

from typing import Literal

import keras
from pydantic import BaseModel, ConfigDict

from training.models.layers.core import Projection, Scale, window_input

__all__ = ["LinearConfig", "build_linear"]


class LinearConfig(BaseModel):
    """Linear has no hyper-parameters beyond the window the trainer chooses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["linear"] = "linear"


def build_linear(
    config: LinearConfig, window_length: int, channels: int, input_scale: float
) -> keras.Model:
    """Build the Keras model; ``input_scale`` divides raw inputs and multiplies the output."""
    inputs = window_input(window_length, channels)
    scaled = Scale(1.0 / input_scale, name="normalise")(inputs)
    flat = keras.layers.Reshape((window_length * channels,), name="flatten")(scaled)  # [B, N·C]
    output = Projection(1, name="linear")(flat)  # [B, 1]
    calibrated = Scale(input_scale, name="denormalise")(output)
    return keras.Model(inputs, calibrated, name=config.kind)
