"""SIGTERM at every stage of the daemon's start-up ends it cleanly (exit 0) and promptly.

The real daemon is started again and again and stopped at one point of its start-up each time:
the moment it reports ``running`` (its MQTT connections still connecting), while the broker is
slow to answer CONNECT (a relay hands the broker's bytes on late, so the SIGTERM falls before,
on or after the CONNACKs), while the broker is down (the connections retry), and once every
connection is up. Each time the daemon must exit 0 within :data:`STOP_BOUND_S`.

(On Python 3.11, ``asyncio.wait_for`` returned the connect's result, or raised its error, instead
of the cancellation when a shutdown's cancellation arrived just as the connect finished: an MQTT
supervisor went on to connect and waited for the connection's loss forever, or retried a refused
connect forever, and the shutdown waited for it. The code before hung in each run of this file.)
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.broker import Mosquitto
from devkit.daemon import GatewayDaemon
from tests.gateway.e2e.harness import WAIT_S
from tests.reliability.harness import DEFAULT_MODEL
from tests.support.slow_relay import SlowRelay

STOP_BOUND_S = 10.0  # a clean shutdown here takes well under a second
# MQTT sources besides the publisher: nine connections connecting as the SIGTERM comes, each
# supervised on its own, make one start exercise the race nine times (the code before hung in
# about one start in three).
SOURCES = 8
RUNS = 8  # right after 'running'; starts take 1-3 s, so all points stay under a minute
CONNACK_DELAY_S = 0.2
# After 'running', before the SIGTERM: before, around and after the delayed CONNACKs.
DELAYED_OFFSETS_S = [0.0, 0.15, 0.2, 0.25]


def _write_config(directory: Path, port: int, sources: int = SOURCES) -> Path:
    """One gateway with ``sources`` MQTT sources and its publisher on a broker at ``port``,
    quick retries and status."""
    broker = f"port = {port}\nreconnect_initial_s = 0.05\nreconnect_max_s = 0.2\n"
    mqtt_sources = "".join(
        f"""
[[sources]]
kind = "mqtt"
topics = ["sensors/{n}/+/raw"]
client_id = "gw-stop-in-{n}"
[sources.broker]
{broker}"""
        for n in range(sources)
    )
    path = directory / "gateway.toml"
    path.write_text(
        f"""
gateway_id = "gw-stop"
state_dir = "{directory / "state"}"
[[models]]
feature = "pm10"
model_dir = "{DEFAULT_MODEL}"
[state]
status_interval_s = 0.05
[logging]
format = "json"
level = "info"
{mqtt_sources}
[publisher]
shutdown_flush_s = 2
[publisher.broker]
{broker}
""",
        encoding="utf-8",
    )
    return path


class Starts:
    """Starts a fresh daemon (own state directory) per run and stops it with SIGTERM."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._count = itertools.count()
        self.running: GatewayDaemon | None = None

    def start(self, port: int) -> GatewayDaemon:
        directory = self._root / f"run-{next(self._count)}"
        directory.mkdir()
        daemon = GatewayDaemon(_write_config(directory, port), directory / "state")
        self.running = daemon.start()
        return daemon

    def sigterm_and_wait(self, daemon: GatewayDaemon, point: str) -> None:
        """SIGTERM now; the daemon must be gone, with exit 0, within STOP_BOUND_S."""
        sent = time.monotonic()
        daemon.process.send_signal(signal.SIGTERM)
        try:
            code = daemon.process.wait(timeout=STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            daemon.kill()
            pytest.fail(
                f"{point}: the daemon was still running {STOP_BOUND_S} s after SIGTERM; "
                f"end of its log ({daemon.log}):\n{daemon.log_tail()}"
            )
        assert code == 0, f"{point}: exit code {code}; end of its log:\n{daemon.log_tail()}"
        assert time.monotonic() - sent < STOP_BOUND_S
        self.running = None


@pytest.fixture
def starts(tmp_path: Path) -> Iterator[Starts]:
    runs = Starts(tmp_path / "runs")
    (tmp_path / "runs").mkdir()
    yield runs
    if runs.running is not None:
        runs.running.kill()


def _running(daemon: GatewayDaemon) -> None:
    """Until the daemon reports phase 'running' (its connections may still be connecting)."""
    daemon.wait_ready(WAIT_S, wait_sources=False, poll_s=0.002)


def test_sigterm_as_soon_as_running(starts: Starts, mosquitto: Mosquitto) -> None:
    for _ in range(RUNS):
        daemon = starts.start(mosquitto.port)
        _running(daemon)
        starts.sigterm_and_wait(daemon, "right after 'running'")


def test_sigterm_while_the_connack_is_late(starts: Starts, mosquitto: Mosquitto) -> None:
    with SlowRelay(mosquitto.host, mosquitto.port, CONNACK_DELAY_S) as relay:
        for offset in DELAYED_OFFSETS_S:
            daemon = starts.start(relay.port)
            _running(daemon)
            time.sleep(offset)
            starts.sigterm_and_wait(daemon, f"{offset} s after 'running', CONNACK late")


def test_sigterm_while_the_broker_is_down(starts: Starts, mosquitto: Mosquitto) -> None:
    mosquitto.stop()
    for run in range(3):
        daemon = starts.start(mosquitto.port)
        _running(daemon)
        time.sleep(0.1 * run)  # in a refused connect, or in the backoff between two
        starts.sigterm_and_wait(daemon, "broker down")


def test_sigterm_once_connected(starts: Starts, mosquitto: Mosquitto) -> None:
    for _ in range(2):
        daemon = starts.start(mosquitto.port)
        daemon.wait_ready(WAIT_S)  # every MQTT source is subscribed
        status = daemon.wait_status(lambda s: s.get("publisher", {}).get("connected") is True)
        assert status["publisher"]["connected"], "the publisher did not connect"
        starts.sigterm_and_wait(daemon, "both connections up")
