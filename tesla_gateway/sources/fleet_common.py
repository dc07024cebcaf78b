"""What the fleet sources (Tasmota, ESPHome, sensor.community, PurpleAir) share.

Each turns a device's native output into readings through
:func:`tesla_gateway.contract.readings.validate_reading`
and counts what it refuses with :class:`tesla_gateway.ingest.rejects.RejectCounter`; this module
holds the
limits they all apply, the MQTT subscription loop the two MQTT kinds share, and the hand-off to
the gateway's queue.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from tesla_gateway.contract.readings import (
    Reading,
    ReadingRejectedError,
    RejectReason,
    covariate_fault,
    validate_reading,
)
from tesla_gateway.contract.sensor_kind import PmValues, SensorKind
from tesla_gateway.ingest.ingest_log import commit_queued
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.mqtt.config import DEFAULT_MAX_INBOX, MqttBrokerConfig
from tesla_gateway.mqtt.connection import MqttConnection
from tesla_gateway.mqtt.inbox import InboundMessage

__all__ = [
    "FleetLimits",
    "FleetMqttConfig",
    "FleetSource",
    "PmKind",
    "covariate_number",
    "enqueue",
    "fahrenheit_to_celsius",
    "json_object",
    "number",
    "run_mqtt_subscription",
    "validated",
]

# Plantower sensors report two PM sets: "atm" (atmospheric environment, what the serial PMS5003
# source and the node firmware use) and "cf_1" (factory CF=1, meant for indoor use).
PmKind = PmValues


class FleetLimits(BaseModel):
    """Limits every fleet source applies to the readings it builds, and what its devices
    deliver (checked at start against what the models were trained on)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    delivers: SensorKind | None = Field(
        default=None,
        description=(
            "The sensor and value set this source's devices deliver, e.g. "
            '{ model = "PMS5003", values = "atm" }; default: what the kind\'s settings '
            "give (docs/sources.md)."
        ),
    )
    accept_sensor_mismatch: bool = Field(
        default=False,
        description=(
            "Start even though a model was trained on another sensor or value set than this "
            "source delivers (its calibration is then outside what the model learned)."
        ),
    )

    sensor_id_prefix: str = Field(
        default="",
        max_length=32,
        pattern=r"^[A-Za-z0-9_.-]*$",
        description=(
            "Prepended to every sensor id this source derives. Tasmota, ESPHome and "
            "sensor.community default to 'tasmota-', 'esphome-', 'airrohr-' and PurpleAir's "
            "derived ids start 'purpleair-', so two sources do not share an id by accident."
        ),
    )
    max_future_s: float = Field(
        default=300.0, ge=0, description="Readings further in the future are rejected."
    )
    max_age_s: float | None = Field(
        default=7 * 24 * 3600.0,
        gt=0,
        description="Readings older than this are rejected as stale; null accepts any age.",
    )
    max_payload_bytes: int = Field(
        default=16_384, ge=256, le=1_048_576, description="Larger payloads are rejected."
    )

    def sensor_delivered(self) -> SensorKind | None:
        """``delivers``, else the kind's default from its settings (None: not known)."""
        return self.delivers if self.delivers is not None else self.default_sensor()

    def default_sensor(self) -> SensorKind | None:
        """What the kind delivers with these settings; each kind says."""
        return None


class FleetMqttConfig(FleetLimits):
    """A subscription on the broker the devices publish to."""

    broker: MqttBrokerConfig = Field(
        default_factory=MqttBrokerConfig, description="Broker the devices publish to."
    )
    qos: int = Field(default=0, ge=0, le=2, description="Subscription QoS.")
    client_id: str | None = Field(
        default=None,
        max_length=64,
        description="MQTT client id; default tesla-gateway-<gateway id>-<kind>-<index>.",
    )
    max_inbox_messages: int = Field(
        default=DEFAULT_MAX_INBOX,
        ge=1,
        le=1_000_000,
        description="Most received messages waiting to be decoded.",
    )


class FleetSource(Protocol):
    """What the service needs from a fleet source."""

    async def run(self, queue: asyncio.Queue[Reading], rejects: RejectCounter) -> None: ...

    def stats(self) -> dict[str, object]: ...


