"""The fleet source kinds (devices already deployed, read without reflashing), built by kind.

``tasmota`` and ``esphome`` subscribe to the devices' own MQTT topics, ``sensor_community``
listens for the airrohr firmware's POSTs, ``purpleair`` polls units' local JSON; each maps its
device's output onto the validated reading (docs/sources.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tesla_gateway.sources.esphome import EsphomeSource, EsphomeSourceConfig
from tesla_gateway.sources.fleet_common import FleetSource
from tesla_gateway.sources.purpleair import PurpleAirSource, PurpleAirSourceConfig
from tesla_gateway.sources.sensor_community import (
    SensorCommunitySource,
    SensorCommunitySourceConfig,
)
from tesla_gateway.sources.tasmota import TasmotaSource, TasmotaSourceConfig

__all__ = ["FLEET_KINDS", "FleetSourceConfig", "make_fleet_source"]

FleetSourceConfig = (
    TasmotaSourceConfig | EsphomeSourceConfig | SensorCommunitySourceConfig | PurpleAirSourceConfig
)
FLEET_KINDS = frozenset({"tasmota", "esphome", "sensor_community", "purpleair"})


def make_fleet_source(
    config: FleetSourceConfig,
    *,
    gateway_id: str,
    index: int,
    clock: Callable[[], float] = time.time,
) -> FleetSource:
    """The source for one ``[[sources]]`` entry of a fleet kind."""
    client_id = f"tesla-gateway-{gateway_id}-{config.kind}-{index}"[:64]
    if isinstance(config, TasmotaSourceConfig):
        return TasmotaSource(config, client_id=client_id, clock=clock)
    if isinstance(config, EsphomeSourceConfig):
        return EsphomeSource(config, client_id=client_id, clock=clock)
    if isinstance(config, SensorCommunitySourceConfig):
        return SensorCommunitySource(config, clock=clock)
    return PurpleAirSource(config, clock=clock)
