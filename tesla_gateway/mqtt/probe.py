"""One real connection attempt to a configured broker, and why it failed if it did.

``tesla-gateway check-config --probe`` asks this for every broker in the configuration: the
daemon itself never gives up on a broker (it retries and logs), so only a probe can say before
the start that a host name, port, password or certificate is wrong. The attempt uses the
configured credentials and TLS files through the daemon's own client factory, paho's public API
(:class:`~tesla_gateway.mqtt.plain_client.PlainClient`), its own client id and a clean session,
and disconnects cleanly once the broker accepted it.
"""

from __future__ import annotations

import socket
import ssl
import time

from paho.mqtt.client import MQTT_LOG_ERR, ConnectFlags
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from tesla_gateway.errors import ConfigError
from tesla_gateway.mqtt.attempt import PahoClient
from tesla_gateway.mqtt.client_factory import ClientFactory
from tesla_gateway.mqtt.config import MqttBrokerConfig
from tesla_gateway.mqtt.plain_client import PlainClient

__all__ = ["probe_broker"]

_AUTH_REASONS = frozenset({0x86, 0x87, 0x8C})  # bad user name or password, not authorised, method
_LOOP_STEP_S = 0.1


def probe_broker(broker: MqttBrokerConfig, *, client_id: str, timeout_s: float) -> str | None:
    """Connect once (DNS, TCP, TLS, CONNECT, CONNACK) within about ``timeout_s``; None when the
    broker accepted the connection, else the reason, starting with what kind of failure it was
    (``refused``, ``auth failed``, ``TLS error``, ``timeout``, ``host not found``, ...)."""
    limited = broker.model_copy(update={"connect_timeout_s": timeout_s})
    factory = ClientFactory(limited, PlainClient, client_id=client_id, clean_start=True)
    try:
        client = factory.make()
    except ConfigError as exc:  # an unreadable password file, TLS files that do not load
        return f"not tried: {exc}"
    answers: list[ReasonCode] = []

    def on_connect(
        _client: object,
        _userdata: object,
        _flags: ConnectFlags,
        reason: ReasonCode,
        _properties: Properties | None,
    ) -> None:
        answers.append(reason)

    client.on_connect = on_connect
    said: list[str] = []  # paho's errors: why a connection ended (it raises none from loop())
    client.on_log = lambda _c, _u, level, text: said.append(text) if level == MQTT_LOG_ERR else None
    try:
        factory.connect(client)  # blocking: DNS, TCP and TLS handshakes, CONNECT sent
        _wait_for_connack(client, answers, timeout_s)
    except OSError as exc:
        _close_sockets_left_in(exc)
        return _failure(exc, timeout_s)
    finally:
        client.disconnect()
        client.close_sockets()
    if not answers:
        return _closed_early(said, tls=broker.tls is not None)
    reason = answers[0]
    if not reason.is_failure:
        return None
    if reason.value in _AUTH_REASONS:
        return f"auth failed: {reason}"
    return f"refused by the broker: {reason}"


class _NoConnackError(TimeoutError):
    """The connection was made but the broker did not answer CONNECT in time."""


def _wait_for_connack(client: PahoClient, answers: list[ReasonCode], timeout_s: float) -> None:
    """Run paho's loop until the CONNACK, the connection's end or the deadline."""
    deadline = time.monotonic() + timeout_s
    while not answers:
        if time.monotonic() >= deadline:
            raise _NoConnackError(f"no CONNACK within {timeout_s:g} s")
        if client.loop(timeout=_LOOP_STEP_S) != MQTTErrorCode.MQTT_ERR_SUCCESS:
            return  # closed before answering


def _closed_early(said: list[str], *, tls: bool) -> str:
    """The broker ended the connection before its CONNACK: with TLS, most likely over a client
    certificate it requires (TLS 1.3 says so after the handshake, or just closes); without,
    most likely plain MQTT sent to a TLS port."""
    reason = said[0] if said else "no reason given"
    if tls:
        return (
            f"TLS error: the broker ended the connection after the handshake ({reason}; does "
            "it require a client certificate: cert_file and key_file?)"
        )
    return (
        f"refused: the broker closed the connection before answering CONNECT ({reason}; "
        "plain MQTT to a TLS port?)"
    )


def _close_sockets_left_in(exc: OSError) -> None:
    """paho leaves the socket of a failed TLS handshake open in its frame
    (``Client._ssl_wrap_socket``): close it now rather than when the error is freed (with a
    ResourceWarning)."""
    traceback = exc.__traceback__
    while traceback is not None:
        for value in traceback.tb_frame.f_locals.values():
            if isinstance(value, socket.socket):
                value.close()
        traceback = traceback.tb_next


def _failure(exc: OSError, timeout_s: float) -> str:
    """What kind of failure ``exc`` is, and its detail."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS error: the broker's certificate did not verify ({exc.verify_message})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error: {exc.reason or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "refused: nothing accepts connections on that port"
    if isinstance(exc, socket.gaierror):
        return f"host not found: {exc.strerror}"
    if isinstance(exc, TimeoutError):
        detail = (
            exc if isinstance(exc, _NoConnackError) else f"no connection within {timeout_s:g} s"
        )
        return f"timeout: {detail}"
    return f"cannot connect: {exc.strerror or exc}"
