"""Readings in over MQTT and serial at the same time, calibrated readings out over MQTT.

Two MQTT nodes (one stamping Unix seconds, one ISO-8601, two readings per period sent out of
order) and one serial node feed the real daemon at once; every period comes back on its topic
with the mean raw value, warm-up periods flagged with a null calibration, and every valid
window calibrated to what LiteRT computes on the same window in the test.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from devkit.broker import Mosquitto
from devkit.pty import PtySerial
from tests.gateway.e2e.harness import (
    MODEL,
    PREFIX,
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

PERIODS = N + 6


def test_mqtt_and_serial_readings_are_calibrated_together(
    tmp_path: Path,
    mosquitto: Mosquitto,
    pty_serial: PtySerial,
    model_factory: ModelFactory,
    daemons: list[Daemon],
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    config = write_config(tmp_path, mosquitto, model.path, serial_ports=[pty_serial.path])
    node = SerialNode(pty_serial, "node-s")
    calibrated = Calibrated(mosquitto)
    mqtt = MqttNodes(mosquitto)
    try:
        daemons.append(Daemon(config, tmp_path / "state", nodes=[node]))
        base = grid_base(PERIODS + 5)
        rng = np.random.default_rng(11)
        series = {s: rng.uniform(5, 120, PERIODS).round(2) for s in ("mq-a", "mq-b", "node-s")}
        for period in range(PERIODS):
            start = base + period * P
            for sensor in ("mq-a", "mq-b"):
                value = series[sensor][period]
                iso_time = sensor == "mq-b"
                mqtt.send(sensor, start + 7, value + 0.5, iso_time=iso_time)  # later one first
                mqtt.send(sensor, start + 2, value - 0.5, iso_time=iso_time)
            node.send(start + 5, float(series["node-s"][period]))
        for sensor in series:  # the last period closes by the wall-clock fallback
            wait_for(partial(calibrated.has, sensor, PERIODS), f"{sensor}: {PERIODS} periods")

        for sensor, values in series.items():
            got = calibrated.by_period(sensor)
            assert len(got) == PERIODS
            valid = list(range(N - 1, PERIODS))
            expected = litert_expected(model.path, windows_ending_at(values, valid))
            for period in range(PERIODS):
                payload = got[iso(base + period * P)]
                assert payload["ts"] == iso(base + (period + 1) * P)
                assert payload["period_s"] == P
                assert payload["raw"] == as_published(values[period])
                assert payload["unit"] == "µg/m³"
                assert payload["model"] == "test-tesla"
                if period < N - 1:
                    assert payload["quality"] == ["warming_up"]
                    assert payload["calibrated"] is None
                else:
                    assert payload["quality"] == ["ok"]
                    assert payload["calibrated"] == as_published(float(expected[period - N + 1]))
        status = daemons[-1].status()
        assert status["readings_in"] == PERIODS * 5
        assert status["rejected"]["total"] == 0
        assert set(status["windows"]["pm10"]["outcomes"]) >= {"accepted"}
        assert status["windows"]["pm10"]["sensors"] == 3
        assert calibrated.collector.on(f"{PREFIX}/status")[-1] == b"online"
        assert daemons[-1].stop() == 0
    finally:
        mqtt.close()
        calibrated.close()
