"""Parts of a [B, N, C] window as single STRIDED_SLICE ops: one channel, or the newest period.

A model that reads the hour of the day needs it only at the newest period (the hour is the
same information at every position), so TESLA's ``hour_input="head"`` feeds its body the PM
channel alone and its head the newest period's channels (training/models/tesla.py).
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

__all__ = ["ChannelOf", "NewestChannels", "RepeatTokens"]


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
class NewestChannels(keras.layers.Layer):
    """The newest position (the window is oldest first): [B, N, C] -> [B, C - first_channel]
    (its channels from ``first_channel`` on), or [B, N] -> [B, 1]. (Not training.classical's
    NewestPeriod, which takes every channel and holds that registered name.)"""

    def __init__(self, first_channel: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.first_channel = int(first_channel)

    def call(self, inputs: Any) -> Any:
        if len(inputs.shape) == 2:
            return inputs[:, -1:]
        return inputs[:, -1, self.first_channel :]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "first_channel": self.first_channel}


@keras.saving.register_keras_serializable(package="tesla")
class RepeatTokens(keras.layers.Layer):
    """[B, k] -> [B, z, k], the same row for every token, as a MUL by a constant of ones.

    Added to a FULLY_CONNECTED's [B, z, k] output, a broadcast [B, 1, k] was folded by the
    converter into that FULLY_CONNECTED's bias, which is wrong in 16x8; repeated, it is not.
    """

    def __init__(self, tokens: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tokens = int(tokens)

    def call(self, inputs: Any) -> Any:
        ones = ops.ones((1, self.tokens, 1), dtype=inputs.dtype)
        return ones * ops.reshape(inputs, (-1, 1, inputs.shape[-1]))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "tokens": self.tokens}
