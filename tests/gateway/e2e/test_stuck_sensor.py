"""A frozen sensor through the real daemon and mosquitto: published without a value.

``mq-dead`` sends exactly 0.0 every period (a PMS5003 whose laser died: Antwerp_4043AE read 0.0
for 814 hours); with ``health.stuck_periods = 4`` (the default, 30, exceeds the test model's
N = 8) every period it could be calibrated in carries ``"calibrated": null``, no interval and
quality ``["stuck"]``, its health says ``stuck``, and the stats and Prometheus count the
periods withheld; ``mq-live`` beside it keeps its calibrations (checked against LiteRT run by
the test on the windows it sent).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from devkit.broker import Mosquitto, free_port
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
    litert_expected,
    wait_for,
    windows_ending_at,
    write_config,
)
from tests.gateway.e2e.test_metrics import scrape
from tests.support.models import ModelFactory
from tests.support.published import as_published

PERIODS = N + 3
STUCK = 4
FLAGGED = ("tesla_gateway_readings_flagged_total", (("quality", "stuck"),))


def test_daemon_withholds_a_frozen_sensor_and_keeps_calibrating_its_neighbour(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    config = write_config(tmp_path, mosquitto, model.path)
    port = free_port()
    with config.open("a", encoding="utf-8") as out:
        out.write(f"[health]\nstuck_periods = {STUCK}\npublish_interval_s = 0.3\n")
        out.write(f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    live = (20.0 + np.arange(PERIODS) % 4 * 1.5).round(1)
    calibrated = Calibrated(mosquitto)
    mqtt = MqttNodes(mosquitto)
    try:
        daemons.append(Daemon(config, tmp_path / "state"))
        base = grid_base(PERIODS + 5)
        for period in range(PERIODS):
            mqtt.send("mq-dead", base + period * P + 3, 0.0)
            mqtt.send("mq-live", base + period * P + 3, float(live[period]))
        for sensor in ("mq-dead", "mq-live"):
            wait_for(partial(calibrated.has, sensor, PERIODS), f"{sensor} output")
        dead = calibrated.by_period("mq-dead")
        fine = calibrated.by_period("mq-live")
        whole = range(N - 1, PERIODS)  # the test model calibrates whole windows only
        expected = litert_expected(model.path, windows_ending_at(live, whole))
        for index, period in enumerate(whole):
            message = dead[iso(base + period * P)]
            assert message["quality"] == ["stuck"], message
            assert message["calibrated"] is None and "interval" not in message
            assert message["raw"] == 0.0 and message["model"] == "test-tesla"
            assert message["history_periods"] == N
            neighbour = fine[iso(base + period * P)]
            assert neighbour["quality"] == ["ok"], neighbour
            assert neighbour["calibrated"] == as_published(float(expected[index]))
        assert all(dead[iso(base + p * P)]["quality"] == ["warming_up"] for p in range(N - 1))

        def health() -> dict[str, Any] | None:
            payloads = calibrated.collector.on(f"{PREFIX}/mq-dead/pm10/health")
            return json.loads(payloads[-1]) if payloads else None

        flagged = wait_for(
            lambda: (h := health()) is not None and "stuck" in h["flags"] and h,
            "mq-dead health flagged stuck",
        )
        assert flagged["ok"] is False and flagged["stuck_periods"] >= STUCK
        wait_for(
            lambda: (
                calibrated.latest_stats().get("ticker", {}).get("flagged", {}).get("stuck")
                == len(whole)
            ),
            "the stats counting every withheld period",
        )
        samples, _ = scrape(port)
        assert samples[FLAGGED] == len(whole)
    finally:
        calibrated.close()
        mqtt.close()
