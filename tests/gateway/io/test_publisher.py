"""The publisher against a real mosquitto: order, retain, will, store-and-forward, bound."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from devkit.broker import Mosquitto
from tesla_gateway.contract.calibrated import CalibratedReading, Interval, Quality
from tesla_gateway.monitor.monitor import SensorDocument
from tesla_gateway.mqtt.errors import MqttNotConnectedError
from tesla_gateway.publish.config import PublisherConfig
from tesla_gateway.publish.errors import PublisherError
from tesla_gateway.publish.payloads import reading_message, reading_payload
from tesla_gateway.publish.publisher import Publisher
from tests.gateway.io.helpers import broker_config, collecting, eventually
from tests.support.puback_cut import PubackCut

T0 = 1_700_000_000.0


def reading(n: int, sensor: str = "s1", feature: str = "pm10") -> CalibratedReading:
    return CalibratedReading(
        sensor_id=sensor,
        feature=feature,
        period_start=T0 + 60 * n,
        period_seconds=60,
        raw=10.0 + n,
        calibrated=8.0 + n,
        unit="ug/m3",
        model_name="tesla-pm10",
        model_version=3,
        quality=(Quality.OK,),
    )


def config(broker: Mosquitto, **extra: object) -> PublisherConfig:
    values: dict[str, object] = {"broker": broker_config(broker), "stats_interval_s": 3600}
    values.update(extra)
    return PublisherConfig.model_validate(values)


def test_payload_document() -> None:
    warm = CalibratedReading(
        sensor_id="s1",
        feature="pm2_5",
        period_start=T0,
        period_seconds=60,
        raw=4.5,
        calibrated=None,
        unit="ug/m3",
        model_name="tesla-pm25",
        model_version=None,
        quality=(Quality.WARMING_UP,),
    )
    assert reading_payload(warm) == {
        "ts": "2023-11-14T22:14:20Z",
        "period_start": "2023-11-14T22:13:20Z",
        "period_s": 60,
        "raw": 4.5,
        "calibrated": None,
        "unit": "µg/m³",
        "model": "tesla-pm25",
        "model_version": None,
        "quality": ["warming_up"],
    }


def test_delivers_in_order_retained_with_availability(mosquitto: Mosquitto, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Publisher(config(mosquitto), gateway_id="gw1", state_dir=tmp_path) as publisher:
            for n in range(30):
                publisher.submit([reading(n), reading(n, sensor="s2", feature="pm2_5")])
            await asyncio.wait_for(publisher.wait_idle(), 10)
            assert publisher.stats()["published"] == 60

    with collecting(mosquitto, ["tesla/gw1/#"]) as live:
        asyncio.run(scenario())
        live.wait_for(
            lambda m: any(x.topic == "tesla/gw1/status" and x.payload == b"offline" for x in m)
        )
        values = [json.loads(p)["raw"] for p in live.on("tesla/gw1/s1/pm10")]
        assert values == [10.0 + n for n in range(30)]
        assert len(live.on("tesla/gw1/s2/pm2_5")) == 30
        assert live.on("tesla/gw1/status") == [b"online", b"offline"]  # clean shutdown says so
    with collecting(mosquitto, ["tesla/gw1/#"]) as late:  # a late subscriber: retained values
        late.wait_for(lambda m: len(m) == 3)
        latest = json.loads(late.on("tesla/gw1/s1/pm10")[0])
        assert latest["raw"] == 39.0
        assert latest["model_version"] == 3
        assert all(m.retain for m in late.messages)


def test_last_will_says_offline_when_the_gateway_dies(mosquitto: Mosquitto, tmp_path: Path) -> None:
    script = f"""
import asyncio, sys
from pathlib import Path
from tesla_gateway.publish.config import PublisherConfig
from tesla_gateway.publish.publisher import Publisher
config = PublisherConfig.model_validate_json(sys.argv[1])
async def main():
    async with Publisher(config, gateway_id="gwdie", state_dir=Path({str(tmp_path)!r})) as p:
        while not p.connected:
            await asyncio.sleep(0.01)
        print("connected", flush=True)
        await asyncio.sleep(3600)
