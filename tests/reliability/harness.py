"""Shared machinery of the reliability suite: the REAL daemon as a child process, sensors that
publish until the broker acknowledges, a persistent collector of calibrated messages, and the
report every test prints and merges into tests/reliability/last_run.json.

Models: a private copy of the committed default PM10 model (N = 360, 60 s periods; real LiteRT).
Timestamps are replayed in the recent past on the model's grid, so periods close in event time
(the next period's reading closes a period) and the last one by the grace_s fallback.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from devkit.daemon import GatewayDaemon

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "models" / "pm10-ispra-1min"
REPORT_FILE = Path(__file__).with_name("last_run.json")
PERIOD_S = 60
WAIT_S = 60.0  # upper bound on any wait (slow machines); never a timing assertion


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def wait_while_progressing(
    condition: Callable[[], Any], progress: Callable[[], Any], what: str, stall_s: float = WAIT_S
) -> Any:
    """Like :func:`wait_for`, but the time limit restarts whenever ``progress()`` changes: a
    backlog that a loaded machine drains slowly is waited for, a stall is not."""
    seen = progress()
    deadline = time.monotonic() + stall_s
    while True:
        result = condition()
        if result:
            return result
        now = progress()
        if now != seen:
            seen, deadline = now, time.monotonic() + stall_s
        elif time.monotonic() > deadline:
            raise AssertionError(f"no progress for {stall_s} s waiting for {what} (at {seen})")
        time.sleep(0.05)


def grid_base(periods_ago: int) -> int:
    return (int(time.time()) // PERIOD_S - periods_ago) * PERIOD_S


def copy_default_model(target: Path) -> Path:
    shutil.copytree(DEFAULT_MODEL, target)
    return target


def report(name: str, figures: dict[str, Any]) -> None:
    """Print the figures and merge them into last_run.json under ``name``."""
    print(f"\n[reliability] {name}: {json.dumps(figures, sort_keys=True)}")
    try:
        document = json.loads(REPORT_FILE.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        document = {}
    document[name] = {**figures, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    REPORT_FILE.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_config(
    path: Path,
    *,
    gateway_id: str,
    model_dir: Path,
    broker_port: int,
    publisher_port: int | None = None,
    state_dir: Path | None = None,
    save_interval_s: float = 60.0,
    shard: tuple[int, int] | None = None,
    serial_port: Path | None = None,
    mqtt: bool = True,
) -> Path:
    """A daemon configuration; ``state_dir`` defaults to ``path.parent / 'state'``, the
    publisher's broker (``publisher_port``) to the sources' one."""
    state = state_dir if state_dir is not None else path.parent / "state"
    text = f"""
gateway_id = "{gateway_id}"
state_dir = "{state}"
[[models]]
feature = "pm10"
model_dir = "{model_dir}"
[runtime]
model_poll_s = 600
[tick]
grace_s = 1.0
settle_s = 0.05
[state]
status_interval_s = 0.1
save_interval_s = {save_interval_s}
[logging]
format = "json"
level = "info"
[publisher]
shutdown_flush_s = 5
stats_interval_s = 0.5
[publisher.broker]
port = {publisher_port if publisher_port is not None else broker_port}
reconnect_initial_s = 0.05
reconnect_max_s = 0.5
"""
    if mqtt:
        text += f"""
[[sources]]
kind = "mqtt"
topics = ["sensors/+/raw"]
[sources.broker]
port = {broker_port}
reconnect_initial_s = 0.05
reconnect_max_s = 0.5
"""
        if shard is not None:
            text += f"[sources.shard]\nindex = {shard[0]}\ncount = {shard[1]}\n"
    if serial_port is not None:
        text += f"""
