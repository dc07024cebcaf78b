"""Calibrated payloads: compact JSON with the documented fields (docs/mqtt.md)."""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tesla_gateway.contract.calibrated import CalibratedReading, Interval, Quality
from tesla_gateway.publish import payloads


def test_a_calibrated_message_is_the_documented_json() -> None:
    reading = CalibratedReading(
        "s1", "pm10", 1_700_000_000.0 - 20, 60, 12.31, 10.5, "ug/m3", "tesla", 3, ()
    )
    message = payloads.reading_message(reading)
    assert b": " not in message and b", " not in message  # compact
    document = json.loads(message)
    assert document == {
        "ts": "2023-11-14T22:14:00Z",
        "period_start": "2023-11-14T22:13:00Z",
        "period_s": 60,
        "raw": 12.3,
        "calibrated": 10.5,
        "unit": "µg/m³",
        "model": "tesla",
        "model_version": 3,
        "quality": [],
    }


def test_concentrations_are_published_to_a_tenth() -> None:
    """Before: ``"calibrated":33.393028259277344``, a precision no sensor or model has."""
    reading = CalibratedReading(
        "s1", "pm10", 60.0, 60, 12.3456, 33.393028259277344, "ug/m3", "m", 1, (Quality.OK,),
        Interval(30.04999, 36.7123, 0.9),
    )  # fmt: skip
    for message in (payloads.reading_message(reading), _general(reading)):
        text = message.decode()
        assert '"raw":12.3,"calibrated":33.4,' in text
        assert '"interval":{"low":30.0,"high":36.7,"level":0.9}' in text
    batch = json.loads(payloads.batch_payloads([reading], 10)[0][1])
    assert (batch[0]["raw"], batch[0]["calibrated"]) == (12.3, 33.4)
    barely_negative = CalibratedReading(
        "s1", "pm10", 60.0, 60, -0.04, None, "ug/m3", None, None, ()
    )
    assert b'"raw":0.0,' in payloads.reading_message(barely_negative)  # never "-0.0"


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, width=64))
def test_every_published_concentration_has_at_most_one_decimal(value: float) -> None:
    reading = CalibratedReading("s1", "pm10", 60.0, 60, value, value, "ug/m3", "m", 1, ())
    document = json.loads(payloads.reading_message(reading))
    for published in (document["raw"], document["calibrated"]):
        assert published == round(value, 1)
        if abs(value) < 1e15:  # beyond, a float has no tenths left to write
            assert len(repr(published).split(".")[1]) == 1


# -- the template encoder is the general encoder, byte for byte ---------------------------------

_finite_or_not = st.floats(allow_nan=True, allow_infinity=True, width=64)
_text = st.text(st.characters(codec="utf-8"), max_size=12)  # quotes, controls, non-ASCII


@st.composite
def _readings(draw: st.DrawFn) -> CalibratedReading:
    period_seconds = draw(st.sampled_from([1, 60, 600, 3600]))
    start = float(draw(st.integers(0, 4_000_000_000 // period_seconds)) * period_seconds)
    if draw(st.booleans()):
        start += draw(st.floats(0, 1, exclude_max=True))  # a fraction survives in the ISO time
    interval = None
    if draw(st.booleans()):
        interval = Interval(draw(_finite_or_not), draw(_finite_or_not), draw(_finite_or_not))
    history = window_length = None
    if draw(st.booleans()):  # a window was read: its history and N (a young sensor's < N)
        window_length = draw(st.integers(1, 10_000))
        history = draw(st.integers(1, window_length))
    return CalibratedReading(
        sensor_id=draw(st.from_regex(r"[A-Za-z0-9_.-]{1,16}", fullmatch=True)),
        feature=draw(st.sampled_from(["pm10", "pm2_5"])),
        period_start=start,
        period_seconds=period_seconds,
        raw=draw(_finite_or_not),
        calibrated=draw(st.none() | _finite_or_not),
        unit=draw(st.sampled_from(["ug/m3", "µg/m3", "µg/m³"]) | _text),
        model_name=draw(st.none() | _text),
        model_version=draw(st.none() | st.integers(0, 2**40)),
        quality=tuple(draw(st.lists(st.sampled_from(list(Quality)), max_size=3))),
        interval=interval,
        history_periods=history,
        window_length=window_length,
    )


def _general(reading: CalibratedReading) -> bytes:
    return payloads._dumps(payloads.reading_payload(reading))


@settings(max_examples=600, deadline=None)
@given(_readings())
def test_the_template_writes_exactly_what_the_general_encoder_writes(
    reading: CalibratedReading,
) -> None:
    assert payloads.reading_message(reading) == _general(reading)


@settings(max_examples=200, deadline=None)
@given(st.lists(_readings(), min_size=1, max_size=8), st.integers(1, 5))
def test_batches_are_the_documents_with_their_sensor_as_json_arrays(
    readings: list[CalibratedReading], max_readings: int
) -> None:
    expected: dict[str, list[dict[str, object]]] = {}
    for reading in readings:
        expected.setdefault(reading.feature, []).append(
            {"sensor": reading.sensor_id, **payloads.reading_payload(reading)}
        )
    written = payloads.batch_payloads(readings, max_readings)
    assert [(feature, payload) for feature, payload in written] == [
        (feature, payloads._dumps(documents[start : start + max_readings]))
        for feature, documents in expected.items()
        for start in range(0, len(documents), max_readings)
    ]


def test_values_the_template_does_not_handle_take_the_general_path() -> None:
    """A numpy float (its repr is not JSON), NaN and infinity in an interval: still the general
    encoder's bytes."""
    numpy_raw = CalibratedReading(
        "s1", "pm10", 60.0, 60, np.float64(1.5), 2.5, "ug/m3", "m", 1, (Quality.OK,)
    )
    odd_interval = CalibratedReading(
        "s1", "pm10", 60.0, 60, 1.5, 2.5, "ug/m3", "m", 1, (Quality.OK,),
        Interval(math.nan, math.inf, 0.9),
    )  # fmt: skip
    for reading in (numpy_raw, odd_interval):
        assert payloads._reading_text(reading) is None
        assert payloads.reading_message(reading) == _general(reading)
