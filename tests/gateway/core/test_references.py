"""Reference readings on the model's grid, and their pairing with co-located sensor periods."""

from __future__ import annotations

import random
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tesla_gateway.contract.calibrated import CalibratedReading, Quality
from tesla_gateway.contract.readings import Reading
from tesla_gateway.monitor.references import ReferenceConfig, ReferenceGrid, ReferencePairing
from tesla_gateway.sources.mqtt_source import MqttSourceConfig

P = 60


def reference_config(**overrides: object) -> ReferenceConfig:
    fields: dict[str, object] = {
        "name": "ref",
        "feature": "pm10",
        "colocated_with": ["s1", "s2"],
        "mqtt": MqttSourceConfig(topics=["reference/ref"]),
    }
    fields.update(overrides)
    return ReferenceConfig.model_validate(fields)


def reading(sensor: str, timestamp: float, **values: float) -> Reading:
    return Reading(sensor, timestamp, MappingProxyType(values), source="test")


def sensor_period(
    sensor: str, period: int, raw: float, calibrated: float | None
) -> CalibratedReading:
    return CalibratedReading(
        sensor_id=sensor,
        feature="pm10",
        period_start=float(period * P),
        period_seconds=P,
        raw=raw,
        calibrated=calibrated,
        unit="ug/m3",
        model_name="m",
        model_version=2 if calibrated is not None else None,
        quality=(Quality.OK,) if calibrated is not None else (Quality.WARMING_UP,),
    )


def test_config_needs_explicit_topics_and_valid_ids() -> None:
    with pytest.raises(ValidationError, match=r"mqtt\.topics must be given"):
        ReferenceConfig.model_validate(
            {"name": "ref", "feature": "pm10", "colocated_with": ["s1"], "mqtt": {}}
        )
    with pytest.raises(ValidationError, match="must match"):
        reference_config(colocated_with=["bad id"])
    with pytest.raises(ValidationError, match="unique"):
        reference_config(colocated_with=["s1", "s1"])


def test_grid_averages_closes_in_event_time_and_by_wall_clock() -> None:
    grid = ReferenceGrid(P, retain_periods=10)
    assert grid.add(10 * P + 1, 10.0, arrival=0.0)  # the periods before it are over
    assert grid.closed_through == 9
    assert not grid.add(10 * P + 30, 20.0, arrival=0.0)
    assert not grid.add(10 * P + 30, 20.0, arrival=0.0)  # a redelivered duplicate
    assert grid.add(12 * P + 5, 40.0, arrival=0.0)  # closes 10 and the empty 11
    assert grid.closed_through == 11
    assert grid.mean(10) == 15.0 and grid.mean(11) is None
    assert not grid.add(11 * P + 5, 99.0, arrival=0.0)  # late: its period is closed
    assert grid.late == 1 and grid.duplicates == 1
    assert not grid.close_idle(now=13 * P + 9, grace_s=10.0)
    assert grid.close_idle(now=13 * P + 10, grace_s=10.0)
    assert grid.closed_through == 12 and grid.mean(12) == 40.0


def test_pairs_form_whichever_side_closes_first() -> None:
    pairing = ReferencePairing(reference_config(), max_pending_periods=100)
    # Sensor first: waits for the reference period to close.
    assert pairing.observe_sensor(sensor_period("s1", 5, 30.0, 21.0)) == []
    pairing.observe_reference(reading("ref", 5 * P + 10, pm10=20.0), P, now=0.0)
    pairs = pairing.observe_reference(reading("ref", 6 * P + 10, pm10=22.0), P, now=0.0)
    assert [(p.row.sensor_id, p.row.raw, p.row.reference, p.row.calibrated) for p in pairs] == [
        ("s1", 30.0, 20.0, 21.0)
    ]
    # Reference first: period 6 closes by the wall clock, then the sensor period pairs at once.
    assert pairing.close_idle(now=7 * P + 61, grace_s=60.0) == []
    pairs = pairing.observe_sensor(sensor_period("s2", 6, 31.0, None))
    assert [
        (p.row.sensor_id, p.row.reference, p.row.calibrated, p.row.model_version) for p in pairs
    ] == [("s2", 22.0, None, None)]
    # A period the reference missed stays unpaired.
    assert pairing.observe_sensor(sensor_period("s1", 7, 30.0, 21.0)) == []
    pairing.observe_reference(reading("ref", 9 * P, pm10=25.0), P, now=0.0)
    assert pairing.unpaired == 1 and pairing.paired == 2


