"""Sensor ids cluster mode cannot carry, under the breaks attacker round 2 found (issue 29).

Before: a stream subject whose sensor token was no sensor id ('*', '>', 'café', 300 characters,
'room//2' from the MQTT topic ``sensors/room.2/raw`` on nats-server's MQTT listener) was
calibrated under that id; and a serial node 'room.1' (a valid id for one gateway) was published
to ``sensors.room.1.raw``, which no stream takes, retried every 0.5 s forever while every other
local sensor queued behind it. Real nats-server; the windows' owner is a real
:class:`WindowStore` behind the few methods the daemon's ticker lends the member (no models).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from paho.mqtt import publish as mqtt_publish

from devkit.nats_servers import NatsServer
from tesla_gateway.cluster.config import ClusterConfig
from tesla_gateway.cluster.engine import Engine, connect
from tesla_gateway.cluster.member import ClusterMember
from tesla_gateway.cluster.puller import StreamMessage
from tesla_gateway.cluster.traffic import SOURCE_NAME, Traffic
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading, RejectReason
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.ingest.rejects import RejectCounter
from tests.cluster.owners import StoreOwner, member_config, stats_of, until

_GEOMETRY = WindowGeometry(4, 60, ("pm10",), GapPolicy(max_interpolated_periods=2))
_WAIT_S = 40.0  # an upper bound on slow CI, never a timing assertion
_ODD_TOKENS = ["*", ">", "caf\u00e9", "a" * 300, "room//2", "_x", "-x", "x%2Fy", "\u202e"]


async def _stream_subjects(engine: Engine, stream: str) -> list[str]:
    """The subject of every message of a stream, in order."""
    info = await engine.js.stream_info(stream)
    subjects = []
    for sequence in range(info.state.first_seq, info.state.last_seq + 1):
        message = await engine.js.get_msg(stream, sequence)
        assert message.subject is not None
        subjects.append(message.subject)
    return subjects


@pytest.mark.parametrize("token", _ODD_TOKENS, ids=repr)
def test_a_subject_token_that_is_no_sensor_id_is_rejected_by_the_decode(token: str) -> None:
    rejects = RejectCounter()
    traffic = Traffic(member_config("nats://127.0.0.1:1"), rejects)
    payloads = [b'{"ts": 1700000000.0, "pm10": 1.0}', b'[{"ts": 1700000000.0, "pm10": 1.0}]']
    for payload in payloads:
        message = StreamMessage(f"sensors.part.0.{token}", payload, 1, 1_700_000_001.0)
        assert traffic.decode(message) == ()
    assert rejects.count(RejectReason.BAD_SENSOR_ID, source=SOURCE_NAME) == len(payloads)
    assert traffic.decoded == 0


def test_odd_ids_in_the_stream_are_rejected_counted_and_acked_beside_clean_ones(
    nats_server: NatsServer,
) -> None:
    """The live path: the MQTT node 'room.2' through nats-server's MQTT listener and odd
    subjects published by a plain client reach the member's decode; only the clean sensor
    reaches the windows, every odd message is counted by reason and acknowledged."""
    config = member_config(nats_server.url)
    owner, rejects = StoreOwner(), RejectCounter()
    member = ClusterMember(
        config,
        gateway_id="g0",
        ticker=owner,
        tick_lock=asyncio.Lock(),
        ingest=owner.ingest,
        on_dropped=lambda sensors: None,
        rejects=rejects,
    )
    odd = ["*", ">", "caf\u00e9", "a" * 300]

    async def run() -> None:
        engine = await connect(config, "node")
        task = asyncio.create_task(member.run())
        try:
            await until(
                task, lambda: stats_of(member)["partitions"].get("0", {}).get("ready"), "owning"
            )
            now = time.time()
            document = json.dumps({"ts": now, "pm10": 20.0}).encode()
            await asyncio.to_thread(
                mqtt_publish.single,
                "sensors/room.2/raw",
                document,
                qos=1,
                hostname="127.0.0.1",
                port=nats_server.mqtt_port,
            )
            for token in [*odd, "ok-1"]:
                await engine.js.publish(f"sensors.{token}.raw", document)
            await until(task, lambda: "ok-1" in owner.store.last_seen(), "the clean reading")
            # 'sensors.*.raw' and 'sensors.>.raw' are stored as they are (the partition
            # transform leaves a wildcard alone), so no partition's consumer delivers them.
            expected = len(odd) - 2 + 1  # café, 300 x 'a' and room//2
            await until(
                task, lambda: rejects.count(RejectReason.BAD_SENSOR_ID) >= expected, "rejects"
            )
            stored = await _stream_subjects(engine, config.readings_stream)
            assert "sensors.part.0.room//2" in stored  # the MQTT listener's spelling of room.2
            assert {"sensors.*.raw", "sensors.>.raw"} <= set(stored)
            assert set(owner.store.last_seen()) == {"ok-1"}
            assert rejects.count(RejectReason.BAD_SENSOR_ID, source=SOURCE_NAME) == expected
            assert stats_of(member)["decoded"] == 1
            info = await engine.js.consumer_info(config.readings_stream, "part-0")
            deadline = time.monotonic() + _WAIT_S
            while info.num_ack_pending or info.num_pending:  # acked: they never come back
                assert time.monotonic() < deadline, f"not acknowledged: {info}"
                await asyncio.sleep(0.2)
                info = await engine.js.consumer_info(config.readings_stream, "part-0")
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await engine.close()

    asyncio.run(run())


def _local(sensor_id: str, at: float) -> Reading:
    return Reading(sensor_id, at, {"pm10": 20.0}, "node")


async def _forwarding(
    config: ClusterConfig, rejects: RejectCounter
) -> tuple[Engine, Traffic, asyncio.Queue[Reading], asyncio.Task[None]]:
    engine = await connect(config, "g0")
    traffic = Traffic(config, rejects)
    queue: asyncio.Queue[Reading] = asyncio.Queue()
    task = asyncio.create_task(traffic.forward_local(engine, queue))
    return engine, traffic, queue, task


async def _stop(task: asyncio.Task[None], engine: Engine) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await engine.close()


def test_a_local_id_that_is_not_one_subject_token_is_rejected_and_others_keep_flowing(
    nats_server: NatsServer,
) -> None:
    """The serial node 'room.1' ahead of a clean one in the forward queue: rejected (its id
    named, counted by reason), and the clean one's readings all reach the stream."""
    config = member_config(nats_server.url)
    rejects = RejectCounter()

    async def run() -> None:
        engine, traffic, queue, task = await _forwarding(config, rejects)
        try:
            now = time.time()
            for step in range(4):
                queue.put_nowait(_local("room.1", now + step))
                queue.put_nowait(_local("serial-ok", now + step))
            await until(task, lambda: traffic.local_forwarded == 4, "the clean sensor's readings")
            assert traffic.stats()["local_rejected"] == 4
            assert rejects.count(RejectReason.BAD_SENSOR_ID, source="node") == 4
            stored = await _stream_subjects(engine, config.readings_stream)
            assert stored == ["sensors.part.0.serial-ok"] * 4
        finally:
            await _stop(task, engine)

    asyncio.run(run())


