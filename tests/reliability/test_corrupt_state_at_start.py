"""A real daemon started over a damaged window snapshot and a damaged outbox (findings 3 and 4 of
issue 12: the first raised NotImplementedError in np.load, the second an uncaught
OperationalError when the queue was read; either made every start exit 1, a crash loop).

The state is left by a real daemon run, then damaged as a disk would: a flipped compression
method in the snapshot's zip directory, and outbox rows whose text is not UTF-8 or whose payload
has the wrong type, queued in front of a sound message. The daemon must start, set the snapshot
aside and say so on its stats topic, drop and count the bad rows, deliver the sound message and
calibrate new readings.
"""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

import pytest

from devkit.broker import Mosquitto
from tesla_gateway.publish.publisher import OUTBOX_FILENAME
from tests.reliability.harness import (
    PERIOD_S,
    Collector,
    Daemon,
    Sensors,
    copy_default_model,
    grid_base,
    iso,
    report,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.reliability


def unsupported_compression(snapshot: Path, member: str = "meta.npy") -> None:
    """Mark one member of the .npz's central directory as 'shrunk' (method 1): one field."""
    data = bytearray(snapshot.read_bytes())
    entry = data.find(b"PK\x01\x02")
    while entry >= 0:
        name_length = struct.unpack_from("<H", data, entry + 28)[0]
        if data[entry + 46 : entry + 46 + name_length] == member.encode():
            struct.pack_into("<H", data, entry + 10, 1)
            snapshot.write_bytes(data)
            return
        entry = data.find(b"PK\x01\x02", entry + 4)
    raise AssertionError(f"{member} not in {snapshot}")


def damage_outbox(path: Path, good_topic: str, good_payload: bytes) -> None:
    """Two rows a damaged page could hold, then one sound message behind them."""
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO outbox (topic, payload, qos, retain, queued_at) "
            "VALUES (CAST(x'7465736c612fff' AS TEXT), x'7b7d', 1, 0, 0)"
        )
        db.execute(
            "INSERT INTO outbox (topic, payload, qos, retain, queued_at) "
            "VALUES ('tesla/gw-c/x/pm10', 'text, not a blob', 1, 0, 0)"
        )
        db.execute(
            "INSERT INTO outbox (topic, payload, qos, retain, queued_at) VALUES (?, ?, 1, 0, 0)",
            (good_topic, good_payload),
        )


def test_daemon_starts_over_a_corrupt_snapshot_and_outbox(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    model = copy_default_model(tmp_path / "model")
    config = write_config(
        tmp_path / "gw.toml", gateway_id="gw-c", model_dir=model, broker_port=mosquitto.port
    )
    state = tmp_path / "state"
    collector = Collector(mosquitto.port)
    sensors = Sensors(mosquitto.port)
    base = grid_base(100)
    try:
        first = Daemon(config, state)
        for period in range(3):
            sensors.send("node-1", base + period * PERIOD_S + 30, 25.0)
        wait_for(lambda: collector.snapshot()[("gw-c", "node-1", iso(base))], "a first reading")
        assert first.stop() == 0
        snapshot = state / "windows" / "pm10.npz"
        unsupported_compression(snapshot)
        queued_period = iso(base - 50 * PERIOD_S)
        damage_outbox(
            state / OUTBOX_FILENAME,
            "tesla/gw-c/queued/pm10",
            b'{"period_start": "' + queued_period.encode() + b'"}',
        )

        daemon = Daemon(config, state)
        try:
            for period in range(10, 14):
                sensors.send("node-2", base + period * PERIOD_S + 30, 30.0)
            new_key = ("gw-c", "node-2", iso(base + 10 * PERIOD_S))
            wait_for(  # status() raises, with the daemon's log, if it exited
                lambda: daemon.status() is not None and collector.snapshot()[new_key],
                "a new reading calibrated",
            )
            wait_for(
                lambda: collector.snapshot()[("gw-c", "queued", queued_period)],
                "the sound queued message delivered",
            )
            stats = wait_for(
                lambda: (
                    (s := collector.stats.get("gw-c", {}))
                    .get("publisher", {})
                    .get("outbox", {})
                    .get("invalid_rows_dropped")
                    and s
                ),
                "stats that count the damage",
            )
            set_aside = stats["state"]["set_aside"]
            assert set_aside["count"] == 1
            (record,) = set_aside["files"]
            assert record["kind"] == "window snapshot pm10"
            assert "NotImplementedError" in record["reason"]
            assert Path(record["moved_to"]).exists() and not snapshot.exists()
            assert stats["state"]["corrupt"] == 1
            assert stats["publisher"]["outbox"]["invalid_rows_dropped"] == 2
            assert daemon.stop() == 0
        finally:
            daemon.kill()
        log = config.with_suffix(".log").read_text()
        assert "state_file_set_aside" in log and "outbox_invalid_row_dropped" in log
    finally:
        sensors.close()
        collector.close()
    report(
        "corrupt_state_at_start",
        {
            "set_aside": set_aside["count"],
            "reason": record["reason"],
            "outbox_invalid_rows_dropped": stats["publisher"]["outbox"]["invalid_rows_dropped"],
        },
    )
