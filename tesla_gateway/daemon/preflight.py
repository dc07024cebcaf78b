"""The start-up checks, in one place: ``run`` refuses on the fatal ones, ``check-config`` runs all.

Pydantic validates the file's shape; what it cannot see is the machine around it: a release key
file, a broker password or TLS file that is not there or not readable, a state directory the
daemon cannot write, a serial port named twice, a model directory that is missing or holds a
model for another feature, a source delivering another sensor or value set than the models
were trained on (tesla_gateway/daemon/sensor_match.py). ``run`` and ``check-config`` both call
:func:`preflight`, so what one accepts the other accepts too.

Each finding has a severity: ``fatal`` (``run`` refuses to start: exit 2), ``degraded`` (``run``
starts but something would not work, e.g. a feature without a model: ``check-config`` exits 1),
``warning`` (something that may still appear after the start, e.g. an unplugged USB port: told,
not failed).
"""

from __future__ import annotations

import os
import ssl
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from tesla_gateway.contract.time_of_day import utc_offset_for
from tesla_gateway.daemon.config import GatewayConfig
from tesla_gateway.daemon.findings import Finding, Severity
from tesla_gateway.daemon.sensor_match import check_sensor_kinds
from tesla_gateway.errors import GatewayError
from tesla_gateway.mqtt.config import MqttBrokerConfig

__all__ = [
    "Finding",
    "PreflightError",
    "Severity",
    "preflight",
    "probe_brokers",
    "refuse_on_fatal",
]


class PreflightError(GatewayError):
    """``run`` refuses to start: the message lists every fatal finding."""


def preflight(config: GatewayConfig, *, load_models: bool) -> list[Finding]:
    """Every start-up check. With ``load_models`` also what the daemon starts degraded without
    and repairs while it runs: each model, loaded by the daemon's rule (a release repairs it),
    and a writable state directory (a disk that comes back); systemd's ExecStartPre skips those,
    so a read-only SD card or a missing model never keeps the daemon from starting."""
    findings = [
        _check_release_key(config),
        *_check_brokers(config),
        *_check_serial_ports(config),
        *_check_sensor_id_levels(config),
        *check_sensor_kinds(config),
    ]
    if load_models:
        findings.append(_check_state_dir(config.state_dir))
        findings.extend(_check_models(config))
    return findings


def refuse_on_fatal(findings: list[Finding]) -> None:
    """Raise :class:`PreflightError` if any finding would stop the daemon."""
    fatal = [f for f in findings if f.severity is Severity.FATAL]
    if fatal:
        raise PreflightError("; ".join(f"{f.check}: {f.detail}" for f in fatal))


def _check_release_key(config: GatewayConfig) -> Finding:
    if config.ota is None:
        return Finding("release key", Severity.OK, "none configured (models trusted on sha256)")
    try:
        config.model_trust()
    except GatewayError as exc:
        return Finding("release key", Severity.FATAL, str(exc))
    return Finding("release key", Severity.OK, str(config.ota.public_key_file))


def _brokers(config: GatewayConfig) -> Iterator[tuple[str, MqttBrokerConfig]]:
    """Every broker the daemon connects to, named as in the configuration."""
    yield "publisher.broker", config.publisher.broker
    for index, source in enumerate(config.sources):
        broker = getattr(source, "broker", None)
        if isinstance(broker, MqttBrokerConfig):
            yield f"sources[{index}].broker", broker
    for reference in config.references:
        yield f"references.{reference.name}.mqtt.broker", reference.mqtt.broker
    if config.ota is not None and config.ota.broker is not None:
        yield "ota.broker", config.ota.broker


def _check_brokers(config: GatewayConfig) -> Iterator[Finding]:
    """Password and TLS files are read at connect: one that cannot be read stops the daemon."""
    for name, broker in _brokers(config):
        problems: list[str] = []
        if broker.password_file is not None:
            try:
                broker.resolve_password()
            except GatewayError as exc:
                problems.append(str(exc))
        tls = broker.tls
        if tls is not None:
            try:
                context = ssl.create_default_context(
                    cafile=str(tls.ca_file) if tls.ca_file else None
                )
                if tls.cert_file is not None and tls.key_file is not None:
                    context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                problems.append(f"tls files cannot be loaded ({exc})")
        if problems:
            yield Finding(name, Severity.FATAL, "; ".join(problems))
        else:
            yield Finding(name, Severity.OK, f"{broker.host}:{broker.port}")


def probe_brokers(config: GatewayConfig, *, timeout_s: float) -> Iterator[Finding]:
    """``check-config --probe``: one real connection to each configured broker, with its
    credentials and TLS; degraded when it fails (the daemon would start and keep retrying)."""
    from tesla_gateway.mqtt.probe import probe_broker

    client_id = f"tesla-gateway-{config.gateway_id}-probe"[:64]  # never a daemon connection's
    for name, broker in _brokers(config):
        check = f"broker {name} {broker.host}:{broker.port}"
        problem = probe_broker(broker, client_id=client_id, timeout_s=timeout_s)
        if problem is None:
            yield Finding(check, Severity.OK, "ok")
        else:
            yield Finding(check, Severity.DEGRADED, problem)


