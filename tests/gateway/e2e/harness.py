"""The real daemon (``python -m tesla_gateway run``) wired to a real broker and pty serial ports.

Sensor nodes are simulated (no Arduino board exists here): MQTT nodes publish the documented
JSON with a plain paho client; serial nodes write line-protocol bytes into the master side of
a pty whose slave side the daemon opens through pyserial. Expected calibrations come from
LiteRT run by the test itself on windows the test builds (``training.export.litert_predict``),
never from the gateway's own code.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

from devkit.broker import Mosquitto
from devkit.daemon import GatewayDaemon
from devkit.pty import PtySerial
from tesla_gateway.sources.line_protocol import encode_hello, encode_hello_request, encode_reading
from tests.gateway.io.helpers import Collector

GATEWAY_ID = "gw-e2e"
PREFIX = f"tesla/{GATEWAY_ID}"
P = 10  # seconds per period: a small grid keeps every timestamp within the serial backlog
N = 8
MAX_GAP = 2
MODEL = {"window_length": N, "period_seconds": P, "max_interpolated_periods": MAX_GAP}
WAIT_S = 30.0  # upper bound on any wait (slow CI); never a timing assertion
HELLO_REQUEST = encode_hello_request().rstrip(b"\n")


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll until ``condition()`` is truthy; return it, or fail naming what was awaited."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def iso(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


def grid_base(periods_ago: int) -> int:
    """The start of the period ``periods_ago`` periods before now (replayed, recent past)."""
    return (int(time.time()) // P - periods_ago) * P


def write_config(
    tmp_path: Path,
    broker: Mosquitto,
    model_dir: Path,
    *,
    serial_ports: Sequence[Path] = (),
    known: Sequence[str] | None = None,
    model_poll_s: float = 600.0,
    grace_s: float = 0.5,
    shutdown_flush_s: float = 5.0,
    io_loop: str = "thread",
) -> Path:
    """A gateway.toml with fast reconnects, ticks and stats."""
    sensors = (
        f"allow_unknown = false\nknown = {json.dumps(list(known))}"
        if known is not None
        else "allow_unknown = true"
    )
    serial = "".join(
        f"""
[[sources]]
kind = "node"
port = "{port}"
reconnect_initial_s = 0.05
reconnect_max_s = 0.5
"""
        for port in serial_ports
    )
    path = tmp_path / "gateway.toml"
    path.write_text(
        f"""
