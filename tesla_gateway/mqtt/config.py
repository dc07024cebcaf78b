"""Where the broker is, how to reach and authenticate to it, and what we leave behind (the will)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from tesla_gateway.password_file import read_password_file

__all__ = ["DEFAULT_MAX_INBOX", "ClientKind", "IoLoop", "MqttBrokerConfig", "MqttTlsConfig", "Will"]

DEFAULT_MAX_INBOX = 10_000  # received messages waiting for on_message; ~3 MB of small readings

IoLoop = Literal["thread", "event_loop"]
ClientKind = Literal["fast", "plain"]


class MqttTlsConfig(BaseModel):
    """TLS towards the broker; with no ``ca_file`` the system's trust store is used."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: Path | None = Field(
        default=None, description="PEM bundle of the CA(s) that signed the broker certificate."
    )
    cert_file: Path | None = Field(
        default=None, description="PEM client certificate, for brokers that require one."
    )
    key_file: Path | None = Field(default=None, description="PEM private key of cert_file.")
    insecure: bool = Field(
        default=False,
        description="Skip the broker host name check. Only for testing: it allows impostors.",
    )

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be given together")
        return self


class MqttBrokerConfig(BaseModel):
    """Where the broker is and how to authenticate; shared by the source and the publisher."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", min_length=1, description="Broker host name or IP.")
    port: int = Field(default=1883, ge=1, le=65535, description="Broker port (8883 for TLS).")
    transport: Literal["tcp"] = Field(default="tcp", description="Transport; only tcp for now.")
    protocol: Literal["5", "3.1.1"] = Field(default="5", description="MQTT protocol version.")
    keepalive: int = Field(
        default=60, ge=5, le=65535, description="Seconds between keep-alive pings."
    )
    tls: MqttTlsConfig | None = Field(default=None, description="TLS settings; omit for plain TCP.")
    username: str | None = Field(default=None, description="User name for authentication.")
    password: SecretStr | None = Field(
        default=None, description="Password; prefer password_file so it stays out of the config."
    )
    password_file: Path | None = Field(
        default=None, description="File whose first line is the password (e.g. a systemd secret)."
    )
    connect_timeout_s: float = Field(
        default=10.0, gt=0, description="Seconds to wait for TCP connect and CONNACK."
    )
    reconnect_initial_s: float = Field(
        default=0.5, gt=0, description="First delay before reconnecting; doubles per failure."
    )
    reconnect_max_s: float = Field(default=30.0, gt=0, description="Longest reconnect delay.")
    client: ClientKind = Field(
        default="fast",
        description=(
            "'fast': paho with the gateway's lean receive and publish path (fast_path.py); "
            "'plain': paho's own API only, slower. 'fast' falls back to 'plain' by itself, with "
            "a log line, when the installed paho lacks what the fast path relies on."
        ),
    )

    io_loop: IoLoop = Field(
        default="thread",
        description=(
            "'thread': paho's network loop in its own thread, messages handed to the event loop "
            "in batches; 'event_loop': the socket is read and written by the gateway's event "
            "loop itself (no thread hand-offs; plain TCP only: with TLS 'thread' is used)."
        ),
    )

    @model_validator(mode="after")
    def _credentials_consistent(self) -> Self:
        if self.password is not None and self.password_file is not None:
            raise ValueError("give either password or password_file, not both")
        if (self.password is not None or self.password_file is not None) and not self.username:
            raise ValueError("a password needs a username")
        if self.reconnect_max_s < self.reconnect_initial_s:
            raise ValueError("reconnect_max_s must not be smaller than reconnect_initial_s")
        return self

    def resolve_password(self) -> SecretStr | None:
        """The password, reading ``password_file`` if configured (at connect, so rotation works)."""
        if self.password_file is None:
            return self.password
        return SecretStr(read_password_file(self.password_file, "mqtt password_file"))


@dataclass(frozen=True, slots=True)
class Will:
    """Last will: what the broker publishes for us if we vanish without a clean DISCONNECT."""

    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = True
