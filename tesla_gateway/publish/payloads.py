"""The JSON documents on our topics (docs/mqtt.md): calibrated readings, batches, health,
drift and stats, encoded to the bytes the broker receives."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

from tesla_gateway.contract.calibrated import CalibratedReading, Quality, published_value
from tesla_gateway.contract.timefmt import iso8601

__all__ = [
    "DISPLAY_UNIT",
    "batch_payloads",
    "document_payload",
    "reading_message",
    "reading_payload",
]


def _dumps(document: object) -> bytes:
    """Compact JSON. (orjson was tried here and dropped: with it the daemon held 155 instead of
    128 MB after make bench's load phases at 10,000 sensors, and the batch topic's p99 rose.)"""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


DISPLAY_UNIT = "µg/m³"
_UNIT_ALIASES = {"ug/m3": DISPLAY_UNIT, "µg/m3": DISPLAY_UNIT, DISPLAY_UNIT: DISPLAY_UNIT}


def _finite(value: float | None) -> float | None:
    """A concentration as published (to 0.1 µg/m³), or None when there is none."""
    return published_value(value) if value is not None and math.isfinite(value) else None


def reading_payload(reading: CalibratedReading) -> dict[str, object]:
    """The JSON document of a calibrated topic (docs/mqtt.md); ``interval`` only when the
    model's manifest carries prediction intervals and the value is calibrated. Concentrations
    (raw, calibrated, the interval's ends) to 0.1 µg/m³ (contract.calibrated.published_value)."""
    document: dict[str, object] = {
        "ts": iso8601(reading.period_start + reading.period_seconds),
        "period_start": iso8601(reading.period_start),
        "period_s": reading.period_seconds,
        "raw": _finite(reading.raw),
        "calibrated": _finite(reading.calibrated),
        "unit": _UNIT_ALIASES.get(reading.unit, reading.unit),
        "model": reading.model_name,
        "model_version": reading.model_version,
        "quality": [quality.value for quality in reading.quality],
    }
    if reading.interval is not None:
        document["interval"] = {
            "low": published_value(reading.interval.low),
            "high": published_value(reading.interval.high),
            "level": reading.interval.level,
        }
    if reading.history_periods is not None:
        document["history_periods"] = reading.history_periods
        warm_up = _warm_up(reading)
        if warm_up is not None:
            document["warm_up"] = warm_up
    return document


def _warm_up(reading: CalibratedReading) -> dict[str, object] | None:
    """Progress of a sensor whose window is not whole yet: periods it has, the N it needs, and
    when it will have them (the end of that period, as ``ts``); None once whole."""
    have, need = reading.history_periods, reading.window_length
    if have is None or need is None or have >= need:
        return None
    end = reading.period_start + reading.period_seconds * (1 + need - have)
    return {"have": have, "need": need, "ready_at": iso8601(end)}


def reading_message(reading: CalibratedReading) -> bytes:
    """The payload of ``<prefix>/<sensor>/<feature>``.

    One per sensor per period, on the publish path of every tick: written from a template
    (about 3 instead of 12 µs), byte for byte what ``_dumps(reading_payload(...))`` writes
    (a Hypothesis test holds the two equal); anything unusual takes that general path.
    """
    text = _reading_text(reading)
    return _dumps(reading_payload(reading)) if text is None else text.encode("utf-8")


def _reading_text(reading: CalibratedReading) -> str | None:
    """The template's JSON text, or None when a field is not of the plain kind it handles."""
    raw, calibrated, interval = reading.raw, reading.calibrated, reading.interval
    start, seconds, version = reading.period_start, reading.period_seconds, reading.model_version
    history, need = reading.history_periods, reading.window_length
    if (
        type(raw) is not float
        or (calibrated is not None and type(calibrated) is not float)
        or type(start) is not float
        or type(seconds) is not int
        or (version is not None and type(version) is not int)
        or (history is not None and type(history) is not int)
        or (need is not None and type(need) is not int)
    ):
        return None
    tail = "}"
    if history is not None:
        tail = f',"history_periods":{history}}}'
        if need is not None and history < need:
            ready_at = _iso_text(start + seconds * (1 + need - history))
            tail = (
                f',"history_periods":{history},"warm_up":{{"have":{history},"need":{need},'
                f'"ready_at":{ready_at}}}}}'
            )
    if interval is not None:
        low, high, level = interval.low, interval.high, interval.level
        if not (_plain_float(low) and _plain_float(high) and _plain_float(level)):
            return None
        tail = (
            f',"interval":{{"low":{float.__repr__(published_value(low))},"high":'
            f"{float.__repr__(published_value(high))},"
            f'"level":{float.__repr__(level)}}}{tail}'
        )
    return (
        f'{{"ts":{_iso_text(start + seconds)},"period_start":{_iso_text(start)},'
        f'"period_s":{seconds},"raw":{_number_text(raw)},"calibrated":'
        f'{_number_text(calibrated)},"unit":{_unit_text(reading.unit)},'
        f'"model":{_optional_string_text(reading.model_name)},'
        f'"model_version":{"null" if version is None else version},'
        f'"quality":{_quality_text(reading.quality)}{tail}'
    )


def _plain_float(value: object) -> bool:
    """A finite float proper (``json`` writes NaN and infinities as non-JSON words)."""
    return type(value) is float and math.isfinite(value)


def _number_text(value: float | None) -> str:
    """``_finite`` as JSON: ``null`` for None and non-finite values."""
    if value is None or not math.isfinite(value):
        return "null"
    return float.__repr__(published_value(value))


@lru_cache(maxsize=1024)
def _iso_text(timestamp: float) -> str:
    """A period's ISO time as JSON: every sensor of a tick shares the same few."""
    return json.dumps(iso8601(timestamp))


@lru_cache(maxsize=64)
def _unit_text(unit: str) -> str:
    return json.dumps(_UNIT_ALIASES.get(unit, unit), ensure_ascii=False)


@lru_cache(maxsize=256)
def _optional_string_text(value: str | None) -> str:
    return json.dumps(value, ensure_ascii=False)


@lru_cache(maxsize=256)
def _quality_text(quality: tuple[Quality, ...]) -> str:
    return json.dumps([flag.value for flag in quality], ensure_ascii=False, separators=(",", ":"))


def batch_payloads(
    readings: Sequence[CalibratedReading], max_readings: int
) -> list[tuple[str, bytes]]:
    """``(feature, payload)`` per ``<prefix>/_batch/<feature>`` message: JSON arrays of at most
    ``max_readings`` documents, each a reading's document with its ``sensor``."""
    by_feature: dict[str, list[str]] = {}
    for reading in readings:
        by_feature.setdefault(reading.feature, []).append(_batch_element(reading))
    return [
        (feature, f"[{','.join(elements[start : start + max_readings])}]".encode())
        for feature, elements in by_feature.items()
        for start in range(0, len(elements), max_readings)
    ]


def _batch_element(reading: CalibratedReading) -> str:
    """``{"sensor": ..., **reading_payload(reading)}`` as compact JSON text."""
    text = _reading_text(reading)
    if text is None:
        return _dumps({"sensor": reading.sensor_id, **reading_payload(reading)}).decode("utf-8")
    return f'{{"sensor":{_optional_string_text(reading.sensor_id)},{text[1:]}'


def document_payload(document: Mapping[str, object]) -> bytes:
    """A health, drift or stats document (anything not JSON-native written as its str)."""
    return json.dumps(document, ensure_ascii=False, default=str).encode("utf-8")
