"""The daemon is SIGKILLed at random points of a steady stream and restarted.

After every kill: each window snapshot decodes, the outbox passes SQLite's integrity check, and
the restarted daemon restores its windows (``state.restored``) with nothing set aside as corrupt.
A reading the broker has acknowledged to its sensor is durable (docs/deployment.md: the ingest
log, ``tesla_gateway/ingest/ingest_log.py``), so every period sent must be calibrated and
delivered: the test
fails on any loss. Duplicates are allowed (at least once) and counted.
"""

from __future__ import annotations

import json
import random
import sqlite3
import time
from pathlib import Path

import numpy as np
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


def check_state_files(state_dir: Path) -> None:
    for snapshot in (state_dir / "windows").glob("*.npz"):
        with np.load(snapshot, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            assert meta["format_version"] == 1
            assert data["ring"].shape[0] == len(meta["sensor_ids"])
    outbox = state_dir / "outbox.sqlite3"
    if outbox.exists():
        with sqlite3.connect(outbox) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert not list(state_dir.rglob("*.corrupt-*"))


def snapshot_exists(state_dir: Path) -> bool:
    return (state_dir / "windows" / "pm10.npz").exists()


def test_sigkill_and_restart(tmp_path: Path, mosquitto: Mosquitto, long_form: bool) -> None:
    sensors_n, periods, kills = (10, 300, 15) if long_form else (4, 80, 5)
    rng = random.Random(2)
    model = copy_default_model(tmp_path / "model")
    state_dir = tmp_path / "state"
    config = write_config(
        tmp_path / "gw.toml",
        gateway_id="gw-k",
        model_dir=model,
        broker_port=mosquitto.port,
        save_interval_s=0.3,
    )
    collector = Collector(mosquitto.port)
    daemon = Daemon(config, state_dir)
    sensors = Sensors(mosquitto.port)
    names = [f"node-{i:02d}" for i in range(sensors_n)]
    base = grid_base(periods + 10)
    kill_at = set(rng.sample(range(8, periods - 2), kills))
    expected: set[tuple[str, str, str]] = set()
    restored = 0
    replayed = 0
    kills_after_a_snapshot = 0
    try:
        for period in range(periods):
            if period in kill_at:
                time.sleep(rng.uniform(0.0, 0.4))  # somewhere in ingest, tick, save or publish
                daemon.kill()
                kills_after_a_snapshot += snapshot_exists(state_dir)
                check_state_files(state_dir)
                daemon = Daemon(config, state_dir)
                status = daemon.status()
                assert status["state"]["corrupt"] == 0
                restored += status["state"]["restored"]
                replayed += status.get("ingest_log", {}).get("replayed", 0)
            for name in names:
                sensors.send(name, base + period * PERIOD_S + 30, rng.uniform(5, 80))
                expected.add(("gw-k", name, iso(base + period * PERIOD_S)))
        last = {("gw-k", name, iso(base + (periods - 1) * PERIOD_S)) for name in names}
        wait_for(lambda: all(collector.snapshot()[key] for key in last), "the last period")
        time.sleep(1.0)  # let stragglers of the outbox arrive before counting
        received = collector.snapshot()
        figures = delivery_figures(expected, received)
        lost = sorted(key for key in expected if received[key] == 0)
        assert daemon.stop() == 0
        check_state_files(state_dir)
    finally:
        sensors.close()
        collector.close()
        daemon.kill()
    figures |= {
        "kills": kills,
        "restores": restored,
        "readings_sent": sensors.sent,
        "replayed_from_ingest_log": replayed,
    }
    report("daemon_sigkill", figures)
    assert restored == kills_after_a_snapshot  # every restart found its windows
    assert figures["unexpected"] == 0
    assert not lost, f"{len(lost)} acknowledged periods lost: {lost[:20]}"
