"""``tesla-gateway init``: write a first, commented configuration for this Pi's broker and sensors.

The file is built from the answers given as flags, then loaded with the daemon's own
``load_config`` before it takes the target's name, so ``init`` never writes a configuration that
``check-config`` would refuse. The models default to the ones shipped in the wheel
(:mod:`tesla_gateway.models.bundled`), found from the installed package: no checkout is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args

from tesla_gateway import __version__
from tesla_gateway.contract.readings import GATEWAY_ID_PATTERN, SENSOR_ID_PATTERN, Feature
from tesla_gateway.contract.time_of_day import system_zone
from tesla_gateway.daemon.config import load_config
from tesla_gateway.daemon.init_fleet import (
    FleetAnswers,
    add_fleet_arguments,
    fleet_answers,
    fleet_source_lines,
)
from tesla_gateway.errors import ConfigError, GatewayError
from tesla_gateway.models.bundled import bundled_models, example_config

__all__ = ["InitError", "add_init_parser", "render_config", "run_init", "write_config"]

_FEATURES: tuple[str, ...] = get_args(Feature)
_DEFAULT_OUT = Path("gateway.toml")
_DEFAULT_STATE_DIR = "tesla-gateway-state"
_DEFAULT_TOPIC = "sensors/+/raw"


class InitError(GatewayError):
    """The answers cannot make a valid configuration, or the target must not be overwritten."""


@dataclass(frozen=True)
class Pms5003Port:
    """A bare PMS5003 on a USB-serial adapter, published under ``sensor_id``."""

    sensor_id: str
    port: Path


@dataclass(frozen=True)
class InitAnswers:
    """Everything ``init`` asks, already checked."""

    gateway_id: str
    state_dir: str
    models: list[tuple[str, Path]]  # (feature, model directory); a feature may have several
    broker_host: str
    broker_port: int
    username: str | None
    password_file: Path | None
    ca_file: Path | None
    topics: tuple[str, ...]
    sensors: tuple[str, ...]  # known sensor ids; empty: any id is accepted
    node_ports: tuple[Path, ...]
    pms5003_ports: tuple[Pms5003Port, ...]
    discovery: bool
    fleet: FleetAnswers = field(default_factory=FleetAnswers)  # Tasmota, ESPHome, airrohr, ...
    timezone: str | None = None  # --timezone (checked with the fleet flags); else the system's


def add_init_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``init`` beside the commands that read a configuration."""
    text = "write a commented configuration for this broker and these sensors"
    parser = commands.add_parser("init", help=text, description=text)
    add = parser.add_argument
    add("--out", type=Path, default=_DEFAULT_OUT, help="file to write (default: %(default)s)")
    add("--force", action="store_true", help="overwrite --out if it exists")
    add("--gateway-id", help="this gateway's name in topics and logs (default: the host name)")
    add(
        "--state-dir",
        default=_DEFAULT_STATE_DIR,
        help="windows, outbox and status; relative to the file (default: %(default)s)",
    )
    add(
        "--feature",
        action="append",
        choices=_FEATURES,
        help="feature to calibrate with its bundled model, repeatable (default: pm10)",
    )
    add(
        "--model-dir",
        action="append",
        default=[],
        metavar="FEATURE=DIR",
        help="calibrate FEATURE with the model in DIR (instead of a bundled one), repeatable",
    )
    add("--broker-host", default="127.0.0.1", help="MQTT broker (default: %(default)s)")
    add("--broker-port", type=int, default=1883, help="MQTT port (default: %(default)s)")
    add("--username", help="MQTT user name")
    add("--password-file", type=Path, help="file whose first line is the MQTT password")
    add("--ca-file", type=Path, help="CA bundle of the broker's certificate: connect with TLS")
    add(
        "--topic",
        action="append",
        help=f"topic filter the sensors publish on, repeatable (default: {_DEFAULT_TOPIC})",
    )
    add(
        "--sensor",
        action="append",
        default=[],
        metavar="ID",
        help="a sensor id of this deployment, repeatable; given, other ids are rejected",
    )
    add(
        "--serial-port",
        action="append",
        default=[],
        type=Path,
        metavar="PORT",
        help="an Arduino node (tesla firmware) on this serial port, repeatable",
    )
    add(
        "--pms5003",
        action="append",
        default=[],
        metavar="ID=PORT",
        help="a bare PMS5003 on this USB-serial port, published as sensor ID, repeatable",
    )
    add("--home-assistant", action="store_true", help="publish Home Assistant discovery")
    add_fleet_arguments(parser)


