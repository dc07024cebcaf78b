"""Closing MqttConnections at any moment of their connect returns promptly (real mosquitto).

A shutdown closes every connection, whatever each is doing: in the worker thread's connect,
waiting for CONNACK, subscribing, or connected. Each round opens many connections at once (their
connects finish one after another, a few threads at a time) and closes them all a little later
than the round before, so that over the rounds closes land on every step of a connect, the
moment a step completes included. Each close must return within :data:`CLOSE_BOUND_S`.

(On Python 3.11, ``asyncio.wait_for`` returned the step's result instead of raising when the
cancellation arrived just as that step completed: the supervisor connected anyway, then waited
for the connection's loss, and close() waited for the supervisor forever. Before the fix, some
round of each setup left connections hanging.)
"""

from __future__ import annotations

import asyncio

import pytest

from devkit.broker import Mosquitto
from tesla_gateway.mqtt.connection import MqttConnection
from tests.gateway.io.helpers import broker_config

CONNECTIONS = 16  # per round: more connects in flight, more of them finishing as the close comes
ROUNDS = 40
STEP_S = 0.0005  # each round closes this much later after opening than the one before
CLOSE_BOUND_S = 2.0  # a close takes milliseconds here


@pytest.mark.parametrize(
    "setup",
    [
        {"client": "fast", "io_loop": "thread"},
        {"client": "plain", "io_loop": "thread"},
        {"client": "fast", "io_loop": "event_loop"},
    ],
    ids=["fast", "plain", "fast-event-loop"],
)
def test_closing_at_any_moment_of_the_connect_returns_promptly(
    mosquitto: Mosquitto, setup: dict[str, str]
) -> None:
    async def closed_in_time(connection: MqttConnection) -> bool:
        try:
            async with asyncio.timeout(CLOSE_BOUND_S):
                await connection.close()
        except TimeoutError:
            return False
        return not connection.connected

    async def scenario() -> None:
        config = broker_config(mosquitto, **setup)
        for round_ in range(ROUNDS):
            connections = [
                MqttConnection(
                    config, client_id=f"close-{round_}-{n}", clean_start=True, name=f"c{n}"
                )
                for n in range(CONNECTIONS)
            ]
            for connection in connections:
                await connection.__aenter__()
            await asyncio.sleep(round_ * STEP_S)
            closed = await asyncio.gather(*(closed_in_time(c) for c in connections))
            hanging = closed.count(False)
            assert hanging == 0, (
                f"round {round_} (closed {round_ * STEP_S * 1000:.1f} ms after opening): "
                f"{hanging} of {CONNECTIONS} connections still open {CLOSE_BOUND_S} s after close()"
            )

    asyncio.run(scenario())
