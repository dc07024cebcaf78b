"""Sharding by sensor: two real daemons with different shards on one mosquitto calibrate every
sensor exactly once between them; plus the properties of the consistent hash itself."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from devkit.broker import Mosquitto
from tesla_gateway.contract.readings import SENSOR_ID_PATTERN
from tesla_gateway.ingest.sharding import ShardConfig, shard_of
from tests.reliability.harness import (
    PERIOD_S,
    Collector,
    Daemon,
    Sensors,
    copy_default_model,
    grid_base,
    iso,
    report,
    wait_for,
    write_config,
)

sensor_ids = st.from_regex(SENSOR_ID_PATTERN, fullmatch=True)


@given(sensor_ids, st.integers(1, 64))
def test_shard_is_in_range_and_stable(sensor_id: str, count: int) -> None:
    shard = shard_of(sensor_id, count)
    assert 0 <= shard < count
    assert shard_of(sensor_id, count) == shard
    assert sum(ShardConfig(index=i, count=count).owns(sensor_id) for i in range(count)) == 1


@settings(max_examples=50)
@given(sensor_ids, st.integers(1, 63))
def test_growing_by_one_shard_only_moves_sensors_to_the_new_one(sensor_id: str, count: int) -> None:
    before, after = shard_of(sensor_id, count), shard_of(sensor_id, count + 1)
    assert after in (before, count)


def test_shards_are_balanced() -> None:
    counts = Counter(shard_of(f"node-{i}", 4) for i in range(4000))
    assert all(850 <= n <= 1150 for n in counts.values()), counts


def test_shard_config_is_validated() -> None:
    with pytest.raises(ValidationError):
        ShardConfig(index=2, count=2)


@pytest.mark.reliability
def test_two_sharded_daemons_calibrate_every_sensor_exactly_once(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    sensors_n, periods = 12, 6
    names = [f"node-{i:02d}" for i in range(sensors_n)]
    owners = {name: shard_of(name, 2) for name in names}
    assert set(owners.values()) == {0, 1}  # both shards own sensors
    model = copy_default_model(tmp_path / "model")
    daemons = []
    collector = Collector(mosquitto.port)
    sensors = Sensors(mosquitto.port)
    try:
        for index in (0, 1):
            directory = tmp_path / f"gw{index}"
            directory.mkdir()
            config = write_config(
                directory / "gw.toml",
                gateway_id=f"gw-s{index}",
                model_dir=model,
                broker_port=mosquitto.port,
                shard=(index, 2),
            )
            daemons.append(Daemon(config, directory / "state"))
        base = grid_base(periods + 5)
        for period in range(periods):
            for name in names:
                sensors.send(name, base + period * PERIOD_S + 30, 20.0 + period)
        expected = {
            (f"gw-s{owners[name]}", name, iso(base + period * PERIOD_S))
            for name in names
            for period in range(periods)
        }
        wait_for(lambda: all(collector.snapshot()[key] for key in expected), "every sensor")
        statuses = [daemon.status() for daemon in daemons]
        for daemon in daemons:
            assert daemon.stop() == 0
    finally:
        sensors.close()
        collector.close()
        for daemon in daemons:
            daemon.kill()
    received = collector.snapshot()
    by_sensor_period = Counter((name, period) for _, name, period in received)
    assert set(received) == expected  # nothing from the wrong gateway
    assert all(n == 1 for n in by_sensor_period.values())  # exactly once
    windows = [s["windows"]["pm10"]["sensors"] for s in statuses]
    assert sum(windows) == sensors_n
    report(
        "sharding",
        {
            "gateways": 2,
            "sensors": sensors_n,
            "periods": periods,
            "sensors_per_gateway": windows,
            "calibrated_messages": sum(received.values()),
            "duplicated": sum(n - 1 for n in by_sensor_period.values()),
        },
    )
