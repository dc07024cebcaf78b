"""Cluster members flag a frozen sensor as one gateway does (tesla_gateway/contract/stuck.py).

Two real gateway processes share the partitions of one real nats-server; half the sensors send
exactly 0.0 every reading. With ``health.stuck_periods = 3`` (the default, 30, exceeds the test
model's window of 4), whichever member owns a sensor publishes each of its whole windows as
``stuck`` without a value, and each live sensor's as ``ok`` with one: the rule rides on the
member's ticker (Ticker -> ring), so both members must give the same flags.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from devkit.nats_servers import NatsServer
from tests.cluster.harness import (
    PERIOD_S,
    WINDOW,
    ClusterGateway,
    by_id,
    expected_periods,
    replay_into,
    sharing,
    stream_messages,
    value_of,
    wait_calibrated,
    wait_for,
    write_config,
)
from tests.support.models import ModelFactory

pytest.importorskip("nats")

SENSORS = [f"s{index:02d}" for index in range(12)]
DEAD = set(SENSORS[::2])
STUCK = 3
PERIODS = WINDOW + 4


def stuck_count(gateway: ClusterGateway) -> int:
    """Periods this member published as stuck (its status file's ticker counters)."""
    ticker = gateway.status().get("ticker") or {}
    return int((ticker.get("flagged") or {}).get("stuck", 0))


def test_both_members_withhold_a_frozen_sensor_and_calibrate_the_rest(
    nats_server: NatsServer, model_factory: ModelFactory, tmp_path: Path
) -> None:
    model = model_factory.get(window_length=WINDOW, period_seconds=PERIOD_S).path
    gateways = []
    for name in ("g0", "g1"):
        config = write_config(
            tmp_path / name,
            name,
            model,
            [nats_server.url],
            nats_server.mqtt_port,
            replicas=1,
            sources=f"[health]\nstuck_periods = {STUCK}\n",
        )
        gateways.append(ClusterGateway(tmp_path / name, name, config))
    start = (int(time.time()) // PERIOD_S - PERIODS - 3) * PERIOD_S  # a period boundary
    sent = [
        (
            sensor,
            start + step * 0.5,
            0.0 if sensor in DEAD else value_of(sensor, start + step * 0.5),
        )
        for step in range(4 * PERIODS)
        for sensor in SENSORS
    ]
    try:
        for gateway in gateways:
            gateway.start()
        for gateway in gateways:
            gateway.wait_ready(wait_sources=False)
        wait_for(lambda: sharing(gateways, [nats_server.url]), "two gateways sharing partitions")
        replay_into(nats_server.url, sent)
        expected = expected_periods(sent)
        wait_calibrated([nats_server.url], expected, "every closed period calibrated")
        withheld = len(DEAD) * (PERIODS - WINDOW)  # each dead sensor's whole windows
        counted = wait_for(
            lambda: (
                sum(counts := [stuck_count(gateway) for gateway in gateways]) == withheld and counts
            ),
            "both members' stats counting the stuck periods",
        )
        assert all(count > 0 for count in counted), counted  # each owned some dead sensors
    finally:
        for gateway in gateways:
            gateway.stop()
    documents = by_id(stream_messages([nats_server.url], "TESLA_CALIBRATED"))
    assert set(documents) == expected
    whole = {start + period * PERIOD_S for period in range(WINDOW - 1, PERIODS - 1)}
    for msg_id, document in documents.items():
        sensor, _, period_start = msg_id.split(".")
        if int(period_start) not in whole:
            assert document["quality"] == ["warming_up"], (msg_id, document)
            continue
        if sensor in DEAD:
            assert document["quality"] == ["stuck"], (msg_id, document)
            assert document["calibrated"] is None and "interval" not in document
            assert document["raw"] == 0.0
        else:
            assert document["quality"] == ["ok"], (msg_id, document)
            assert document["calibrated"] is not None
