"""The JSON reading payloads sensors publish over MQTT (documented in docs/mqtt.md).

One object per reading, or a JSON array of them (a batch). The schema is strict: numbers must be
JSON numbers, unknown keys are rejected, and everything then goes through
:func:`tesla_gateway.contract.readings.validate_reading`, the one rule set every source shares.
Nothing from the
wire is used as a path or a format string; sizes are bounded before parsing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from tesla_gateway.contract.readings import (
    COVARIATES,
    SEQ_MAX,
    Reading,
    ReadingRejectedError,
    RejectReason,
    covariate_fault,
    validate_reading,
)
from tesla_gateway.sources.payload_rules import MAX_ISO_LENGTH, PayloadRules, epoch_seconds
from tesla_gateway.sources.payloads_fast import decode_plain_payload

__all__ = [
    "DecodedPayload",
    "ReadingPayload",
    "decode_payload",
    "decode_payload_fully",
    "parse_timestamp",
]


_Number = Annotated[float, Field(strict=True)]
_Fields = tuple[str | None, float | str | None, dict[str, float], int | None]


class ReadingPayload(BaseModel):
    """One reading as JSON. Values are in µg/m³ (PM), % (rh) and °C (temp_c)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sensor: str | None = Field(
        default=None,
        max_length=64,
        description="Sensor id; optional when the topic carries it (must then agree).",
    )
    ts: _Number | Annotated[str, Field(max_length=MAX_ISO_LENGTH)] | None = Field(
        default=None,
        validation_alias=AliasChoices("ts", "timestamp", "time"),
        description=(
            "Measurement time: Unix seconds, Unix milliseconds, or ISO-8601 with a UTC offset. "
            "Absent: the gateway's receive time."
        ),
    )
    seq: Annotated[int, Field(strict=True, ge=0, le=SEQ_MAX)] | None = Field(
        default=None,
        description=(
            "The node's sequence number: +1 per reading, wrapping after 2**32-1; lets the "
            "gateway count readings that never arrived."
        ),
    )
    pm1: _Number | None = Field(default=None, description="PM1 in µg/m³.")
    pm2_5: _Number | None = Field(
        default=None, validation_alias=AliasChoices("pm2_5", "pm25"), description="PM2.5, µg/m³."
    )
    pm10: _Number | None = Field(default=None, description="PM10 in µg/m³.")
    rh: _Number | None = Field(
        default=None, validation_alias=AliasChoices("rh", "humidity"), description="RH in %."
    )
    temp_c: _Number | None = Field(
        default=None,
        validation_alias=AliasChoices("temp_c", "temperature"),
        description="Air temperature in °C.",
    )

    def values(self) -> dict[str, float]:
        measured = {
            "pm1": self.pm1,
            "pm2_5": self.pm2_5,
            "pm10": self.pm10,
            "rh": self.rh,
            "temp_c": self.temp_c,
        }
        return {name: value for name, value in measured.items() if value is not None}


@dataclass(frozen=True, slots=True)
class DecodedPayload:
    """Readings accepted from one payload, and the rejects among a batch's elements (with the
    covariates dropped from accepted readings: each reading's ``dropped``, listed here too)."""

    readings: tuple[Reading, ...]
    rejects: tuple[ReadingRejectedError, ...]


def parse_timestamp(value: float | str | None, *, received_at: float) -> float:
    """Unix seconds from any documented form; raise :class:`ReadingRejectedError` otherwise."""
    if value is None:
        return received_at
    if isinstance(value, float | int):
        return epoch_seconds(float(value))
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ReadingRejectedError(
            RejectReason.SCHEMA, f"timestamp {value!r} is not ISO-8601"
        ) from exc
    if parsed.tzinfo is None:
        raise ReadingRejectedError(
            RejectReason.SCHEMA, f"timestamp {value!r} has no UTC offset; append 'Z' or '+00:00'"
        )
    try:
        return parsed.timestamp()
    except (OverflowError, OSError, ValueError) as exc:
        raise ReadingRejectedError(
            RejectReason.SCHEMA, f"timestamp {value!r} is out of range"
        ) from exc


