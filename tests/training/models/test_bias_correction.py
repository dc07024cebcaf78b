"""The integer graph's output bias correction (training/bias_correction.py), on a real TESLA
and the real converter: the last bias is found behind the output's Scale, a mean output error is
removed from the int8 graph, and the Keras model keeps its weights."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from training.bias_correction import convert_bias_corrected, output_bias
from training.export import _keras_outputs, convert_device, litert_predict
from training.models import TeslaConfig, build_model

N = 32
INPUT_SCALE = 60.0


def _windows(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    level = rng.gamma(2.0, 12.0, size=(count, 1))
    return (level * rng.lognormal(0.0, 0.2, size=(count, N))).astype("float32")


@pytest.fixture(scope="module")
def tesla() -> keras.Model:
    keras.utils.set_random_seed(5)
    model = build_model(TeslaConfig(d_model=8, heads=2), N, 1, input_scale=INPUT_SCALE)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="mse")
    x = _windows(2048, 0)
    model.fit(x, 0.6 * x[:, -1] + 0.2 * x.mean(axis=1) + 2.0, batch_size=64, epochs=3, verbose=0)
    return model


def test_the_last_bias_is_the_aggregators_behind_the_output_scale(tesla: keras.Model) -> None:
    found = output_bias(tesla)
    assert found is not None
    bias, slope = found
    assert bias is tesla.get_layer("aggregator").across_tokens.bias
    assert slope == pytest.approx(INPUT_SCALE)


def test_an_ending_it_does_not_know_gets_no_correction() -> None:
    inputs = keras.Input(shape=(N,))
    model = keras.Model(inputs, keras.layers.Dense(1, activation="relu")(inputs))
    assert output_bias(model) is None


def test_a_mean_integer_error_is_removed_and_keras_keeps_its_weights(tesla: keras.Model) -> None:
    """A systematic error put into the int8 graph (the aggregator's bias moved by 3 µg/m³ before
    conversion, standing in for int8 weight rounding) is measured on the representative windows
    and corrected; the Keras model is left as it was."""
    representative, check = _windows(200, 1), _windows(128, 2)
    bias, slope = output_bias(tesla)  # type: ignore[misc]
    original = np.array(bias.numpy())
    keras_check = _keras_outputs(tesla, check)

    def biased_convert(model: keras.Model, windows: np.ndarray) -> bytes:
        kept = np.array(bias.numpy())
        bias.assign(kept + 3.0 / slope)
        try:
            return convert_device(model, windows)
        finally:
            bias.assign(kept)

    plain = biased_convert(tesla, representative)
    corrected, shift = convert_bias_corrected(
        tesla,
        representative,
        convert=biased_convert,
        keras_predict=_keras_outputs,
        integer_predict=litert_predict,
        min_shift=0.05,
    )
    assert shift == pytest.approx(-3.0, abs=0.5)
    before = np.mean(litert_predict(plain, check) - keras_check)
    after = np.mean(litert_predict(corrected, check) - keras_check)
    assert abs(before) > 2.5
    assert abs(after) < abs(before) / 5
    np.testing.assert_array_equal(bias.numpy(), original)
    np.testing.assert_array_equal(_keras_outputs(tesla, check), keras_check)
    _, none = convert_bias_corrected(
        tesla,
        representative,
        convert=convert_device,
        keras_predict=_keras_outputs,
        integer_predict=litert_predict,
        min_shift=10.0,
    )
    assert none == 0.0
