"""Two clients with one client id (two gateways with one gateway_id) must not storm the broker.

Before the backoff, two MqttConnections with one client id on a real mosquitto took each
other's session over about 50 times a second (MQTT 5) with a log line each. The policy is
tested alone (pure, fake clocks), then against a real mosquitto, then with a scripted broker
for the one thing Debian's mosquitto 2.0.11 never does: tell an MQTT 5 client "Session taken
over" (reason 0x8E) in a DISCONNECT before closing it (it just closes the socket).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from devkit.broker import Mosquitto
from tesla_gateway.mqtt import session_loss
from tesla_gateway.mqtt.config import MqttBrokerConfig
from tesla_gateway.mqtt.connection import MqttConnection
from tesla_gateway.mqtt.session_loss import (
    REPORT_INTERVAL_S,
    SESSION_TAKEN_OVER,
    STABLE_AFTER_S,
    SessionLossPolicy,
    session_problems,
)
from tests.gateway.io.helpers import broker_config, eventually


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _policy(clock: FakeClock | None = None) -> SessionLossPolicy:
    clock = clock or FakeClock()
    return SessionLossPolicy(0.5, 4.0, monotonic=clock, wall_clock=lambda: 1_800_000_000.0)


def test_a_stable_connection_reconnects_at_once_and_resets_the_backoff() -> None:
    policy = _policy()
    assert policy.after_failed_attempt() == 0.5
    assert policy.after_failed_attempt() == 1.0
    decision = policy.after_loss(lasted_s=STABLE_AFTER_S + 1, reason_code=None)
    assert (decision.wait_s, decision.unstable, decision.in_a_row) == (0.0, False, 0)
    assert policy.after_failed_attempt() == 0.5  # reset by the stable connection


def test_short_connections_back_off_doubling_to_the_maximum() -> None:
    policy = _policy()
    waits = [policy.after_loss(lasted_s=0.2, reason_code=None).wait_s for _ in range(6)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert policy.lost == 6
    assert policy.taken_over == 0


def test_a_takeover_backs_off_even_after_a_long_connection_and_is_counted() -> None:
    policy = _policy()
    decision = policy.after_loss(lasted_s=3600.0, reason_code=SESSION_TAKEN_OVER)
    assert decision.taken_over and decision.unstable and decision.wait_s == 0.5
    assert policy.stats(connections=7, connected_for_s=STABLE_AFTER_S - 1) == {
        "connections": 7,
        "lost": 1,
        "taken_over": 1,
        "last_taken_over": 1_800_000_000.0,
        "unstable_in_a_row": 1,
    }
    assert policy.stats(connections=7, connected_for_s=None)["unstable_in_a_row"] == 1
    assert policy.stats(connections=7, connected_for_s=STABLE_AFTER_S)["unstable_in_a_row"] == 0


def test_the_status_names_a_recent_takeover_and_a_run_of_short_connections() -> None:
    now = 1_800_000_000.0
    sessions: dict[str, object] = {
        "publisher": {"taken_over": 2, "last_taken_over": now - 30, "unstable_in_a_row": 2},
        "mqtt-source-0": {"taken_over": 0, "last_taken_over": None, "unstable_in_a_row": 3},
        "reference-station": {"taken_over": 1, "last_taken_over": now - 3600},  # long ago
        "fleet": {"unstable_in_a_row": 2},  # two in a row: a broker restart, not a pattern
        "broken": "not a mapping",
    }
    assert session_problems(sessions, now) == [
        "mqtt mqtt-source-0: the broker closed 3 connections in a row right after accepting "
        "them (another client with its client id?)",
        "mqtt publisher: session taken over by another client with its client id "
        "(2 time(s) in all)",
    ]


def test_repeats_are_reported_once_a_minute_and_the_third_in_a_row_always() -> None:
    clock = FakeClock()
    policy = _policy(clock)
    reported = []
    for _ in range(6):
        reported.append(policy.after_loss(lasted_s=0.1, reason_code=None).report)
        clock.now += 1.0
    assert reported == [True, False, True, False, False, False]
    clock.now += REPORT_INTERVAL_S
    assert policy.after_loss(lasted_s=0.1, reason_code=None).report


def test_failed_attempts_are_a_warning_at_once_then_once_a_minute_while_they_last() -> None:
    clock = FakeClock()
    policy = _policy(clock)
    decisions = []
    for _ in range(70):  # one attempt a second for 70 s
        decisions.append(policy.after_connect_failure())
        clock.now += 1.0
    reported = [(d.attempts, d.failing_for_s) for d in decisions if d.report]
    assert reported == [(1, 0.0), (61, REPORT_INTERVAL_S)]
    assert [d.wait_s for d in decisions[:5]] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert policy.after_connected() == 70
    again = policy.after_connect_failure()  # a new run: told at once, counted from one
    assert (again.report, again.attempts, again.failing_for_s) == (True, 1, 0.0)


def test_a_broker_that_stays_unreachable_keeps_being_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: one warning for the first failed attempt, then only debug lines for as long as
    the broker stayed away (a daemon down for a day said so once, at its start)."""
    monkeypatch.setattr(session_loss, "REPORT_INTERVAL_S", 0.5)
    broker = Mosquitto(tmp_path / "late")  # not started: its port refuses connections
    config = broker_config(broker, reconnect_initial_s=0.05, reconnect_max_s=0.1)

    async def scenario() -> None:
        async with MqttConnection(config, client_id="patient", clean_start=True) as connection:
            await asyncio.sleep(1.3)
            await asyncio.to_thread(broker.start)
            try:
                await asyncio.wait_for(connection.wait_connected(), 10)
            finally:
                await asyncio.to_thread(broker.stop)

    with capture_logs() as logs:
        asyncio.run(scenario())
    failed = [e for e in logs if e["event"] == "mqtt_connect_failed"]
    warnings = [e for e in failed if e["log_level"] == "warning"]
    assert 2 <= len(warnings) <= 4, [(e["log_level"], e["attempts"]) for e in failed]
    assert warnings[0]["attempts"] == 1  # the first failure at once
    assert warnings[-1]["attempts"] > warnings[0]["attempts"]
    assert warnings[-1]["failing_for_s"] >= 0.5
    assert f"127.0.0.1:{broker.port}" in warnings[-1]["error"]
    assert len(failed) > len(warnings)  # the rest at debug level
    connected = [e for e in logs if e["event"] == "mqtt_connected"]
    assert connected[0]["after_failed_attempts"] == len(failed)


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
@pytest.mark.parametrize("client", ["fast", "plain"])
def test_two_clients_with_one_id_back_off_and_say_why(
    mosquitto: Mosquitto, protocol: str, client: str
) -> None:
    config = broker_config(
        mosquitto, protocol=protocol, client=client, reconnect_initial_s=0.1, reconnect_max_s=0.8
    )

    async def scenario() -> tuple[int, int, int]:
        first = MqttConnection(config, client_id="twin", clean_start=True, name="first")
        second = MqttConnection(config, client_id="twin", clean_start=True, name="second")
        async with first, second:
            await asyncio.sleep(3.0)
            lost = first.session_stats()["lost"], second.session_stats()["lost"]
            assert all(isinstance(n, int) for n in lost)
            return first.generation + second.generation, int(lost[0] or 0), int(lost[1] or 0)

    with capture_logs() as logs:
        connections, lost_first, lost_second = asyncio.run(scenario())
    # Without the backoff: about 150 connections in these 3 s; with it, 0.1 s doubling to 0.8.
    assert connections <= 16, connections
    assert lost_first + lost_second >= 2
    unstable = [e for e in logs if e["event"] == "mqtt_connection_unstable"]
    assert unstable
    hints = [e["hint"] for e in unstable if "hint" in e]
    assert hints, "three short connections in a row must name the likely cause"
    assert "'twin'" in hints[0] and "gateway_id" in hints[0]
    assert not [e for e in logs if e["event"] == "mqtt_session_taken_over"]  # no reason given