def decode_payload(
    payload: bytes,
    *,
    topic_sensor_id: str | None,
    received_at: float,
    source: str,
    rules: PayloadRules,
) -> DecodedPayload:
    """Parse one MQTT payload into readings.

    Problems with the payload as a whole (too large, not UTF-8, not JSON, wrong shape) raise
    :class:`ReadingRejectedError`; in a batch, each bad element is rejected on its own and the
    good ones are kept. Plainly valid payloads take the C path of :mod:`payloads_fast`.
    """
    plain = decode_plain_payload(
        payload,
        topic_sensor_id=topic_sensor_id,
        received_at=received_at,
        source=source,
        rules=rules,
    )
    if plain is not None:
        return DecodedPayload(readings=plain, rejects=())
    return decode_payload_fully(
        payload,
        topic_sensor_id=topic_sensor_id,
        received_at=received_at,
        source=source,
        rules=rules,
    )


def decode_payload_fully(
    payload: bytes,
    *,
    topic_sensor_id: str | None,
    received_at: float,
    source: str,
    rules: PayloadRules,
) -> DecodedPayload:
    """:func:`decode_payload` without the C path: every rule, every reject explained."""
    if len(payload) > rules.max_payload_bytes:
        raise ReadingRejectedError(
            RejectReason.TOO_LARGE,
            f"payload of {len(payload)} bytes exceeds max_payload_bytes={rules.max_payload_bytes}",
        )
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReadingRejectedError(RejectReason.BAD_ENCODING, "payload is not UTF-8") from exc
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ReadingRejectedError(RejectReason.BAD_JSON, f"payload is not JSON: {exc}") from exc
    elements: Sequence[Any]
    if isinstance(document, dict):
        elements = [document]
    elif isinstance(document, list):
        if not document:
            raise ReadingRejectedError(RejectReason.NO_VALUES, "batch is empty")
        if len(document) > rules.max_batch:
            raise ReadingRejectedError(
                RejectReason.TOO_LARGE,
                f"batch of {len(document)} readings exceeds max_batch={rules.max_batch}",
            )
        elements = document
    else:
        raise ReadingRejectedError(
            RejectReason.SCHEMA,
            f"payload must be an object or an array, not {type(document).__name__}",
        )
    readings: list[Reading] = []
    rejects: list[ReadingRejectedError] = []
    for element in elements:
        try:
            reading = _decode_element(
                element,
                topic_sensor_id=topic_sensor_id,
                received_at=received_at,
                source=source,
                rules=rules,
            )
        except ReadingRejectedError as exc:
            rejects.append(exc)
            continue
        readings.append(reading)
        rejects.extend(reading.dropped)
    return DecodedPayload(readings=tuple(readings), rejects=tuple(rejects))


def _decode_element(
    element: object,
    *,
    topic_sensor_id: str | None,
    received_at: float,
    source: str,
    rules: PayloadRules,
) -> Reading:
    if not isinstance(element, dict):
        raise ReadingRejectedError(
            RejectReason.SCHEMA, f"a reading must be a JSON object, not {type(element).__name__}"
        )
    fields = _plain_fields(element)
    dropped: list[ReadingRejectedError] = []
    if fields is not None:
        sensor, ts, values, seq = fields
    else:
        parsed = _validated(element, dropped)
        sensor, ts, values, seq = parsed.sensor, parsed.ts, parsed.values(), parsed.seq
    sensor_id = _sensor_id(sensor, topic_sensor_id)
    if rules.allowed_sensors is not None and sensor_id not in rules.allowed_sensors:
        raise ReadingRejectedError(
            RejectReason.UNKNOWN_SENSOR,
            f"sensor {sensor_id[:64]!r} is not in the configured allowed_sensors",
        )
    timestamp = parse_timestamp(ts, received_at=received_at)
    return validate_reading(
        sensor_id,
        timestamp,
        values,
        now=received_at,
        source=source,
        max_future_s=rules.max_future_s,
        max_age_s=rules.max_age_s,
        seq=seq,
        dropped=dropped,
    )


