"""The gateway.toml of a gateway in cluster mode, for the cluster demo, the bench and the
cluster tests (tests/cluster/harness.py).

No ``[[sources]]``: in cluster mode a gateway takes its readings from its partitions of the
readings stream. Calibrated values go to MQTT through a nats-server's MQTT listener (3.1.1).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devkit.demo.gateway_config import DEMO_SITE_ZONE

__all__ = ["ClusterGatewayConfig", "write_cluster_config"]


@dataclass(frozen=True, slots=True)
class ClusterGatewayConfig:
    """What one cluster gateway's gateway.toml is made from."""

    work_dir: Path
    gateway_id: str
    model_dirs: Sequence[Path]  # each sensor gets the one with the most channels it reports
    servers: Sequence[str]
    mqtt_port: int
    partitions: int = 6
    replicas: int = 3
    pin_ttl_s: float = 5.0
    snapshot_interval_s: float = 2.0
    grace_s: float = 5.0
    settle_s: float = 0.1
    status_interval_s: float = 0.5
    max_kv_value_bytes: int = 512 * 1024  # the product's default; smaller: the object store
    extra: str = ""  # TOML appended as is: [[sources]] and sections of the caller's own

    @property
    def state_dir(self) -> Path:
        return self.work_dir / "state"

    @property
    def path(self) -> Path:
        return self.work_dir / "gateway.toml"


def write_cluster_config(config: ClusterGatewayConfig) -> Path:
    """Write gateway.toml; strings go through json.dumps, which TOML reads as basic strings."""
    config.work_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Generated for one run by devkit/cluster_demo/config.py.",
        f"gateway_id = {json.dumps(config.gateway_id)}",
        f"state_dir = {json.dumps(str(config.state_dir))}",
        f"timezone = {json.dumps(DEMO_SITE_ZONE)}",  # the demo slice's site, for the hour
    ]
    for index, model_dir in enumerate(config.model_dirs):
        lines += ["", "[[models]]", 'feature = "pm10"', f"model_dir = {json.dumps(str(model_dir))}"]
        if index:
            lines.append(f'id = "pm10-{index}"')
    lines += [
        "",
        "[tick]",
        f"grace_s = {config.grace_s}",
        f"settle_s = {config.settle_s}",
        "",
        "[state]",
        f"status_interval_s = {config.status_interval_s}",
        "save_interval_s = 600",
        "",
        "[sensors]",
        "allow_unknown = true",
        "",
        "[logging]",
        'format = "json"',
        'level = "info"',
        "",
        "[publisher]",
        "stats_interval_s = 5",
        "shutdown_flush_s = 2",
        "",
        "[publisher.broker]",
        f"port = {config.mqtt_port}",
        'protocol = "3.1.1"  # nats-server\'s MQTT listener refuses MQTT 5',
        "reconnect_initial_s = 0.1",
        "reconnect_max_s = 1",
        "",
        "[cluster]",
        f"servers = {json.dumps(list(config.servers))}",
        f"partitions = {config.partitions}",
        f"replicas = {config.replicas}",
        f"pin_ttl_s = {config.pin_ttl_s}",
        f"snapshot_interval_s = {config.snapshot_interval_s}",
        f"max_kv_value_bytes = {config.max_kv_value_bytes}",
        config.extra,
    ]
    config.path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return config.path
