"""Calibrated payloads: compact JSON with the documented fields (docs/mqtt.md)."""

from __future__ import annotations

import json

from gateway.calibrated import CalibratedReading
from gateway.publish import payloads


def test_a_calibrated_message_is_the_documented_json() -> None:
    reading = CalibratedReading(
        "s1", "pm10", 1_700_000_000.0 - 20, 60, 12.25, 10.5, "ug/m3", "tesla", 3, ()
    )
    message = payloads.reading_message(reading)
    assert b": " not in message and b", " not in message  # compact
    document = json.loads(message)
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
