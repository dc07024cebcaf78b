"""Cleaning: the gateway's limits, counted by reason and column, and the >50 % sensor rule."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from tesla_gateway.contract.readings import FIELD_LIMITS
from training.data import CleaningRules, CoLocationData, LoadCounts, clean, tidy_frame

NAN = float("nan")


def _data(
    rows: list[tuple[str, int, float, float, float, float]], **extra: object
) -> CoLocationData:
    sensors, minutes, raw, reference, rh, temp = zip(*rows, strict=True)
    frame = tidy_frame(
        timestamp=pd.to_datetime([60 * m for m in minutes], unit="s", utc=True),
        sensor_id=pd.Series(sensors),
        raw=raw,
        reference=reference,
        covariates={"rh": rh, "temp_c": temp},
    )
    return CoLocationData(
        frame=frame,
        feature="pm10",
        period_seconds=60,
        source="test",
        target="reference",
        attribution="test",
        **extra,  # type: ignore[arg-type]
    )


def test_counts_every_rule_by_column_and_reason() -> None:
    high = FIELD_LIMITS["pm10"][1]
    rows = [
        ("a", 0, 10.0, 11.0, 50.0, 5.0),  # valid
        ("a", 1, NAN, 11.0, 50.0, 5.0),  # raw missing -> row dropped
        ("a", 2, -3.0, 11.0, 50.0, 5.0),  # raw negative
        ("a", 3, -999.0, 11.0, 50.0, 5.0),  # raw sentinel
        ("a", 4, high + 0.5, 11.0, 50.0, 5.0),  # raw out of range (PMS spike)
        ("a", 5, float("inf"), 11.0, 50.0, 5.0),  # raw not finite
        ("a", 6, 12.0, 1600.0, 50.0, 5.0),  # reference spike -> reference NaN only
        ("a", 7, 12.0, -0.9, 50.0, 5.0),  # reference negative
        ("a", 8, 12.0, 9999.0, 101.0, -41.0),  # reference sentinel, rh and temp out of range
        ("a", 9, 12.0, NAN, -9999.0, -12.0),  # missing reference is not a removal; rh sentinel
        ("a", 10, high, 0.0, 100.0, 85.0),  # limits are inclusive
    ]
    cleaned, report = clean(_data(rows), CleaningRules(max_removed_fraction=1.0))
    frame = cleaned.frame
    assert report.rows_read == 11
    assert report.rows_kept == 6
    assert dict(report.rows_dropped) == {
        "raw:missing": 1,
        "raw:negative": 1,
        "raw:not_finite": 1,
        "raw:out_of_range": 1,
        "raw:sentinel": 1,
    }
    assert dict(report.values_nulled) == {
        "reference:negative": 1,
        "reference:out_of_range": 1,
        "reference:sentinel": 1,
        "rh:out_of_range": 1,
        "rh:sentinel": 1,
        "temp_c:out_of_range": 1,
    }
    assert frame["raw"].tolist() == [10.0, 12.0, 12.0, 12.0, 12.0, high]
    assert frame["reference"].isna().tolist() == [False, True, True, True, True, False]
    assert frame["rh"].isna().tolist() == [False, False, False, True, True, False]
    assert frame["temp_c"].tolist()[3:] == [pytest.approx(NAN, nan_ok=True), -12.0, 85.0]
    # 5 rows dropped + 3 references invalidated out of 11: by default the sensor would go.
    assert report.removed_fraction["a"] == pytest.approx(8 / 11)
    assert clean(_data(rows))[1].sensors_dropped == ("a",)


def test_sensor_losing_more_than_half_is_dropped() -> None:
    rows = [("good", m, 10.0, 10.0, 50.0, 5.0) for m in range(10)]
    rows += [("half", m, 10.0 if m < 5 else -1.0, 10.0, 50.0, 5.0) for m in range(10)]
    rows += [("bad", m, 10.0 if m < 4 else -1.0, 10.0, 50.0, 5.0) for m in range(10)]
    cleaned, report = clean(_data(rows))
    assert report.sensors_dropped == ("bad",)
    assert cleaned.sensor_ids == ("good", "half")  # exactly half removed is kept
    assert report.rows_dropped["sensor_dropped"] == 4
    assert report.rows_dropped["raw:negative"] == 11
    assert report.rows_kept == 15
    assert report.rows_read == report.rows_kept + sum(report.rows_dropped.values())
    strict = CleaningRules(max_removed_fraction=0.0)
    assert clean(_data(rows), strict)[1].sensors_dropped == ("bad", "half")


def test_duplicates_are_collapsed_to_their_mean_and_counted() -> None:
    rows = [
        ("a", 0, 10.0, 20.0, 50.0, 5.0),
        ("a", 0, 14.0, NAN, 60.0, 7.0),
        ("a", 0, -5.0, 30.0, 70.0, 9.0),  # invalid raw: dropped before collapsing
        ("a", 1, 11.0, 21.0, 50.0, 5.0),
    ]
    cleaned, report = clean(_data(rows))
    assert report.rows_dropped["duplicate"] == 1
    assert report.rows_dropped["raw:negative"] == 1
    first = cleaned.frame.iloc[0]
    assert (first["raw"], first["reference"], first["rh"], first["temp_c"]) == (
        12.0,
        20.0,
        55.0,
        6.0,
    )
    assert len(cleaned.frame) == 2
    assert report.rows_read == report.rows_kept + sum(report.rows_dropped.values())
    assert str(cleaned.frame["timestamp"].dtype) == "datetime64[ns, UTC]"


def test_loader_counts_are_carried_into_the_report() -> None:
    rows = [("a", m, 10.0, 10.0, 50.0, 5.0) for m in range(4)]
    counts = LoadCounts(rows_read=7, rows_dropped={"raw:warmup": 3}, values_nulled={"rh:warmup": 2})
    cleaned, report = clean(_data(rows, load_counts=counts))
    assert report.rows_read == 7
    assert report.rows_kept == 4
    assert dict(report.rows_dropped) == {"raw:warmup": 3}
    assert report.rows_read == report.rows_kept + sum(report.rows_dropped.values())
    assert dict(report.values_nulled) == {"rh:warmup": 2}
    assert cleaned.load_counts is counts


def test_rules_are_strict_config() -> None:
    with pytest.raises(ValidationError):
        CleaningRules(max_removed_fraction=1.5)
    with pytest.raises(ValidationError):
        CleaningRules.model_validate({"sentinels": [1.0]})
    assert np.isin(-9999.0, CleaningRules().sentinel_values)


def test_frozen_runs_are_dropped_whole_per_sensor_in_time_order() -> None:
    """A dead unit's repeated value (Antwerp_4043AE read 0.0 for 814 hours) is no reading; the
    same values split across sensors, or shuffled rows, are judged per sensor in time order."""
    frozen = [("a", m, 0.0, 9.0 + m % 3, 50.0, 5.0) for m in range(10, 14)]
    rows = [
        ("a", 0, 3.0, 4.0, 50.0, 5.0),
        *reversed(frozen),  # rows out of time order
        ("b", 11, 0.0, 8.0, 50.0, 5.0),  # another sensor's zeros interleaved
        ("b", 12, 0.0, 8.0, 50.0, 5.0),
        ("a", 20, 5.0, 6.0, 50.0, 5.0),
        ("a", 21, 5.0, 6.0, 50.0, 5.0),
    ]
    cleaned, report = clean(_data(rows), CleaningRules(stuck_periods=4, max_removed_fraction=1.0))
    assert report.rows_dropped == {"raw:stuck": 4}
    frame = cleaned.frame
    assert sorted(frame.loc[frame["sensor_id"] == "a", "raw"].tolist()) == [3.0, 5.0, 5.0]
    assert frame.loc[frame["sensor_id"] == "b", "raw"].tolist() == [0.0, 0.0]
    assert report.removed_fraction["a"] == pytest.approx(4 / 7)
    kept, none = clean(_data(rows), CleaningRules(stuck_periods=None, max_removed_fraction=1.0))
    assert none.rows_dropped == {} and len(kept.frame) == len(rows)


def test_invalid_readings_inside_a_frozen_run_do_not_hide_it() -> None:
    rows = [("a", m, 0.0, 9.0, 50.0, 5.0) for m in range(0, 10, 2)]
    rows.insert(2, ("a", 3, NAN, 9.0, 50.0, 5.0))  # a missing raw: dropped for itself
    _, report = clean(_data(rows), CleaningRules(stuck_periods=5, max_removed_fraction=1.0))
    assert report.rows_dropped == {"raw:missing": 1, "raw:stuck": 5}


def test_duplicate_rows_count_once_toward_a_frozen_run() -> None:
    """Fifteen periods of 0.0, each reported twice, are fifteen periods: not frozen at 30."""
    rows = [("a", m, 0.0, 9.0, 50.0, 5.0) for m in range(15) for _ in range(2)]
    rows.append(("a", 20, 4.0, 9.0, 50.0, 5.0))
    cleaned, report = clean(_data(rows), CleaningRules(max_removed_fraction=1.0))
    assert "raw:stuck" not in report.rows_dropped
    assert report.rows_dropped == {"duplicate": 15}
    assert len(cleaned.frame) == 16


@pytest.mark.parametrize("value", [12.3, 0.1])
def test_a_frozen_decimal_with_three_duplicates_is_one_run(value: float) -> None:
    """Three duplicates of 12.3 average to 12.300000000000002: equal to 4 decimals (the
    contract's run_key), so the 40-timestamp frozen run stays one run, not 20 | 1 | 19."""
    rows = [("a", m, value, 9.0, 50.0, 5.0) for m in range(40) for _ in range(3 if m == 20 else 1)]
    rows.append(("a", 45, 4.0, 9.0, 50.0, 5.0))
    _, report = clean(_data(rows), CleaningRules(stuck_periods=30, max_removed_fraction=1.0))
    assert report.rows_dropped == {"raw:stuck": 42}  # every row of the run, duplicates too
