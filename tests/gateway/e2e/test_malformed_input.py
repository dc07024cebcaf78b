"""Malformed input of every kind, over MQTT and over serial, through the daemon.

Each bad message is counted under its reason and source in the stats topic; none stops the
daemon, a source or a port: valid readings sent between and after the bad ones are all
calibrated.
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Any

from devkit.broker import Mosquitto
from devkit.pty import PtySerial
from tesla_gateway.sources.line_protocol import encode_line, encode_reading
from tests.gateway.e2e.harness import (
    MODEL,
    Calibrated,
    Daemon,
    MqttNodes,
    N,
    P,
    SerialNode,
    grid_base,
    wait_for,
    write_config,
)
from tests.support.models import ModelFactory

PERIODS = N + 2


def mqtt_malformed(now: float) -> dict[str, tuple[str, bytes]]:
    """One bad message per reason the MQTT source can give (topic, payload)."""
    good_topic = "sensors/mq-ok/raw"
    return {
        "too_large": (good_topic, b'{"pm10": 1.0, "pad": "' + b"x" * 70_000 + b'"}'),
        "bad_encoding": (good_topic, b'{"pm10": \xff\xfe}'),
        "bad_json": (good_topic, b'{"pm10": 12'),
        "schema": (good_topic, b'{"pm10": "12"}'),
        "bad_sensor_id": ("sensors/-bad/raw", json.dumps({"pm10": 1.0}).encode()),
        "unknown_sensor": ("sensors/stranger/raw", json.dumps({"pm10": 1.0}).encode()),
        "unknown_field": (good_topic, b'{"pm10": 1.0, "colour": 2}'),
        "no_values": (good_topic, json.dumps({"ts": now}).encode()),
        "not_finite": (good_topic, b'{"pm10": NaN}'),
        "negative": (good_topic, b'{"pm10": -3.0}'),
        "out_of_range": (good_topic, b'{"pm10": 5000.0}'),
        "future_timestamp": (good_topic, json.dumps({"ts": now + 3600, "pm10": 1.0}).encode()),
        "stale_timestamp": (good_topic, json.dumps({"ts": now - 8 * 86400, "pm10": 1.0}).encode()),
    }


def serial_malformed() -> dict[str, bytes]:
    """One bad line per reason the serial node decoder can give."""
    good = encode_reading("node-ok", 900, None, {"pm10": 5.0})
    tampered = good[:-5] + (b"0000" if not good.endswith(b"0000\n") else b"1111") + b"\n"
    return {
        "too_large": b"R," + b"9" * 600 + b"\n",
        "bad_encoding": b"R,node-ok,1,-,pm10=1\x01*0000\n",
        "bad_frame": b"R,node-ok,1,-,pm10=1\n",  # no *CRC
        "bad_checksum": tampered,
        "unknown_field": encode_line("R", ["node-ok", "2", "-", "colour=1"]),
        "bad_sensor_id": encode_line("R", ["-bad", "3", "-", "pm10=1"]),
        # A node speaks only for the id of its hello: not for an MQTT sensor (issue 12, #11).
        "sensor_not_owned": encode_reading("mq-ok", 4, None, {"pm10": 1.0}),
        "not_finite": encode_line("R", ["node-ok", "5", "-", "pm10=nan"]),
        "negative": encode_reading("node-ok", 6, None, {"pm10": -2.0}),
        "out_of_range": encode_reading("node-ok", 7, None, {"pm10": 4000.0}),
    }


def stats_show(calibrated: Calibrated, expected: dict[str, dict[str, int]]) -> dict[str, Any]:
    rejected = calibrated.latest_stats().get("rejected", {})
    return rejected if rejected.get("by_source") == expected else {}


def assert_rejects_logged(log: Path, port: Path, serial_source: str) -> None:
    """Every line the daemon wrote (stdout and stderr, JSON logging) is a JSON object, LiteRT's
    XNNPACK line included; each reject has its own line naming the sensor when known and the
    topic or port it came in on."""
    lines = log.read_text(encoding="utf-8").splitlines()
    events = [json.loads(line) for line in lines]  # raises on any raw line
    assert all(isinstance(event, dict) for event in events)
    assert any(e["event"] == "native_stderr" and "XNNPACK" in e["message"] for e in events)
    logged = {
        (e["source"], e["reason"]): (e["sensor"], e["where"])
        for e in events
        if e["event"] == "reading_rejected"
    }
    for reason in mqtt_malformed(0.0):
        sensor, where = logged["mqtt", reason]
        if reason == "bad_sensor_id":
            assert (sensor, where) == (None, "sensors/-bad/raw")
        elif reason == "unknown_sensor":  # refused at admission, after the source
            assert sensor == "stranger"
        else:
            assert (sensor, where) == ("mq-ok", "sensors/mq-ok/raw"), reason
    for reason in serial_malformed():
        sensor, where = logged[serial_source, reason]
        assert where == str(port), reason
        assert sensor == "node-ok", reason  # the node of that port (its hello), the offender


def test_malformed_input_is_counted_by_reason_and_survived(
    tmp_path: Path,
    mosquitto: Mosquitto,
    pty_serial: PtySerial,
    model_factory: ModelFactory,
    daemons: list[Daemon],
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    config = write_config(
        tmp_path,
        mosquitto,
        model.path,
        serial_ports=[pty_serial.path],
        known=["mq-ok", "node-ok"],
    )
    node = SerialNode(pty_serial, "node-ok")
    calibrated = Calibrated(mosquitto)
    mqtt = MqttNodes(mosquitto)
    try:
        daemons.append(Daemon(config, tmp_path / "state", nodes=[node]))
        base = grid_base(PERIODS + 5)
        bad_mqtt = list(mqtt_malformed(time.time()).values())
        bad_serial = list(serial_malformed().values())
        for period in range(PERIODS):  # valid readings between bursts of bad ones
            mqtt.send("mq-ok", base + period * P + 2, 20.0 + period)
            node.send(base + period * P + 2, 30.0 + period)
            for topic, payload in bad_mqtt[period::PERIODS]:
                mqtt.send_raw(topic, payload)
            for line in bad_serial[period::PERIODS]:
                node.send_raw(line)
        for sensor in ("mq-ok", "node-ok"):
            wait_for(partial(calibrated.has, sensor, PERIODS), f"{sensor}: every valid period")

        serial_source = f"serial:{pty_serial.path.name}"
        expected = {
            "mqtt": dict.fromkeys(mqtt_malformed(0.0), 1),
            serial_source: dict.fromkeys(serial_malformed(), 1),
        }
        rejected = wait_for(partial(stats_show, calibrated, expected), "the stats topic")
        assert rejected["total"] == len(bad_mqtt) + len(bad_serial)
        got = {sensor: calibrated.by_period(sensor) for sensor in ("mq-ok", "node-ok")}
        for sensor, offset in (("mq-ok", 20.0), ("node-ok", 30.0)):
            raws = sorted(payload["raw"] for payload in got[sensor].values())
            assert raws == [offset + period for period in range(PERIODS)]  # nothing bad got in
            assert sum(p["quality"] == ["ok"] for p in got[sensor].values()) == PERIODS - N + 1
        status = daemons[-1].status()
        assert status["readings_in"] == 2 * PERIODS
        assert status["windows"]["pm10"]["sensors"] == 2
        assert daemons[-1].stop() == 0
        assert_rejects_logged(daemons[-1].log, pty_serial.path, serial_source)
    finally:
        mqtt.close()
        calibrated.close()
