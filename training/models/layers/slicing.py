"""Parts of a [B, N, C] window as single STRIDED_SLICE ops: one channel, or the newest period.

A model that reads the hour of the day needs it only at the newest period (the hour is the
same information at every position), so TESLA's ``hour_input="head"`` feeds its body the PM
channel alone and its head the newest period's channels (training/models/tesla.py).
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

__all__ = ["ChannelOf", "NewestPeriod", "RepeatTokens"]


@keras.saving.register_keras_serializable(package="tesla")
class ChannelOf(keras.layers.Layer):
    """One channel of every position: [B, N, C] -> [B, N]."""

    def __init__(self, channel: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.channel = int(channel)

    def call(self, inputs: Any) -> Any:
        return inputs[:, :, self.channel]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "channel": self.channel}


@keras.saving.register_keras_serializable(package="tesla")
class NewestPeriod(keras.layers.Layer):
    """Every channel of the newest position (the window is oldest first): [B, N, C] -> [B, C]."""

    def call(self, inputs: Any) -> Any:
        return inputs[:, -1, :]


@keras.saving.register_keras_serializable(package="tesla")
class RepeatTokens(keras.layers.Layer):
    """[B, k] -> [B, z, k], the same row for every token (a MUL by a constant of ones)."""

    def __init__(self, tokens: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tokens = int(tokens)

    def call(self, inputs: Any) -> Any:
        ones = ops.ones((1, self.tokens, 1), dtype=inputs.dtype)
        return ones * inputs[:, None, :]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "tokens": self.tokens}
