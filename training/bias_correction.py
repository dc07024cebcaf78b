"""Output bias correction for the integer device graph.

Rounding the last projection's weights to int8 shifts its output by sum(dw_i * x_i); when that
projection adds up large terms that cancel (TESLA's aggregator over its tokens), the shift is
nearly the same on every window: a bias, not noise. Measured on a short-training TESLA at
N = 720: the integer graph was 1.44 µg/m³ RMS from Keras with a median |difference| of 1.44
(calibrating on the check windows themselves did not help: not the representative set), and
TensorFlow's quantisation debugger put a mean error of -0.89 µg/m³ on the final
FULLY_CONNECTED alone. The fix is the classic bias correction (Nagel et al., "Data-Free
Quantization Through Weight Equalization and Bias Correction", ICCV 2019, section 4.2): the mean
output error on the representative windows is added to the float bias of that last projection
before the integer conversion. Only the device graph changes; the float graph and Keras keep
their weights. The exporter still verifies the result on held-out windows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import numpy.typing as npt

from training.models.layers.core import Projection, Scale
from training.models.layers.norm import FeatureAggregator

Array = npt.NDArray[np.float32]


def output_bias(model: keras.Model) -> tuple[Any, float] | None:
    """The bias variable added last before the model's output, and the output's slope in it.

    Follows fixed Scale layers back from the output to a FeatureAggregator or a linear
    one-unit Projection; None for any other ending (no correction is made).
    """
    layer = model.layers[-1]
    slope = 1.0
    while isinstance(layer, Scale):
        factors = layer.factor if isinstance(layer.factor, list) else [layer.factor]
        if len(factors) != 1:
            return None  # a per-channel scale is an input's, never the one output's
        slope *= factors[0]
        parents = layer._inbound_nodes[0].parent_nodes  # Keras has no public form
        if len(parents) != 1:
            return None
        layer = parents[0].operation
    if isinstance(layer, FeatureAggregator):
        return layer.across_tokens.bias, slope
    if isinstance(layer, Projection) and layer.units == 1 and layer._activation_name is None:
        return layer.bias, slope
    return None


def convert_bias_corrected(
    model: keras.Model,
    representative: Array,
    *,
    convert: Callable[[keras.Model, Array], bytes],
    keras_predict: Callable[[keras.Model, Array], Array],
    integer_predict: Callable[[bytes, Array], Array],
    min_shift: float,
) -> tuple[bytes, float]:
    """The integer FlatBuffer, converted again with the last bias corrected when the mean output
    error on the representative windows is at least ``min_shift`` (the output's step); returns
    the bytes and the correction applied to the output (0.0 when none)."""
    device = convert(model, representative)
    found = output_bias(model)
    if found is None:
        return device, 0.0
    shift = float(
        np.mean(keras_predict(model, representative) - integer_predict(device, representative))
    )
    if not np.isfinite(shift) or abs(shift) < min_shift:
        return device, 0.0
    bias, slope = found
    original = np.array(bias.numpy())
    bias.assign(original + shift / slope)
    try:
        return convert(model, representative), shift
    finally:
        bias.assign(original)
