"""The real daemon (``python -m tesla_gateway run``) against a real mosquitto, end to end.

Readings go in over MQTT, calibrated readings come out over MQTT and are checked against the
Keras model on the same window; then a hot reload (accepted, then a corrupt one refused), a
SIGTERM with exit 0, and a restart that resumes from the saved windows without warm-up.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

from devkit.broker import Mosquitto
from devkit.daemon import GatewayDaemon
from tesla_gateway.daemon.cli import main
from tests.support.models import ModelFactory, TestModel, corrupt_model_file
from tests.support.published import as_published

P = 60
N = 8
WAIT_S = 60.0  # generous upper bound for slow CI machines; never a timing assertion


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Subscriber:
    """Collects every calibrated message the gateway publishes."""

    def __init__(self, broker: Mosquitto, topic: str) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._client = paho.Client(CallbackAPIVersion.VERSION2, client_id="test-subscriber")
        self._client.on_message = self._on_message
        self._client.connect(broker.host, broker.port)
        self._client.subscribe(topic, qos=1)
        self._client.loop_start()

    def _on_message(self, _client: Any, _userdata: Any, message: paho.MQTTMessage) -> None:
        if message.retain:
            return  # the retained latest value from an earlier run
        with self._lock:
            self.messages.append((message.topic, json.loads(message.payload)))

    def by_period(self, sensor: str) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {
                payload["period_start"]: payload
                for topic, payload in self.messages
                if topic.split("/")[-2] == sensor
            }

    def close(self) -> None:
        self._client.loop_stop()
        self._client.disconnect()


class Sensors:
    """Sensor nodes publishing JSON readings over MQTT (QoS 1)."""

    def __init__(self, broker: Mosquitto) -> None:
        self._client = paho.Client(CallbackAPIVersion.VERSION2, client_id="test-sensors")
        self._client.connect(broker.host, broker.port)
        self._client.loop_start()

    def send(self, sensor: str, timestamp: float, pm10: float) -> None:
        payload = json.dumps({"ts": timestamp, "pm10": pm10})
        self._client.publish(f"sensors/{sensor}/raw", payload, qos=1).wait_for_publish(10)

    def close(self) -> None:
        self._client.loop_stop()
        self._client.disconnect()


class Daemon(GatewayDaemon):
    """The daemon (devkit's wrapper), started on construction and ready once subscribed."""

    def __init__(self, config: Path, state_dir: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(config, state_dir, log=state_dir.parent / "daemon.log", env=env)
        self.start()
        self.wait_ready(WAIT_S)


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.kill()


def write_config(tmp_path: Path, broker: Mosquitto, model_dir: Path) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f"""
gateway_id = "gw-test"
state_dir = "{tmp_path / "state"}"
[[models]]
feature = "pm10"
model_dir = "{model_dir}"
[runtime]
model_poll_s = 600
[tick]
grace_s = 2.0
settle_s = 0.2
[state]
status_interval_s = 0.1
[sensors]
allow_unknown = false
known = ["node-a", "node-b"]
[logging]
format = "json"
level = "info"
[[sources]]
kind = "mqtt"
topics = ["sensors/+/raw"]
[sources.broker]
port = {broker.port}
[publisher]
shutdown_flush_s = 5
[publisher.broker]
port = {broker.port}
""",
        encoding="utf-8",
    )
    return path


def expected(model: TestModel, series: np.ndarray, period: int) -> float:
    window = series[period - N + 1 : period + 1].astype(np.float32)[None]
    return float(model.keras_predict(window)[0])


def all_periods_out(subscriber: Subscriber, sensor: str, count: int) -> bool:
    return len(subscriber.by_period(sensor)) == count


def period_out(subscriber: Subscriber, sensor: str, period_start: str) -> dict[str, Any] | None:
    return subscriber.by_period(sensor).get(period_start)


def iso(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


class NotifySocket:
    """Stands in for systemd's notify socket (systemd cannot run here): a thread records
    every datagram, as systemd reads them promptly."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.datagrams: list[str] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self._running = True
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while self._running:
            try:
                self.datagrams.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue

    def close(self) -> None:
        self._running = False
        self._thread.join()
        self.sock.close()


def test_daemon_end_to_end(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    model_dir = tmp_path / "models" / "pm10"
    v1 = model_factory.copy(model_dir)
    config = write_config(tmp_path, mosquitto, model_dir)
    state_dir = tmp_path / "state"
    subscriber = Subscriber(mosquitto, "tesla/gw-test/+/pm10")
    sensors = Sensors(mosquitto)
    notify = NotifySocket(tmp_path / "notify.sock")
    try:
        systemd_env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "200000"}
        daemons.append(Daemon(config, state_dir, env=systemd_env))
        daemon = daemons[-1]
        base = (int(time.time()) // P - 100) * P  # 100 minutes ago: replayed, in the past
        rng = np.random.default_rng(7)
        series = {s: rng.uniform(5, 90, 12).round(1) for s in ("node-a", "node-b")}
        for period in range(10):
            for sensor, values in series.items():
                # two readings per period, the later one first (out of order), averaging to
                # the series value
                sensors.send(sensor, base + period * P + 40, values[period] + 1.0)
                sensors.send(sensor, base + period * P + 10, values[period] - 1.0)
        sensors.send("intruder", base, 10.0)  # not in sensors.known: counted, not calibrated
        # Periods 0..8 close in event time; period 9 by the wall-clock fallback (grace_s).
        for sensor in series:
            wait_for(partial(all_periods_out, subscriber, sensor, 10), f"{sensor} output")
        for sensor, values in series.items():
            got = subscriber.by_period(sensor)
            for period in range(10):
                payload = got[iso(base + period * P)]
                assert payload["raw"] == pytest.approx(values[period])
                if period < N - 1:
                    assert payload["quality"] == ["warming_up"]
                    assert payload["calibrated"] is None
                else:
                    assert payload["quality"] == ["ok"]
                    assert payload["model_version"] == 1
                    assert payload["calibrated"] == as_published(expected(v1, values, period))

        # Hot reload: v2 is accepted; a corrupt v3 is refused and v2 keeps serving.
        shutil.rmtree(model_dir)
        model_factory.copy(model_dir, version=2, seed=5)
        assert main(["reload", "--config", str(config)]) == 0
        wait_for(lambda: daemon.status()["models"]["pm10"]["version"] == 2, "version 2")
        shutil.rmtree(model_dir)
        model_factory.copy(model_dir, version=3, seed=6)
        corrupt_model_file(model_dir)
        assert main(["reload", "--config", str(config)]) == 0
        status = wait_for(
            lambda: (s := daemon.status())["models"]["pm10"]["rejected"] == 1 and s, "rejection"
        )
        assert status["models"]["pm10"]["version"] == 2
        assert "sha256" in status["models"]["pm10"]["last_error"]
        assert status["readings_in"] == 40
        assert status["rejected"]["by_reason"] == {"unknown_sensor": 1}
        assert status["windows"]["pm10"]["sensors"] == 2

        assert daemon.stop() == 0
        datagrams = list(notify.datagrams)
        assert datagrams[0].startswith("READY=1\nSTATUS=running")
        assert "WATCHDOG=1" in datagrams
        assert datagrams[-1].startswith("STOPPING=1")
        assert (state_dir / "windows" / "pm10.npz").exists()
        assert not (state_dir / "gateway.pid").exists()
        assert json.loads((state_dir / "status.json").read_text())["phase"] == "stopped"

        # Restart with the v2 model: the windows come back, so period 10 is calibrated at once.
        shutil.rmtree(model_dir)
        v2 = model_factory.copy(model_dir, version=2, seed=5)
        daemons.append(Daemon(config, state_dir))
        assert daemons[-1].status()["state"]["restored"] == 1
        for sensor, values in series.items():
            sensors.send(sensor, base + 10 * P + 5, float(values[10]))
            sensors.send(sensor, base + 11 * P + 5, float(values[11]))  # closes period 10
        for sensor, values in series.items():
            payload = wait_for(
                partial(period_out, subscriber, sensor, iso(base + 10 * P)), "period 10"
            )
            assert payload["quality"] == ["ok"]
            assert payload["model_version"] == 2
            assert payload["calibrated"] == as_published(expected(v2, values, 10))
        capture = daemons[-1]
        assert capture.stop() == 0
        stopped = subprocess.run(
            [sys.executable, "-m", "tesla_gateway", "status", "--config", str(config)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert stopped.returncode == 3  # the LSB code for "not running"
        summary = stopped.stdout
        assert "not running" in summary and "model pm10: test-tesla v2" in summary
    finally:
        sensors.close()
        subscriber.close()
        notify.close()


def test_sigint_takes_the_same_clean_path(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    model_dir = tmp_path / "models" / "pm10"
    model_factory.copy(model_dir)
    config = write_config(tmp_path, mosquitto, model_dir)
    daemons.append(Daemon(config, tmp_path / "state"))
    daemon = daemons[-1]
    daemon.process.send_signal(signal.SIGINT)
    assert daemon.process.wait(timeout=WAIT_S) == 0
    status = json.loads((tmp_path / "state" / "status.json").read_text())
    assert status["phase"] == "stopped"
    assert "shutdown_requested" in daemon.log.read_text()


def test_second_daemon_on_the_same_state_dir_is_refused(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    model_dir = tmp_path / "models" / "pm10"
    model_factory.copy(model_dir)
    config = write_config(tmp_path, mosquitto, model_dir)
    daemons.append(Daemon(config, tmp_path / "state"))
    second = subprocess.run(
        [sys.executable, "-m", "tesla_gateway", "run", "--config", str(config)],
        capture_output=True,
        check=False,
        text=True,
        timeout=WAIT_S,
    )
    assert second.returncode == 1
    assert "already runs with state_dir" in second.stderr
    assert daemons[-1].stop() == 0


def test_no_loadable_model_starts_degraded_and_a_copied_model_repairs_it(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    """Without a model the daemon still runs (degraded, said on status), so it can be repaired
    without a restart: here by copying a model in and reloading; with [ota], by a release."""
    model_dir = tmp_path / "no-such-model"
    config = write_config(tmp_path, mosquitto, model_dir)
    daemons.append(Daemon(config, tmp_path / "state"))
    status = daemons[-1].status()
    assert status["degraded"] == ["pm10"]
    assert "does not exist" in status["models"]["pm10"]["last_error"]
    model_factory.copy(model_dir)
    assert main(["reload", "--config", str(config)]) == 0
    wait_for(lambda: daemons[-1].status()["models"]["pm10"]["version"] == 1, "the repair")
    assert daemons[-1].status()["degraded"] == []
    assert daemons[-1].stop() == 0
