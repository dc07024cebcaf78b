"""The broker is stopped and restarted repeatedly during a steady stream through the real daemon.

Every reading the sensors got a PUBACK for must come out as exactly one calibrated message per
(sensor, period), or at least once: the delivery guarantee is at-least-once (docs/deployment.md),
so duplicates are counted and reported. One loss is not the gateway's to prevent and is counted
apart: across a broker restart mosquitto may deliver a sensor's queued QoS 1 readings out of
order, and a reading that arrives after a newer reading of the same sensor closed its period is
*late* (counted in the windows' ``late`` outcome, never calibrated into a closed period). So
every lost calibration must be matched by a late reading; anything beyond that is a real loss.
The broker is stopped with SIGTERM (mosquitto saves its persistence: the gateway's persistent
session and the collector's queue survive); a SIGKILLed broker loses what it acknowledged but had
not yet saved, a property of the broker's persistence (autosave_interval), not of the gateway.
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import pytest

from devkit.broker import Mosquitto
from tests.reliability.harness import (
    PERIOD_S,
    Collector,
    Daemon,
    Sensors,
    copy_default_model,
    delivery_figures,
    grid_base,
    iso,
    report,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.reliability


def test_broker_restarts_lose_nothing(
    tmp_path: Path, mosquitto: Mosquitto, long_form: bool
) -> None:
    sensors_n, periods, outages = (20, 300, 12) if long_form else (5, 60, 4)
    rng = random.Random(1)
    model = copy_default_model(tmp_path / "model")
    config = write_config(
        tmp_path / "gw.toml", gateway_id="gw-r", model_dir=model, broker_port=mosquitto.port
    )
    collector = Collector(mosquitto.port)
    daemon = Daemon(config, tmp_path / "state")
    sensors = Sensors(mosquitto.port)
    names = [f"node-{i:02d}" for i in range(sensors_n)]
    base = grid_base(periods + 10)
    outage_at = set(rng.sample(range(5, periods - 1), outages))
    expected: set[tuple[str, str, str]] = set()
    try:
        for period in range(periods):
            if period in outage_at:
                mosquitto.restart()
            for name in names:
                sensors.send(name, base + period * PERIOD_S + 30, rng.uniform(5, 80))
                expected.add(("gw-r", name, iso(base + period * PERIOD_S)))
        with contextlib.suppress(AssertionError):  # counted as lost below, with the keys named
            wait_for(lambda: all(collector.snapshot()[k] for k in expected), "every message")
        received = collector.snapshot()
        missing = sorted(key for key in expected if not received[key])
        figures = delivery_figures(expected, received)
        status = daemon.status()
        assert daemon.stop() == 0
    finally:
        sensors.close()
        collector.close()
        daemon.kill()
    figures |= {
        "broker_restarts": outages,
        "readings_sent": sensors.sent,
        "sensor_retries": sensors.retries,
        "readings_accepted": status["readings_in"],
        "rejected": status["rejected"]["total"],
        "late_readings": status["windows"]["pm10"]["outcomes"]["late"],
    }
    report("broker_restarts", figures)
    assert figures["lost"] <= figures["late_readings"], missing[:20]
    assert figures["unexpected"] == 0
