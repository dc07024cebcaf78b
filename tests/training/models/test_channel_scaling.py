"""Per-channel input scaling of covariate TESLA models (training/train.py covariate_scales)."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest

from tesla_gateway.contract.series import GapPolicy
from training.data import WindowSet, clean, generate_synthetic, to_grid
from training.models import LinearConfig, TeslaConfig, build_model
from training.train import TrainConfig, covariate_scales


def _windows(channels: tuple[str, ...]) -> WindowSet:
    data, _ = clean(generate_synthetic(n_sensors=2, days=1, period_seconds=600, seed=4))
    return WindowSet.build(list(to_grid(data).values()), 12, GapPolicy(max_interpolated_periods=2),
                           channels=channels)  # fmt: skip


def test_each_covariate_gets_the_99th_percentile_of_its_own_values() -> None:
    channels = ("raw", "rh", "temp_c")
    windows = _windows(channels)
    config = TrainConfig(dataset="synthetic", channels=channels, window_length=12)
    scales = covariate_scales(config, windows, 143.0)
    assert scales is not None and scales[0] == 143.0
    for scale, channel in zip(scales[1:], channels[1:], strict=True):
        expected = np.percentile(np.abs(windows.current(channel)), 99)
        assert scale == pytest.approx(max(1.0, expected))
    assert covariate_scales(config.model_copy(update={"channels": ("raw",)}), windows, 1.0) is None
    linear = config.model_copy(update={"model": LinearConfig()})
    assert covariate_scales(linear, windows, 1.0) is None


def test_the_graph_divides_each_channel_by_its_scale_and_reloads(tmp_path: Path) -> None:
    scales = (100.0, 50.0, 10.0)
    model = build_model(TeslaConfig(d_model=8, heads=2), 12, 3, 100.0, channel_scales=scales)
    normalise = model.get_layer("normalise")
    window = np.ones((1, 12, 3), np.float32)
    np.testing.assert_allclose(np.asarray(normalise(window))[0, 0], [0.01, 0.02, 0.1], rtol=1e-6)
    model.save(tmp_path / "model.keras")
    reloaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(
        reloaded.predict(window, verbose=0), model.predict(window, verbose=0)
    )
    with pytest.raises(ValueError, match="tesla, not linear"):
        build_model(LinearConfig(), 12, 3, 100.0, channel_scales=scales)
