"""Calibrated payloads: the C encoder (orjson) and the standard-library fallback write the same
compact JSON, so a subscriber cannot tell which platform a gateway runs on (the one difference
is how an exponent is spelt: 1e-05 or 1e-5, the same number to every JSON parser)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.calibrated import CalibratedReading, Quality
from gateway.publish import payloads

readings = st.builds(
    CalibratedReading,
    sensor_id=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True),
    feature=st.sampled_from(["pm10", "pm2_5"]),
    period_start=st.integers(0, 4_000_000_000).map(lambda t: float(t - t % 60)),
    period_seconds=st.sampled_from([60, 600, 3600]),
    raw=st.floats(allow_nan=True, allow_infinity=True, width=64),
    calibrated=st.none() | st.floats(allow_nan=True, allow_infinity=True),
    unit=st.sampled_from(["ug/m3", "µg/m³", "µg/m3"]),
    model_name=st.none() | st.text(max_size=12),
    model_version=st.none() | st.integers(0, 2**31),
    quality=st.lists(st.sampled_from(list(Quality)), max_size=3).map(tuple),
)


@pytest.mark.skipif(payloads._dumps is payloads._stdlib_dumps, reason="orjson not installed")
@settings(max_examples=300, deadline=None)
@given(st.lists(readings, min_size=1, max_size=5))
def test_both_encoders_write_the_same_bytes(batch: list[CalibratedReading]) -> None:
    documents = [payloads.reading_payload(reading) for reading in batch]
    for document in [*documents, documents]:
        fast, fallback = payloads._dumps(document), payloads._stdlib_dumps(document)
        assert json.loads(fast) == json.loads(fallback)


def test_a_calibrated_message_is_the_documented_json() -> None:
    reading = CalibratedReading(
        "s1", "pm10", 1_700_000_000.0 - 20, 60, 12.25, 10.5, "ug/m3", "tesla", 3, ()
    )
    document = json.loads(payloads.reading_message(reading))
    assert document == {
        "ts": "2023-11-14T22:14:00Z",
        "period_start": "2023-11-14T22:13:00Z",
        "period_s": 60,
        "raw": 12.25,
        "calibrated": 10.5,
        "unit": "µg/m³",
        "model": "tesla",
        "model_version": 3,
        "quality": [],
    }
