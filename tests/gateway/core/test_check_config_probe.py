"""``check-config --probe`` connects to every configured broker once and says whether it could.

Before, check-config only checked that the password and TLS files could be read: a wrong host,
port, password or CA passed it, and the daemon then retried in the background. Every broker
here is real (mosquitto on loopback, with users or TLS) or a real socket: a closed port, and a
listener that accepts TCP but never answers CONNECT.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.broker import Mosquitto, TestPki, free_port, make_test_pki
from tesla_gateway.daemon.cli import main

BASE = """
gateway_id = "gw-1"
state_dir = "state"
[[models]]
feature = "pm10"
model_dir = "models/pm10"
"""


def broker_table(section: str, port: int, extra: str = "") -> str:
    return f'[{section}]\nhost = "127.0.0.1"\nport = {port}\n{extra}'


def probe(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    config = tmp_path / "gateway.toml"
    config.write_text(BASE + text, encoding="utf-8")
    code = main(
        [
            "check-config",
            "--skip-models",
            "--probe",
            "--probe-timeout-s",
            "1",
            "--config",
            str(config),
        ]
    )
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_reachable_broker_is_ok_and_a_closed_port_is_refused(
    mosquitto: Mosquitto, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    closed = free_port()
    text = broker_table("publisher.broker", mosquitto.port) + (
        '[[sources]]\nkind = "mqtt"\n' + broker_table("sources.broker", closed)
    )
    code, out, err = probe(tmp_path, text, capsys)
    assert f"broker publisher.broker 127.0.0.1:{mosquitto.port}: ok" in out
    assert f"broker sources[0].broker 127.0.0.1:{closed}: refused" in err
    assert "1 of 2 broker(s) could not be reached" in err
    assert code == 1
    assert "configuration OK" not in out


def test_every_broker_reached_is_configuration_ok(
    mosquitto: Mosquitto, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = broker_table("publisher.broker", mosquitto.port) + (
        '[[sources]]\nkind = "mqtt"\n' + broker_table("sources.broker", mosquitto.port)
    )
    code, out, err = probe(tmp_path, text, capsys)
    assert code == 0, out + err
    assert out.count(": ok\n") == 2
    assert out.rstrip().endswith("configuration OK (models not loaded: --skip-models)")


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_a_wrong_password_is_auth_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], protocol: str
) -> None:
    secret = tmp_path / "password"
    secret.write_text("wrong\n", encoding="utf-8")
    with Mosquitto(tmp_path / "auth", users={"gateway": "right"}) as broker:
        extra = f'protocol = "{protocol}"\nusername = "gateway"\npassword_file = "{secret}"\n'
        code, _, err = probe(tmp_path, broker_table("publisher.broker", broker.port, extra), capsys)
        assert code == 1
        line = f"broker publisher.broker 127.0.0.1:{broker.port}: auth failed: "
        assert line in err, err
        assert "wrong" not in err  # the password is never shown
        secret.write_text("right\n", encoding="utf-8")
        code, out, err = probe(
            tmp_path, broker_table("publisher.broker", broker.port, extra), capsys
        )
        assert code == 0, out + err


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[tuple[Mosquitto, TestPki]]:
    pki = make_test_pki(tmp_path / "pki")
    with Mosquitto(tmp_path / "tls", tls=pki) as broker:
        yield broker, pki


def test_tls_errors_are_named(
    tls_broker: tuple[Mosquitto, TestPki], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broker, pki = tls_broker
    client = f'cert_file = "{pki.client_cert}"\nkey_file = "{pki.client_key}"\n'
    right = broker_table("publisher.broker", broker.port, "[publisher.broker.tls]\n")
    # No ca_file: the system trust store does not know the test CA.
    code, _, err = probe(tmp_path, right + client, capsys)
    assert code == 1
    assert "TLS error: the broker's certificate did not verify" in err, err
    # The broker requires a client certificate: it ends the handshake with an alert.
    code, _, err = probe(tmp_path, right + f'ca_file = "{pki.ca}"\n', capsys)
    assert code == 1
    assert "TLS error: the broker ended the connection after the handshake" in err, err
    assert "client certificate" in err
    # Plain MQTT to the TLS port.
    code, _, err = probe(tmp_path, broker_table("publisher.broker", broker.port), capsys)
    assert code == 1
    assert f"127.0.0.1:{broker.port}: refused: the broker closed the connection" in err, err
    code, out, err = probe(tmp_path, right + f'ca_file = "{pki.ca}"\n' + client, capsys)
    assert code == 0, out + err
    assert f"broker publisher.broker 127.0.0.1:{broker.port}: ok" in out


def test_a_broker_that_never_answers_is_a_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel completes the handshake
        port = silent.getsockname()[1]
        code, _, err = probe(tmp_path, broker_table("publisher.broker", port), capsys)
    assert code == 1
    assert f"broker publisher.broker 127.0.0.1:{port}: timeout: no CONNACK within 1 s" in err