# Every key ReadingPayload accepts (aliases included) -> its field.
_FIELD_OF_KEY = {
    "sensor": "sensor",
    "ts": "ts",
    "timestamp": "ts",
    "time": "ts",
    "seq": "seq",
    "pm1": "pm1",
    "pm2_5": "pm2_5",
    "pm25": "pm2_5",
    "pm10": "pm10",
    "rh": "rh",
    "humidity": "rh",
    "temp_c": "temp_c",
    "temperature": "temp_c",
}
_VALUE_FIELDS = ("pm1", "pm2_5", "pm10", "rh", "temp_c")  # ReadingPayload.values() order
_COVARIATE_KEYS = frozenset(key for key, name in _FIELD_OF_KEY.items() if name in COVARIATES)


def _plain_fields(element: dict[str, Any]) -> _Fields | None:
    """The fields of an element that is plainly valid for :class:`ReadingPayload`, or None.

    The hot path: what a sensor sends (known keys, one alias per field, JSON numbers) is read
    here without pydantic, at a fraction of the cost. Anything else returns None and goes
    through :class:`ReadingPayload`, so the accepted readings and the reject reasons and
    messages are exactly those of the model (tests compare both paths).
    """
    sensor: str | None = None
    ts: float | str | None = None
    seq = element.get("seq")
    if seq is not None and (type(seq) is not int or not 0 <= seq <= SEQ_MAX):
        return None  # exactly an int: bool is one and must be refused
    found: dict[str, float] = {}
    seen: set[str] = set()
    for key, value in element.items():
        name = _FIELD_OF_KEY.get(key)
        if name is None or name in seen:
            return None  # unknown key, or two aliases of one field: the model's error
        seen.add(name)
        kind = type(value)
        if value is None or name == "seq":  # seq: checked above
            continue
        if name == "sensor":
            if kind is not str or len(value) > 64:
                return None
            sensor = value
        elif kind is float or kind is int:  # exactly: bool is an int and must be refused
            try:
                number = float(value)
            except OverflowError:
                return None
            if name == "ts":
                ts = number
            else:
                found[name] = number
        elif name == "ts" and kind is str and len(value) <= MAX_ISO_LENGTH:
            ts = value
        else:
            return None
    values = {name: found[name] for name in _VALUE_FIELDS if name in found}
    return sensor, ts, values, seq


def _validated(element: dict[str, Any], dropped: list[ReadingRejectedError]) -> ReadingPayload:
    """The element as a :class:`ReadingPayload`; a covariate of the wrong type (``"rh": "55"``)
    is left out and its fault appended to ``dropped``, so the reading keeps its PM."""
    try:
        return ReadingPayload.model_validate(element)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        bad_covariates = _bad_covariates(errors)
        if bad_covariates:
            kept = {key: value for key, value in element.items() if key not in bad_covariates}
            parsed = _validated(kept, [])
            dropped.extend(
                covariate_fault(_FIELD_OF_KEY[key], f"{key}: {message}")
                for key, message in bad_covariates.items()
            )
            return parsed
        reason = (
            RejectReason.UNKNOWN_FIELD
            if any(error["type"] == "extra_forbidden" for error in errors)
            else RejectReason.SCHEMA
        )
        first = errors[0]
        where = ".".join(str(part) for part in first["loc"])[:60]
        raise ReadingRejectedError(reason, f"{where}: {first['msg']}") from exc


def _bad_covariates(errors: Sequence[Any]) -> dict[str, str]:
    """Covariate key -> message, when every error is a covariate's value; else empty."""
    found: dict[str, str] = {}
    for error in errors:
        location = error["loc"]
        key = location[0] if location else None
        if error["type"] == "extra_forbidden" or key not in _COVARIATE_KEYS:
            return {}
        found.setdefault(str(key), str(error["msg"]))
    return found


def _sensor_id(from_payload: str | None, from_topic: str | None) -> str:
    if from_topic is not None:
        if from_payload is not None and from_payload != from_topic:
            raise ReadingRejectedError(
                RejectReason.BAD_SENSOR_ID,
                f"payload sensor {from_payload[:64]!r} differs from "
                f"topic sensor {from_topic[:64]!r}",
            )
        return from_topic
    if from_payload is None:
        raise ReadingRejectedError(
            RejectReason.SCHEMA, "no sensor id: put it in the topic or in the 'sensor' key"
        )
    return from_payload
