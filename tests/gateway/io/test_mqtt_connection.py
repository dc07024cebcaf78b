"""MqttConnection against a real mosquitto: acks, refusals, outages, persistent sessions."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import ValidationError
from structlog.testing import capture_logs

from devkit.broker import Mosquitto, make_test_pki
from tesla_gateway.errors import ConfigError
from tesla_gateway.mqtt.config import MqttBrokerConfig
from tesla_gateway.mqtt.connection import MqttConnection
from tesla_gateway.mqtt.errors import MqttNotConnectedError, MqttPublishError
from tesla_gateway.mqtt.inbox import InboundMessage
from tests.gateway.io.helpers import broker_config, collecting, eventually, publish_raw


@pytest.fixture(
    params=[("fast", "thread"), ("plain", "thread"), ("fast", "event_loop")],
    ids=["fast", "plain", "fast-event-loop"],
)
def paho_setup(request: pytest.FixtureRequest) -> dict[str, str]:
    """Every connection test runs on both paho clients (the plain fallback must behave the same)
    and on both network loops (paho's thread, the event loop itself)."""
    client, io_loop = request.param
    return {"client": client, "io_loop": io_loop}


def test_publish_completes_on_puback_and_reaches_subscribers(
    mosquitto: Mosquitto, paho_setup: dict[str, str]
) -> None:
    async def scenario() -> None:
        async with MqttConnection(
            broker_config(mosquitto, **paho_setup), client_id="pub", clean_start=True
        ) as connection:
            assert connection.client_kind == paho_setup["client"]
            await asyncio.wait_for(connection.wait_connected(), 10)
            for n in range(20):
                await connection.publish("t/x", str(n).encode(), qos=1)

    with collecting(mosquitto, ["t/#"]) as collector:
        asyncio.run(scenario())
        collector.wait_for(lambda m: len(m) == 20)
        assert collector.on("t/x") == [str(n).encode() for n in range(20)]


def _open_descriptors() -> set[str]:
    return {entry.name for entry in Path("/proc/self/fd").iterdir()}


def test_a_closed_connection_leaves_no_descriptor_open(
    mosquitto: Mosquitto, paho_setup: dict[str, str]
) -> None:
    """Closing returns every descriptor at once, paho's wake-up socket pair included: left to
    the garbage collector, a client in a reference cycle can have its sockets finalised first
    (an 'unclosed socket' ResourceWarning in a later, unrelated place) and a reconnecting
    daemon holds two more descriptors per dead client until a collection runs."""

    async def scenario() -> None:
        async with MqttConnection(
            broker_config(mosquitto, **paho_setup), client_id="fds", clean_start=True
        ) as connection:
            await asyncio.wait_for(connection.wait_connected(), 10)
            await connection.publish("t/x", b"1", qos=1)

    gc.disable()  # what closing leaves open, not what a collection would close
    try:
        before = _open_descriptors()
        asyncio.run(scenario())
        left = _open_descriptors() - before
    finally:
        gc.enable()
    assert left == set()


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_subscribe_and_receive_in_order(
    mosquitto: Mosquitto, protocol: str, paho_setup: dict[str, str]
) -> None:
    received: list[InboundMessage] = []

    async def on_message(message: InboundMessage) -> None:
        received.append(message)

    async def scenario() -> None:
        config = broker_config(mosquitto, **paho_setup, protocol=protocol)
        async with (
            MqttConnection(config, client_id="sub", clean_start=True, on_message=on_message) as sub,
            MqttConnection(config, client_id="pub", clean_start=True) as pub,
        ):
            await sub.subscribe(["in/+"])
            await asyncio.wait_for(sub.wait_connected(), 10)
            await asyncio.wait_for(pub.wait_connected(), 10)
            for n in range(10):
                await pub.publish(f"in/{n % 3}", str(n).encode())
            await eventually(lambda: len(received) == 10)

    asyncio.run(scenario())
    assert [m.payload for m in received] == [str(n).encode() for n in range(10)]
    assert received[4].topic == "in/1"


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_publish_many_in_one_write_arrives_intact_and_in_order(
    mosquitto: Mosquitto, protocol: str, paho_setup: dict[str, str]
) -> None:
    # The packets are encoded by the gateway, not paho: payload sizes either side of the 1-,
    # 2- and 3-byte remaining-length encodings, retain on every other one (an empty retained
    # payload would clear the topic), and a topic the broker cannot take, which fails alone.
    prefix = f"many{protocol.replace('.', '')}"
    sizes = [0, 1, 100, 120, 128, 16_000, 16_380, 16_384, 200_000]
    messages = [
        (f"{prefix}/{i}", bytes([65 + i]) * size, i % 2 == 1) for i, size in enumerate(sizes)
    ]

    async def scenario() -> list[BaseException | None]:
        config = broker_config(mosquitto, **paho_setup, protocol=protocol)
        async with MqttConnection(config, client_id=prefix, clean_start=True) as connection:
            await asyncio.wait_for(connection.wait_connected(), 10)
            futures = connection.start_publish_many([*messages, (f"{prefix}/+", b"x", False)])
            return await asyncio.gather(*futures, return_exceptions=True)

    with collecting(mosquitto, [f"{prefix}/#"]) as live:
        results = asyncio.run(scenario())
        live.wait_for(lambda m: len(m) >= len(sizes))
        received = [(m.topic, len(m.payload), m.payload[:1]) for m in live.messages]
    assert received == [(t, len(p), p[:1]) for t, p, _ in messages]
    assert [m.payload for m in live.messages] == [payload for _, payload, _ in messages]
    assert results[:-1] == [None] * len(sizes)
    assert isinstance(results[-1], MqttPublishError)
    with collecting(mosquitto, [f"{prefix}/#"]) as later:  # retained ones are kept for newcomers
        later.wait_for(lambda m: len(m) >= 4)
        assert sorted(m.topic for m in later.messages) == [f"{prefix}/{i}" for i in (1, 3, 5, 7)]
        assert all(m.retain for m in later.messages)


def test_a_persistent_sessions_queue_is_acknowledged_as_it_arrives(
    mosquitto: Mosquitto, paho_setup: dict[str, str]
) -> None:
    """The broker sends a persistent session's queue right after CONNACK, before the connection
    is reported up; those messages must be acknowledged too, or each holds one of the broker's
    20 in-flight slots and delivery stops (found by the long broker-restart test)."""
    received: list[InboundMessage] = []

    async def on_message(message: InboundMessage) -> None:
        received.append(message)

    config = broker_config(mosquitto, **paho_setup)

    def subscriber() -> MqttConnection:  # the same persistent session each time
        return MqttConnection(
            config,
            client_id="queued-sub",
            clean_start=False,
            session_expiry_s=3600,
            on_message=on_message,
        )

    async def scenario() -> None:
        async with subscriber() as sub:
            await sub.subscribe(["queued/#"])
            await asyncio.wait_for(sub.wait_connected(), 10)
        async with MqttConnection(config, client_id="queued-pub", clean_start=True) as pub:
            await asyncio.wait_for(pub.wait_connected(), 10)
            for n in range(200):  # queued for the offline session
                await pub.publish("queued/x", str(n).encode())
        async with subscriber() as sub:
            await sub.subscribe(["queued/#"])
            await eventually(lambda: len(received) >= 200)

    asyncio.run(scenario())
    assert [m.payload for m in received] == [str(n).encode() for n in range(200)]


def test_acknowledgements_flow_so_the_broker_keeps_sending(
    mosquitto: Mosquitto, paho_setup: dict[str, str]
) -> None:
    """mosquitto sends a 3.1.1 client at most 20 unacknowledged QoS 1 messages: all 500 arrive
    only if the batched PUBACKs reach it."""
    received: list[InboundMessage] = []

    async def on_message(message: InboundMessage) -> None:
        received.append(message)

    async def scenario() -> None:
        config = broker_config(mosquitto, **paho_setup, protocol="3.1.1")
        async with (
            MqttConnection(config, client_id="sub", clean_start=True, on_message=on_message) as sub,
            MqttConnection(config, client_id="pub", clean_start=True) as pub,
        ):
            await sub.subscribe(["in/#"])
            await asyncio.wait_for(sub.wait_connected(), 10)
            await asyncio.wait_for(pub.wait_connected(), 10)
            await asyncio.gather(
                *(pub.start_publish(f"in/{n % 7}", str(n).encode(), qos=1) for n in range(500))
            )
            await eventually(lambda: len(received) == 500)

    asyncio.run(scenario())
    assert [int(m.payload) for m in received] == list(range(500))


def test_lean_and_paho_receive_paths_keep_order_and_fields(
    mosquitto: Mosquitto, paho_setup: dict[str, str]
) -> None:
    """QoS 0/1 without properties take the lean decoder; QoS 2 and MQTT 5 properties take
    paho's own path: both deliver every message, in order, with topic, payload, QoS and retain."""
    received: list[InboundMessage] = []

    async def on_message(message: InboundMessage) -> None:
        received.append(message)

    publisher = paho.Client(
        callback_api_version=CallbackAPIVersion.VERSION2,
        client_id="raw-pub",
        protocol=MQTTProtocolVersion.MQTTv5,
    )
    user_property = Properties(PacketTypes.PUBLISH)
    user_property.UserProperty = ("k", "v")
    sent = [
        ("in/a", b"plain-qos1", 1, None, False),
        ("in/b", b"with-properties", 1, user_property, False),
        ("in/\u00e9", "caf\u00e9".encode(), 0, None, False),
        ("in/c", b"qos2", 2, None, False),
        ("in/d", b"", 1, None, False),
        ("in/e", b"x" * 70_000, 1, None, False),
    ]

    async def scenario() -> None:
        config = broker_config(mosquitto, **paho_setup, protocol="5")
        async with MqttConnection(
            config, client_id="sub", clean_start=True, on_message=on_message
        ) as sub:
            await sub.subscribe(["in/#"], qos=2)
            await asyncio.wait_for(sub.wait_connected(), 10)
            publisher.connect(mosquitto.host, mosquitto.port)
            publisher.loop_start()
            try:
                # One at a time: paho hands a QoS 2 message over at PUBREL, which the broker
                # may send after the next message's PUBLISH.
                for count, (topic, payload, qos, properties, retain) in enumerate(sent, 1):
                    publisher.publish(
                        topic, payload, qos=qos, retain=retain, properties=properties
                    ).wait_for_publish(10)
                    await eventually(functools.partial(_has_length, received, count))
            finally:
                publisher.disconnect()
                publisher.loop_stop()

    asyncio.run(scenario())
    assert [(m.topic, m.payload, m.qos, m.retain) for m in received] == [
        (topic, payload, qos, retain) for topic, payload, qos, _, retain in sent
    ]


def test_refused_connection_is_not_connected_and_publish_raises(
    tmp_path: Path, paho_setup: dict[str, str]
) -> None:
    broker = Mosquitto(tmp_path / "auth", users={"gateway": "right"})
    broker.start()
    try:

        async def scenario() -> None:
            config = broker_config(broker, **paho_setup, username="gateway", password="wrong")
            with capture_logs() as logs:
                async with MqttConnection(config, client_id="c", clean_start=True) as connection:
                    await eventually(
                        lambda: [x["event"] for x in logs].count("mqtt_connect_failed") >= 2
                    )
                    assert "refused" in logs[0]["error"]
                    assert not connection.connected
                with pytest.raises(MqttNotConnectedError):
                    await connection.publish("t", b"x")
            password_file = tmp_path / "secret"
            password_file.write_text("right\n", encoding="utf-8")
            config = broker_config(
                broker, **paho_setup, username="gateway", password_file=password_file
            )
            async with MqttConnection(config, client_id="c", clean_start=True) as connection:
                await asyncio.wait_for(connection.wait_connected(), 10)
                await connection.publish("t", b"x")

        asyncio.run(scenario())
    finally:
        broker.stop()


def test_a_failing_handler_stops_the_connection_and_serve_raises_its_error(
    mosquitto: Mosquitto, paho_setup: dict[str, str]
) -> None:
    """The supervisor and the dispatcher run as one group: when the handler fails, serve() and
    close() raise its error and the supervisor stops too (it used to go on reconnecting with
    nobody handling the messages), and close() still disconnects."""

    async def on_message(_message: InboundMessage) -> None:
        raise RuntimeError("handler broke")

    async def scenario() -> None:
        connection = MqttConnection(
            broker_config(mosquitto, **paho_setup),
            client_id="failing",
            clean_start=True,
            on_message=on_message,
        )
        with pytest.raises(RuntimeError, match="handler broke"):
            async with connection:
                await connection.subscribe(["fail/x"])
                await asyncio.wait_for(connection.wait_connected(), 10)
                await asyncio.to_thread(publish_raw, mosquitto, [("fail/x", b"1")])
                with pytest.raises(RuntimeError, match="handler broke"):
                    await asyncio.wait_for(connection.serve(), 10)
                running = {task.get_name() for task in asyncio.all_tasks() if not task.done()}
                assert "mqtt-supervisor" not in running
        assert not connection.connected

    asyncio.run(scenario())


def test_outage_fails_loudly_then_reconnects(
    mosquitto: Mosquitto, paho_setup: dict[str, str]
) -> None:
    async def scenario() -> None:
        async with MqttConnection(
            broker_config(mosquitto, **paho_setup), client_id="pub", clean_start=True
        ) as connection:
            await asyncio.wait_for(connection.wait_connected(), 10)
            first_generation = connection.generation
            mosquitto.stop()
            await eventually(lambda: not connection.connected)
            with pytest.raises(MqttNotConnectedError):
                await connection.publish("t", b"lost?")
            mosquitto.start()
            await asyncio.wait_for(connection.wait_connected(), 10)
            assert connection.generation == first_generation + 1
            await connection.publish("t", b"back")

    asyncio.run(scenario())


def test_config_rejects_inconsistent_credentials(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="password needs a username"):
        MqttBrokerConfig.model_validate({"password": "x"})
    with pytest.raises(ValidationError, match="either password or password_file"):
        MqttBrokerConfig.model_validate(
            {"username": "u", "password": "x", "password_file": str(tmp_path / "p")}
        )
    with pytest.raises(ValidationError, match="extra"):
        MqttBrokerConfig.model_validate({"hots": "typo"})
    missing = MqttBrokerConfig(username="u", password_file=tmp_path / "missing")
    with pytest.raises(ConfigError, match="cannot be read"):
        missing.resolve_password()
    assert "secret" not in repr(
        MqttBrokerConfig.model_validate({"username": "u", "password": "secret"})
    )


def test_unreadable_tls_files_are_a_config_error(
    mosquitto: Mosquitto, tmp_path: Path, paho_setup: dict[str, str]
) -> None:
    config = broker_config(
        mosquitto, **paho_setup, tls={"ca_file": str(tmp_path / "missing-ca.pem")}
    )

    async def scenario() -> None:
        async with MqttConnection(config, client_id="c", clean_start=True) as connection:
            await asyncio.wait_for(connection.serve(), 10)

    with pytest.raises(ConfigError, match="ca_file"):
        asyncio.run(scenario())


def test_tls_with_ca_and_client_certificate(tmp_path: Path, paho_setup: dict[str, str]) -> None:
    pki = make_test_pki(tmp_path / "pki")
    broker = Mosquitto(tmp_path / "tls", tls=pki)
    broker.start()
    try:
        tls = {
            "ca_file": str(pki.ca),
            "cert_file": str(pki.client_cert),
            "key_file": str(pki.client_key),
        }

        async def scenario() -> None:
            async with MqttConnection(
                broker_config(broker, **paho_setup, tls=tls),
                client_id="tls",
                clean_start=True,
            ) as connection:
                await asyncio.wait_for(connection.wait_connected(), 10)
                await connection.publish("t/tls", b"secret reading")
            # Without a client certificate the broker refuses the handshake: never connected.
            without_cert = broker_config(broker, **paho_setup, tls={"ca_file": str(pki.ca)})
            with capture_logs() as logs:
                async with MqttConnection(
                    without_cert, client_id="anon", clean_start=True
                ) as other:
                    await eventually(
                        lambda: [x["event"] for x in logs].count("mqtt_connect_failed") >= 2
                    )
                    assert not other.connected

        asyncio.run(scenario())
    finally:
        broker.stop()


def _has_length(items: list[InboundMessage], length: int) -> bool:
    return len(items) == length


@pytest.mark.parametrize(("protocol", "expected"), [("5", 20), ("3.1.1", 65_535)])
def test_the_brokers_receive_maximum_is_known(
    mosquitto: Mosquitto, protocol: str, expected: int, paho_setup: dict[str, str]
) -> None:
    """mosquitto announces max_inflight_messages (default 20) in its MQTT 5 CONNACK; the
    publisher never keeps more than that in flight, whatever publisher.in_flight says."""

    async def scenario() -> int:
        async with MqttConnection(
            broker_config(mosquitto, **paho_setup, protocol=protocol),
            client_id="rm",
            clean_start=True,
        ) as connection:
            await asyncio.wait_for(connection.wait_connected(), 10)
            return connection.server_receive_maximum

    assert asyncio.run(scenario()) == expected


def _flood(broker: Mosquitto, topic: str, count: int, qos: int) -> paho.Client:
    """A plain paho publisher that sends ``count`` messages as fast as it can (not waiting for
    acknowledgements); the caller disconnects it."""
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="flood")
    client.max_queued_messages_set(0)
    client.max_inflight_messages_set(1000)
    client.connect(broker.host, broker.port)
    client.loop_start()
    for n in range(count):
        client.publish(topic, str(n).encode(), qos=qos)
    return client