def run_init(args: argparse.Namespace) -> int:
    """Write the configuration; 0 on success, 2 (a usage error) otherwise."""
    try:
        answers = _answers(args)
        path = write_config(args.out, render_config(answers), force=args.force)
    except GatewayError as exc:
        print(f"tesla-gateway init: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    print(f"  check it: tesla-gateway check-config --config {path}")
    print(f"  run it:   tesla-gateway run --config {path}")
    return 0


def write_config(out: Path, text: str, *, force: bool) -> Path:
    """Validate ``text`` as a configuration at ``out``, then put it there.

    The candidate is written beside the target (relative paths resolve against its folder) and
    loaded with ``load_config``; only a valid one is written. Without ``force`` an existing
    target is kept: the file is created exclusively, even if it appeared meanwhile.
    """
    out = out.absolute()
    if out.exists() and not force:
        raise InitError(f"{out} exists; pass --force to overwrite it")
    try:
        descriptor, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".toml", dir=out.parent)
    except OSError as exc:
        raise InitError(f"cannot write in {out.parent}: {exc.strerror}") from exc
    candidate = Path(name)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
        try:
            load_config(candidate, environ={})
        except ConfigError as exc:
            raise InitError(f"these answers do not make a valid configuration: {exc}") from exc
        if force:
            candidate.chmod(0o644)  # a configuration holds no secret (password_file does)
            candidate.replace(out)
        else:
            with out.open("x", encoding="utf-8") as target:
                target.write(text)
    except FileExistsError:
        raise InitError(f"{out} exists; pass --force to overwrite it") from None
    except OSError as exc:
        raise InitError(f"cannot write {out}: {exc.strerror}") from exc
    finally:
        candidate.unlink(missing_ok=True)
    return out


def _answers(args: argparse.Namespace) -> InitAnswers:
    gateway_id = args.gateway_id or _host_gateway_id()
    if not GATEWAY_ID_PATTERN.fullmatch(gateway_id):
        raise InitError(f"--gateway-id {gateway_id!r} must match {GATEWAY_ID_PATTERN.pattern}")
    for sensor in args.sensor:
        _check_sensor_id(sensor, "--sensor")
    pms_ports = tuple(_pms5003_port(value) for value in args.pms5003)
    return InitAnswers(
        gateway_id=gateway_id,
        state_dir=args.state_dir,
        models=_models(args.feature or ([] if args.model_dir else ["pm10"]), args.model_dir),
        broker_host=args.broker_host,
        broker_port=args.broker_port,
        username=args.username,
        password_file=args.password_file.absolute() if args.password_file else None,
        ca_file=args.ca_file.absolute() if args.ca_file else None,
        topics=tuple(args.topic or [_DEFAULT_TOPIC]),
        sensors=tuple(args.sensor),
        node_ports=tuple(args.serial_port),
        pms5003_ports=pms_ports,
        discovery=args.home_assistant,
        fleet=fleet_answers(args),
        timezone=args.timezone,
    )


def _host_gateway_id() -> str:
    """The host name when it is a valid id (``raspberrypi``), else ``gateway``."""
    name = socket.gethostname().split(".")[0]
    return name if GATEWAY_ID_PATTERN.fullmatch(name) else "gateway"


def _models(features: Sequence[str], overrides: Sequence[str]) -> list[tuple[str, Path]]:
    chosen = dict.fromkeys(features)
    given: dict[str, Path] = {}
    for value in overrides:
        feature, separator, directory = value.partition("=")
        if not separator or not directory or feature not in _FEATURES:
            raise InitError(
                f"--model-dir {value!r}: expected FEATURE=DIR, FEATURE one of {_FEATURES}"
            )
        given[feature] = Path(directory).absolute()
        chosen.setdefault(feature)
    missing = [feature for feature in chosen if feature not in given]
    bundled = bundled_models() if missing else {}
    models: list[tuple[str, Path]] = []
    for feature in chosen:
        if feature in given:
            models.append((feature, given[feature]))
        elif feature in bundled:
            models += [(feature, path) for path in bundled[feature]]
        else:
            raise InitError(
                f"no bundled model calibrates {feature} (bundled: {', '.join(bundled)}); "
                f"give one with --model-dir {feature}=DIR"
            )
    return models


def _check_sensor_id(sensor_id: str, flag: str) -> None:
    if not SENSOR_ID_PATTERN.fullmatch(sensor_id):
        raise InitError(f"{flag} {sensor_id!r} must match {SENSOR_ID_PATTERN.pattern}")


def _pms5003_port(value: str) -> Pms5003Port:
    sensor_id, separator, port = value.partition("=")
    if not separator or not port:
        raise InitError(f"--pms5003 {value!r}: expected SENSOR_ID=PORT, e.g. usb-pms=/dev/ttyUSB0")
    _check_sensor_id(sensor_id, "--pms5003")
    return Pms5003Port(sensor_id, Path(port))


def _toml(value: str | Path) -> str:
    """A TOML basic string (JSON's escapes are valid TOML)."""
    return json.dumps(str(value), ensure_ascii=False)