def test_a_connection_that_lasted_reconnects_at_once_after_a_broker_restart(
    mosquitto: Mosquitto, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_loss, "STABLE_AFTER_S", 0.3)
    config = broker_config(mosquitto)

    async def scenario() -> None:
        async with MqttConnection(config, client_id="steady", clean_start=True) as connection:
            await asyncio.wait_for(connection.wait_connected(), 10)
            await asyncio.sleep(0.5)  # longer than STABLE_AFTER_S
            await asyncio.to_thread(mosquitto.restart)
            await eventually(lambda: connection.connected and connection.generation == 2, 10)
            assert connection.session_stats()["lost"] == 1

    with capture_logs() as logs:
        asyncio.run(scenario())
    losses = [e for e in logs if e["event"].startswith("mqtt_connection_")]
    assert [(e["event"], e["retry_in_s"]) for e in losses] == [("mqtt_connection_lost", 0.0)]


# -- a broker that says "Session taken over" ------------------------------------------------

CONNACK_V5 = bytes([0x20, 0x03, 0x00, 0x00, 0x00])  # no session, success, no properties
DISCONNECT_TAKEN_OVER = bytes([0xE0, 0x02, SESSION_TAKEN_OVER, 0x00])


@contextlib.asynccontextmanager
async def taking_over_broker(after_s: float) -> AsyncIterator[tuple[int, list[int]]]:
    """Accepts every MQTT 5 CONNECT, then ``after_s`` later sends DISCONNECT 0x8E and closes
    (what EMQX, HiveMQ and newer mosquitto do when a second client takes the client id)."""
    accepted: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            header = await reader.readexactly(2)  # CONNECT is short: one length byte
            await reader.readexactly(header[1])
            writer.write(CONNACK_V5)
            await writer.drain()
            accepted.append(1)
            await asyncio.sleep(after_s)
            writer.write(DISCONNECT_TAKEN_OVER)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port, accepted
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("client", ["fast", "plain"])
def test_an_mqtt5_takeover_is_an_error_that_says_what_to_change(client: str) -> None:
    async def scenario() -> tuple[dict[str, int | float | None], int]:
        async with taking_over_broker(after_s=0.1) as (port, accepted):
            config = MqttBrokerConfig.model_validate(
                {
                    "host": "127.0.0.1",
                    "port": port,
                    "client": client,
                    "reconnect_initial_s": 0.2,
                    "reconnect_max_s": 0.4,
                    "connect_timeout_s": 5.0,
                }
            )
            connection = MqttConnection(
                config, client_id="tesla-gateway-gw1-in", clean_start=True, name="source"
            )
            async with connection:
                await eventually(lambda: connection.session_stats()["taken_over"] == 3, 10)
            return connection.session_stats(), len(accepted)

    with capture_logs() as logs:
        stats, accepted = asyncio.run(scenario())
    assert stats["taken_over"] == 3 and stats["lost"] == 3
    assert isinstance(stats["last_taken_over"], float)
    assert accepted <= 4  # waited between attempts: 0.2, 0.4, 0.4 s
    errors = [e for e in logs if e["event"] == "mqtt_session_taken_over"]
    assert errors[0]["log_level"] == "error"
    assert errors[0]["reason"] == "Session taken over"
    assert "'tesla-gateway-gw1-in'" in errors[0]["error"]
    assert "gateway_id" in errors[0]["error"]
    assert [e["log_level"] for e in errors] == ["error", "debug", "debug"]  # rate-limited
