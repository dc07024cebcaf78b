"""Readings from ESPHome nodes: their MQTT sensor state topics, one plain number per topic.

ESPHome (github.com/esphome/esphome) publishes each sensor's state on
``<topic_prefix>/sensor/<object_id>/state`` (``MQTTComponent::get_default_topic_for_`` in
``esphome/components/mqtt/mqtt_component.cpp``; the prefix defaults to the node name), as the
number formatted with the sensor's accuracy decimals (``MQTTSensorComponent::publish_state`` in
``mqtt_sensor.cpp``), ``nan`` when it has no value. The ``pmsx003`` component's PM2.5, PM10
and, on a PMS5003T/ST, temperature and humidity are separate sensors, so each arrives on its own
topic; the object id is derived from the name the user gave the sensor, which is why the
mapping from object id to channel is configured, never guessed.

The values of one node are grouped into one reading per ``group_s`` window of the Unix epoch:
a window's values (mean per channel) become a reading, stamped with the receive time of its
latest value, once a value of a later window arrives or ``grace_s`` after the window ended.
A window with no PM value is rejected as ``no_values``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from tesla_gateway.contract.readings import Reading, ReadingRejectedError, RejectReason
from tesla_gateway.contract.sensor_kind import PMS5003_ATM, SensorKind
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.mqtt.connection import MqttConnection
from tesla_gateway.mqtt.inbox import InboundMessage
from tesla_gateway.mqtt.topics import TopicFilter
from tesla_gateway.sources.fleet_common import (
    FleetLimits,
    FleetMqttConfig,
    enqueue,
    run_mqtt_subscription,
    validated,
)

__all__ = ["EsphomeGrouper", "EsphomeSource", "EsphomeSourceConfig", "parse_state", "split_topic"]

SOURCE_NAME = "esphome"
Channel = Literal["pm1", "pm2_5", "pm10", "rh", "temp_c"]
_FEATURES = ("pm1", "pm2_5", "pm10")
_MAX_STATE_BYTES = 32
_Outcome = tuple[list[Reading], list[ReadingRejectedError]]


class EsphomeSourceConfig(FleetMqttConfig):
    """ESPHome nodes publishing sensor states over MQTT (``kind = "esphome"``)."""

    kind: Literal["esphome"] = Field(description="Source kind: ESPHome MQTT state topics.")
    sensor_id_prefix: str = Field(
        default="esphome-",
        max_length=32,
        pattern=r"^[A-Za-z0-9_.-]*$",
        description=(
            "Sensor id = prefix + the node's topic prefix; the default keeps ESPHome ids apart "
            "from other sources' ('' gives the bare topic prefix, the ids before: docs/sources.md)."
        ),
    )
    topics: list[Annotated[str, AfterValidator(TopicFilter)]] = Field(
        default_factory=lambda: ["+/sensor/+/state"],
        validate_default=True,
        min_length=1,
        description="Topic filters of the nodes' states (<prefix>/sensor/<object_id>/state).",
    )
    channels: dict[Annotated[str, Field(pattern=r"^[a-z0-9_-]{1,64}$")], Channel] = Field(
        min_length=1,
        description=(
            "Object id -> channel (pm1, pm2_5, pm10, rh, temp_c); states of other object ids "
            "are ignored (counted in the source's stats)."
        ),
    )
    group_s: float = Field(
        default=60.0, ge=1, le=3600, description="Window (s) grouping one node's values."
    )
    grace_s: float = Field(
        default=5.0, ge=0, le=600, description="Wait this long after a window for late values."
    )
    max_nodes: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description=(
            "Most nodes with an open window at once: values from further new prefixes are "
            "rejected (unknown_sensor), so topics from the wire cannot grow memory without bound."
        ),
    )

    def default_sensor(self) -> SensorKind:
        """The ``pmsx003`` component's pm_* sensors: a PMS5003's atmospheric values (its
        ``*_std`` sensors are CF=1; another PM component needs ``delivers``)."""
        return PMS5003_ATM


def parse_state(payload: bytes) -> float:
    """An ESPHome state payload as a number; ``nan`` and anything else are rejected."""
    if len(payload) > _MAX_STATE_BYTES:
        raise ReadingRejectedError(RejectReason.TOO_LARGE, f"state of {len(payload)} bytes")
    try:
        value = float(payload.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ReadingRejectedError(
            RejectReason.SCHEMA, f"state {payload[:32]!r} is not a number"
        ) from exc
    if not math.isfinite(value):
        raise ReadingRejectedError(RejectReason.NOT_FINITE, f"state is {value}")
    return value


def split_topic(topic: str) -> tuple[str, str]:
    """``<prefix>/sensor/<object_id>/state`` -> (prefix, object id)."""
    levels = topic.split("/")
    if len(levels) < 4 or levels[-1] != "state" or levels[-3] != "sensor":
        raise ReadingRejectedError(
            RejectReason.SCHEMA, f"topic {topic[:100]!r} is not <prefix>/sensor/<id>/state"
        )
    return "/".join(levels[:-3]), levels[-2]


@dataclass
class _Window:
    index: int
    last_at: float
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, channel: str, value: float, at: float) -> None:
        self.sums[channel] = self.sums.get(channel, 0.0) + value
        self.counts[channel] = self.counts.get(channel, 0) + 1
        self.last_at = max(self.last_at, at)

    def means(self) -> dict[str, float]:
        return {name: self.sums[name] / self.counts[name] for name in self.sums}


class EsphomeGrouper:
    """Groups each node's single-value states into readings (the rule in the module doc)."""

    def __init__(
        self, limits: FleetLimits, *, group_s: float, grace_s: float, max_nodes: int = 10_000
    ) -> None:
        self._limits = limits
        self._group_s = group_s
        self._grace_s = grace_s
        self._max_nodes = max_nodes
        self._open: dict[str, _Window] = {}

    def add(self, node: str, channel: str, value: float, at: float) -> _Outcome:
        """Record one value received at ``at``; returns what closing the node's previous
        window produced (its reading, or why it was refused)."""
        index = math.floor(at / self._group_s)
        outcome: _Outcome = ([], [])
        window = self._open.get(node)
        if window is not None and window.index != index:
            del self._open[node]
            self._close(node, window, at, outcome)
            window = None
        if window is None:
            if len(self._open) >= self._max_nodes:
                outcome[1].append(
                    ReadingRejectedError(
                        RejectReason.UNKNOWN_SENSOR,
                        f"node {node[:64]!r}: already {self._max_nodes} nodes with open windows "
                        "(max_nodes)",
                    )
                )
                return outcome
            window = self._open[node] = _Window(index=index, last_at=at)
        window.add(channel, value, at)
        return outcome

    def close_due(self, now: float) -> _Outcome:
        """Close the windows that ended ``grace_s`` ago."""
        outcome: _Outcome = ([], [])
        for node, window in list(self._open.items()):
            if now >= (window.index + 1) * self._group_s + self._grace_s:
                del self._open[node]
                self._close(node, window, now, outcome)
        return outcome

    def _close(self, node: str, window: _Window, now: float, outcome: _Outcome) -> None:
        values = window.means()
        try:
            if not any(name in values for name in _FEATURES):
                raise ReadingRejectedError(
                    RejectReason.NO_VALUES,
                    f"node {node[:64]!r}: no PM value in a {self._group_s:.0f} s window "
                    f"(only {sorted(values)})",
                )
            # The time is the gateway's own (a value's receive time), so a step of the gateway's
            # clock moves it as it moves every reading stamped at arrival.
            reading = validated(
                node,
                window.last_at,
                values,
                limits=self._limits,
                now=now,
                source=SOURCE_NAME,
                stamped_at_gateway=True,
            )
            outcome[0].append(reading)
        except ReadingRejectedError as exc:
            outcome[1].append(exc)


