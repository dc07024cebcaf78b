"""One reading with a fast clock, through the real daemon (issue 12, finding 8).

A sensor replays its recent readings (true clock), one of them stamped 200 s ahead of the
daemon's clock (inside the default ``max_future_s`` of 300 s). Before the fix every true reading
after it was ``late``: dropped, its periods never published. Now the fast reading is held,
dropped as a ``clock_outlier`` when the next true reading contradicts it, and every true period
is published with its true raw value.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

from devkit.broker import Mosquitto
from tests.gateway.e2e.harness import (
    MODEL,
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
OUTLIER_AFTER = 3  # the fast reading comes after the true reading of this period


def test_a_fast_reading_makes_no_true_reading_late(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    config = write_config(tmp_path, mosquitto, model.path)
    calibrated = Calibrated(mosquitto)
    mqtt = MqttNodes(mosquitto)
    try:
        daemons.append(Daemon(config, tmp_path / "state"))
        base = grid_base(PERIODS + 1)
        for period in range(PERIODS):
            mqtt.send("clk", base + period * P + 3, 10.0 + period)
            if period == OUTLIER_AFTER:
                mqtt.send("clk", time.time() + 200, 99.0)  # a clock jumped ahead, once
        wait_for(partial(calibrated.has, "clk", PERIODS), "every true period published")
        got = calibrated.by_period("clk")
        assert sorted(got) == [iso(base + period * P) for period in range(PERIODS)]
        assert [got[iso(base + p * P)]["raw"] for p in range(PERIODS)] == [
            10.0 + p for p in range(PERIODS)
        ]
        assert all(got[iso(base + p * P)]["quality"] == ["ok"] for p in range(N - 1, PERIODS))
        status = wait_for(
            lambda: (s := daemons[-1].status()).get("rejected", {}).get("total") and s,
            "the outlier counted",
        )
        assert status["windows"]["pm10"]["outcomes"]["late"] == 0
        assert status["windows"]["pm10"]["outcomes"]["clock_outlier"] == 1
        assert status["rejected"]["by_reason"] == {"clock_outlier": 1}
        assert daemons[-1].stop() == 0
    finally:
        mqtt.close()
        calibrated.close()
