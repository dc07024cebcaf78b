"""How each connection attempt's paho client is chosen, built and connected.

Each attempt uses a fresh client with ``reconnect_on_failure=False`` and ``manual_ack=True``:
paho never reconnects or replays on its own (the supervising loop in
:mod:`tesla_gateway.mqtt.connection` owns that), and a message is acknowledged only once the
gateway handled it. ``client: fast`` uses :class:`~tesla_gateway.mqtt.fast_path.LeanClient`
unless the installed paho breaks the fast path's contract; ``client: plain``, or that case, uses
:class:`~tesla_gateway.mqtt.plain_client.PlainClient` (paho's public API).
"""

from __future__ import annotations

from dataclasses import dataclass

from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from structlog.typing import FilteringBoundLogger

from tesla_gateway.errors import ConfigError
from tesla_gateway.mqtt.attempt import PahoClient
from tesla_gateway.mqtt.config import ClientKind, MqttBrokerConfig, Will
from tesla_gateway.mqtt.fast_path import LeanClient, contract_problems, paho_version
from tesla_gateway.mqtt.plain_client import PlainClient

__all__ = ["ClientFactory", "choose_client_class"]


def choose_client_class(
    kind: ClientKind, log: FilteringBoundLogger
) -> type[LeanClient] | type[PlainClient]:
    """The paho client class for ``kind``: the fast one unless the installed paho breaks it."""
    if kind == "plain":
        return PlainClient
    problems = contract_problems()
    if not problems:
        return LeanClient
    log.warning(
        "mqtt_fast_path_unavailable",
        paho_version=paho_version(),
        problems=list(problems),
        using="plain",
    )
    return PlainClient


@dataclass(frozen=True, slots=True)
class ClientFactory:
    """Everything one connection's paho clients are built from, the same for every attempt."""

    broker: MqttBrokerConfig
    client_class: type[LeanClient] | type[PlainClient]
    client_id: str
    clean_start: bool
    will: Will | None = None
    session_expiry_s: int = 0
    max_in_flight: int | None = None

    @property
    def kind(self) -> ClientKind:
        """'fast' (the lean path) or 'plain' (chosen, or the fallback)."""
        return "fast" if self.client_class is LeanClient else "plain"

    def make(self) -> PahoClient:
        """A fresh, unconnected client; the password file is read now (so rotation works)."""
        broker = self.broker
        v5 = broker.protocol == "5"
        client = self.client_class(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            clean_session=None if v5 else self.clean_start,
            protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311,
            transport=broker.transport,
            reconnect_on_failure=False,
            manual_ack=True,
        )
        client.connect_timeout = broker.connect_timeout_s
        if self.max_in_flight is not None:  # paho's own cap (20) on unacknowledged publishes
            client.max_inflight_messages_set(self.max_in_flight)
        if broker.username:
            password = broker.resolve_password()
            client.username_pw_set(
                broker.username,
                password.get_secret_value() if password is not None else None,
            )
        tls = broker.tls
        if tls is not None:
            try:
                client.tls_set(
                    ca_certs=str(tls.ca_file) if tls.ca_file else None,
                    certfile=str(tls.cert_file) if tls.cert_file else None,
                    keyfile=str(tls.key_file) if tls.key_file else None,
                )
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                raise ConfigError(
                    f"mqtt tls: cannot load ca_file/cert_file/key_file ({exc}); "
                    "check the paths and that the key matches the certificate"
                ) from exc
            client.tls_insecure_set(tls.insecure)
        if self.will is not None:
            client.will_set(
                self.will.topic, self.will.payload, qos=self.will.qos, retain=self.will.retain
            )
        return client

    def connect(self, client: PahoClient) -> None:
        """Blocking, so run in a worker thread: DNS, TCP (and TLS) handshake, sending CONNECT."""
        broker = self.broker
        if broker.protocol == "5":
            properties = None
            if self.session_expiry_s > 0:
                properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
                properties.SessionExpiryInterval = self.session_expiry_s
            client.connect(
                broker.host,
                broker.port,
                broker.keepalive,
                clean_start=self.clean_start,
                properties=properties,
            )
        else:
            client.connect(broker.host, broker.port, broker.keepalive)