class BlockedConsumer:
    """An ``on_message`` that handles nothing until ``release`` is set: the inbox fills."""

    def __init__(self) -> None:
        self.received: list[InboundMessage] = []
        self.release = asyncio.Event()

    async def __call__(self, message: InboundMessage) -> None:
        await self.release.wait()
        self.received.append(message)


@contextlib.asynccontextmanager
async def flood_subscriber(
    config: MqttBrokerConfig, consumer: BlockedConsumer, bound: int
) -> AsyncIterator[MqttConnection]:
    """A connection subscribed to ``flood/#`` (QoS 1) with an inbox of ``bound`` messages."""
    async with MqttConnection(
        config, client_id="sub", clean_start=True, on_message=consumer, max_inbox=bound
    ) as sub:
        await sub.subscribe(["flood/#"], qos=1)
        await asyncio.wait_for(sub.wait_connected(), 10)
        yield sub


def _stop(client: paho.Client) -> None:
    client.disconnect()
    client.loop_stop()


@pytest.mark.parametrize("client", ["fast", "plain"])
@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_a_qos0_flood_is_bounded_by_the_inbox_and_the_excess_is_counted(
    mosquitto: Mosquitto, protocol: str, client: str
) -> None:
    """Finding 5 (issue 12): a QoS 0 flood faster than the gateway handles messages grew the
    inbox without bound. Here the consumer does not move at all until the flood is over: at
    most max_inbox messages wait, the rest are dropped and counted, none is lost silently.
    (paho's thread; on the event loop reading stops at the bound instead: the next test.)"""
    flood, bound = 20_000, 200
    consumer = BlockedConsumer()
    received, release = consumer.received, consumer.release

    async def scenario() -> dict[str, int]:
        config = broker_config(mosquitto, client=client, io_loop="thread", protocol=protocol)
        async with flood_subscriber(config, consumer, bound) as sub:
            publisher = await asyncio.to_thread(_flood, mosquitto, "flood/q0", flood, 0)
            try:
                # A QoS 1 marker after the flood: once it is held back at the bound, every
                # QoS 0 message before it has been read.
                publisher.publish("flood/marker", b"end", qos=1)
                await eventually(lambda: sub.inbox_stats()["held_back"] >= 1, 30)
                stats = sub.inbox_stats()
                release.set()
                await eventually(lambda: len(received) == bound + 1, 30)
            finally:
                await asyncio.to_thread(_stop, publisher)
            return stats

    with capture_logs() as logs:
        stats = asyncio.run(scenario())
    assert stats["buffered"] == stats["peak"] == stats["max"] == bound
    assert stats["dropped_qos0"] == flood - bound  # mosquitto delivered all; we dropped these
    assert [m.payload for m in received[:-1]] == [str(n).encode() for n in range(bound)]
    assert received[-1].payload == b"end"
    drops = [entry for entry in logs if entry["event"] == "mqtt_inbox_full_dropped"]
    assert len(drops) == 1  # rate-limited: one line for the whole burst
    # The line is written when the dispatcher next wakes: after the release it says all of
    # them; on a loaded machine it may wake during the flood and say the count so far (the
    # stats above are exact either way).
    assert 0 < drops[0]["dropped_total"] <= flood - bound


