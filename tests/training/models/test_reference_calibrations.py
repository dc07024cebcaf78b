"""The practitioners' reference calibrations: OLS on the current reading and the EPA correction."""

from __future__ import annotations

import numpy as np
import pytest

from training.errors import DataError
from training.metrics import error_metrics
from training.reference_calibrations import (
    barkjohn_2021,
    current_channel,
    epa_purpleair_pm25,
    fit_ols,
    reference_rows,
)
from training.train import TrainConfig, prepare_data

# Hand-computed at RH = 50 % (0.0862·50 = 4.31), one value in every piece of the extension.
HAND_VALUES = [
    (10.0, 0.524 * 10 - 4.31 + 5.75),  # 6.68: Barkjohn 2021
    (40.0, 0.655 * 40 - 4.31 + 5.75),  # s = 0.5: slope halfway between 0.524 and 0.786
    (100.0, 0.786 * 100 - 4.31 + 5.75),  # 80.04
    # s = 0.5: 0.738·235 − 4.31·0.5 + 2.966·0.5 + 5.75·0.5 + 8.84e-4·235²·0.5
    (235.0, 173.43 - 2.155 + 1.483 + 2.875 + 24.40945),
    (400.0, 2.966 + 0.69 * 400 + 8.84e-4 * 400**2),  # 420.406: no RH term
]


@pytest.mark.parametrize(("pm", "expected"), HAND_VALUES)
def test_epa_correction_hand_values(pm: float, expected: float) -> None:
    assert float(epa_purpleair_pm25(pm, 50.0)) == pytest.approx(expected, abs=1e-9)


def test_barkjohn_2021_is_the_low_piece() -> None:
    pm = np.array([0.0, 5.0, 29.0])
    rh = np.array([20.0, 60.0, 95.0])
    np.testing.assert_allclose(barkjohn_2021(pm, rh), 0.524 * pm - 0.0862 * rh + 5.75)
    np.testing.assert_allclose(epa_purpleair_pm25(pm, rh), barkjohn_2021(pm, rh))


@pytest.mark.parametrize("breakpoint", [30.0, 50.0, 210.0, 260.0])
@pytest.mark.parametrize("rh", [10.0, 90.0])
def test_epa_correction_is_continuous_at_each_breakpoint(breakpoint: float, rh: float) -> None:
    below, at = epa_purpleair_pm25([breakpoint - 1e-9, breakpoint], rh)
    assert below == pytest.approx(at, abs=1e-6)


@pytest.fixture(scope="module")
def humid_windows():
    config = TrainConfig(
        dataset="synthetic",
        dataset_options={"n_sensors": 4, "days": 1, "period_seconds": 60, "seed": 3},
        window_length=16,
        channels=("raw", "rh"),
    )
    return prepare_data(config)


def test_reference_rows_include_epa_only_for_pm2_5_with_humidity(humid_windows) -> None:
    rows = reference_rows(humid_windows.train, humid_windows.test, "pm2_5")
    assert set(rows) == {"raw", "ols", "epa"}
    current = humid_windows.test.current_raw()
    rh = current_channel(humid_windows.test, "rh")
    assert rows["epa"] == error_metrics(
        epa_purpleair_pm25(current, rh), humid_windows.test.targets()
    )
    assert set(reference_rows(humid_windows.train, humid_windows.test, "pm10")) == {"raw", "ols"}


def test_ols_is_fitted_on_training_windows(humid_windows) -> None:
    ols = fit_ols(humid_windows.train)
    rows = reference_rows(humid_windows.train, humid_windows.test, "pm2_5")
    target = humid_windows.test.targets()
    assert rows["ols"] == error_metrics(ols.predict(humid_windows.test.current_raw()), target)
    assert rows["ols"].rmse < rows["raw"].rmse


def test_current_channel_reads_the_newest_value(humid_windows) -> None:
    x, _ = humid_windows.test.gather(np.arange(5))
    np.testing.assert_array_equal(current_channel(humid_windows.test, "rh")[:5], x[:, -1, 1])
    with pytest.raises(DataError, match="temp_c"):
        current_channel(humid_windows.test, "temp_c")
