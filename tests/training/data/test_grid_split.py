"""Gridding on the gateway's epoch-aligned periods, and the paper's sensor split."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tesla_gateway.contract.series import period_index
from training.data import CoLocationData, SensorSplit, paper_split, tidy_frame, to_grid
from training.errors import DataError

NAN = float("nan")


def _data(
    *,
    seconds: list[float],
    sensors: list[str],
    raw: list[float],
    reference: list[float],
    rh: list[float],
    period: int,
) -> CoLocationData:
    frame = tidy_frame(
        timestamp=pd.to_datetime(seconds, unit="s", utc=True),
        sensor_id=pd.Series(sensors),
        raw=raw,
        reference=reference,
        covariates={"rh": rh},
    )
    return CoLocationData(frame, "pm2_5", period, "test", "reference", "test")


def test_readings_within_a_period_are_averaged_on_the_epoch_grid() -> None:
    base = 1_700_000_000 - 1_700_000_000 % 60  # a period start
    data = _data(
        seconds=[base + 5, base + 59, base + 60, base + 241, base + 10],
        sensors=["a", "a", "a", "a", "b"],
        raw=[10.0, 20.0, 7.0, 9.0, 1.0],
        reference=[NAN, 4.0, 5.0, NAN, 2.0],
        rh=[40.0, 60.0, NAN, 80.0, 1.0],
        period=60,
    )
    grids = to_grid(data)
    assert list(grids) == ["a", "b"]
    a = grids["a"]
    assert a.first_period == period_index(base + 5, 60)
    assert a.period_seconds == 60
    assert len(a) == 5
    np.testing.assert_array_equal(a.raw, [15.0, 7.0, NAN, NAN, 9.0])
    np.testing.assert_array_equal(a.reference, [4.0, 5.0, NAN, NAN, NAN])
    np.testing.assert_array_equal(a.covariates["rh"], [50.0, NAN, NAN, NAN, 80.0])
    np.testing.assert_array_equal(a.observed, [True, True, False, False, True])
    np.testing.assert_array_equal(a.timestamps, base + 60 * np.arange(5))
    assert a.raw.dtype == np.float64
    assert a.observed.dtype == np.bool_
    assert len(grids["b"]) == 1


def test_hourly_grid_and_unaligned_start() -> None:
    data = _data(
        seconds=[3600 * 10 + 1800, 3600 * 12 + 5],
        sensors=["x", "x"],
        raw=[1.0, 3.0],
        reference=[1.0, 3.0],
        rh=[NAN, NAN],
        period=3600,
    )
    grid = to_grid(data)["x"]
    assert grid.first_period == 10
    np.testing.assert_array_equal(grid.timestamps, [36000, 39600, 43200])
    np.testing.assert_array_equal(grid.observed, [True, False, True])
    with pytest.raises(KeyError, match="no channel 'temp_c'"):
        grid.channel("temp_c")


def test_paper_split() -> None:
    split = paper_split(["40641B", "4065ED", "406414", "4065E0", "4065D0", "40642E"])
    assert split == SensorSplit(
        train=("406414", "40641B", "40642E", "4065D0"), validation="4065E0", test="4065ED"
    )
    assert split.role("4065ED") == "test"
    assert split.role("4065E0") == "validation"
    assert split.role("406414") == "train"
    assert paper_split(["c", "a", "b", "a"]) == SensorSplit(("a",), "b", "c")
    with pytest.raises(DataError, match=r"at least 3 sensors.*got 2"):
        paper_split(["a", "b"])