def _check_state_dir(state_dir: Path) -> Finding:
    """The daemon runs without a writable state_dir (degraded: outbox in memory, no windows
    saved), so this is not fatal, but it is not OK either."""
    existing = state_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the daemon creates the missing part
    if not existing.is_dir():
        return Finding("state_dir", Severity.DEGRADED, f"{existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        return Finding(
            "state_dir",
            Severity.DEGRADED,
            f"{existing} is not writable by uid {os.geteuid()}: windows and the outbox would "
            "not survive a restart (run check-config as the service user)",
        )
    note = "" if existing == state_dir else " (will be created)"
    return Finding("state_dir", Severity.OK, f"{state_dir}{note}")


def _check_serial_ports(config: GatewayConfig) -> Iterator[Finding]:
    ports = [
        port for source in config.sources if isinstance(port := getattr(source, "port", None), Path)
    ]
    for port, count in sorted(Counter(ports).items()):
        if count > 1:
            yield Finding(
                f"serial {port}",
                Severity.FATAL,
                f"configured {count} times: one source per port",
            )
        elif not port.exists():
            yield Finding(
                f"serial {port}",
                Severity.WARNING,
                "not present now; the daemon opens it when it appears",
            )
        else:
            yield Finding(f"serial {port}", Severity.OK, "present")


def _check_sensor_id_levels(config: GatewayConfig) -> Iterator[Finding]:
    """A topic filter that has no level ``sensor_id_topic_level`` (and no ``#`` before it) can
    only deliver messages that are all rejected as bad_sensor_id."""
    for index, source in enumerate(config.sources):
        level = getattr(source, "sensor_id_topic_level", None)
        topics = getattr(source, "topics", None)
        if not isinstance(level, int) or not isinstance(topics, list):
            continue
        short = [
            topic
            for topic in topics
            if isinstance(topic, str)
            and "#" not in topic.split("/")[: level + 1]
            and len(topic.split("/")) <= level
        ]
        if short:
            yield Finding(
                f"sources[{index}].topics",
                Severity.DEGRADED,
                f"{short} have no level {level} (sensor_id_topic_level): every message on them "
                "would be rejected as bad_sensor_id",
            )


def _check_models(config: GatewayConfig) -> Iterator[Finding]:
    """Load every model by the daemon's own rule: the current slot, else the previous one, else
    the directory's files; refused when the manifest's feature is not the configured one, or
    when its version is below the one the slot served last (the daemon's record)."""
    from tesla_gateway.models.served import SERVED_FILENAME, ServedVersions
    from tesla_gateway.models.watch import ModelSet

    try:
        trust = config.model_trust()
    except GatewayError:
        return  # reported by _check_release_key
    models = ModelSet(
        config.model_dirs,
        config.runtime.preference,
        num_threads=config.runtime.num_threads,
        trust=trust,
        features=config.model_features,
        # The daemon's floor, read only: check-config writes and moves nothing.
        served=ServedVersions(config.state_dir / SERVED_FILENAME, read_only=True),
        allow_downgrade=config.ota is not None and config.ota.allow_downgrade,
    )
    results = {result.slot: result for result in models.refresh(force=True)}
    stats = models.stats()
    for slot, model in zip(config.model_dirs, config.models, strict=True):
        name = (
            f"model {model.feature}" if slot == model.feature else f"model {model.feature} ({slot})"
        )
        if not model.model_dir.exists():
            yield Finding(name, Severity.DEGRADED, f"model_dir {model.model_dir} does not exist")
            continue
        calibrator = models.get(slot)
        if calibrator is None:
            yield Finding(name, Severity.DEGRADED, str(results[slot].error))
            continue
        manifest = calibrator.manifest
        fallback = stats[slot]["fallback"]
        yield Finding(
            name,
            Severity.OK,
            f"{manifest.name} v{manifest.version} (N={manifest.window_length}, period "
            f"{manifest.period_seconds}s) on {calibrator.runtime_name} "
            f"{calibrator.runtime_version}; {calibrator.trust}"
            + (
                ""
                if len(manifest.input_channels) == 1
                else f"; channels {', '.join(manifest.channel_names)}"
            )
            + _hour_note(calibrator.geometry.hour_positions is not None, config.timezone)
            + (f"; FALLBACK to {stats[slot]['slot']} ({fallback})" if fallback else ""),
        )


def _hour_note(reads_hour: bool, zone: str | None) -> str:
    """Where the hour of a model that reads it is taken: a wrong zone shifts every value."""
    if not reads_hour:
        return ""
    offset = utc_offset_for(zone, time.time())
    sign, minutes = ("+" if offset >= 0 else "-"), abs(offset) // 60
    where = f"timezone {zone}" if zone else "this machine's zone (set timezone to be sure)"
    return f"; hour of the day in {where}: UTC{sign}{minutes // 60:02d}:{minutes % 60:02d}"