def test_a_reading_no_stream_takes_is_dropped_and_counted_not_retried_forever(
    nats_server: NatsServer,
) -> None:
    """With the readings stream gone the stream refuses for good: counted as refused and the
    next reading is tried; once the stream is back, readings flow again."""
    config = member_config(nats_server.url)
    rejects = RejectCounter()

    async def run() -> None:
        engine, traffic, queue, task = await _forwarding(config, rejects)
        try:
            await engine.js.delete_stream(config.readings_stream)
            now = time.time()
            queue.put_nowait(_local("s1", now))
            queue.put_nowait(_local("s2", now))
            await until(task, lambda: traffic.stats()["local_refused"] == 2, "both refused")
            await (await connect(config, "other")).close()  # makes the stream again
            queue.put_nowait(_local("s3", now + 1))
            await until(task, lambda: traffic.local_forwarded == 1, "s3 forwarded")
            stored = await _stream_subjects(engine, config.readings_stream)
            assert stored == ["sensors.part.0.s3"]
        finally:
            await _stop(task, engine)

    asyncio.run(run())


def test_a_server_outage_is_retried_and_loses_nothing(nats_server: NatsServer) -> None:
    """Transient: the only server stops while readings wait; they are kept (not refused, not
    given up) and stored once each after it is back."""
    config = member_config(nats_server.url)
    rejects = RejectCounter()

    async def run() -> None:
        engine, traffic, queue, task = await _forwarding(config, rejects)
        try:
            await asyncio.to_thread(nats_server.stop)
            now = time.time()
            for step in range(3):
                queue.put_nowait(_local("s1", now + step))
            await asyncio.sleep(2.0)  # several failed attempts while it is down
            assert traffic.local_forwarded == 0
            await asyncio.to_thread(nats_server.start)
            await until(task, lambda: traffic.local_forwarded == 3, "all three forwarded")
            stats = traffic.stats()
            assert (stats["local_refused"], stats["local_failed"]) == (0, 0)
            stored = await _stream_subjects(engine, config.readings_stream)
            assert stored == ["sensors.part.0.s1"] * 3
        finally:
            await _stop(task, engine)

    asyncio.run(run())
