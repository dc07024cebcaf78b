"""What can go wrong on an MQTT connection, one class per cause."""

from __future__ import annotations

from tesla_gateway.errors import GatewayError

__all__ = [
    "MqttConnectError",
    "MqttError",
    "MqttNotConnectedError",
    "MqttPublishError",
    "MqttSubscribeError",
]


class MqttError(GatewayError):
    """Root of the MQTT connection's errors."""


class MqttNotConnectedError(MqttError):
    """The broker is not connected (now, or the connection dropped before the acknowledgement)."""


class MqttConnectError(MqttError):
    """A connection attempt failed: unreachable broker, TLS failure or refused CONNACK."""


class MqttPublishError(MqttError):
    """The broker acknowledged a publish with a failure reason code (e.g. not authorised)."""


class MqttSubscribeError(MqttError):
    """The broker refused a subscription."""