class EsphomeSource:
    """Subscribes to the nodes' state topics and feeds grouped readings into the queue."""

    def __init__(
        self,
        config: EsphomeSourceConfig,
        *,
        client_id: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._client_id = config.client_id or client_id
        self._clock = clock
        self._grouper = EsphomeGrouper(
            config, group_s=config.group_s, grace_s=config.grace_s, max_nodes=config.max_nodes
        )
        self._connection: MqttConnection | None = None
        self._accepted = 0
        self._ignored = 0

    def stats(self) -> dict[str, object]:
        connection = self._connection
        return {
            "kind": SOURCE_NAME,
            "connected": connection is not None and connection.connected,
            "session": connection.session_stats() if connection is not None else {},
            "accepted": self._accepted,
            "ignored_states": self._ignored,
        }

    def _count(self, outcome: _Outcome, rejects: RejectCounter) -> list[Reading]:
        readings, refused = outcome
        for exc in refused:
            rejects.reject_error(exc, source=SOURCE_NAME)
        for reading in readings:
            rejects.reject_dropped(reading)
        self._accepted += len(readings)
        return readings

    async def run(self, queue: asyncio.Queue[Reading], rejects: RejectCounter) -> None:
        def on_message(message: InboundMessage) -> list[Reading]:
            try:
                node, object_id = split_topic(message.topic)
                channel = self._config.channels.get(object_id)
                if channel is None:
                    self._ignored += 1
                    return []
                value = parse_state(message.payload)
            except ReadingRejectedError as exc:
                rejects.reject_error(exc, source=SOURCE_NAME)
                return []
            return self._count(self._grouper.add(node, channel, value, self._clock()), rejects)

        def connected(connection: MqttConnection | None) -> None:
            self._connection = connection

        async with asyncio.TaskGroup() as group:
            group.create_task(self._close_windows(queue, rejects), name="esphome-windows")
            await run_mqtt_subscription(
                self._config,
                topics=list(self._config.topics),
                client_id=self._client_id,
                name=SOURCE_NAME,
                on_message=on_message,
                queue=queue,
                connected=connected,
            )

    async def _close_windows(self, queue: asyncio.Queue[Reading], rejects: RejectCounter) -> None:
        """Close the windows no later value closed (a node that went quiet)."""
        interval = min(1.0, self._config.group_s / 4)
        while True:
            await asyncio.sleep(interval)
            readings = self._count(self._grouper.close_due(self._clock()), rejects)
            await enqueue(queue, readings)
