"""Credentials never reach the logs or error messages: a real mosquitto with authentication,
a ``password_file`` (right, then wrong), structlog's capture_logs, and the config error path."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from devkit.broker import Mosquitto
from tesla_gateway.daemon.config import load_config
from tesla_gateway.errors import ConfigError
from tesla_gateway.mqtt.config import MqttBrokerConfig
from tesla_gateway.mqtt.connection import MqttConnection

RIGHT = "Pw-correct-4f9a2e"
WRONG = "Pw-wrong-77c1d0"


@pytest.fixture
def auth_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path / "broker", users={"gateway": RIGHT})
    broker.start()
    yield broker
    broker.stop()


def test_password_file_works_and_is_never_logged(tmp_path: Path, auth_broker: Mosquitto) -> None:
    secret = tmp_path / "mqtt-password"
    secret.write_text(WRONG + "\n", encoding="utf-8")
    config = MqttBrokerConfig(
        port=auth_broker.port,
        username="gateway",
        password_file=secret,
        reconnect_initial_s=0.05,
        reconnect_max_s=0.1,
    )

    async def scenario() -> tuple[bool, bool]:
        async with MqttConnection(config, client_id="secret-test", clean_start=True) as connection:
            await asyncio.sleep(0.5)  # refused attempts with the wrong password, logged
            refused = not connection.connected
            secret.write_text(RIGHT + "\n", encoding="utf-8")  # rotated: read at each connect
            await asyncio.wait_for(connection.wait_connected(), 10)
            await connection.publish("t/x", b"1")
            return refused, connection.connected

    with capture_logs() as logs:
        refused, connected = asyncio.run(scenario())
    assert refused and connected
    assert any(entry["event"] == "mqtt_connect_failed" for entry in logs)
    text = repr(logs)
    assert RIGHT not in text and WRONG not in text
    assert RIGHT not in repr(config) and RIGHT not in config.model_dump_json()


def test_inline_password_is_hidden_in_repr_and_config_errors(tmp_path: Path) -> None:
    config = MqttBrokerConfig(username="gateway", password=RIGHT)  # type: ignore[arg-type]
    assert RIGHT not in repr(config) and RIGHT not in str(config.model_dump())
    path = tmp_path / "gateway.toml"
    # An invalid value for a password key must not be echoed into the (journaled) error.
    path.write_text(
        f"""
gateway_id = "g"
state_dir = "{tmp_path}"
[[models]]
feature = "pm10"
model_dir = "{tmp_path}"
[publisher.broker]
username = "gateway"
password = ["{RIGHT}"]
""",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as error:
        load_config(path, environ={})
    assert "password" in str(error.value) and RIGHT not in str(error.value)
    path.write_text(path.read_text().replace(f'["{RIGHT}"]', "123456789"), encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        load_config(path, environ={})
    assert "123456789" not in str(error.value)
