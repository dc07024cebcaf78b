"""The hour-of-day channels training derives: the contract's rule (window_hours) in the site's
standard time with the offset at each window's newest period, on the same windows as the
readings, the zone carried from the loader to the grid, and windows with the hour withheld."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.contract.time_of_day import UNKNOWN_HOUR
from training.batches import WindowBatches
from training.data import CoLocationData, GriddedSensor, WindowSet, load_dataset, to_grid
from training.data.frame import tidy_frame
from training.data.hours import standard_offsets, withhold_hour
from training.errors import DataError
from training.train import TrainConfig

NAN = float("nan")
HOURS = ("raw", "hour_sin", "hour_cos")


def _unix(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def _sensor(raw: list[float], *, start: str, zone: str, period: int = 3600) -> GriddedSensor:
    values = np.asarray(raw, dtype=np.float64)
    return GriddedSensor(
        sensor_id="A",
        first_period=int(_unix(start)) // period,
        period_seconds=period,
        raw=values,
        reference=np.arange(values.size, dtype=np.float64),
        observed=~np.isnan(values),
        zone=zone,
    )


def _windows(sensor: GriddedSensor, n: int, max_gap: int = 0) -> WindowSet:
    policy = GapPolicy(max_interpolated_periods=max_gap)
    return WindowSet.build([sensor], n, policy, channels=HOURS)


def test_hour_is_local_standard_time_in_winter_and_summer() -> None:
    # Rome is UTC+1 standard, UTC+2 in summer: the hour channels ignore the summer clock
    for start in ("2020-01-15T11:00:00", "2020-07-15T11:00:00"):
        windows = _windows(_sensor([1.0, 2.0], start=start, zone="Europe/Rome"), 2)
        x, _ = windows.gather([0])
        # 11:00 UTC is 12:00 standard time (half the day: angle pi), then 13:00
        angle = 2 * math.pi * 13 / 24
        np.testing.assert_allclose(x[0, :, 1], [0.0, math.sin(angle)], atol=1e-6)
        np.testing.assert_allclose(x[0, :, 2], [-1.0, math.cos(angle)], atol=1e-6)
        np.testing.assert_allclose(windows.current("hour_cos"), [math.cos(angle)], atol=1e-6)


def test_utc_zone_reads_the_utc_hour() -> None:
    windows = _windows(_sensor([1.0], start="2020-01-15T06:00:00", zone="UTC"), 1)
    x, _ = windows.gather([0])
    np.testing.assert_allclose(x[0, 0, 1:], [1.0, 0.0], atol=1e-6)


def test_a_filled_gap_holds_its_own_hour_and_the_windows_are_the_readings() -> None:
    raw = [1.0, 2.0, NAN, 4.0, 5.0, NAN, NAN, NAN, 9.0]
    sensor = _sensor(raw, start="2020-01-15T00:00:00", zone="Europe/Rome", period=60)
    with_hour = _windows(sensor, 3, max_gap=1)
    raw_only = WindowSet.build([sensor], 3, GapPolicy(max_interpolated_periods=1))
    # the same windows are valid: the hour is derived where the reading is
    assert with_hour.meta()["period_start_s"].tolist() == raw_only.meta()["period_start_s"].tolist()
    x, _ = with_hour.gather(np.arange(len(with_hour)))
    np.testing.assert_array_equal(x[:, :, 0], raw_only.gather(np.arange(len(raw_only)))[0])
    # the newest period of window 0, and the filled gap at 00:02 (01:02 standard time) within it
    newest = int(with_hour.meta()["period_start_s"][0] // 60) - sensor.first_period
    gap = 2 - (newest - 2)
    angle = 2 * math.pi * (1 + 2 / 60) / 24
    assert x[0, gap, 1] == pytest.approx(math.sin(angle), abs=1e-6)
    assert x[0, gap, 2] == pytest.approx(math.cos(angle), abs=1e-6)


def test_the_window_takes_its_year_s_standard_offset() -> None:
    # Moscow kept +4 h all through 2013 and moved its standard time from +4 h to +3 h at
    # 2014-10-25 22:00 UTC: a year with a change takes its smaller offset throughout
    # (tesla_gateway.contract.time_of_day.standard_offset_seconds), as the gateway does
    change = _unix("2014-10-25T22:00:00")
    starts = np.array([_unix("2013-06-01T00:00:00"), change - 3600.0, change, change + 3600.0])
    assert standard_offsets("Europe/Moscow", starts).tolist() == [14400, 10800, 10800, 10800]
    sensor = _sensor([1.0, 2.0], start="2014-10-25T21:00:00", zone="Europe/Moscow")
    x, _ = _windows(sensor, 1).gather([0, 1])
    # 21:00 UTC is 00:00 at +3 h, 22:00 UTC 01:00
    np.testing.assert_allclose(x[:, 0, 1], [0.0, math.sin(2 * math.pi / 24)], atol=1e-6)


def test_hour_channels_need_each_other_and_the_reading() -> None:
    sensor = _sensor([1.0, 2.0], start="2020-01-15T00:00:00", zone="UTC")
    policy = GapPolicy(max_interpolated_periods=0)
    for channels in (("raw", "hour_sin"), ("hour_sin", "hour_cos")):
        with pytest.raises(DataError, match="go together"):
            WindowSet.build([sensor], 1, policy, channels=channels)


def test_withheld_windows_have_unknown_hour_and_keep_their_readings() -> None:
    x = np.random.default_rng(0).normal(size=(4, 5, 3)).astype(np.float32)
    which = np.array([True, False, True, False])
    out = withhold_hour(x, HOURS, which)
    assert (out[which, :, 1] == UNKNOWN_HOUR[0]).all()
    assert (out[which, :, 2] == UNKNOWN_HOUR[1]).all()
    np.testing.assert_array_equal(out[~which], x[~which])
    np.testing.assert_array_equal(out[:, :, 0], x[:, :, 0])


@pytest.mark.parametrize(("fraction", "withheld"), [(0.0, 0), (1.0, 16)])
def test_batches_withhold_the_configured_share(fraction: float, withheld: int) -> None:
    sensor = _sensor([float(i) for i in range(20)], start="2020-01-15T07:00:00", zone="UTC")
    windows = WindowSet.build([sensor], 5, GapPolicy(max_interpolated_periods=0), channels=HOURS)
    batches = WindowBatches(
        windows, np.arange(len(windows)), 16, seed=0, unknown_hour_fraction=fraction
    )
    x, _ = batches[0]
    unknown = (x[:, :, 1] == 0).all(axis=1) & (x[:, :, 2] == 0).all(axis=1)
    assert int(unknown.sum()) == withheld


def test_config_takes_both_hour_channels_or_neither() -> None:
    with pytest.raises(ValidationError, match="go together"):
        TrainConfig(channels=("raw", "hour_sin"))
    with pytest.raises(ValidationError, match="withholds the hour channels"):
        TrainConfig(unknown_hour_fraction=0.1)
    assert TrainConfig(channels=HOURS, unknown_hour_fraction=0.15).unknown_hour_fraction == 0.15


def test_zone_travels_from_the_data_to_the_grid_and_is_checked() -> None:
    frame = tidy_frame(
        pd.to_datetime(["2020-01-15T00:00:00Z", "2020-01-15T00:01:00Z"]), "A", [1.0, 2.0], [1, 2]
    )
    data = CoLocationData(frame, "pm10", 60, "test", "reference", "none", zone="Europe/Rome")
    assert to_grid(data)["A"].zone == "Europe/Rome"
    with pytest.raises(DataError, match="IANA time zone"):
        CoLocationData(frame, "pm10", 60, "test", "reference", "none", zone="Mars/Olympus")


def test_plain_csv_takes_the_zone_as_an_option(tmp_path: Path) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text(
        "timestamp,sensor_id,raw,reference\n"
        "2020-01-15T00:00:00Z,A,1,1\n2020-01-15T00:01:00Z,A,2,2\n",
        encoding="utf-8",
    )
    assert load_dataset("csv", path).zone == "UTC"
    assert load_dataset("csv", path, zone="Europe/Brussels").zone == "Europe/Brussels"
