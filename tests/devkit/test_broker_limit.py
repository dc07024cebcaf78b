"""The broker-limit measurement of make bench, run small against a real mosquitto."""

from __future__ import annotations

import shutil

import pytest

from devkit.bench import broker_limit


@pytest.mark.skipif(shutil.which("mosquitto_sub") is None, reason="mosquitto-clients missing")
def test_every_message_reaches_the_c_subscriber_and_is_timed() -> None:
    figures = broker_limit.broker_forwarding_rate(messages=3_000, sensors=1_000)
    assert figures["broker_messages"] == 3_000
    assert figures["broker_forward_s"] > 0
    assert figures["broker_forward_per_s"] == pytest.approx(3_000 / figures["broker_forward_s"])


def test_packet_ids_follow_the_publishers_own_sequence() -> None:
    """Pre-encoded packets carry the ids WirePublisher.packet_ids hands out, wrap included."""
    assert broker_limit._packet_ids(0, 3) == [1, 2, 3]
    assert broker_limit._packet_ids(65_534, 3) == [65_535, 1, 2]


def test_a_missing_subscriber_is_named_with_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda _name: None)
    with pytest.raises(broker_limit.BrokerClientsMissingError, match="mosquitto-clients"):
        broker_limit.broker_forwarding_rate(messages=10, sensors=10)
