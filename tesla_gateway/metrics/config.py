"""``[metrics]``: where the Prometheus endpoint listens; validated once, with the extra present."""

from __future__ import annotations

import importlib
import ipaddress
from typing import Self

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

__all__ = ["MetricsConfig", "split_listen"]

EXTRA_HINT = "pip install 'tesla-gateway[metrics]' (prometheus_client 0.24 or later)"


def split_listen(listen: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); ValueError with what is wrong."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"listen = {listen!r}: expected 'host:port', e.g. '127.0.0.1:9108'")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise ValueError(f"listen = {listen!r}: [{host}] is not an IPv6 address") from exc
    port = int(port_text)
    if not 0 < port < 65_536:
        raise ValueError(f"listen = {listen!r}: port must be 1-65535")
    return host, port


class MetricsConfig(BaseModel):
    """The optional Prometheus endpoint (docs/deployment.md, "Metrics")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    listen: str = Field(
        default="127.0.0.1:9108",
        description="host:port of the /metrics endpoint ('0.0.0.0:9108' for every interface).",
    )
    max_connections: int = Field(
        default=64,
        ge=1,
        le=1024,
        description=(
            "Most connections open at once; more are closed as soon as they are accepted "
            "(each costs a file descriptor)."
        ),
    )
    max_connections_per_host: int = Field(
        default=8,
        ge=1,
        le=1024,
        description=(
            "Most connections open at once from one address, so that one host cannot keep "
            "the scrapers out."
        ),
    )
    sensor_staleness: bool = Field(
        default=True,
        # per_sensor: its earlier name (it exported the seconds since each sensor's reading).
        validation_alias=AliasChoices("sensor_staleness", "per_sensor"),
        description=(
            "Export tesla_gateway_sensor_last_reading_timestamp_seconds{sensor}, the Unix time "
            "of each sensor's last reading, for staleness alerts: one series per sensor with "
            "windows (at most sensors.max_sensors)."
        ),
    )
    sensor_gauges: bool = Field(
        default=False,
        description=(
            "Also export each (sensor, feature)'s newest raw and calibrated value "
            "(tesla_gateway_sensor_raw_micrograms_per_cubic_meter{sensor,feature}, "
            "tesla_gateway_sensor_calibrated_micrograms_per_cubic_meter{sensor,feature,model}): "
            "up to two series per sensor and feature, so off by default."
        ),
    )

    @model_validator(mode="after")
    def _usable(self) -> Self:
        split_listen(self.listen)
        try:  # the library's aiohttp handler serves /metrics: prometheus_client >= 0.24
            importlib.import_module("prometheus_client.aiohttp")
        except ImportError as exc:
            raise ValueError(f"[metrics] needs the 'metrics' extra: {EXTRA_HINT}") from exc
        return self

    @property
    def host(self) -> str:
        return split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return split_listen(self.listen)[1]
