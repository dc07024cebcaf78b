"""Every model behind one builder interface: a config with a ``kind`` and :func:`build_model`.

All builders map a window [B, N] (or [B, N, C]) of raw readings to [B, 1] calibrated readings,
with the input scaling inside the graph, so the trainer and the exporter treat them alike.
"""

from __future__ import annotations

from typing import Annotated

import keras
from pydantic import Field

from training.models.tesla import TeslaConfig, build_tesla

__all__ = ["ModelConfig", "TeslaConfig", "build_model"]

ModelConfig = Annotated[TeslaConfig, Field(discriminator="kind")]


def build_model(
    config: TeslaConfig, window_length: int, channels: int, input_scale: float
) -> keras.Model:
    """Build the Keras model a config describes."""
    return build_tesla(config, window_length, channels, input_scale)