gateway_id = "{GATEWAY_ID}"
state_dir = "{tmp_path / "state"}"
[[models]]
feature = "pm10"
model_dir = "{model_dir}"
[runtime]
model_poll_s = {model_poll_s}
[tick]
grace_s = {grace_s}
settle_s = 0.1
[state]
status_interval_s = 0.1
save_interval_s = 600
[sensors]
{sensors}
[logging]
format = "json"
level = "info"
[[sources]]
kind = "mqtt"
topics = ["sensors/+/raw"]
[sources.broker]
port = {broker.port}
reconnect_initial_s = 0.05
reconnect_max_s = 0.5
io_loop = "{io_loop}"
{serial}
[publisher]
stats_interval_s = 0.2
shutdown_flush_s = {shutdown_flush_s}
[publisher.broker]
port = {broker.port}
reconnect_initial_s = 0.05
reconnect_max_s = 0.5
io_loop = "{io_loop}"
""",
        encoding="utf-8",
    )
    return path


class Daemon(GatewayDaemon):
    """The daemon (devkit's wrapper), started on construction and ready once subscribed and
    every serial node's port is open."""

    def __init__(
        self,
        config: Path,
        state_dir: Path,
        nodes: Sequence[SerialNode] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(config, state_dir, log=state_dir.parent / "daemon.log", env=env)
        self.start()
        self.wait_ready(WAIT_S)
        for node in nodes:
            node.wait_opened()


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Daemons a test started; killed at teardown if the test did not stop them."""
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.kill()


class MqttNodes:
    """Sensor nodes publishing JSON readings with QoS 1 (each publish waits for its PUBACK)."""

    def __init__(self, broker: Mosquitto) -> None:
        self._client = paho.Client(CallbackAPIVersion.VERSION2, client_id="e2e-nodes")
        self._client.connect(broker.host, broker.port)
        self._client.loop_start()

    def send(self, sensor: str, timestamp: float, pm10: float, *, iso_time: bool = False) -> None:
        document: dict[str, object] = {"pm10": pm10}
        if iso_time:
            document["timestamp"] = iso(timestamp)
        else:
            document["ts"] = timestamp
        self.send_raw(f"sensors/{sensor}/raw", json.dumps(document).encode())

    def send_raw(self, topic: str, payload: bytes) -> None:
        self._client.publish(topic, payload, qos=1).wait_for_publish(10)

    def close(self) -> None:
        self._client.loop_stop()
        self._client.disconnect()


class SerialNode:
    """An Arduino node on a pty: answers the daemon's hello request and writes ``R`` lines."""

    def __init__(self, device: PtySerial, node_id: str) -> None:
        self.device = device
        self.node_id = node_id
        self._seq = 0

    def wait_opened(self) -> None:
        """The daemon sends ``Q`` whenever it opens the port; answer as the firmware does."""
        self.device.read_until(HELLO_REQUEST, timeout_s=WAIT_S)
        self.device.write(encode_hello(self.node_id, "1.0.0"))

    def send(self, timestamp: float, pm10: float) -> None:
        self.device.write(encode_reading(self.node_id, self._seq, timestamp, {"pm10": pm10}))
        self._seq += 1

    def send_raw(self, line: bytes) -> None:
        self.device.write(line)


class Calibrated:
    """Everything the daemon publishes under its prefix, seen by an independent subscriber."""

    def __init__(self, broker: Mosquitto, persistent_id: str | None = None) -> None:
        self.collector = Collector(broker, [f"{PREFIX}/#"], persistent_id=persistent_id)

    def arrivals(self, sensor: str) -> list[dict[str, Any]]:
        """Calibrated payloads of one sensor in arrival order (retained replays skipped)."""
        topic = f"{PREFIX}/{sensor}/pm10"
        with self.collector._lock:
            return [
                json.loads(m.payload)
                for m in self.collector.messages
                if m.topic == topic and not m.retain
            ]

    def by_period(self, sensor: str) -> dict[str, dict[str, Any]]:
        return {payload["period_start"]: payload for payload in self.arrivals(sensor)}

    def has(self, sensor: str, count: int) -> bool:
        return len(self.by_period(sensor)) >= count

    def latest_stats(self) -> dict[str, Any]:
        payloads = self.collector.on(f"{PREFIX}/stats")
        return dict(json.loads(payloads[-1])) if payloads else {}

    def close(self) -> None:
        self.collector.close()


def litert_expected(model_dir: Path, windows: np.ndarray) -> np.ndarray:
    """LiteRT on the model file, one batched invoke, run by the test (not the gateway)."""
    from training.export import litert_predict

    flatbuffer = (model_dir / "model.tflite").read_bytes()
    return litert_predict(flatbuffer, np.asarray(windows, dtype=np.float32))


def fill_short_gaps(series: np.ndarray, max_gap: int) -> np.ndarray:
    """Training's gap rule, written independently: interpolate runs of at most ``max_gap`` NaN
    between two observed values; longer runs stay NaN."""
    filled = series.astype(np.float64).copy()
    observed = np.flatnonzero(~np.isnan(series))
    for left, right in itertools.pairwise(observed):
        if 1 < right - left <= max_gap + 1:
            filled[left + 1 : right] = np.interp(
                np.arange(left + 1, right), [left, right], [series[left], series[right]]
            )
    return filled


def windows_ending_at(series: np.ndarray, periods: Sequence[int]) -> np.ndarray:
    return np.stack([series[p - N + 1 : p + 1] for p in periods]).astype(np.float32)
