"""Weight averaging of the short-history fine-tuning (training/history_swa.py), on a tiny Keras
model: the snapshots are the epochs' weights, the averages their mean, the result one graph of
the same shape."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from training.history_swa import WeightSnapshots, average_weights, select


def _tiny() -> keras.Model:
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def test_snapshots_hold_each_epochs_end_weights_and_the_moving_average() -> None:
    model = _tiny()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32)).reshape(-1, 1)
    start = [np.array(w) for w in model.get_weights()]
    snapshots = WeightSnapshots(decays=(0.5, 0.999999))
    model.fit(x, y, epochs=3, batch_size=16, callbacks=[snapshots], verbose=0)

    assert len(snapshots.epochs) == 3
    for held, now in zip(snapshots.epochs[-1], model.get_weights(), strict=True):
        np.testing.assert_array_equal(held, now)
    assert not np.allclose(snapshots.epochs[0][0], snapshots.epochs[-1][0])  # it trained
    # a decay near 1 barely leaves the start; 0.5 follows the last batches
    final = model.get_weights()[0]
    np.testing.assert_allclose(snapshots.ema[0.999999][0], start[0], atol=1e-3)
    fast = snapshots.ema[0.5][0]
    assert np.abs(fast - final).max() < np.abs(start[0] - final).max() / 4
    # one moving average per decay, at the end of training; a copy, not the running buffer
    assert set(snapshots.ema) == {0.5, 0.999999}
    snapshots.ema[0.5][0] += 1.0
    np.testing.assert_array_equal(snapshots.ema[0.5][0], fast)


def test_the_average_is_the_element_wise_mean_and_loads_into_the_same_model() -> None:
    model = _tiny()
    members = [[w + i for w in model.get_weights()] for i in range(3)]
    averaged = average_weights(members)
    for mean, base in zip(averaged, model.get_weights(), strict=True):
        np.testing.assert_allclose(mean, base + 1.0, rtol=1e-6)
    model.set_weights(averaged)  # same shapes: the same graph
    with pytest.raises(ValueError, match="nothing to average"):
        average_weights([])


def _score(curve: tuple[float, ...], short: float, train: float) -> dict[str, object]:
    """Validation RMSE at K = 1, 60, 180, 360, the short-history mean, the training windows'."""
    validation = dict(zip(("1", "60", "180", "360"), curve, strict=True))
    return {"validation": validation, "validation_short_mean": short, "train_short_mean": train}


def test_the_choice_ranks_only_averages_that_pass_on_validation_ties_on_training_windows() -> None:
    baseline = _score((6.62, 6.34, 5.62, 3.38), 6.32, 6.78)
    scored = {
        "a: epoch 4": _score((6.60, 6.00, 5.00, 3.30), 6.00, 6.50),  # a single epoch: not eligible
        "a: swa 2..8": _score((6.64, 6.28, 5.44, 3.40), 6.297, 6.724),
        "a: ema 0.999": _score((6.64, 6.18, 5.40, 3.34), 6.262, 6.672),
        "b: ema 0.999": _score((6.64, 6.22, 5.43, 3.34), 6.270, 6.600),  # tied, better in-sample
        "b: swa 5..10": _score((6.64, 6.20, 5.40, 3.45), 6.230, 6.600),  # K = N 2 % worse
        "c: swa 1..10": _score((6.72, 6.20, 5.40, 3.38), 6.250, 6.600),  # K = 1 1.5 % worse
        "c: ema 0.9998": _score((6.60, 6.35, 5.40, 3.30), 6.250, 6.600),  # not better at K = 60
    }
    assert select(baseline, scored) == ["b: ema 0.999", "a: ema 0.999", "a: swa 2..8"]
    assert select(baseline, {"x: swa 1..2": _score((7, 7, 7, 7), 7, 7)}) == []