asyncio.run(main())
"""
    with collecting(mosquitto, ["tesla/gwdie/status"]) as live:
        process = subprocess.Popen(
            [sys.executable, "-c", script, config(mosquitto).model_dump_json()],
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[3],
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
        )
        try:
            assert process.stdout is not None
            for line in process.stdout:  # structlog's own lines come first
                if line.strip() == b"connected":
                    break
            live.wait_for(lambda m: [x.payload for x in m] == [b"online"])
            process.send_signal(signal.SIGKILL)  # no clean DISCONNECT: the broker sends the will
            process.wait(10)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        live.wait_for(lambda m: [x.payload for x in m] == [b"online", b"offline"])


def test_store_and_forward_across_a_broker_outage(mosquitto: Mosquitto, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Publisher(config(mosquitto), gateway_id="gw2", state_dir=tmp_path) as publisher:
            await asyncio.wait_for(_connected(publisher), 10)
            for n in range(10):
                publisher.submit([reading(n)])
            await asyncio.wait_for(publisher.wait_idle(), 10)
            await asyncio.to_thread(live.wait_for, lambda m: len(m) == 10)
            mosquitto.stop()
            await eventually(lambda: not publisher.connected)
            for n in range(10, 50):  # the broker is down: these queue in the outbox
                publisher.submit([reading(n)])
            assert publisher.queued == 40
            mosquitto.start()
            await asyncio.wait_for(publisher.wait_idle(), 20)

    with collecting(mosquitto, ["tesla/gw2/s1/#"], persistent_id="observer") as live:
        with capture_logs():
            asyncio.run(scenario())
        # The last message arriving means the outbox is drained; loss or reordering before it
        # shows up in the assertions below.
        last = reading_message(reading(49))
        live.wait_for(lambda m: any(x.payload == last for x in m), timeout_s=20)
        values = [json.loads(p)["raw"] for p in live.on("tesla/gw2/s1/pm10")]
    # Zero loss, in order. The only repeats allowed are of messages delivered before the outage:
    # the broker redelivers those to the observer's own persisted session (its leg, not ours).
    assert list(dict.fromkeys(values)) == [10.0 + n for n in range(50)]
    after_outage = values[values.index(20.0) :]
    assert after_outage == [10.0 + n for n in range(10, 50)]


def test_a_batch_cut_after_its_first_acknowledgement_resends_the_rest_in_order(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """Five readings go out in one write; the broker takes the first and acknowledges it, then
    the connection is lost with the other four unsent. Only the first leaves the outbox: the
    four are sent again, in order, once the gateway reconnects."""

    async def scenario() -> dict[str, object]:
        async with PubackCut(mosquitto.host, mosquitto.port) as proxy:
            settings = PublisherConfig.model_validate(
                {"broker": broker_config(mosquitto, port=proxy.port), "stats_interval_s": 3600}
            )
            async with Publisher(settings, gateway_id="gw12", state_dir=tmp_path) as publisher:
                await asyncio.wait_for(_connected(publisher), 10)
                cut = proxy.arm("tesla/gw12/s1/pm10")
                publisher.submit([reading(n) for n in range(5)])
                await asyncio.wait_for(cut.wait(), 10)
                await asyncio.wait_for(publisher.wait_idle(), 20)
                return publisher.stats()

    with collecting(mosquitto, ["tesla/gw12/s1/#"]) as live:
        with capture_logs() as logs:
            stats = asyncio.run(scenario())
        live.wait_for(lambda m: len(m) >= 5, timeout_s=20)
        values = [json.loads(p)["raw"] for p in live.on("tesla/gw12/s1/pm10")]
    assert values == [10.0 + n for n in range(5)]  # the broker never had 2..5 before the cut
    assert stats["published"] == 5 and stats["queued"] == 0
    assert "publisher_waiting_for_broker" in [log["event"] for log in logs]


def test_bound_drops_the_oldest_and_counts_them(mosquitto: Mosquitto, tmp_path: Path) -> None:
    publisher = Publisher(
        config(mosquitto, outbox_max_messages=5), gateway_id="gw3", state_dir=tmp_path
    )
    with capture_logs() as logs:
        publisher.submit([reading(n) for n in range(8)])  # not connected yet: all queue
    assert publisher.queued == 5
    assert publisher.stats()["dropped"] == 3
    assert [log["event"] for log in logs] == ["outbox_full_dropped_oldest"]

    async def scenario() -> None:
        async with publisher:
            await asyncio.wait_for(publisher.wait_idle(), 10)

    with collecting(mosquitto, ["tesla/gw3/s1/#"]) as live:
        asyncio.run(scenario())
        live.wait_for(lambda m: len(m) == 5)
        assert [json.loads(p)["raw"] for p in live.on("tesla/gw3/s1/pm10")] == [
            10.0 + n for n in range(3, 8)
        ]


def test_outbox_survives_a_restart(mosquitto: Mosquitto, tmp_path: Path) -> None:
    first = Publisher(config(mosquitto), gateway_id="gw4", state_dir=tmp_path)
    first.submit([reading(n) for n in range(4)])

    async def close_without_broker() -> None:
        await first.aclose()

    mosquitto.stop()
    asyncio.run(close_without_broker())
    mosquitto.start()
    second = Publisher(config(mosquitto), gateway_id="gw4", state_dir=tmp_path)
    assert second.queued == 4

    async def deliver() -> None:
        async with second:
            await asyncio.wait_for(second.wait_idle(), 10)

    with collecting(mosquitto, ["tesla/gw4/s1/#"]) as live:
        asyncio.run(deliver())
        live.wait_for(lambda m: len(m) == 4)
        assert [json.loads(p)["raw"] for p in live.on("tesla/gw4/s1/pm10")] == [
            10.0,
            11.0,
            12.0,
            13.0,
        ]


def test_discovery_and_stats(mosquitto: Mosquitto, tmp_path: Path) -> None:
    async def scenario() -> None:
        cfg = config(mosquitto, discovery=True, stats_interval_s=0.05, topic_prefix="site/a")
        async with Publisher(cfg, gateway_id="gw5", state_dir=tmp_path) as publisher:
            publisher.submit_stats({"readings_in": 12, "rejected": {"bad_json": 1}})
            publisher.submit([reading(0), reading(0, feature="pm2_5")])
            await asyncio.wait_for(publisher.wait_idle(), 10)
            assert await publisher.publish_stats()

    with collecting(mosquitto, ["homeassistant/#", "site/a/stats"]) as live:
        asyncio.run(scenario())
        # the gateway's device, then calibrated and raw per (sensor, feature)
        live.wait_for(lambda m: len([x for x in m if x.topic.startswith("homeassistant")]) == 5)
        live.wait_for(lambda m: any(x.topic == "site/a/stats" for x in m))
        pm10 = json.loads(live.on("homeassistant/sensor/tesla_gw5/s1_pm10/config")[0])
        assert pm10["device_class"] == "pm10"
        assert pm10["unit_of_measurement"] == "\u03bcg/m\u00b3"  # HA's constant (Greek mu)
        assert pm10["state_topic"] == "site/a/s1/pm10"
        assert pm10["availability"][0]["topic"] == "site/a/status"
        assert pm10["availability"][1]["topic"] == "site/a/s1/availability"
        assert pm10["availability_mode"] == "all"
        assert pm10["device"]["via_device"] == "tesla_gw5"
        assert pm10["value_template"] == "{{ value_json.calibrated }}"
        pm25 = json.loads(live.on("homeassistant/sensor/tesla_gw5/s1_pm2_5/config")[0])
        assert pm25["device_class"] == "pm25"
        stats = json.loads(live.on("site/a/stats")[-1])
        assert stats["readings_in"] == 12
        assert stats["publisher"]["published"] == 2


async def _connected(publisher: Publisher) -> None:
    await eventually(lambda: publisher.connected)


def test_a_refused_message_is_counted_and_does_not_block_the_queue(tmp_path: Path) -> None:
    acl = "topic readwrite tesla/gw6/status\ntopic readwrite tesla/gw6/ok/#\ntopic read #\n"
    broker = Mosquitto(tmp_path / "acl", acl=acl)
    broker.start()
    try:

        async def scenario() -> dict[str, object]:
            publisher = Publisher(config(broker), gateway_id="gw6", state_dir=tmp_path / "state")
            publisher.submit([reading(0, sensor="denied"), reading(1, sensor="ok")])
            async with publisher:
                await asyncio.wait_for(publisher.wait_idle(), 10)
                return publisher.stats()

        with collecting(broker, ["tesla/gw6/#"]) as live:
            with capture_logs() as logs:
                stats = asyncio.run(scenario())
            live.wait_for(lambda m: len(live.on("tesla/gw6/ok/pm10")) == 1)
        assert stats["refused"] == 1
        assert stats["published"] == 1
        assert "publish_refused" in [log["event"] for log in logs]
    finally:
        broker.stop()


def test_stats_after_close_and_submit_after_close(mosquitto: Mosquitto, tmp_path: Path) -> None:
    publisher = Publisher(config(mosquitto), gateway_id="gw7", state_dir=tmp_path)
    publisher.submit([reading(0)])
    mosquitto.stop()
    asyncio.run(publisher.aclose())
    assert publisher.stats()["queued"] == 1  # the last counts stay readable for the status
    with pytest.raises(PublisherError, match="closed"):
        publisher.submit([reading(1)])


def test_batch_topic_carries_each_ticks_readings_as_arrays(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    cfg = config(mosquitto, per_sensor_topics=False, batch_topic=True, batch_max_readings=2)

    async def scenario() -> None:
        async with Publisher(cfg, gateway_id="gw1", state_dir=tmp_path) as publisher:
            publisher.submit([reading(0, sensor=f"s{i}") for i in range(3)])
            publisher.submit([reading(1, sensor="s0", feature="pm2_5")])
            await asyncio.wait_for(publisher.wait_idle(), 10)

    with collecting(mosquitto, ["tesla/gw1/#"]) as live:
        asyncio.run(scenario())
        live.wait_for(lambda m: len([x for x in m if "_batch" in x.topic]) == 3)
    batches = [m for m in live.messages if "_batch" in m.topic]
    assert [m.topic for m in batches] == ["tesla/gw1/_batch/pm10"] * 2 + ["tesla/gw1/_batch/pm2_5"]
    assert not any(m.retain for m in batches)
    documents = [json.loads(m.payload) for m in batches]
    assert [[d["sensor"] for d in batch] for batch in documents] == [["s0", "s1"], ["s2"], ["s0"]]
    assert documents[0][1] == {"sensor": "s1", **reading_payload(reading(0, sensor="s1"))}
    assert not [m for m in live.messages if m.topic.endswith(("/s0/pm10", "/s1/pm10"))]


def test_a_publisher_must_publish_readings_somewhere(mosquitto: Mosquitto) -> None:
    with pytest.raises(ValueError, match="cannot both be false"):
        config(mosquitto, per_sensor_topics=False)


class _WithheldAcks:
    """A connection whose PUBACKs the test releases by hand: the only way to hold a real
    broker's acknowledgements at chosen points. Everything else the publisher needs from
    MqttConnection (connected, receive maximum) is trivial here."""

    connected = True
    server_receive_maximum = 65_535

    def __init__(self) -> None:
        self.sent: list[tuple[str, asyncio.Future[None]]] = []

    def start_publish_many(
        self, messages: list[tuple[str, bytes, bool]]
    ) -> list[asyncio.Future[None]]:
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[None]] = [loop.create_future() for _ in messages]
        self.sent += [(topic, f) for (topic, _, _), f in zip(messages, futures, strict=True)]
        return futures

    async def wait_disconnected(self) -> None:
        await asyncio.Event().wait()


def test_the_window_slides_one_acknowledgement_at_a_time(tmp_path: Path) -> None:
    # in_flight 4, ten readings: each PUBACK lets exactly one more message go, in order, and a
    # message is deleted from the outbox only once acknowledged.
    settings = PublisherConfig.model_validate(
        {"broker": {"host": "127.0.0.1", "port": 1}, "in_flight": 4, "stats_interval_s": 3600}
    )
    publisher = Publisher(settings, gateway_id="gw9", state_dir=tmp_path / "state")
    connection = _WithheldAcks()

    def sent_count(count: int) -> Callable[[], bool]:
        return lambda: len(connection.sent) == count

    async def scenario() -> None:
        publisher.submit([reading(n) for n in range(10)])
        drain = asyncio.create_task(publisher._delivery.drain(connection))  # type: ignore[arg-type]
        await eventually(sent_count(4))
        await asyncio.sleep(0.05)
        assert len(connection.sent) == 4  # the window is full: nothing more goes out
        for acknowledged in range(6):
            connection.sent[acknowledged][1].set_result(None)
            await eventually(sent_count(5 + acknowledged))
            assert len(publisher._outbox) == 10 - (acknowledged + 1)
        for _, future in connection.sent[6:]:
            future.set_result(None)
        await eventually(lambda: len(publisher._outbox) == 0)
        drain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await drain

    asyncio.run(scenario())
    assert [topic for topic, _ in connection.sent] == ["tesla/gw9/s1/pm10"] * 10
    publisher._outbox.close()


def test_monitor_documents_go_on_the_topics_the_publisher_resolves(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    # The service hands the monitor's documents over as they are; the publisher's topic scheme
    # puts each on <prefix>/<sensor>/<feature>/<kind>, retained, with the document as JSON.
    health = SensorDocument("health", "s1", "pm10", {"ts": "2023-11-14T22:13:20Z", "ok": True})
    drift = SensorDocument("drift", "s2", "pm2_5", {"drift": True, "threshold": 2.5})

    async def scenario() -> None:
        cfg = config(mosquitto, topic_prefix="site/b")
        async with Publisher(cfg, gateway_id="gw10", state_dir=tmp_path) as publisher:
            publisher.submit_documents([health, drift])
            await asyncio.wait_for(publisher.wait_idle(), 10)

    asyncio.run(scenario())
    with collecting(mosquitto, ["site/b/#"]) as live:  # after: what the broker retained
        live.wait_for(lambda m: len([x for x in m if x.topic.count("/") == 4]) == 2)
        documents = {m.topic: m for m in live.messages if m.topic.count("/") == 4}
    assert documents["site/b/s1/pm10/health"].payload == (
        b'{"ts": "2023-11-14T22:13:20Z", "ok": true}'
    )
    assert documents["site/b/s2/pm2_5/drift"].payload == b'{"drift": true, "threshold": 2.5}'
    assert all(m.retain for m in documents.values())


def test_a_document_whose_ids_cannot_be_a_topic_is_skipped_and_counted(tmp_path: Path) -> None:
    settings = PublisherConfig.model_validate({"broker": {"host": "127.0.0.1", "port": 1}})
    publisher = Publisher(settings, gateway_id="gw11", state_dir=tmp_path)
    publisher.submit_documents([SensorDocument("health", "s/+", "pm10", {})])
    assert publisher.queued == 0
    assert publisher.stats()["unpublishable"] == 1  # (test_publisher_ids.py: the rest go out)
    asyncio.run(publisher.aclose())


def test_an_evicted_sensor_that_comes_back_while_offline_keeps_its_discovery(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """Eviction's removals and the returning sensor's configs can meet in one delivery window
    (the broker was away): the configs must end up retained, not the removal."""
    topic = "homeassistant/sensor/tesla_gw7/s1_pm10/config"

    async def scenario() -> None:
        publisher = Publisher(
            config(mosquitto, discovery=True), gateway_id="gw7", state_dir=tmp_path
        )
        publisher.sensor_seen("s1")
        publisher.submit([reading(0)])
        publisher.forget_sensors(["s1"])  # admission evicted it
        publisher.sensor_seen("s1")  # and it is back before the broker is
        publisher.submit([reading(1)])
        async with publisher:
            await asyncio.wait_for(publisher.wait_idle(), 10)

    with collecting(mosquitto, ["homeassistant/#", "tesla/gw7/s1/availability"]) as live:
        asyncio.run(scenario())
        live.wait_for(lambda m: len([x for x in m if x.topic == topic]) >= 3)
    with collecting(mosquitto, ["homeassistant/#", "tesla/gw7/s1/availability"]) as late:
        late.wait_for(lambda m: any(x.topic == topic for x in m))
        assert json.loads(late.on(topic)[-1])["state_topic"] == "tesla/gw7/s1/pm10"
        late.wait_for(lambda m: any(x.topic == "tesla/gw7/s1/availability" for x in m))
        assert late.on("tesla/gw7/s1/availability") == [b"online"]


def test_a_quiet_sensor_goes_offline_on_its_availability_topic(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    async def scenario() -> None:
        cfg = config(mosquitto, sensor_offline_after_s=0.2)
        async with Publisher(cfg, gateway_id="gw8", state_dir=tmp_path) as publisher:
            publisher.sensor_seen("s1")
            publisher.sensor_seen("s2")
            await eventually(lambda: publisher.stats()["sensors_online"] == 0)
            publisher.sensor_seen("s2")
            await asyncio.wait_for(publisher.wait_idle(), 10)
            assert publisher.stats()["sensors_online"] == 1

    with collecting(mosquitto, ["tesla/gw8/+/availability"]) as live:
        asyncio.run(scenario())
        live.wait_for(lambda m: len(m) == 5)
        assert live.on("tesla/gw8/s1/availability") == [b"online", b"offline"]
        assert live.on("tesla/gw8/s2/availability") == [b"online", b"offline", b"online"]


def test_payload_carries_the_interval_only_when_there_is_one() -> None:
    plain = reading(0)
    assert "interval" not in reading_payload(plain)
    with_interval = dataclasses.replace(plain, interval=Interval(low=8.5, high=11.3, level=0.9))
    assert reading_payload(with_interval)["interval"] == {"low": 8.5, "high": 11.3, "level": 0.9}


# -- delivery's promises beyond QoS 1 and the happy path (survivors of make mutation) ----------


def test_qos_2_readings_go_out_in_order_retained_at_qos_2(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    async def scenario() -> dict[str, object]:
        cfg = config(mosquitto, qos=2)
        async with Publisher(cfg, gateway_id="gq", state_dir=tmp_path) as publisher:
            publisher.submit([reading(n) for n in range(5)])
            await asyncio.wait_for(publisher.wait_idle(), 10)
            with collecting(mosquitto, ["tesla/gq/#"], qos=2) as late:  # retained, while up
                late.wait_for(lambda m: len(m) == 2)
                assert {(m.topic, m.payload, m.retain) for m in late.messages} == {
                    ("tesla/gq/status", b"online", True),
                    ("tesla/gq/s1/pm10", reading_message(reading(4)), True),
                }
            return publisher.stats()

    with collecting(mosquitto, ["tesla/gq/#"], qos=2) as live:
        stats = asyncio.run(scenario())
        live.wait_for(lambda m: len([x for x in m if x.topic == "tesla/gq/s1/pm10"]) == 5)
    data = [m for m in live.messages if m.topic == "tesla/gq/s1/pm10"]
    assert [json.loads(m.payload)["raw"] for m in data] == [10.0 + n for n in range(5)]
    assert {m.qos for m in data} == {2}
    assert [m.qos for m in live.messages if m.payload == b"online"] == [1]  # status: QoS 1
    assert stats["published"] == 5 and stats["refused"] == 0


def test_refused_status_discovery_and_readings_are_each_counted_and_logged(
    tmp_path: Path,
) -> None:
    # Discovery refused too (publish_or_log). The status stays allowed: a refused "offline"
    # at close raises MqttPublishError out of Publisher.aclose (not suppressed there).
    acl = "topic readwrite tesla/gw6/status\ntopic readwrite tesla/gw6/ok/#\ntopic read #\n"
    broker = Mosquitto(tmp_path / "acl", acl=acl)
    broker.start()
    try:

        async def scenario() -> dict[str, object]:
            cfg = config(broker, discovery=True)
            publisher = Publisher(cfg, gateway_id="gw6", state_dir=tmp_path / "state")
            publisher.submit([reading(0, sensor="denied"), reading(1, sensor="ok")])
            publisher.submit([reading(2, sensor="denied2")])
            async with publisher:
                await asyncio.wait_for(publisher.wait_idle(), 10)
                return publisher.stats()

        with capture_logs() as logs:
            stats = asyncio.run(scenario())
        refused = [e for e in logs if e["event"] == "publish_refused"]
        topics = [e["topic"] for e in refused]
        assert {"tesla/gw6/denied/pm10", "tesla/gw6/denied2/pm10"} <= set(topics)
        assert len([topic for topic in topics if topic.startswith("homeassistant/")]) >= 2
        # Each says why: the broker's reason (an ACL here), not just that it failed.
        assert all(
            "not authorized" in str(e["error"]).lower() and e["log_level"] == "error"
            for e in refused
        ), [e["error"] for e in refused]
        assert stats["refused"] == len(refused) >= 4
        assert stats["published"] == 1
    finally:
        broker.stop()


def _held_publisher(tmp_path: Path) -> tuple[Publisher, _WithheldAcks]:
    settings = PublisherConfig.model_validate(
        {"broker": {"host": "127.0.0.1", "port": 1}, "in_flight": 4, "stats_interval_s": 3600}
    )
    return Publisher(settings, gateway_id="gw9", state_dir=tmp_path / "state"), _WithheldAcks()


def test_new_messages_go_out_while_the_window_has_room_without_waiting_for_an_ack(
    tmp_path: Path,
) -> None:
    publisher, connection = _held_publisher(tmp_path)

    def sent_count(count: int) -> Callable[[], bool]:
        return lambda: len(connection.sent) == count

    async def scenario() -> None:
        publisher.submit([reading(n) for n in range(3)])
        drain = asyncio.create_task(publisher._delivery.drain(connection))  # type: ignore[arg-type]
        await eventually(sent_count(3))
        publisher.submit([reading(3)])  # one place left in the window: it goes at once
        await eventually(sent_count(4))
        for _, future in connection.sent:
            future.set_result(None)
        await eventually(lambda: len(publisher._outbox) == 0)
        publisher.submit([reading(4)])  # idle, then woken: the same drain sends it
        await eventually(sent_count(5))
        assert not drain.done()
        connection.sent[4][1].set_result(None)
        await eventually(lambda: len(publisher._outbox) == 0)
        drain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await drain

    asyncio.run(scenario())
    publisher._outbox.close()


def test_a_lost_connection_settles_every_acknowledged_message_first(tmp_path: Path) -> None:
    """The oldest fails as not connected, a later one was acknowledged, one is unanswered: the
    acknowledged one leaves the outbox (never sent again), the others stay, in order."""
    publisher, connection = _held_publisher(tmp_path)

    async def scenario() -> None:
        publisher.submit([reading(n) for n in range(3)])
        drain = asyncio.create_task(publisher._delivery.drain(connection))  # type: ignore[arg-type]
        await eventually(lambda: len(connection.sent) == 3)
        connection.sent[2][1].set_result(None)
        connection.sent[0][1].set_exception(MqttNotConnectedError("gone"))
        with pytest.raises(MqttNotConnectedError):
            await drain
        remaining = publisher._outbox.peek(10)
        assert [json.loads(m.payload)["raw"] for m in remaining] == [10.0, 11.0]
        connection.sent[1][1].cancel()  # never answered: dropped with the connection

    asyncio.run(scenario())
    publisher._outbox.close()


def test_a_cancelled_drain_leaves_its_unanswered_publishes_quietly(tmp_path: Path) -> None:
    """Cancelled with publishes in flight: the cancellation goes through, and their later
    outcomes (an error, a cancellation) are never reported as unhandled."""
    publisher, connection = _held_publisher(tmp_path)
    reported: list[dict[str, object]] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: reported.append(context)
        )
        publisher.submit([reading(n) for n in range(2)])
        drain = asyncio.create_task(publisher._delivery.drain(connection))  # type: ignore[arg-type]
        await eventually(lambda: len(connection.sent) == 2)
        drain.cancel()
        with pytest.raises(asyncio.CancelledError):
            await drain
        connection.sent[0][1].set_exception(MqttNotConnectedError("gone"))
        connection.sent[1][1].cancel()
        await asyncio.sleep(0)
        connection.sent.clear()
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(scenario())
    gc.collect()
    assert reported == []
    publisher._outbox.close()


class _Refusing(_WithheldAcks):
    """A connection that says it is up and refuses every publish as not connected."""

    def start_publish_many(
        self, messages: list[tuple[str, bytes, bool]]
    ) -> list[asyncio.Future[None]]:
        raise MqttNotConnectedError("not connected")

    async def wait_connected(self) -> None:
        return None


def test_a_refused_send_waits_for_the_broker_and_says_how_many_are_queued(tmp_path: Path) -> None:
    publisher, _ = _held_publisher(tmp_path)
    connection = _Refusing()

    async def connected(_: object) -> None:
        return None

    async def scenario() -> list[dict[str, object]]:
        publisher.submit([reading(n) for n in range(3)])
        with capture_logs() as logs:
            run = asyncio.create_task(
                publisher._delivery.run(connection, on_connected=connected)  # type: ignore[arg-type]
            )
            await eventually(lambda: len(logs) >= 2)
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
        return [dict(entry) for entry in logs]

    logs = asyncio.run(scenario())
    assert logs[0] == {
        "event": "publisher_waiting_for_broker",
        "log_level": "info",
        "prefix": "tesla/gw9",
        "queued": 3,
    }
    publisher._outbox.close()