def test_covariates_are_averaged_per_period_of_the_pair() -> None:
    pairing = ReferencePairing(reference_config(), max_pending_periods=100)
    pairing.observe_covariates(reading("s1", 3 * P + 1, pm10=30.0, rh=50.0, temp_c=20.0), P)
    pairing.observe_covariates(reading("s1", 3 * P + 31, pm10=30.0, rh=60.0), P)
    pairing.observe_covariates(reading("s1", 4 * P + 1, pm10=30.0, rh=90.0, temp_c=30.0), P)
    pairing.observe_reference(reading("ref", 3 * P, pm10=20.0), P, now=0.0)
    pairing.observe_reference(reading("ref", 5 * P, pm10=20.0), P, now=0.0)
    (pair,) = pairing.observe_sensor(sensor_period("s1", 3, 30.0, 21.0))
    assert pair.row.rh == 55.0 and pair.row.temp_c == 20.0
    (other,) = pairing.observe_sensor(sensor_period("s2", 3, 30.0, 21.0))
    assert other.row.rh is None and other.row.temp_c is None


def test_pending_periods_are_bounded() -> None:
    pairing = ReferencePairing(reference_config(), max_pending_periods=3)
    for period in range(5):
        pairing.observe_sensor(sensor_period("s1", period, 30.0, 21.0))
    assert pairing.expired == 2
    pairing.observe_reference(reading("ref", 0, pm10=20.0), P, now=0.0)
    pairs = pairing.close_idle(now=1e9, grace_s=0.0)
    assert pairs == []  # only period 0 had a reference, and it had expired
    assert pairing.unpaired == 0  # 2-4 wait for later reference periods
    pairing.observe_reference(reading("ref", 3 * P, pm10=20.0), P, now=0.0)
    assert pairing.unpaired == 1  # period 2 passed without a reference reading


def test_a_new_model_period_resets_the_grid() -> None:
    pairing = ReferencePairing(reference_config(), max_pending_periods=10)
    pairing.observe_sensor(sensor_period("s1", 1, 30.0, 21.0))
    pairing.observe_reference(reading("ref", 100.0, pm10=20.0), 3600, now=0.0)
    assert pairing.resets == 1 and pairing.grid is not None
    assert pairing.grid.period_seconds == 3600


@settings(max_examples=200, deadline=None)
@given(
    sensor_periods=st.sets(st.integers(0, 30), max_size=25),
    reference_periods=st.dictionaries(
        st.integers(0, 30), st.lists(st.floats(0, 500), min_size=1, max_size=3), max_size=25
    ),
    order=st.randoms(use_true_random=False),
)
def test_every_period_with_both_sides_is_paired_once_with_the_reference_mean(
    sensor_periods: set[int],
    reference_periods: dict[int, list[float]],
    order: random.Random,
) -> None:
    """Whatever the interleaving of the two (each in its own order), pairs = the intersection."""
    pairing = ReferencePairing(reference_config(), max_pending_periods=1000)
    sensor_events = [("sensor", p, 0) for p in sorted(sensor_periods)]
    reference_events = [
        ("reference", p, i)
        for p in sorted(reference_periods)
        for i in range(len(reference_periods[p]))
    ]
    pairs = []
    while sensor_events or reference_events:
        take_sensor = sensor_events and (not reference_events or order.random() < 0.5)
        kind, period, index = (sensor_events if take_sensor else reference_events).pop(0)
        if kind == "sensor":
            pairs += pairing.observe_sensor(sensor_period("s1", period, float(period), 1.0))
        else:
            value = reference_periods[period][index]
            pairs += pairing.observe_reference(
                reading("ref", period * P + index, pm10=value), P, now=0.0
            )
    pairs += pairing.close_idle(now=1e12, grace_s=0.0)
    got = {round(p.row.period_start / P): p.row.reference for p in pairs}
    assert len(got) == len(pairs)
    assert set(got) == sensor_periods & set(reference_periods)
    for period, reference in got.items():
        values = reference_periods[period]
        assert reference == pytest.approx(sum(values) / len(values))
