"""Sensor admission across restarts, through the real daemon (issue 12, finding 7).

The tester filled a gateway with real sensors, restarted it and sent 100 new ids: restored
windows did not count toward ``sensors.max_sensors``, the new ids filled the cap and the real
sensors were rejected. Here 100 real sensors (and one that went quiet long ago) are restored,
1,000 new ids flood the restarted daemon, and the real sensors must go on being calibrated
while the quiet one is evicted, from the stats and from the snapshot.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np

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

REAL = [f"real-{i:03d}" for i in range(100)]
FLOOD = [f"new-{i:04d}" for i in range(1_000)]
QUIET = "quiet-1"
BEFORE = N + 2  # periods before the restart: the windows are full
AFTER = 3
EVICT_IDLE_S = 600


def calibrated_in(calibrated: Calibrated, sensor: str, starts: list[str]) -> bool:
    got = calibrated.by_period(sensor)
    return all(start in got and got[start]["calibrated"] is not None for start in starts)


def test_restored_sensors_keep_their_place_against_a_flood_and_idle_ones_are_evicted(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    config = write_config(tmp_path, mosquitto, model.path)
    text = config.read_text(encoding="utf-8")
    config.write_text(
        text.replace(
            "allow_unknown = true",
            f"allow_unknown = true\nmax_sensors = 101\nevict_idle_s = {EVICT_IDLE_S}",
        ),
        encoding="utf-8",
    )
    state_dir = tmp_path / "state"
    calibrated = Calibrated(mosquitto)
    mqtt = MqttNodes(mosquitto)
    try:
        daemons.append(Daemon(config, state_dir))
        base = grid_base(BEFORE + AFTER + 5)
        quiet_base = grid_base(3 * EVICT_IDLE_S // P)  # its newest period ended long ago
        for period in range(3):
            mqtt.send(QUIET, quiet_base + period * P + 1, 10.0)
        rng = np.random.default_rng(7)
        for period in range(BEFORE):
            for sensor in REAL:
                mqtt.send(sensor, base + period * P + 1, float(rng.uniform(5, 80)))
        last_before = [iso(base + (BEFORE - 2) * P)]
        for sensor in REAL:
            wait_for(partial(calibrated_in, calibrated, sensor, last_before), f"{sensor} run 1")
        assert daemons[-1].stop() == 0

        daemons.append(Daemon(config, state_dir))
        for sensor in FLOOD:  # 1,000 new ids, one reading each, before the real ones report
            mqtt.send(sensor, base + BEFORE * P + 1, 30.0)
        for period in range(BEFORE, BEFORE + AFTER):
            for sensor in REAL:
                mqtt.send(sensor, base + period * P + 2, float(rng.uniform(5, 80)))
        after = [iso(base + period * P) for period in range(BEFORE, BEFORE + AFTER - 1)]
        for sensor in REAL:  # calibrated at once: their restored windows were kept
            wait_for(partial(calibrated_in, calibrated, sensor, after), f"{sensor} after restart")
        status = wait_for(
            lambda: (s := daemons[-1].status()).get("readings_in") == 1 + AFTER * len(REAL) and s,
            "every admitted reading counted",
        )
        admission = status["admission"]
        assert admission["evicted"] == 1  # the quiet sensor, at start
        assert admission["sensors"] == 101  # the 100 restored ones and one new id
        assert admission["rejected_full"] == len(FLOOD) - 1
        assert status["rejected"]["by_reason"] == {"unknown_sensor": len(FLOOD) - 1}
        assert status["windows"]["pm10"]["sensors"] == 101
        assert daemons[-1].stop() == 0
    finally:
        mqtt.close()
        calibrated.close()
    with np.load(state_dir / "windows" / "pm10.npz") as snapshot:
        saved = set(json.loads(str(snapshot["meta"]))["sensor_ids"])
    assert QUIET not in saved and set(REAL) <= saved and len(saved) == 101
