"""DLinear (Zeng et al. 2023): split the window into trend and remainder, a linear map each.

The trend is a moving average (kernel 25 by default, edges padded by repetition as in the
authors' series decomposition), written as a constant [N, N] matrix A; the remainder is
window - trend; output = W_s·remainder + W_t·trend + b. Because every step is linear, the
layer evaluates it as one map with W = W_s + A (W_t - W_s) (see
:class:`training.models.layers.time_axis.DecomposedLinear`): the same function and parameters,
and one FULLY_CONNECTED on the device with weights that quantise well. [B, N(, C)] -> [B, 1];
parameters 2·N·C + 1.
"""

from __future__ import annotations

from typing import Literal

import keras
from pydantic import BaseModel, ConfigDict, Field

from training.models.layers.core import Scale, window_input
from training.models.layers.time_axis import DecomposedLinear, moving_average_matrix

__all__ = ["DLinearConfig", "build_dlinear"]


class DLinearConfig(BaseModel):
    """The authors' default moving-average kernel (25 periods)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["dlinear"] = "dlinear"
    moving_average: int = Field(
        default=25, ge=1, description="Odd kernel of the trend's moving average, in periods."
    )


def build_dlinear(
    config: DLinearConfig, window_length: int, channels: int, input_scale: float
) -> keras.Model:
    """Build the Keras model; ``input_scale`` divides raw inputs and multiplies the output."""
    inputs = window_input(window_length, channels)
    scaled = Scale(1.0 / input_scale, name="normalise")(inputs)
    series = keras.layers.Reshape((window_length, channels), name="as_channels")(scaled)
    average = moving_average_matrix(window_length, config.moving_average)  # [N, N]
    output = DecomposedLinear(average, name="decomposed_linear")(series)  # [B, 1]
    calibrated = Scale(input_scale, name="denormalise")(output)
    return keras.Model(inputs, calibrated, name=config.kind)
