"""The paho internals the fast path relies on, and the fallback when they change.

``tesla_gateway/mqtt/fast_path.py`` overrides and calls private methods of ``paho.Client`` and reads
its private attributes. These tests fail when the installed paho no longer provides them (a new
paho: run them before widening the pin in pyproject.toml), and prove that the daemon then uses
the plain client on its own, with a log line, and still delivers.
"""

from __future__ import annotations

import asyncio
import re
import threading
import tomllib
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt import client as paho
from structlog.testing import capture_logs

from devkit.broker import Mosquitto
from tesla_gateway.mqtt import fast_path
from tesla_gateway.mqtt.connection import MqttConnection
from tesla_gateway.mqtt.fast_path import LeanClient, contract_holds, contract_problems
from tesla_gateway.mqtt.inbox import InboundMessage
from tests.gateway.io.helpers import broker_config, eventually

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


@pytest.fixture
def fresh_contract() -> Iterator[None]:
    """The check is cached per process: recompute it around a test that changes paho."""
    contract_problems.cache_clear()
    yield
    contract_problems.cache_clear()


def test_the_installed_paho_holds_the_fast_paths_contract() -> None:
    assert contract_problems() == ()
    assert contract_holds()


def test_the_contract_names_every_private_part_the_fast_path_overrides() -> None:
    """A new override in LeanClient must be added to the contract, or this fails."""
    overridden = {
        name
        for name, value in vars(LeanClient).items()
        if callable(value) and hasattr(paho.Client, name) and not name.startswith("__")
    }
    assert overridden <= set(fast_path.PAHO_METHODS)


def test_paho_is_pinned_to_the_installed_minor() -> None:
    """The pin allows exactly the minor this contract was checked on."""
    dependencies = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["dependencies"]
    (pin,) = [d for d in dependencies if d.startswith("paho-mqtt")]
    match = re.fullmatch(r"paho-mqtt>=(\d+)\.(\d+),<(\d+)\.(\d+)", pin)
    assert match is not None, f"{pin!r} should read paho-mqtt>=X.Y,<X.Y+1"
    low_major, low_minor, high_major, high_minor = map(int, match.groups())
    assert (high_major, high_minor) == (low_major, low_minor + 1)
    major, minor = map(int, version("paho-mqtt").split(".")[:2])
    assert (major, minor) == (low_major, low_minor)


def _renamed_parameter(original: Callable[..., Any]) -> Callable[..., Any]:
    def _handle_pubackcomp(self: paho.Client, command: str) -> Any:
        return original(self, command)

    return _handle_pubackcomp


def _plain_lock_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def init(self: paho.Client, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._out_message_mutex = threading.Lock()  # type: ignore[assignment]

    return init


CHANGES: dict[str, tuple[str, Callable[[pytest.MonkeyPatch], None]]] = {
    "method gone": (
        "paho.Client._update_inflight is gone",
        lambda mp: mp.delattr(paho.Client, "_update_inflight"),
    ),
    "parameter renamed": (
        "paho.Client._handle_pubackcomp takes ('command',), expected ('cmd',)",
        lambda mp: mp.setattr(
            paho.Client,
            "_handle_pubackcomp",
            _renamed_parameter(paho.Client._handle_pubackcomp),
        ),
    ),
    "static method made a method": (
        "paho.Client._raise_for_invalid_topic changed between method and static method",
        lambda mp: mp.setattr(paho.Client, "_raise_for_invalid_topic", lambda self, topic: None),
    ),
    "attribute of another type": (
        "paho.Client()._out_message_mutex is lock, not RLock",
        lambda mp: mp.setattr(paho.Client, "__init__", _plain_lock_init(paho.Client.__init__)),
    ),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_changed_paho_breaks_the_contract(
    change: str, monkeypatch: pytest.MonkeyPatch, fresh_contract: None
) -> None:
    expected, apply = CHANGES[change]
    apply(monkeypatch)
    assert expected in contract_problems()
    assert not contract_holds()


def test_a_broken_contract_falls_back_to_the_plain_client_which_still_delivers(
    mosquitto: Mosquitto, monkeypatch: pytest.MonkeyPatch, fresh_contract: None
) -> None:
    # A change paho's own code does not notice (it passes the argument by position).
    CHANGES["parameter renamed"][1](monkeypatch)
    received: list[InboundMessage] = []

    async def on_message(message: InboundMessage) -> None:
        received.append(message)

    async def scenario() -> list[str]:
        config = broker_config(mosquitto)  # client: fast, the default
        with capture_logs() as logs:
            async with (
                MqttConnection(
                    config, client_id="fb-sub", clean_start=True, on_message=on_message
                ) as sub,
                MqttConnection(config, client_id="fb-pub", clean_start=True) as pub,
            ):
                assert (sub.client_kind, pub.client_kind) == ("plain", "plain")
                await sub.subscribe(["fallback/+"])
                await asyncio.wait_for(sub.wait_connected(), 10)
                await asyncio.wait_for(pub.wait_connected(), 10)
                for n in range(5):
                    await pub.publish(f"fallback/{n}", str(n).encode())
                await asyncio.gather(*pub.start_publish_many([("fallback/5", b"5", False)]))
                await eventually(lambda: len(received) == 6)
        unavailable = [e for e in logs if e["event"] == "mqtt_fast_path_unavailable"]
        assert len(unavailable) == 2  # one line per connection, not per reconnect
        assert unavailable[0]["using"] == "plain"
        assert unavailable[0]["paho_version"] == version("paho-mqtt")
        problems: list[str] = unavailable[0]["problems"]
        return problems

    problems = asyncio.run(scenario())
    assert any("_handle_pubackcomp" in problem for problem in problems)
    assert [m.payload for m in received] == [str(n).encode() for n in range(6)]


def test_plain_can_be_chosen_in_config_without_a_log_line(mosquitto: Mosquitto) -> None:
    async def scenario() -> None:
        with capture_logs() as logs:
            async with MqttConnection(
                broker_config(mosquitto, client="plain"), client_id="pl", clean_start=True
            ) as connection:
                assert connection.client_kind == "plain"
                await asyncio.wait_for(connection.wait_connected(), 10)
                await connection.publish("plain/x", b"1")
        assert not [e for e in logs if e["event"] == "mqtt_fast_path_unavailable"]

    asyncio.run(scenario())


def test_an_unknown_client_kind_is_rejected(mosquitto: Mosquitto) -> None:
    with pytest.raises(ValueError, match="client"):
        broker_config(mosquitto, client="turbo")
