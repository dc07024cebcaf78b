"""Readings from Tasmota devices with a PMS5003: their ``tele/<topic>/SENSOR`` JSON as it is.

Tasmota (github.com/arendst/Tasmota) publishes every TelePeriod a JSON object whose
``PMS5003`` block is written by ``tasmota/tasmota_xsns_sensor/xsns_18_pms5003.ino``:
``CF1``/``CF2.5``/``CF10`` are the CF=1 values, ``PM1``/``PM2.5``/``PM10`` the atmospheric ones
(µg/m³), then particle counts. A PMSx003T build adds ``Temperature``/``Humidity`` to the block;
other sensors (``BME280``, ``SHT3X``, ...) add blocks of their own with the same two keys
(``ResponseAppendTHD`` in ``tasmota/tasmota_support/support.ino``), in the unit the top-level
``TempUnit`` names. ``Time`` (``ResponseGetTime`` in support.ino) is local time without an offset
by default, with one when SetOption52 is on, Unix seconds with time format 2, and comes with
``Epoch`` (Unix seconds) with time format 1. docs/sources.md gives the mapping.

Because the default ``Time`` carries no offset, ``timezone`` has no default: a gateway that
assumed UTC refused every reading east of UTC as future and shifted every one west of it into
the past. A ``Time`` without an offset that still lies a whole number of quarter hours (a zone
offset) from its receive time is refused with a message naming ``timezone``, never shifted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator

from tesla_gateway.contract.readings import (
    SENSOR_ID_PATTERN,
    Reading,
    ReadingRejectedError,
    RejectReason,
)
from tesla_gateway.contract.sensor_kind import SensorKind
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.mqtt.connection import MqttConnection
from tesla_gateway.mqtt.inbox import InboundMessage
from tesla_gateway.mqtt.topics import TopicFilter
from tesla_gateway.sources.fleet_common import (
    FleetMqttConfig,
    PmKind,
    covariate_number,
    fahrenheit_to_celsius,
    json_object,
    number,
    run_mqtt_subscription,
    validated,
)

__all__ = ["TasmotaSource", "TasmotaSourceConfig", "decode_tasmota"]

SOURCE_NAME = "tasmota"
# Block keys per PM kind: (pm1, pm2_5, pm10), as xsns_18_pms5003.ino names them.
_PM_KEYS: dict[str, tuple[str, str, str]] = {
    "atm": ("PM1", "PM2.5", "PM10"),
    "cf_1": ("CF1", "CF2.5", "CF10"),
}
_MAX_TIME_LENGTH = 40
# PM block name -> the sensor model it holds (xsns_18_pms5003.ino, xsns_20_novasds.ino).
_BLOCK_SENSORS = {
    "PMS5003": "PMS5003",
    "PMS5003T": "PMS5003T",
    "PMS3003": "PMS3003",
    "ZH03x": "ZH03",
    "SDS0X1": "SDS011",
}
# Zone offsets are whole quarter hours between UTC-12 and UTC+14. A Tasmota device publishes as
# it measures (it keeps no backlog), so a Time that far from its receive time, within a couple
# of minutes of such an offset, is a zone setting that differs from the devices' own.
_ZONE_STEP_S = 900
_ZONE_SLACK_S = 120
_MAX_ZONE_STEPS = 14 * 4


def _known_zone(name: str) -> str:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"{name!r} is not an IANA time zone (e.g. 'Europe/Rome', 'UTC')") from exc
    return name


class TasmotaSourceConfig(FleetMqttConfig):
    """Tasmota devices publishing ``tele/<topic>/SENSOR`` (``kind = "tasmota"``)."""

    kind: Literal["tasmota"] = Field(description="Source kind: Tasmota telemetry over MQTT.")
    sensor_id_prefix: str = Field(
        default="tasmota-",
        max_length=32,
        pattern=r"^[A-Za-z0-9_.-]*$",
        description=(
            "Sensor id = prefix + the device topic; the default keeps Tasmota ids apart from "
            "other sources' ('' gives the bare device topic, the ids before: docs/sources.md)."
        ),
    )
    topics: list[Annotated[str, AfterValidator(TopicFilter)]] = Field(
        default_factory=lambda: ["tele/+/SENSOR"],
        validate_default=True,
        min_length=1,
        description="Topic filters of the devices' SENSOR telemetry (Tasmota's FullTopic).",
    )
    sensor_id_topic_level: int = Field(
        default=1,
        ge=0,
        le=32,
        description="0-based topic level holding the device topic ('tele/<topic>/SENSOR' -> 1).",
    )
    block: str = Field(
        default="PMS5003",
        pattern=r"^[A-Za-z0-9_.-]{1,32}$",
        description="Name of the PM block (PMS5003; PMS3003 on a PMS3003 build).",
    )
    pm_kind: PmKind = Field(
        default="atm",
        description="'atm': PM1/PM2.5/PM10 (as the serial PMS5003 source); 'cf_1': CF1/CF2.5/CF10.",
    )
    covariate_blocks: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,32}$")]] = Field(
        default_factory=lambda: [
            "PMS5003",
            "BME280",
            "SHT3X",
            "BME680",
            "SHT4X",
            "HTU21",
            "AM2301",
        ],
        description="Blocks searched in order for Temperature and Humidity.",
    )
    timezone: str = Field(
        description=(
            "IANA zone of the devices' clocks (Tasmota's Timezone setting, e.g. 'Europe/Rome'): "
            "Tasmota's default Time has no offset. 'UTC' for devices that run in UTC or send an "
            "offset (SetOption52) or Epoch, which are used as they are. Required."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _zone_given(cls, data: Any) -> Any:
        if isinstance(data, dict) and "timezone" not in data:
            raise ValueError(
                "set timezone on this Tasmota source: the IANA zone the devices' clocks run in "
                "(Tasmota's Timezone setting; the console's 'Status 7' shows it), e.g. "
                'timezone = "Europe/Rome". Tasmota\'s Time has no offset by default; '
                "'UTC' only if the devices run in UTC or send an offset (SetOption52)"
            )
        return data

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        return _known_zone(value)

    def default_sensor(self) -> SensorKind | None:
        """The block's sensor; a Plantower block's values are ``pm_kind``'s (an SDS011's
        ``SDS0X1`` block reads with the default keys, and is an SDS011 all the same)."""
        model = _BLOCK_SENSORS.get(self.block, self.block)
        try:
            return SensorKind(model=model, values=self.pm_kind if model.startswith("PMS") else None)
        except ValidationError:
            return None  # a block name no sensor model has: not known


def decode_tasmota(
    payload: bytes,
    *,
    device: str,
    received_at: float,
    config: TasmotaSourceConfig,
) -> Reading:
    """One SENSOR message into a reading; raise :class:`ReadingRejectedError` otherwise."""
    document = json_object(payload, max_bytes=config.max_payload_bytes)
    block = document.get(config.block)
    if not isinstance(block, dict):
        raise ReadingRejectedError(
            RejectReason.NO_VALUES, f"no {config.block} block (sensor not ready or absent)"
        )
    values: dict[str, float] = {}
    for name, key in zip(("pm1", "pm2_5", "pm10"), _PM_KEYS[config.pm_kind], strict=True):
        if key in block:
            values[name] = number(block[key], f"{config.block}.{key}")
    if "pm2_5" not in values and "pm10" not in values:
        raise ReadingRejectedError(
            RejectReason.NO_VALUES, f"{config.block} block has no PM2.5 or PM10 value"
        )
    fahrenheit = document.get("TempUnit") == "F"
    dropped: list[ReadingRejectedError] = []
    for name, key in (("temp_c", "Temperature"), ("rh", "Humidity")):
        for block_name in config.covariate_blocks:
            candidate = document.get(block_name)
            if isinstance(candidate, dict) and key in candidate:
                value = covariate_number(candidate[key], f"{block_name}.{key}", name, dropped)
                if value is not None:
                    values[name] = (
                        fahrenheit_to_celsius(value) if name == "temp_c" and fahrenheit else value
                    )
                break
    timestamp = _timestamp(document, received_at, ZoneInfo(config.timezone))
    return validated(
        device,
        timestamp,
        values,
        limits=config,
        now=received_at,
        source=SOURCE_NAME,
        dropped=dropped,
    )


def _timestamp(document: dict[str, Any], received_at: float, zone: ZoneInfo) -> float:
    epoch = document.get("Epoch")
    if epoch is not None:
        return number(epoch, "Epoch")
    value = document.get("Time")
    if value is None:
        return received_at
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)  # time format 2: Unix seconds
    if not isinstance(value, str) or len(value) > _MAX_TIME_LENGTH:
        raise ReadingRejectedError(RejectReason.SCHEMA, "Time is neither a string nor a number")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ReadingRejectedError(RejectReason.SCHEMA, f"Time {value!r} is not ISO-8601") from exc
    naive = parsed.tzinfo is None
    if naive:
        parsed = parsed.replace(tzinfo=zone)
    try:
        timestamp = parsed.timestamp()
    except (OverflowError, OSError, ValueError) as exc:
        raise ReadingRejectedError(RejectReason.SCHEMA, f"Time {value!r} is out of range") from exc
    if naive:
        _refuse_zone_offset(value, timestamp, received_at, zone)
    return timestamp


def _refuse_zone_offset(value: str, timestamp: float, received_at: float, zone: ZoneInfo) -> None:
    """Refuse a local Time that lies a zone offset from its receive time (module doc)."""
    gap = timestamp - received_at
    steps = round(gap / _ZONE_STEP_S)
    if (
        steps == 0
        or abs(steps) > _MAX_ZONE_STEPS
        or abs(gap - steps * _ZONE_STEP_S) > _ZONE_SLACK_S
    ):
        return
    hours = steps * _ZONE_STEP_S / 3600
    raise ReadingRejectedError(
        RejectReason.FUTURE_TIMESTAMP if gap > 0 else RejectReason.STALE_TIMESTAMP,
        f"Time {value!r} read in timezone {zone.key} is {hours:+g} h from its receive time: the "
        "devices' clocks run in another zone; set timezone on this tasmota source to theirs "
        "(the device console's 'Status 7' shows it)",
    )


class TasmotaSource:
    """Subscribes to the devices' SENSOR topics and feeds validated readings into the queue."""

    def __init__(
        self,
        config: TasmotaSourceConfig,
        *,
        client_id: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._client_id = config.client_id or client_id
        self._clock = clock
        self._connection: MqttConnection | None = None
        self._accepted = 0

    def stats(self) -> dict[str, object]:
        connection = self._connection
        return {
            "kind": SOURCE_NAME,
            "connected": connection is not None and connection.connected,
            "session": connection.session_stats() if connection is not None else {},
            "accepted": self._accepted,
        }

    async def run(self, queue: asyncio.Queue[Reading], rejects: RejectCounter) -> None:
        def on_message(message: InboundMessage) -> list[Reading]:
            try:
                device = _topic_level(message.topic, self._config.sensor_id_topic_level)
                reading = decode_tasmota(
                    message.payload, device=device, received_at=self._clock(), config=self._config
                )
            except ReadingRejectedError as exc:
                rejects.reject_error(exc, source=SOURCE_NAME)
                return []
            rejects.reject_dropped(reading, where=message.topic)
            self._accepted += 1
            return [reading]

        def connected(connection: MqttConnection | None) -> None:
            self._connection = connection

        await run_mqtt_subscription(
            self._config,
            topics=list(self._config.topics),
            client_id=self._client_id,
            name=SOURCE_NAME,
            on_message=on_message,
            queue=queue,
            connected=connected,
        )


def _topic_level(topic: str, level: int) -> str:
    levels = topic.split("/")
    if level >= len(levels) or not SENSOR_ID_PATTERN.fullmatch(levels[level]):
        raise ReadingRejectedError(
            RejectReason.BAD_SENSOR_ID,
            f"topic {topic[:100]!r} has no valid sensor id at level {level}",
        )
    return levels[level]
