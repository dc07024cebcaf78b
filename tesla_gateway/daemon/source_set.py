"""Every source the config names, built at start: the sensors' sources and the references'.

The sensors' sources (MQTT, the serial ports as one source, each fleet kind) all feed the one
ingest queue; each reference station has an MQTT subscription and a queue of its own, so its
readings reach the monitor and never the windows. Each source reports its own stats; this set
only names them for the stats snapshot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping

from tesla_gateway.contract.readings import Reading
from tesla_gateway.daemon.config import GatewayConfig, MqttSourceEntry
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.monitor.references import ReferenceConfig
from tesla_gateway.sources.fleet import make_fleet_source
from tesla_gateway.sources.fleet_common import FleetSource
from tesla_gateway.sources.mqtt_source import MqttSource, MqttSourceConfig
from tesla_gateway.sources.serial_source import (
    NodeLink,
    NodePortConfig,
    Pms5003PortConfig,
    SerialSource,
)

__all__ = ["SourceRun", "SourceSet"]

SourceRun = Callable[[asyncio.Queue[Reading], RejectCounter], Coroutine[None, None, None]]


class SourceSet:
    """The configured sources, made by :meth:`make_sources` and :meth:`make_references`."""

    def __init__(self, config: GatewayConfig, *, clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._clock = clock
        self.reference_rejects = RejectCounter()  # the references' own (not the sensors')
        self._mqtt_sources: dict[str, MqttSource] = {}
        self._fleet_sources: dict[str, FleetSource] = {}
        self._reference_sources: dict[str, MqttSource] = {}
        self._serial_source: SerialSource | None = None

    @property
    def links(self) -> Mapping[str, NodeLink]:
        """The serial nodes' write sides, for the OTA relay (none without serial ports)."""
        return self._serial_source.links if self._serial_source is not None else {}

    def make_sources(self) -> list[tuple[str, SourceRun]]:
        """The sensors' sources, by task name; a serial port configured twice raises here."""
        made: list[tuple[str, SourceRun]] = []
        serial_ports: list[NodePortConfig | Pms5003PortConfig] = []
        for index, source in enumerate(self._config.sources):
            if isinstance(source, MqttSourceEntry):
                mqtt = MqttSource(source, gateway_id=self._config.gateway_id, clock=self._clock)
                self._mqtt_sources[f"mqtt-source-{index}"] = mqtt
                made.append((f"mqtt-source-{index}", mqtt.run))
            elif isinstance(source, NodePortConfig | Pms5003PortConfig):
                serial_ports.append(source)
            else:
                fleet = make_fleet_source(
                    source, gateway_id=self._config.gateway_id, index=index, clock=self._clock
                )
                self._fleet_sources[f"{source.kind}-source-{index}"] = fleet
                made.append((f"{source.kind}-source-{index}", fleet.run))
        if serial_ports:
            self._serial_source = SerialSource(
                serial_ports, clock=self._clock, timezone=self._config.timezone
            )
            made.append(("serial-sources", self._serial_source.run))
        return made

    def make_references(
        self, queue_bound: int
    ) -> dict[str, tuple[SourceRun, asyncio.Queue[Reading]]]:
        """One MQTT subscription per reference station (by name), each with its own queue."""
        made: dict[str, tuple[SourceRun, asyncio.Queue[Reading]]] = {}
        for reference in self._config.references:
            mqtt = MqttSource(
                _reference_source_config(reference, self._config.gateway_id),
                gateway_id=self._config.gateway_id,
                clock=self._clock,
            )
            self._reference_sources[reference.name] = mqtt
            made[reference.name] = (mqtt.run, asyncio.Queue(maxsize=queue_bound))
        return made

    def stats(self) -> dict[str, object]:
        """The sources' part of the daemon's stats snapshot."""
        sources = {name: source.stats() for name, source in self._mqtt_sources.items()}
        fleet = {name: source.stats() for name, source in self._fleet_sources.items()}
        references = {name: source.stats() for name, source in self._reference_sources.items()}
        return {
            "mqtt_sources_connected": {name: s.connected for name, s in sources.items()},
            "mqtt_other_shard": {name: s.other_shard for name, s in sources.items()},
            "mqtt_inbox": {name: s.inbox for name, s in sources.items()},
            # Session counters of every subscribing connection (the publisher's are in its own
            # stats): sensor sources, references, MQTT fleet sources.
            "mqtt_sessions": {
                **{name: s.session for name, s in sources.items()},
                **{f"reference-{name}": s.session for name, s in references.items()},
                **{name: f["session"] for name, f in fleet.items() if "session" in f},
            },
            "fleet_sources": fleet,
            "references_connected": {name: s.connected for name, s in references.items()},
            "references_rejected": self.reference_rejects.snapshot(),
        }

    def listener_stats(self) -> dict[str, Mapping[str, int]]:
        """The connection counters of the sources that listen (sensor.community), by name."""
        listeners: dict[str, Mapping[str, int]] = {}
        for name, source in self._fleet_sources.items():
            connections = source.stats().get("connections")
            if isinstance(connections, Mapping):
                listeners[name] = connections
        return listeners


def _reference_source_config(reference: ReferenceConfig, gateway_id: str) -> MqttSourceConfig:
    """The reference's subscription, with a client id of its own (never the sensors' one)."""
    client_id = reference.mqtt.client_id or f"tesla-gateway-{gateway_id}-ref-{reference.name}"
    return reference.mqtt.model_copy(update={"client_id": client_id[:64]})
