"""An implausible output through the real daemon and mosquitto: published without a value.

The model's graph is ``raw - 30`` (real LiteRT) with prediction intervals of half-width 5 in its
manifest: a sensor reading 10 gets -20, whose whole interval lies below zero. Its calibrated
topic must carry ``"calibrated": null`` with quality ``["implausible"]`` and its raw value, its
health topic the ``implausible`` flag, the stats the count; a sensor reading 50 is unaffected.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

from devkit.broker import Mosquitto
from tesla_gateway.contract.manifest import PredictionIntervals, write_manifest
from tests.gateway.e2e.harness import (
    MODEL,
    PREFIX,
    Calibrated,
    Daemon,
    MqttNodes,
    N,
    P,
    grid_base,
    iso,
    wait_for,
    write_config,
)
from tests.support.models import ModelFactory

PERIODS = N + 3


def test_daemon_withholds_an_implausible_output_and_flags_the_sensor(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL, affine=(1.0, -30.0))
    intervals = PredictionIntervals(
        level=0.9, edges=[], half_widths=[5.0], counts=[100], calibration_sensor="v1"
    )
    write_manifest(model.path, model.manifest.model_copy(update={"intervals": intervals}))
    config = write_config(tmp_path, mosquitto, model.path)
    calibrated = Calibrated(mosquitto)
    mqtt = MqttNodes(mosquitto)
    try:
        daemon = Daemon(config, tmp_path / "state")
        daemons.append(daemon)
        base = grid_base(PERIODS + 5)
        for period in range(PERIODS):
            mqtt.send("mq-low", base + period * P + 3, 10.0)
            mqtt.send("mq-ok", base + period * P + 3, 50.0)
        for sensor in ("mq-low", "mq-ok"):
            wait_for(partial(calibrated.has, sensor, PERIODS), f"{sensor} output")
        low = calibrated.by_period("mq-low")
        fine = calibrated.by_period("mq-ok")
        for period in range(N - 1, PERIODS):
            message = low[iso(base + period * P)]
            assert message["quality"] == ["implausible"]
            assert message["calibrated"] is None and "interval" not in message
            assert message["raw"] == 10.0 and message["model"] == "test-tesla"
            assert fine[iso(base + period * P)]["quality"] == ["ok"]
            assert fine[iso(base + period * P)]["calibrated"] == 20.0

        def health(sensor: str) -> dict[str, Any] | None:
            payloads = calibrated.collector.on(f"{PREFIX}/{sensor}/pm10/health")
            return json.loads(payloads[-1]) if payloads else None

        flagged = wait_for(
            lambda: (h := health("mq-low")) is not None and "implausible" in h["flags"] and h,
            "mq-low health flagged implausible",
        )
        assert flagged["ok"] is False and flagged["implausible_fraction"] > 0
        stats = wait_for(
            lambda: (
                calibrated.latest_stats().get("ticker", {}).get("flagged", {}).get("implausible")
                == PERIODS - N + 1
                and calibrated.latest_stats()
            ),
            "the stats counting every withheld period",
        )
        assert stats["health"]["flagged"]["implausible"] == 1
        log = [json.loads(line) for line in daemon.log.read_text().splitlines() if "{" in line]
        warnings = [entry for entry in log if entry.get("event") == "implausible_outputs"]
        assert warnings and {entry["sensor"] for entry in warnings} == {"mq-low"}
    finally:
        calibrated.close()
        mqtt.close()
