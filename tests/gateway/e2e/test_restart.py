"""A restart in the middle of a stream, with sensors on MQTT and serial.

Readings published over MQTT while the daemon is down are held by the broker in the daemon's
persistent session and delivered when it returns; the saved windows are restored, so the
first periods after the restart are calibrated at once (no warm-up) for both sensors, with the
values LiteRT gives on the windows that span the restart.
(tests/gateway/core/test_service.py covers the MQTT-only restart and the reload paths.)
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

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

BEFORE = N + 1
PERIODS = BEFORE + 3


def test_restart_restores_windows_and_receives_readings_sent_while_down(
    tmp_path: Path,
    mosquitto: Mosquitto,
    pty_serial: PtySerial,
    model_factory: ModelFactory,
    daemons: list[Daemon],
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    config = write_config(tmp_path, mosquitto, model.path, serial_ports=[pty_serial.path])
    state_dir = tmp_path / "state"
    node = SerialNode(pty_serial, "node-r")
    calibrated = Calibrated(mosquitto)
    mqtt = MqttNodes(mosquitto)
    try:
        daemons.append(Daemon(config, state_dir, nodes=[node]))
        base = grid_base(PERIODS + 5)
        rng = np.random.default_rng(21)
        series = {s: rng.uniform(5, 80, PERIODS).round(2) for s in ("mq-r", "node-r")}
        for period in range(BEFORE):
            mqtt.send("mq-r", base + period * P + 4, float(series["mq-r"][period]))
            node.send(base + period * P + 4, float(series["node-r"][period]))
        for sensor in series:
            wait_for(partial(calibrated.has, sensor, BEFORE), f"{sensor} before the restart")
        assert daemons[-1].stop() == 0

        for period in range(BEFORE, PERIODS):  # the broker keeps these for the daemon
            mqtt.send("mq-r", base + period * P + 4, float(series["mq-r"][period]))
        daemons.append(Daemon(config, state_dir, nodes=[node]))
        assert daemons[-1].status()["state"]["restored"] == 1
        for period in range(BEFORE, PERIODS):
            node.send(base + period * P + 4, float(series["node-r"][period]))
        for sensor in series:
            wait_for(partial(calibrated.has, sensor, PERIODS), f"{sensor} after the restart")

        after = list(range(BEFORE, PERIODS))
        for sensor, values in series.items():
            got = calibrated.by_period(sensor)
            expected = litert_expected(model.path, windows_ending_at(values, after))
            for period, value in zip(after, expected, strict=True):
                payload = got[iso(base + period * P)]
                assert payload["quality"] == ["ok"], (sensor, period)
                assert payload["raw"] == as_published(values[period])
                assert payload["calibrated"] == as_published(float(value))
        status = daemons[-1].status()
        assert status["readings_in"] == 2 * (PERIODS - BEFORE)
        assert status["rejected"]["total"] == 0
        assert daemons[-1].stop() == 0
    finally:
        mqtt.close()
        calibrated.close()
