"""A broker outage while readings keep coming in over serial: store-and-forward, no loss, order.

The broker is stopped mid-stream. The serial node keeps reporting; the daemon keeps calibrating
and queues the calibrated readings in its outbox (visible in status.json). When the broker is
back, every queued reading is delivered, in period order, to an observer whose persistent
session spans the outage; the MQTT source reconnects and its readings are calibrated again.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest

from devkit.broker import Mosquitto
from devkit.pty import PtySerial
from tests.gateway.e2e.harness import (
    MODEL,
    Calibrated,
    Daemon,
    MqttNodes,
    N,
    P,
    SerialNode,
    grid_base,
    iso,
    litert_expected,
    wait_for,
    windows_ending_at,
    write_config,
)
from tests.support.models import ModelFactory
from tests.support.published import as_published

BEFORE = N + 2  # periods delivered before the outage
DURING = 15  # periods calibrated while the broker is down
PERIODS = BEFORE + DURING


@pytest.mark.parametrize("io_loop", ["thread", "event_loop"])
def test_outage_queues_calibrated_readings_and_delivers_all_in_order(
    tmp_path: Path,
    mosquitto: Mosquitto,
    pty_serial: PtySerial,
    model_factory: ModelFactory,
    *,
    daemons: list[Daemon],
    io_loop: str,
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    config = write_config(
        tmp_path, mosquitto, model.path, serial_ports=[pty_serial.path], io_loop=io_loop
    )
    node = SerialNode(pty_serial, "node-o")
    calibrated = Calibrated(mosquitto, persistent_id="e2e-observer")
    mqtt: MqttNodes | None = None
    try:
        daemons.append(Daemon(config, tmp_path / "state", nodes=[node]))
        daemon = daemons[-1]
        base = grid_base(PERIODS + 5)
        values = np.random.default_rng(3).uniform(5, 100, PERIODS).round(2)
        for period in range(BEFORE):
            node.send(base + period * P + 1, float(values[period]))
        wait_for(partial(calibrated.has, "node-o", BEFORE), "output before the outage")

        mosquitto.stop()
        wait_for(lambda: daemon.status()["publisher"]["connected"] is False, "publisher down")
        for period in range(BEFORE, PERIODS):
            node.send(base + period * P + 1, float(values[period]))
        status = wait_for(
            lambda: (s := daemon.status())["publisher"]["queued"] == DURING and s,
            "the outage's readings to be queued",
        )
        assert status["ticker"]["published"] == PERIODS
        assert len(calibrated.by_period("node-o")) == BEFORE  # nothing got through meanwhile

        mosquitto.start()
        wait_for(partial(calibrated.has, "node-o", PERIODS), "delivery after the outage")
        arrivals = calibrated.arrivals("node-o")
        first_seen: list[str] = []
        for payload in arrivals:  # at-least-once: a redelivered copy may follow its original
            if payload["period_start"] not in first_seen:
                first_seen.append(payload["period_start"])
        assert first_seen == [iso(base + p * P) for p in range(PERIODS)]  # all, in order
        got = calibrated.by_period("node-o")
        valid = list(range(N - 1, PERIODS))
        expected = litert_expected(model.path, windows_ending_at(values, valid))
        for period, value in zip(valid, expected, strict=True):
            payload = got[iso(base + period * P)]
            assert payload["quality"] == ["ok"]
            assert payload["calibrated"] == as_published(float(value))

        # The MQTT source came back too: its readings are calibrated after the outage.
        wait_for(lambda: all(daemon.status()["mqtt_sources_connected"].values()), "resubscribe")
        mqtt = MqttNodes(mosquitto)
        mqtt.send("mq-o", base + 1, 20.0)
        mqtt.send("mq-o", base + P + 1, 21.0)
        wait_for(partial(calibrated.has, "mq-o", 2), "MQTT readings after the outage")
        publisher = wait_for(
            lambda: (p := daemon.status()["publisher"])["queued"] == 0 and p, "an empty outbox"
        )
        assert publisher["dropped_total"] == 0
        assert publisher["connected"] is True
        assert daemon.stop() == 0
    finally:
        if mqtt is not None:
            mqtt.close()
        calibrated.close()
