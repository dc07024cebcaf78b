"""Publishing one retained message and waiting until the broker has it, as an operator would."""

from __future__ import annotations

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from devkit.broker import Mosquitto

__all__ = ["publish_retained"]


def publish_retained(broker: Mosquitto, topic: str, payload: bytes) -> None:
    """Retains ``payload`` on ``topic`` (QoS 1); an empty payload clears the retained message."""
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2)
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        client.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()
