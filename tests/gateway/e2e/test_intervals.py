"""Prediction intervals through the daemon: a manifest that carries conformal bins makes every
calibrated message carry ``interval`` (low, high, level), looked up from the calibrated value's
bin; warm-up messages carry none (docs/mqtt.md)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from devkit.broker import Mosquitto
from tesla_gateway.contract.manifest import PredictionIntervals, write_manifest
from tests.gateway.e2e.harness import (
    MODEL,
    Calibrated,
    Daemon,
    MqttNodes,
    N,
    P,
    grid_base,
    iso,
    litert_expected,
    wait_for,
    windows_ending_at,
    write_config,
)
from tests.support.models import ModelFactory
from tests.support.published import as_published

PERIODS = 14


def test_daemon_publishes_the_manifest_intervals_with_each_calibrated_value(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    values = np.random.default_rng(7).uniform(5, 120, PERIODS).round(2)
    # Edges between the outputs this series will get, so the published values span 3 bins.
    computed = litert_expected(model.path, windows_ending_at(values, range(N - 1, PERIODS)))
    outputs = np.sort(computed)
    edges = [float(np.mean(outputs[i - 1 : i + 1])) for i in (2, 5)]
    intervals = PredictionIntervals(
        level=0.9, edges=edges, half_widths=[1.0, 3.0, 9.0], counts=[120, 120, 120],
        calibration_sensor="v1",
    )  # fmt: skip
    write_manifest(model.path, model.manifest.model_copy(update={"intervals": intervals}))
    config = write_config(tmp_path, mosquitto, model.path)
    calibrated = Calibrated(mosquitto)
    mqtt = MqttNodes(mosquitto)
    try:
        daemons.append(Daemon(config, tmp_path / "state"))
        base = grid_base(PERIODS + 5)
        for period, value in enumerate(values):
            mqtt.send("mq-i", base + period * P + 3, float(value))
        wait_for(partial(calibrated.has, "mq-i", PERIODS), "mq-i output")
        got = calibrated.by_period("mq-i")
        warm = [got[iso(base + p * P)] for p in range(N - 1)]
        assert all(m["calibrated"] is None and "interval" not in m for m in warm)
        ok = [got[iso(base + p * P)] for p in range(N - 1, PERIODS)]
        assert all(m["quality"] == ["ok"] for m in ok)
        # Published to a tenth (each end and the value): widths within 0.1 of the bins'.
        widths = {round(m["interval"]["high"] - m["calibrated"]) for m in ok}
        assert widths == {1, 3, 9}  # every bin was looked up
        for message, output in zip(ok, computed, strict=True):
            value = message["calibrated"]
            assert value == as_published(float(output))
            low, high = intervals.interval(float(output))
            assert message["interval"] == {
                "low": as_published(low),
                "high": as_published(high),
                "level": 0.9,
            }
            assert message["interval"]["low"] <= value <= message["interval"]["high"]
    finally:
        calibrated.close()
        mqtt.close()
