"""The MQTT source against a real mosquitto: payload variants, rejects, persistent session."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

from devkit.broker import Mosquitto
from tesla_gateway.contract.readings import Reading, RejectReason
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.ingest.sharding import shard_of
from tesla_gateway.sources.mqtt_source import MqttSource, MqttSourceConfig, MqttSourceStats
from tests.gateway.io.helpers import broker_config, eventually, publish_raw


@contextlib.asynccontextmanager
async def running(
    source: MqttSource, queue: asyncio.Queue[Reading], rejects: RejectCounter
) -> AsyncIterator[None]:
    task = asyncio.create_task(source.run(queue, rejects))
    try:
        await asyncio.wait_for(source.wait_connected(), 10)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def take(queue: asyncio.Queue[Reading], n: int) -> list[Reading]:
    return [await asyncio.wait_for(queue.get(), 10) for _ in range(n)]


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_every_payload_variant_arrives_as_a_validated_reading(
    mosquitto: Mosquitto, protocol: str
) -> None:
    now = time.time()
    ms = int((now - 30) * 1000)
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(now) - 20))
    payloads = [
        ("sensors/s1/raw", {"sensor": "s1", "ts": now - 40, "pm10": 10.0}),
        ("sensors/s2/raw", {"ts": ms, "pm2_5": 5.0, "pm1": 2.0}),
        ("sensors/s3/raw", {"timestamp": iso, "pm10": 3.0, "rh": 50, "temp_c": 21.5}),
        ("sensors/s4/raw", {"time": now - 10, "pm25": 4.0}),
        ("sensors/s5/raw", [{"ts": now - 5, "pm10": 1.0}, {"ts": now - 4, "pm10": 2.0}]),
    ]

    async def scenario() -> list[Reading]:
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        config = MqttSourceConfig(broker=broker_config(mosquitto, protocol=protocol))
        source = MqttSource(config, gateway_id=f"gw{protocol.replace('.', '')}")
        async with running(source, queue, RejectCounter()):
            await asyncio.to_thread(
                publish_raw, mosquitto, [(t, json.dumps(p).encode()) for t, p in payloads]
            )
            return await take(queue, 6)

    readings = asyncio.run(scenario())
    assert [r.sensor_id for r in readings] == ["s1", "s2", "s3", "s4", "s5", "s5"]
    assert readings[0].timestamp == pytest.approx(now - 40)
    assert readings[1].timestamp == pytest.approx(ms / 1000)
    assert readings[2].timestamp == int(now) - 20
    assert dict(readings[2].values) == {"pm10": 3.0, "rh": 50.0, "temp_c": 21.5}
    assert dict(readings[3].values) == {"pm2_5": 4.0}
    assert [r.values["pm10"] for r in readings[4:]] == [1.0, 2.0]
    assert all(r.source == "mqtt" for r in readings)


def test_every_malformed_kind_is_counted_and_survived(mosquitto: Mosquitto) -> None:
    now = time.time()
    bad: list[tuple[str, bytes, RejectReason]] = [
        ("sensors/s1/raw", b"\xff\xfe", RejectReason.BAD_ENCODING),
        ("sensors/s1/raw", b"{not json", RejectReason.BAD_JSON),
        ("sensors/s1/raw", b"x" * 2000, RejectReason.TOO_LARGE),
        ("sensors/s1/raw", b'{"pm10": "12"}', RejectReason.SCHEMA),
        ("sensors/s1/raw", b'{"pm10": 1, "co2": 3}', RejectReason.UNKNOWN_FIELD),
        ("sensors/bad!id/raw", b'{"pm10": 1}', RejectReason.BAD_SENSOR_ID),
        ("sensors/intruder/raw", b'{"pm10": 1}', RejectReason.UNKNOWN_SENSOR),
        ("sensors/s1/raw", b"{}", RejectReason.NO_VALUES),
        ("sensors/s1/raw", b'{"pm10": NaN}', RejectReason.NOT_FINITE),
        ("sensors/s1/raw", b'{"pm10": -3}', RejectReason.NEGATIVE),
        ("sensors/s1/raw", b'{"pm10": 99999}', RejectReason.OUT_OF_RANGE),
        (
            "sensors/s1/raw",
            json.dumps({"ts": now + 3600, "pm10": 1}).encode(),
            RejectReason.FUTURE_TIMESTAMP,
        ),
        (
            "sensors/s1/raw",
            json.dumps({"ts": now - 86400 * 30, "pm10": 1}).encode(),
            RejectReason.STALE_TIMESTAMP,
        ),
    ]

    async def scenario() -> tuple[list[Reading], RejectCounter]:
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        rejects = RejectCounter()
        config = MqttSourceConfig(
            broker=broker_config(mosquitto),
            max_payload_bytes=1024,
            allowed_sensors=["s1", "bad!id"],
        )
        source = MqttSource(config, gateway_id="gw")
        async with running(source, queue, rejects):
            messages = [(topic, payload) for topic, payload, _ in bad]
            messages.append(("sensors/s1/raw", json.dumps({"ts": now, "pm10": 7.0}).encode()))
            await asyncio.to_thread(publish_raw, mosquitto, messages)
            readings = await take(queue, 1)
        return readings, rejects

    with capture_logs():
        readings, rejects = asyncio.run(scenario())
    assert [r.values["pm10"] for r in readings] == [7.0]  # the good one after all the bad
    for _, _, reason in bad:
        assert rejects.count(reason, source="mqtt") == 1, reason
    assert rejects.count() == len(bad)


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_persistent_session_delivers_readings_sent_while_the_gateway_was_down(
    mosquitto: Mosquitto, protocol: str
) -> None:
    now = time.time()
    config = MqttSourceConfig(
        broker=broker_config(mosquitto, protocol=protocol), session_expiry_s=3600
    )

    async def first_run() -> None:
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        async with running(MqttSource(config, gateway_id="gw"), queue, RejectCounter()):
            pass  # the session and its subscription now exist on the broker

    async def second_run() -> list[Reading]:
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        async with running(MqttSource(config, gateway_id="gw"), queue, RejectCounter()):
            return await take(queue, 5)

    asyncio.run(first_run())
    messages = [
        (f"sensors/s{n}/raw", json.dumps({"ts": now - 60 + n, "pm10": float(n)}).encode())
        for n in range(5)
    ]
    publish_raw(mosquitto, messages)  # the gateway is down
    mosquitto.restart()  # and the broker restarts meanwhile: the session is persisted
    readings = asyncio.run(second_run())
    assert [r.values["pm10"] for r in readings] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_without_persistent_session_nothing_is_kept(mosquitto: Mosquitto) -> None:
    """The control for the test above: it can fail."""
    config = MqttSourceConfig(broker=broker_config(mosquitto), persistent_session=False)

    async def run_once(marker: bool) -> list[Reading]:
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        async with running(MqttSource(config, gateway_id="gw"), queue, RejectCounter()):
            if not marker:
                return []
            marker_payload = json.dumps({"pm10": 99.0}).encode()
            await asyncio.to_thread(publish_raw, mosquitto, [("sensors/s1/raw", marker_payload)])
            return await take(queue, 1)

    asyncio.run(run_once(False))
    publish_raw(mosquitto, [("sensors/s1/raw", json.dumps({"pm10": 1.0}).encode())])
    [first] = asyncio.run(run_once(True))
    assert first.values["pm10"] == 99.0  # the reading sent while down was not kept


def test_slow_consumer_backpressure_keeps_every_reading(mosquitto: Mosquitto) -> None:
    """A full queue holds acknowledgements back instead of dropping readings."""

    async def scenario() -> list[Reading]:
        queue: asyncio.Queue[Reading] = asyncio.Queue(maxsize=2)
        source = MqttSource(MqttSourceConfig(broker=broker_config(mosquitto)), gateway_id="gw")
        async with running(source, queue, RejectCounter()):
            messages = [
                ("sensors/s1/raw", json.dumps({"pm10": float(n)}).encode()) for n in range(50)
            ]
            await asyncio.to_thread(publish_raw, mosquitto, messages)
            await eventually(queue.full)
            return await take(queue, 50)

    readings = asyncio.run(scenario())
    assert [r.values["pm10"] for r in readings] == [float(n) for n in range(50)]


def test_a_sharded_source_reports_what_it_left_to_other_shards(mosquitto: Mosquitto) -> None:
    # Shard 0 of 2: the readings of the other shard's sensors are counted in the source's own
    # stats snapshot (read-only: nothing outside the source can reset the count).
    ids = [f"s{n}" for n in range(12)]
    mine = [sensor for sensor in ids if shard_of(sensor, 2) == 0]
    assert 0 < len(mine) < len(ids)

    async def scenario() -> tuple[list[Reading], MqttSourceStats, MqttSource]:
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        config = MqttSourceConfig.model_validate(
            {"broker": broker_config(mosquitto), "shard": {"index": 0, "count": 2}}
        )
        source = MqttSource(config, gateway_id="gw-shard0")
        now = time.time()
        async with running(source, queue, RejectCounter()):
            await asyncio.to_thread(
                publish_raw,
                mosquitto,
                [(f"sensors/{s}/raw", json.dumps({"ts": now, "pm10": 1.0}).encode()) for s in ids],
            )
            readings = await take(queue, len(mine))
            await eventually(lambda: source.stats().other_shard == len(ids) - len(mine))
            return readings, source.stats(), source

    readings, stats, source = asyncio.run(scenario())
    assert sorted(r.sensor_id for r in readings) == sorted(mine)
    assert stats.connected
    assert stats.other_shard == source.other_shard == len(ids) - len(mine)
    assert isinstance(stats.inbox, dict)
    with pytest.raises(AttributeError):
        source.other_shard = 0  # type: ignore[misc]