def render_config(answers: InitAnswers) -> str:
    """The configuration text: the answers, each section commented."""
    lines = [
        f"# tesla-gateway configuration written by `tesla-gateway init` (version {__version__}).",
        "# Check it: tesla-gateway check-config --config THIS_FILE",
        "# Run it:   tesla-gateway run --config THIS_FILE",
        f"# Every section and key, with its default, is described in {example_config()}",
        "# Keys can be overridden from the environment: TESLA_GATEWAY__<SECTION>__<KEY>=<value>.",
        "# Relative paths are relative to this file.",
        "",
        f"gateway_id = {_toml(answers.gateway_id)}",
        f"state_dir = {_toml(answers.state_dir)}   # windows, outbox, status.json, pid file",
        *_timezone_lines(answers.timezone),
        "",
        "# The defaults ship with the gateway (read-only when installed system-wide;",
        "# docs/deployment.md 'Security'). Each is watched for new versions. A feature may have",
        "# several models (PM alone; PM with rh and temp_c): each sensor is calibrated by the",
        "# one with the most input channels it reports, and falls back when one stops.",
    ]
    for feature, model_dir in answers.models:
        lines += ["[[models]]", f"feature = {_toml(feature)}", f"model_dir = {_toml(model_dir)}"]
        lines.append("")
    lines += ["[sensors]"]
    if answers.sensors:
        lines += [
            "# Readings from any other sensor id are rejected (counted as unknown_sensor).",
            "allow_unknown = false",
            f"known = [{', '.join(_toml(sensor) for sensor in answers.sensors)}]",
        ]
    else:
        lines += [
            "# Any sensor id is accepted; list yours to reject strangers:",
            "allow_unknown = true",
            '# known = ["node-01", "node-02"]',
        ]
    lines += [
        "",
        "[logging]",
        'format = "auto"   # json | console | auto (console on a terminal, JSON otherwise)',
        'level = "info"',
        "",
        "# Sensors publishing JSON readings to the broker (docs/mqtt.md), e.g. on sensors/<id>/raw",
        '# the payload {"ts": 1700000000, "pm10": 23.4}; the sensor id is topic level 1.',
        "# A sensor id belongs to one source: an id another source already reports is refused",
        "# (sensor_id_conflict). Tasmota, ESPHome and sensor.community sources (docs/sources.md)",
        '# prefix theirs: sensor_id_prefix = "tasmota-", "esphome-", "airrohr-" by default;',
        '# "" keeps the bare device names, the ids before that default. Fleets already deployed:',
        "# init --tasmota-topic, --esphome-node, --sensor-community-listen, --purpleair-url.",
        "[[sources]]",
        'kind = "mqtt"',
        f"topics = [{', '.join(_toml(topic) for topic in answers.topics)}]",
        "sensor_id_topic_level = 1",
        "[sources.broker]",
        *_broker_lines(answers),
    ]
    for port in answers.node_ports:
        lines += [
            "",
            "# An Arduino node running the tesla firmware (docs/serial-protocol.md).",
            "[[sources]]",
            'kind = "node"',
            f"port = {_toml(port)}",
        ]
    for sensor in answers.pms5003_ports:
        lines += [
            "",
            "# A bare PMS5003 on a USB-serial adapter (9600 baud).",
            "[[sources]]",
            'kind = "pms5003"',
            f"port = {_toml(sensor.port)}",
            f"sensor_id = {_toml(sensor.sensor_id)}",
        ]
    lines += fleet_source_lines(answers.fleet, _broker_lines(answers))
    lines += [
        "",
        "# Calibrated readings go to tesla/<gateway_id>/<sensor>/<feature> (docs/mqtt.md).",
        "[publisher]",
        "qos = 1",
        "retain = true",
        f"discovery = {'true' if answers.discovery else 'false'}   # Home Assistant MQTT discovery",
        "[publisher.broker]",
        *_broker_lines(answers),
        "",
    ]
    return "\n".join(lines)


def _timezone_lines(zone: str | None) -> list[str]:
    zone = zone or system_zone()
    why = "# The sensors' zone, for models that read the hour of the day (its standard time)."
    if zone is None:
        return [why, '# timezone = "Europe/Rome"   # unset: this machine\'s standard offset']
    return [why, f"timezone = {_toml(zone)}"]


def _broker_lines(answers: InitAnswers) -> list[str]:
    lines = [f"host = {_toml(answers.broker_host)}", f"port = {answers.broker_port}"]
    if answers.username is not None:
        lines.append(f"username = {_toml(answers.username)}")
    if answers.password_file is not None:
        lines.append(f"password_file = {_toml(answers.password_file)}   # first line: the password")
    if answers.ca_file is not None:
        lines.append(f"tls = {{ ca_file = {_toml(answers.ca_file)} }}")
    else:
        lines.append('# tls = { ca_file = "/etc/ssl/certs/my-broker-ca.pem" }   # a remote broker')
    return lines
