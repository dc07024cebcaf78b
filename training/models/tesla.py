"""TESLA (AAAI 2025) as one configurable builder; the paper's ablations are options, not copies.

Shapes: input [B, N] raw µg/m³ oldest first (or [B, N, C] with covariate channels), output [B, 1]
µg/m³. Normalisation (a fixed input scale) is inside the graph so the FlatBuffer takes raw values.

``hour_input="head"``: the body (binning, global view, attention) reads the PM channel alone and
the newest period's other channels (the hour of the day) enter only the head. The hour is the
same information at every position, and flattening all N x C inputs into the global view made
the 3-channel graph a third larger and slower on the node (docs/benchmarks/node-m4/).
"""

from __future__ import annotations

from typing import Any, Literal

import keras
from pydantic import BaseModel, ConfigDict, Field

from training.models.bins import BinKind, bin_count, membership_matrix
from training.models.layers.attention import TokenSelfAttention
from training.models.layers.binning import BinnedEmbedding
from training.models.layers.core import Projection, Scale
from training.models.layers.norm import FeatureAggregator, TokenLayerNorm
from training.models.layers.slicing import ChannelOf, NewestChannels, RepeatTokens

__all__ = ["TeslaConfig", "build_tesla"]


class TeslaConfig(BaseModel):
    """Hyper-parameters the paper leaves open; defaults chosen on validation (docs/model.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["tesla"] = "tesla"
    d_model: int = Field(default=16, ge=1, description="Token width d.")
    heads: int = Field(default=4, ge=1, description="Attention heads; must divide d_model.")
    residual: bool = Field(default=True, description="Residual connection around attention.")
    norm_position: Literal["post", "pre"] = Field(
        default="post",
        description=(
            "'post': LayerNorm(T + MHA(T)) feeds the aggregator (the paper's Eq. 5). 'pre': "
            "T + MHA(LayerNorm(T)) keeps a linear path from the readings to the output, which "
            "int8 quantisation preserves (docs/model.md)."
        ),
    )
    bins: BinKind = Field(default="log", description="'log' (TESLA) or 'uniform' (ablation).")
    use_global: bool = Field(default=True, description="Add the global view of the window.")
    aggregator: Literal["linear", "ffn", "mlp"] = Field(
        default="linear",
        description=(
            "TESLA's feature-wise aggregator, a transformer FFN head, or 'mlp': the aggregator "
            "with a hidden ReLU layer of ffn_width per token (a head the node can afford at "
            "N = 360, docs/model.md)."
        ),
    )
    ffn_width: int = Field(
        default=32, ge=1, description="Hidden width of the 'ffn' and 'mlp' heads."
    )
    hour_input: Literal["window", "head"] = Field(
        default="window",
        description=(
            "'window': every channel enters the body at every position. 'head': the body reads "
            "channel 0 (PM) only and the newest period's other channels (the hour of the day) "
            "enter the head: a projection of them is added to every token's hidden layer in "
            "the 'mlp' aggregator, where it meets the newest PM (the last log bin is the "
            "newest period alone). A graph the size of the PM-only one."
        ),
    )


def build_tesla(
    config: TeslaConfig,
    window_length: int,
    channels: int,
    input_scale: float,
    *,
    channel_scales: tuple[float, ...] | None = None,
) -> keras.Model:
    """Build the Keras model; ``input_scale`` divides raw inputs and multiplies the output.

    ``channel_scales`` divides each channel by its own scale instead (covariate models): with
    one scale, temperature entered at a few hundredths of the PM level and the integer device
    graph of an Ispra PM10 + rh + temp_c model deviated 2.9 µg/m³ RMS from float (bound 1.0);
    scaled per channel it deviated 0.49 (docs/training.md, "Covariate models on the device").
    """
    if config.norm_position == "pre" and not config.residual:
        raise ValueError("norm_position='pre' needs residual=True: the residual carries the level")
    shape = (window_length,) if channels == 1 else (window_length, channels)
    inputs = keras.Input(shape=shape, name="window")
    factor = (
        1.0 / input_scale if channel_scales is None else [1.0 / scale for scale in channel_scales]
    )
    if config.hour_input == "head":
        if channels < 2:
            raise ValueError("hour_input='head' needs channels beside PM (the hour of the day)")
        if config.aggregator != "mlp":
            raise ValueError(
                "hour_input='head' needs aggregator='mlp' (the hour enters its hidden layer)"
            )
        scaled = Scale(1.0 / input_scale, name="normalise")(ChannelOf(0, name="pm")(inputs))
        # The head reads the newest period's other channels (the hour) only: the newest PM
        # reaches it already, as the last log bin's token, which is that period alone.
        newest = NewestChannels(first_channel=1, name="newest_others")(inputs)  # [B, C - 1]
        newest = Scale(
            factor if isinstance(factor, float) else factor[1:], name="normalise_others"
        )(newest)
        body_channels = 1
    else:
        scaled = Scale(factor, name="normalise")(inputs)
        newest = None
        body_channels = channels
    normalised = _body(config, scaled, window_length, body_channels)  # [B, z, d]
    output = _head(config, normalised, window_length, newest)  # [B, 1]
    calibrated = Scale(input_scale, name="denormalise")(output)
    return keras.Model(inputs, calibrated, name="tesla")


def _body(config: TeslaConfig, scaled: Any, window_length: int, channels: int) -> Any:
    """Binned embedding, self-attention and LayerNorm: the z tokens the head reads."""
    membership = membership_matrix(window_length, config.bins)
    tokens = BinnedEmbedding(
        membership, config.d_model, channels, config.use_global, name="binned_embedding"
    )(scaled)  # [B, z, d]
    attention = TokenSelfAttention(config.d_model, config.heads, name="attention")
    if config.norm_position == "post":
        attended = attention(tokens)
        if config.residual:
            attended = keras.layers.Add(name="residual")([tokens, attended])
        return TokenLayerNorm(name="layer_norm")(attended)
    attended = attention(TokenLayerNorm(name="layer_norm")(tokens))
    return keras.layers.Add(name="residual")([tokens, attended])


def _head(config: TeslaConfig, normalised: Any, window_length: int, newest: Any) -> Any:
    """The aggregator; with ``newest`` (hour_input='head') the newest period's channels too."""
    z = bin_count(window_length)
    if config.aggregator == "linear":
        output = FeatureAggregator(name="aggregator")(normalised)  # [B, 1]
    elif config.aggregator == "mlp":
        if newest is not None:
            hidden = Projection(config.ffn_width, name="mlp_in")(normalised)  # [B, z, w]
            # One shift for every token: a projection per token ([2, z * w]) grew the FlatBuffer
            # by 4.8 KB (its 144 output channels' quantisation parameters and int64 biases).
            shift = Projection(config.ffn_width, name="newest_in")(newest)  # [B, w]
            shift = RepeatTokens(z, name="newest_tokens")(shift)  # [B, z, w]
            hidden = keras.layers.ReLU(name="mlp_relu")(
                keras.layers.Add(name="newest_shift")([hidden, shift])
            )
        else:
            hidden = Projection(config.ffn_width, activation="relu", name="mlp_in")(normalised)
        flat = keras.layers.Reshape((z * config.ffn_width,))(hidden)
        output = Projection(1, name="head")(flat)
    else:
        hidden = Projection(config.ffn_width, activation="relu", name="ffn_in")(normalised)
        hidden = Projection(config.d_model, name="ffn_out")(hidden)
        block = TokenLayerNorm(name="ffn_norm")(keras.layers.Add()([normalised, hidden]))
        flat = keras.layers.Reshape((z * config.d_model,))(block)
        output = Projection(1, name="head")(flat)
    return output
