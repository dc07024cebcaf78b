"""The hot path of :func:`tesla_gateway.sources.payloads.decode_payload`, in C where msgspec exists.

What nodes send almost always is plainly valid: known keys, JSON numbers in range, a plausible
time. msgspec decodes and range-checks such a payload into typed structs in one C pass, and only
the checks that need the gateway's clock or config run in Python. Anything else (a reject, an
ISO time that does not parse, two aliases of one field, a batch with a bad element) returns None
and the caller runs the full rules, so reasons and messages stay exactly those of
:func:`tesla_gateway.contract.readings.validate_reading` (a Hypothesis test compares both paths).

msgspec has wheels for x86_64 and aarch64 but none on PyPI for 32-bit ARM: without it this
module reports itself unavailable and the full path serves every payload.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Annotated, Any

from tesla_gateway.contract.readings import FIELD_LIMITS, SENSOR_ID_PATTERN, SEQ_MAX, Reading
from tesla_gateway.sources.payload_rules import MAX_ISO_LENGTH, PayloadRules, epoch_seconds

__all__ = ["FAST_DECODE_AVAILABLE", "decode_plain_payload"]

try:
    import msgspec
except ImportError:  # 32-bit Raspberry Pi OS: no wheel; the full path serves every payload
    msgspec = None  # type: ignore[assignment]


def _build_decoder() -> Any:
    """The msgspec decoder of one element or a batch, its limits taken from FIELD_LIMITS."""
    assert msgspec is not None
    unset_type = msgspec.UnsetType
    unset = msgspec.UNSET

    def value(field: str) -> Any:
        low, high = FIELD_LIMITS[field]
        return Annotated[float, msgspec.Meta(ge=low, le=high)] | None | unset_type

    time_type: Any = (
        float | Annotated[str, msgspec.Meta(max_length=MAX_ISO_LENGTH)] | None | unset_type
    )
    namespace: dict[str, Any] = {
        "__annotations__": {
            "sensor": Annotated[str, msgspec.Meta(max_length=64)] | None | unset_type,
            "ts": time_type,
            "timestamp": time_type,
            "time": time_type,
            "seq": Annotated[int, msgspec.Meta(ge=0, le=SEQ_MAX)] | None | unset_type,
            "pm1": value("pm1"),
            "pm2_5": value("pm2_5"),
            "pm25": value("pm2_5"),
            "pm10": value("pm10"),
            "rh": value("rh"),
            "humidity": value("rh"),
            "temp_c": value("temp_c"),
            "temperature": value("temp_c"),
        }
    }
    for name in namespace["__annotations__"]:
        namespace[name] = unset
    element = type(
        "PlainReading",
        (msgspec.Struct,),
        namespace,
        forbid_unknown_fields=True,
    )
    return msgspec.json.Decoder(element | list[element]), element  # type: ignore[valid-type]


if msgspec is not None:
    _DECODER, _ELEMENT = _build_decoder()
    _UNSET: Any = msgspec.UNSET
    _FAILED: tuple[type[Exception], ...] = (msgspec.DecodeError, msgspec.ValidationError)
    FAST_DECODE_AVAILABLE = True
else:  # pragma: no cover - exercised on platforms without msgspec
    _DECODER = _ELEMENT = _UNSET = None
    _FAILED = ()
    FAST_DECODE_AVAILABLE = False

_sensor_id_ok = SENSOR_ID_PATTERN.fullmatch
_isfinite = math.isfinite


def decode_plain_payload(
    payload: bytes,
    *,
    topic_sensor_id: str | None,
    received_at: float,
    source: str,
    rules: PayloadRules,
) -> tuple[Reading, ...] | None:
    """The readings of a plainly valid payload, or None when the full rules must decide."""
    if _DECODER is None or len(payload) > rules.max_payload_bytes:
        return None
    try:
        document = _DECODER.decode(payload)
    except _FAILED:
        return None
    if type(document) is not list:  # one reading per message: the usual case
        reading = _plain_reading(document, topic_sensor_id, received_at, source, rules)
        return None if reading is None else (reading,)
    if not document or len(document) > rules.max_batch:
        return None
    readings: list[Reading] = []
    for element in document:
        reading = _plain_reading(element, topic_sensor_id, received_at, source, rules)
        if reading is None:
            return None
        readings.append(reading)
    return tuple(readings)


def _plain_reading(
    element: Any,
    topic_sensor_id: str | None,
    received_at: float,
    source: str,
    rules: PayloadRules,
) -> Reading | None:
    sensor_id = _sensor_id(element.sensor, topic_sensor_id, rules)
    if sensor_id is None:
        return None
    when = _timestamp(element, received_at, rules)
    if when is None:
        return None
    values = _values(element)
    if values is None:
        return None
    seq = element.seq
    return Reading(
        sensor_id,
        when,
        MappingProxyType(values),
        source,
        None if seq is _UNSET else seq,
        (),  # nothing dropped: a covariate out of range fails the decode (the full rules drop it)
        when == received_at,  # stamped at the gateway: no time of its own (as validate_reading)
    )


def _sensor_id(sensor: Any, topic_sensor_id: str | None, rules: PayloadRules) -> str | None:
    if sensor is _UNSET or sensor is None:
        sensor_id = topic_sensor_id
    elif topic_sensor_id is not None:
        sensor_id = topic_sensor_id if sensor == topic_sensor_id else None
    else:
        sensor_id = sensor if _sensor_id_ok(sensor) else None
    allowed = rules.allowed_sensors
    if sensor_id is None or (allowed is not None and sensor_id not in allowed):
        return None
    return sensor_id


def _timestamp(element: Any, received_at: float, rules: PayloadRules) -> float | None:
    """Unix seconds of a numeric or absent time inside the limits; None for anything else."""
    unset = _UNSET
    ts, timestamp, at = element.ts, element.timestamp, element.time
    if timestamp is unset and at is unset:
        when = ts
    elif ts is unset and (timestamp is unset or at is unset):
        when = at if timestamp is unset else timestamp
    else:
        return None  # two spellings of the time: the full rules explain
    if when is unset or when is None:
        return received_at
    if type(when) is not float or not _isfinite(when):
        return None  # an ISO-8601 string: the full path parses and explains it
    when = epoch_seconds(when)
    max_age_s = rules.max_age_s
    if when > received_at + rules.max_future_s or (
        max_age_s is not None and when < received_at - max_age_s
    ):
        return None
    return when


def _values(element: Any) -> dict[str, float] | None:
    """The measured channels, or None when there are none or one is spelt twice.

    Spelt out channel by channel: no tuple is built per reading.
    """
    unset = _UNSET
    pm2_5, pm25 = element.pm2_5, element.pm25
    rh, humidity = element.rh, element.humidity
    temp_c, temperature = element.temp_c, element.temperature
    if pm2_5 is unset:
        pm2_5 = pm25
    elif pm25 is not unset:
        return None  # one channel spelt twice: the full rules explain
    if rh is unset:
        rh = humidity
    elif humidity is not unset:
        return None
    if temp_c is unset:
        temp_c = temperature
    elif temperature is not unset:
        return None
    # In the order ReadingPayload.values() lists the channels; None is a JSON null (absent).
    values: dict[str, float] = {}
    pm1, pm10 = element.pm1, element.pm10
    if pm1 is not unset and pm1 is not None:
        values["pm1"] = pm1
    if pm2_5 is not unset and pm2_5 is not None:
        values["pm2_5"] = pm2_5
    if pm10 is not unset and pm10 is not None:
        values["pm10"] = pm10
    if rh is not unset and rh is not None:
        values["rh"] = rh
    if temp_c is not unset and temp_c is not None:
        values["temp_c"] = temp_c
    return values or None
