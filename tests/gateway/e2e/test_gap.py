"""Gaps through the daemon: a short gap is interpolated as in training, a long one flags GAP.

With N = 8 and at most 2 interpolated periods, a sensor (one over MQTT, one over serial, the
same series) misses 2 periods (filled: the next windows are calibrated, on the interpolated
window) and later 3 periods (too long: every window that still holds the hole is published
with its raw value, a null calibration and ``gap``, until the hole scrolls out of the window).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from devkit.broker import Mosquitto
from devkit.pty import PtySerial
from tests.gateway.e2e.harness import (
    MAX_GAP,
    MODEL,
    Calibrated,
    Daemon,
    MqttNodes,
    N,
    P,
    SerialNode,
    fill_short_gaps,
    grid_base,
    iso,
    litert_expected,
    wait_for,
    windows_ending_at,
    write_config,
)
from tests.support.models import ModelFactory
from tests.support.published import as_published

PERIODS = 31
SHORT_GAP = (10, 11)  # 2 missing periods: interpolated
LONG_GAP = (16, 17, 18)  # 3 missing periods: longer than the policy
FIRST_CLEAR = LONG_GAP[-1] + N  # first window without the long gap


def test_short_gap_is_filled_and_long_gap_is_flagged_until_it_scrolls_out(
    tmp_path: Path,
    mosquitto: Mosquitto,
    pty_serial: PtySerial,
    model_factory: ModelFactory,
    daemons: list[Daemon],
) -> None:
    assert len(SHORT_GAP) <= MAX_GAP < len(LONG_GAP)
    model = model_factory.copy(tmp_path / "model", **MODEL)
    config = write_config(tmp_path, mosquitto, model.path, serial_ports=[pty_serial.path])
    node = SerialNode(pty_serial, "node-g")
    calibrated = Calibrated(mosquitto)
    mqtt = MqttNodes(mosquitto)
    try:
        daemons.append(Daemon(config, tmp_path / "state", nodes=[node]))
        base = grid_base(PERIODS + 5)
        values = np.random.default_rng(5).uniform(10, 90, PERIODS).round(2)
        series = values.copy()
        series[list(SHORT_GAP + LONG_GAP)] = np.nan
        observed = [p for p in range(PERIODS) if not np.isnan(series[p])]
        for period in observed:
            mqtt.send("mq-g", base + period * P + 3, float(series[period]))
            node.send(base + period * P + 3, float(series[period]))
        for sensor in ("mq-g", "node-g"):
            wait_for(partial(calibrated.has, sensor, len(observed)), f"{sensor} output")

        filled = fill_short_gaps(series, MAX_GAP)
        ok = [p for p in observed if p >= N - 1 and not (LONG_GAP[0] <= p < FIRST_CLEAR)]
        flagged = [p for p in observed if LONG_GAP[-1] < p < FIRST_CLEAR]
        assert ok and flagged
        outputs = litert_expected(model.path, windows_ending_at(filled, ok))
        expected = dict(zip(ok, outputs, strict=True))
        for sensor in ("mq-g", "node-g"):
            got = calibrated.by_period(sensor)
            assert sorted(got) == sorted(iso(base + p * P) for p in observed)  # none made up
            for period in observed:
                payload = got[iso(base + period * P)]
                assert payload["raw"] == as_published(series[period])
                if period in flagged:
                    assert payload["quality"] == ["gap"], period
                    assert payload["calibrated"] is None
                elif period in ok:
                    assert payload["quality"] == ["ok"], period
                    assert payload["calibrated"] == as_published(float(expected[period]))
                else:
                    assert payload["quality"] == ["warming_up"], period
        # The windows right after the short gap were calibrated on interpolated values.
        assert SHORT_GAP[-1] + 1 in ok
        assert daemons[-1].stop() == 0
    finally:
        mqtt.close()
        calibrated.close()
