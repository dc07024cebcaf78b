"""The hour-of-day channels training derives: the contract's values in the site's standard time,
NaN where the raw reading is missing (so the readings' gap fill applies), the zone carried from
the loader to the grid, and windows with the hour withheld."""

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
from training.data.hours import hour_series, standard_offsets, withhold_hour
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


def test_hour_is_local_standard_time_in_winter_and_summer() -> None:
    # Rome is UTC+1 standard, UTC+2 in summer: the hour channels ignore the summer clock
    for start in ("2020-01-15T11:00:00", "2020-07-15T11:00:00"):
        sensor = _sensor([1.0, 2.0], start=start, zone="Europe/Rome")
        sin, cos = sensor.channel("hour_sin"), sensor.channel("hour_cos")
        # 11:00 UTC is 12:00 standard time (half the day: angle pi), then 13:00
        np.testing.assert_allclose(sin, [0.0, math.sin(2 * math.pi * 13 / 24)], atol=1e-12)
        np.testing.assert_allclose(cos, [-1.0, math.cos(2 * math.pi * 13 / 24)], atol=1e-12)


def test_utc_zone_reads_the_utc_hour() -> None:
    sensor = _sensor([1.0], start="2020-01-15T06:00:00", zone="UTC")
    np.testing.assert_allclose(sensor.channel("hour_sin"), [1.0], atol=1e-12)
    np.testing.assert_allclose(sensor.channel("hour_cos"), [0.0], atol=1e-12)


def test_hour_is_nan_where_the_raw_reading_is_missing() -> None:
    sensor = _sensor([1.0, NAN, 3.0, NAN], start="2020-01-15T00:00:00", zone="Europe/Rome")
    for name in ("hour_sin", "hour_cos"):
        values = sensor.channel(name)
        assert np.isnan(values).tolist() == [False, True, False, True]


def test_offset_follows_a_zone_that_changed_its_standard_time() -> None:
    # Moscow's standard offset went from +4 h to +3 h at 2014-10-25 22:00 UTC
    change = _unix("2014-10-25T22:00:00")
    starts = change + np.array([-3600.0, -60.0, 0.0, 3600.0])
    assert standard_offsets("Europe/Moscow", starts).tolist() == [14400, 14400, 10800, 10800]
    sin = hour_series("hour_sin", starts, np.ones(4, dtype=bool), "Europe/Moscow")
    # the last period before the change is 01:59 local, the first after it 01:00
    expected = [math.sin(2 * math.pi * h / 24) for h in (1.0, 1 + 59 / 60, 1.0, 2.0)]
    np.testing.assert_allclose(sin, expected, atol=1e-12)


def test_windows_gap_fill_the_hour_like_the_reading() -> None:
    raw = [1.0, 2.0, NAN, 4.0, 5.0, NAN, NAN, NAN, 9.0]
    sensor = _sensor(raw, start="2020-01-15T00:00:00", zone="Europe/Rome", period=60)
    policy = GapPolicy(max_interpolated_periods=1)
    with_hour = WindowSet.build([sensor], 3, policy, channels=HOURS)
    raw_only = WindowSet.build([sensor], 3, policy, channels=("raw",))
    # the same windows are valid: the hour is missing exactly where the reading is
    assert with_hour.meta()["period_start_s"].tolist() == raw_only.meta()["period_start_s"].tolist()
    x, _ = with_hour.gather(np.arange(len(with_hour)))
    first_end = (with_hour.meta()["period_start_s"][0] // 60) - sensor.first_period
    assert first_end in (3, 4)  # the gap at slot 2 lies inside the first window
    gap = 2 - (first_end - 2)
    # the filled gap is interpolated between its neighbours' hours, as a reading would be
    for channel, name in ((1, "hour_sin"), (2, "hour_cos")):
        hour = sensor.channel(name)
        assert x[0][gap, channel] == pytest.approx((hour[1] + hour[3]) / 2, abs=1e-6)


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
    with pytest.raises(DataError, match="IANA zone"):
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
