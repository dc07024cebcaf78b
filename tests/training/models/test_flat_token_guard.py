"""An all-zero window in the first batch must not end training in NaN.

At initialisation every bias is zero, so an all-zero window gives flat tokens (every feature
equal) and TokenLayerNorm's mean absolute deviation is 0: its 1/mad gradient reached 1e31 and
Adam's second moment overflowed, NaN from the second step (Antwerp_4043AE's dead zeros did this
to 7 of 20 seeds of the default's training). Training now gives flat tokens zero gradient;
inference keeps the plain form, which is the same function.
"""

from __future__ import annotations

import keras
import numpy as np

from training.models import TeslaConfig, build_model

N = 48


def _model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = build_model(TeslaConfig(d_model=16, heads=4, aggregator="ffn"), N, 1, 60.0)
    model.compile(optimizer=keras.optimizers.Adam(3e-4), loss="mse")
    return model


def test_zero_window_in_the_first_batch_trains_without_nan() -> None:
    rng = np.random.default_rng(0)
    model = _model(0)
    losses = []
    for step in range(3):
        x = rng.gamma(2.0, 6.0, (32, N)).astype(np.float32)
        if step == 0:
            x[0] = 0.0  # the only all-zero window: the old norm gave NaN at step 2
        y = (0.5 * x[:, -1:] + 3.0).astype(np.float32)
        losses.append(float(model.train_on_batch(x, y)))
    assert np.isfinite(losses).all(), losses
    assert all(np.isfinite(np.asarray(w)).all() for w in model.weights)


def test_training_and_inference_compute_the_same_function() -> None:
    """The guard changes gradients only: every output, flat windows included, is unchanged."""
    rng = np.random.default_rng(1)
    model = _model(1)
    x = rng.gamma(2.0, 6.0, (8, N)).astype(np.float32)
    x[0] = 0.0
    x[1] = 7.0  # constant but not zero: its tokens are not flat
    inference = np.asarray(model(x, training=False))
    training = np.asarray(model(x, training=True))
    np.testing.assert_allclose(training, inference, rtol=1e-6, atol=1e-6)