[[sources]]
kind = "node"
port = "{serial_port}"
reconnect_initial_s = 0.05
reconnect_max_s = 0.2
max_backlog_s = 86400
"""
    path.write_text(text, encoding="utf-8")
    return path


class Daemon(GatewayDaemon):
    """The daemon (devkit's wrapper), started on construction, observed through status.json."""

    def __init__(
        self,
        config: Path,
        state_dir: Path,
        *,
        file_size_limit: int | None = None,
        wait_sources: bool = True,
        wait_status: bool = True,
    ) -> None:
        """Start the daemon and wait until its status.json says it runs; with ``wait_status``
        false (a state dir that cannot be written has no status.json) the caller waits, e.g.
        for its stats topic."""
        # prlimit execs the daemon in place (same pid) with a cap on file size: a full disk.
        limit = [] if file_size_limit is None else ["prlimit", f"--fsize={file_size_limit}", "--"]
        super().__init__(config, state_dir, wrapper=limit)
        self.start()
        if wait_status:
            self.wait_ready(WAIT_S, wait_sources=wait_sources)

    def rss_kib(self) -> int:
        return self.proc_status_kib("VmRSS")


class Sensors:
    """MQTT sensor nodes: each reading is published with QoS 1 and retried until acknowledged,
    across broker outages (what a node with a local buffer does). ``sent`` counts acknowledged
    readings; a retry after a lost PUBACK may deliver a reading twice (the gateway's windows
    treat a duplicate reading as idempotent)."""

    def __init__(self, port: int, client_id: str = "reliability-sensors") -> None:
        self.sent = 0
        self.retries = 0
        self._client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
        self._client.reconnect_delay_set(0.05, 0.5)  # type: ignore[arg-type]  # paho types int
        self._client.connect("127.0.0.1", port)
        self._client.loop_start()

    def send(self, sensor: str, timestamp: float, pm10: float) -> None:
        payload = json.dumps({"ts": timestamp, "pm10": pm10})
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            info = self._client.publish(f"sensors/{sensor}/raw", payload, qos=1)
            if info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
                with contextlib.suppress(RuntimeError):
                    info.wait_for_publish(2.0)
                if info.is_published():
                    self.sent += 1
                    return
            self.retries += 1
            time.sleep(0.05)
        raise AssertionError(f"reading for {sensor} not acknowledged within {WAIT_S} s")

    def close(self) -> None:
        self._client.loop_stop()
        self._client.disconnect()


class Collector:
    """A persistent-session subscriber of calibrated topics: what a dashboard receives.

    Counts each (gateway, sensor, period) it is sent, so duplicates are visible; retained
    replays are ignored (they are the latest value, not a new delivery).
    """

    def __init__(
        self, port: int, topic: str = "tesla/+/+/pm10", client_id: str = "collector"
    ) -> None:
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.stats: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._topic = topic
        self._client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False
        )
        self._client.reconnect_delay_set(0.05, 0.5)  # type: ignore[arg-type]  # paho types int
        self._client.on_connect = self._on_connect
        self._client.on_message = self._on_message
        self._subscribed = threading.Event()
        self._client.connect("127.0.0.1", port)
        self._client.loop_start()
        assert self._subscribed.wait(WAIT_S)

    def _on_connect(self, client: paho.Client, _u: Any, flags: Any, rc: Any, _p: Any) -> None:
        if not flags.session_present:
            client.subscribe([(self._topic, 1), ("tesla/+/stats", 0)])
        self._subscribed.set()

    def _on_message(self, _c: Any, _u: Any, message: paho.MQTTMessage) -> None:
        levels = message.topic.split("/")
        with self._lock:
            if levels[-1] == "stats":
                self.stats[levels[1]] = json.loads(message.payload)
                return
            if message.retain:
                return
            period = json.loads(message.payload)["period_start"]
            self.counts[(levels[1], levels[2], period)] += 1

    def snapshot(self) -> Counter[tuple[str, str, str]]:
        with self._lock:
            return Counter(self.counts)

    def close(self) -> None:
        self._client.loop_stop()
        self._client.disconnect()


def iso(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


def delivery_figures(
    expected: set[tuple[str, str, str]], received: Counter[tuple[str, str, str]]
) -> dict[str, int]:
    """Lost (expected, never received), duplicated (received more than once), unexpected."""
    return {
        "expected": len(expected),
        "delivered": sum(1 for key in expected if received[key] > 0),
        "lost": sum(1 for key in expected if received[key] == 0),
        "duplicated": sum(n - 1 for key, n in received.items() if n > 1),
        "unexpected": sum(1 for key in received if key not in expected),
    }
