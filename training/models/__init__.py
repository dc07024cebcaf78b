"""Every model behind one builder interface: a config with a ``kind`` and :func:`build_model`.

All builders map a window [B, N] (or [B, N, C]) of raw readings to [B, 1] calibrated readings,
with the input scaling inside the graph, so the trainer and the exporter treat them alike.
TESLA and the paper's seven baselines (Linear, NLinear, DLinear, Transformer, Informer,
PatchTST, iTransformer) are chosen by ``kind``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import keras
from pydantic import Field

from training.models.dlinear import DLinearConfig, build_dlinear
from training.models.informer import InformerConfig, build_informer
from training.models.itransformer import ITransformerConfig, build_itransformer
from training.models.linear import LinearConfig, build_linear
from training.models.nlinear import NLinearConfig, build_nlinear
from training.models.patchtst import PatchTSTConfig, build_patchtst
from training.models.tesla import TeslaConfig, build_tesla
from training.models.transformer import TransformerConfig, build_transformer

__all__ = [
    "BASELINE_KINDS",
    "DLinearConfig",
    "ITransformerConfig",
    "InformerConfig",
    "LinearConfig",
    "ModelConfig",
    "NLinearConfig",
    "PatchTSTConfig",
    "TeslaConfig",
    "TransformerConfig",
    "build_model",
]

AnyModelConfig = (
    TeslaConfig
    | LinearConfig
    | NLinearConfig
    | DLinearConfig
    | TransformerConfig
    | InformerConfig
    | PatchTSTConfig
    | ITransformerConfig
)
ModelConfig = Annotated[AnyModelConfig, Field(discriminator="kind")]

BASELINE_KINDS = (
    "linear",
    "nlinear",
    "dlinear",
    "transformer",
    "informer",
    "patchtst",
    "itransformer",
)

_BUILDERS: dict[str, Callable[[Any, int, int, float], keras.Model]] = {
    "tesla": build_tesla,
    "linear": build_linear,
    "nlinear": build_nlinear,
    "dlinear": build_dlinear,
    "transformer": build_transformer,
    "informer": build_informer,
    "patchtst": build_patchtst,
    "itransformer": build_itransformer,
}


def build_model(
    config: AnyModelConfig,
    window_length: int,
    channels: int,
    input_scale: float,
    *,
    channel_scales: tuple[float, ...] | None = None,
) -> keras.Model:
    """Build the Keras model a config describes; ``channel_scales`` (TESLA only) divides each
    input channel by its own scale (the first is ``input_scale``, which also scales the output)."""
    if channel_scales is None:
        return _BUILDERS[config.kind](config, window_length, channels, input_scale)
    if not isinstance(config, TeslaConfig):
        raise ValueError(f"per-channel input scaling is built for tesla, not {config.kind}")
    if len(channel_scales) != channels or channel_scales[0] != input_scale:
        raise ValueError(
            f"channel_scales {channel_scales} must give {channels} scales, input_scale first"
        )
    return build_tesla(config, window_length, channels, input_scale, channel_scales=channel_scales)
