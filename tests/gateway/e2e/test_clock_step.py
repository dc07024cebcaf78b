"""The gateway's wall clock steps a day forward and back; readings keep flowing (issue 26 item 11).

The field report: a bad NTP answer put the wall clock a day ahead for 15 s; afterwards every
reading of a sensor without a time of its own was ``late`` for 24 hours, because its open period
was a day ahead. The real service runs in this process against a real mosquitto, on a wall clock
the test shifts (the service's ``clock``: what the MQTT source stamps a reading without ``ts``
with and what the ticker reads); the steady clock it is compared with stays the real one. A
sensor publishes payloads without ``ts``; the clock steps while no reading is in flight.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion
from structlog.testing import capture_logs

from devkit.broker import Mosquitto
from tesla_gateway.contract.readings import RejectReason
from tesla_gateway.daemon.config import load_config
from tesla_gateway.daemon.service import GatewayService
from tesla_gateway.windows.outcome import AddOutcome
from tests.reliability.harness import copy_default_model, write_config

DAY = 86_400.0
WAIT_S = 30.0
EVERY_S = 0.1


class ShiftedClock:
    """The real wall clock plus an error the test sets."""

    def __init__(self) -> None:
        self.error = 0.0

    def __call__(self) -> float:
        return time.time() + self.error


class Node:
    """A sensor without a clock: JSON payloads without ``ts``, QoS 1, each acknowledged."""

    def __init__(self, broker: Mosquitto) -> None:
        self.sent = 0
        self._client = paho.Client(CallbackAPIVersion.VERSION2, client_id="clockless-node")
        self._client.connect("127.0.0.1", broker.port)
        self._client.loop_start()

    def send(self, pm10: float) -> None:
        payload = json.dumps({"pm10": pm10})
        self._client.publish("sensors/clockless/raw", payload, qos=1).wait_for_publish(WAIT_S)
        self.sent += 1

    def close(self) -> None:
        self._client.loop_stop()
        self._client.disconnect()


async def until(condition: object, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def scenario(service: GatewayService, clock: ShiftedClock, node: Node) -> None:
    run = asyncio.create_task(service.run())

    def ready() -> bool:
        assert not run.done(), "the service stopped"
        connected = service.sources.stats()["mqtt_sources_connected"]
        return service.reporter.phase == "running" and all(connected.values())  # type: ignore[attr-defined]

    async def send_for(seconds: float) -> None:
        for index in range(round(seconds / EVERY_S)):
            await asyncio.to_thread(node.send, 20.0 + index % 7)
            await asyncio.sleep(EVERY_S)
        await until(lambda: service.ticker.counters.readings_in == node.sent, "the readings")

    await until(ready, "the service")
    await send_for(1.0)
    clock.error = DAY  # the bad NTP answer ...
    await send_for(1.5)
    clock.error = 0.0  # ... and the next, good one
    await send_for(1.5)
    service.request_stop("test")
    assert await asyncio.wait_for(run, WAIT_S) == 0


def test_a_day_forward_and_back_leaves_no_reading_late(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    config = write_config(
        tmp_path / "gw.toml",
        gateway_id="gw-clock",
        model_dir=copy_default_model(tmp_path / "model"),
        broker_port=mosquitto.port,
    )
    clock = ShiftedClock()
    service = GatewayService(load_config(config), clock=clock)
    node = Node(mosquitto)
    try:
        with capture_logs() as logs:
            asyncio.run(scenario(service, clock, node))
    finally:
        node.close()
    counts = service.ticker.store["pm10"].counts
    assert counts[AddOutcome.LATE] == 0, f"{counts[AddOutcome.LATE]} readings late"
    assert service.rejects.count(RejectReason.LATE) == 0
    assert counts[AddOutcome.ACCEPTED] == node.sent
    # The sensor's open period is the true one, not a day ahead.
    assert service.ticker.last_seen()["clockless"] <= time.time() + 60
    steps = [entry for entry in logs if entry["event"] == "clock_step"]
    assert len(steps) == 2, steps  # each step logged once, with its size
    assert abs(float(steps[0]["step_s"]) - DAY) < 5 and abs(float(steps[1]["step_s"]) + DAY) < 5
    assert (
        json.loads((tmp_path / "state" / "status.json").read_text())["ticker"]["clock_steps"] == 2
    )