def validated(
    sensor_id: str,
    timestamp: float,
    values: Mapping[str, float],
    *,
    limits: FleetLimits,
    now: float,
    source: str,
    seq: int | None = None,
    dropped: Sequence[ReadingRejectedError] = (),
    stamped_at_gateway: bool | None = None,
) -> Reading:
    """The one acceptance rule, with this source's prefix and time limits (``dropped``: the
    covariates the decoder could not read, see :func:`covariate_number`;
    ``stamped_at_gateway``: see :func:`validate_reading`)."""
    return validate_reading(
        f"{limits.sensor_id_prefix}{sensor_id}",
        timestamp,
        values,
        now=now,
        source=source,
        max_future_s=limits.max_future_s,
        max_age_s=limits.max_age_s,
        seq=seq,
        dropped=dropped,
        stamped_at_gateway=stamped_at_gateway,
    )


def number(value: object, where: str) -> float:
    """A JSON number, or a string holding one (the airrohr firmware quotes its values)."""
    if isinstance(value, bool):
        raise ReadingRejectedError(RejectReason.SCHEMA, f"{where} is a boolean, not a number")
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError as exc:  # a JSON integer beyond any float
            raise ReadingRejectedError(RejectReason.OUT_OF_RANGE, f"{where} is too large") from exc
    if isinstance(value, str) and len(value) <= 32:
        try:
            return float(value)
        except ValueError:
            pass
    raise ReadingRejectedError(RejectReason.SCHEMA, f"{where} is not a number: {str(value)[:32]!r}")


def covariate_number(
    value: object, where: str, channel: str, dropped: list[ReadingRejectedError]
) -> float | None:
    """A covariate's :func:`number`, or None with its fault appended to ``dropped``: a
    humidity that is not a number costs the humidity, never the reading's PM."""
    try:
        return number(value, where)
    except ReadingRejectedError as exc:
        dropped.append(covariate_fault(channel, exc.detail))
        return None


def json_object(payload: bytes, *, max_bytes: int, what: str = "payload") -> dict[str, Any]:
    """A bounded, UTF-8, JSON object payload; every other shape is a counted reject."""
    if len(payload) > max_bytes:
        raise ReadingRejectedError(
            RejectReason.TOO_LARGE, f"{what} of {len(payload)} bytes exceeds {max_bytes}"
        )
    try:
        document = json.loads(payload.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ReadingRejectedError(RejectReason.BAD_ENCODING, f"{what} is not UTF-8") from exc
    except (ValueError, RecursionError) as exc:
        raise ReadingRejectedError(RejectReason.BAD_JSON, f"{what} is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ReadingRejectedError(RejectReason.SCHEMA, f"{what} is not a JSON object")
    return document


def fahrenheit_to_celsius(value: float) -> float:
    return (value - 32.0) * 5.0 / 9.0


async def enqueue(queue: asyncio.Queue[Reading], readings: list[Reading]) -> None:
    """Hand readings to the ingest loop (waiting when it is behind) and make them durable."""
    for reading in readings:
        await queue.put(reading)
    if readings:
        commit_queued(queue)


async def run_mqtt_subscription(
    config: FleetMqttConfig,
    *,
    topics: list[str],
    client_id: str,
    name: str,
    on_message: Callable[[InboundMessage], list[Reading]],
    queue: asyncio.Queue[Reading],
    connected: Callable[[MqttConnection | None], None],
) -> None:
    """Subscribe and feed each message's readings to the queue until cancelled."""

    async def handle(message: InboundMessage) -> None:
        readings = on_message(message)
        for reading in readings:
            await queue.put(reading)

    connection = MqttConnection(
        config.broker,
        client_id=client_id,
        clean_start=True,
        on_message=handle,
        before_ack=lambda: commit_queued(queue),
        max_inbox=config.max_inbox_messages,
        name=name,
    )
    async with connection:
        connected(connection)
        try:
            await connection.subscribe(list(topics), qos=config.qos)
            await connection.serve()
        finally:
            connected(None)