def test_on_the_event_loop_a_qos0_flood_stops_reading_at_the_bound(mosquitto: Mosquitto) -> None:
    """With io_loop = event_loop, reading on to drop would take the loop's time from the
    messages already in: the socket is read no more once the inbox is full (one message is
    dropped and counted, the one that found it full), and reading resumes, in order, as soon as
    the consumer makes room."""
    flood, bound = 20_000, 200
    consumer = BlockedConsumer()
    received, release = consumer.received, consumer.release

    async def scenario() -> tuple[dict[str, int], dict[str, int]]:
        config = broker_config(mosquitto, io_loop="event_loop")
        async with flood_subscriber(config, consumer, bound) as sub:
            publisher = await asyncio.to_thread(_flood, mosquitto, "flood/q0", flood, 0)
            try:
                publisher.publish("flood/marker", b"end", qos=1)
                await eventually(lambda: sub.inbox_stats()["dropped_qos0"] >= 1, 30)
                await asyncio.sleep(0.5)  # had reading gone on, the drops would grow meanwhile
                full = sub.inbox_stats()
                release.set()
                await eventually(lambda: bool(received) and received[-1].payload == b"end", 30)
            finally:
                await asyncio.to_thread(_stop, publisher)
            return full, sub.inbox_stats()

    full, after = asyncio.run(scenario())
    assert full["buffered"] == full["peak"] == bound and full["dropped_qos0"] == 1
    assert after["peak"] == bound  # never over the bound for QoS 0
    numbers = [int(m.payload) for m in received[:-1]]
    assert numbers[:bound] == list(range(bound))  # the first ones, then the one dropped
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)  # in order, once
    # What was neither received nor dropped here was dropped by the broker (its queue for a
    # client that does not read): the gateway sees that through the senders' seq numbers.
    assert len(numbers) + after["dropped_qos0"] <= flood


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_qos1_beyond_the_inbox_waits_at_the_broker_and_none_is_lost(
    mosquitto: Mosquitto, protocol: str, paho_setup: dict[str, str]
) -> None:
    """QoS 1 is never dropped at the bound: paho's thread holds the next message back and
    reads no more, so the rest stay unacknowledged at the broker until there is room."""
    count, bound = 300, 5
    consumer = BlockedConsumer()
    received, release = consumer.received, consumer.release

    async def scenario() -> tuple[dict[str, int], dict[str, int]]:
        config = broker_config(mosquitto, **paho_setup, protocol=protocol)
        async with flood_subscriber(config, consumer, bound) as sub:
            publisher = await asyncio.to_thread(_flood, mosquitto, "flood/q1", count, 1)
            try:
                await eventually(lambda: sub.inbox_stats()["held_back"] >= 1, 30)
                await asyncio.sleep(0.3)  # had the bound leaked, more would arrive meanwhile
                held = sub.inbox_stats()
                release.set()
                await eventually(lambda: len(received) == count, 30)
            finally:
                await asyncio.to_thread(_stop, publisher)
            return held, sub.inbox_stats()

    held, after = asyncio.run(scenario())
    over = 1 if paho_setup["io_loop"] == "event_loop" else 0  # the one that paused reading
    assert held["buffered"] == held["peak"] == bound + over
    assert held["dropped_qos0"] == after["dropped_qos0"] == 0
    assert after["peak"] == bound + over
    assert [m.payload for m in received] == [str(n).encode() for n in range(count)]


def test_closing_while_a_message_is_held_back_does_not_hang(
    mosquitto: Mosquitto, paho_setup: dict[str, str]
) -> None:
    async def on_message(_message: InboundMessage) -> None:
        await asyncio.Event().wait()  # never returns: the inbox stays full

    async def scenario() -> None:
        sub = MqttConnection(
            broker_config(mosquitto, **paho_setup),
            client_id="sub",
            clean_start=True,
            on_message=on_message,
            max_inbox=1,
        )
        async with sub:
            await sub.subscribe(["flood/#"], qos=1)
            await asyncio.wait_for(sub.wait_connected(), 10)
            publisher = await asyncio.to_thread(_flood, mosquitto, "flood/q1", 5, 1)
            try:
                await eventually(lambda: sub.inbox_stats()["held_back"] >= 1, 30)
                await asyncio.wait_for(sub.close(), 10)  # paho's thread lets the message go
            finally:
                await asyncio.to_thread(_stop, publisher)

    asyncio.run(scenario())
