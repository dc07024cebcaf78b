"""``init``'s flags for fleets already deployed, and the ``[[sources]]`` entries they become.

Tasmota and ESPHome devices publish to the same broker as the rest of the configuration;
sensor.community (airrohr, Nettigo Air Monitor) stations post to a listener on this host;
PurpleAir units are polled. Each flag gives what that kind cannot default (docs/sources.md):
Tasmota's time zone (its ``Time`` has no offset), ESPHome's object ids (named by the user's
YAML), the units' addresses.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from tesla_gateway.errors import GatewayError
from tesla_gateway.sources.esphome import Channel

__all__ = [
    "FleetAnswers",
    "FleetFlagError",
    "add_fleet_arguments",
    "fleet_answers",
    "fleet_source_lines",
]

_CHANNELS: tuple[str, ...] = get_args(Channel)
_MAX_PORT = 65_535


class FleetFlagError(GatewayError):
    """A fleet flag is missing the answer that goes with it, or cannot be read."""


@dataclass(frozen=True)
class FleetAnswers:
    """The fleet sources asked for, already checked."""

    tasmota_topics: tuple[str, ...] = ()
    timezone: str | None = None
    esphome_nodes: tuple[str, ...] = ()
    esphome_channels: tuple[tuple[str, str], ...] = ()  # (object id, channel)
    sensor_community: tuple[str, int] | None = None  # (host, port) to listen on
    purpleair_urls: tuple[str, ...] = ()


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the fleet flags on ``init``'s parser."""
    group = parser.add_argument_group(
        "device fleets", "sources for devices already deployed (docs/sources.md)"
    )
    add = group.add_argument
    add(
        "--tasmota-topic",
        action="append",
        default=[],
        metavar="FILTER",
        help="Tasmota devices' SENSOR topics, e.g. 'tele/+/SENSOR', repeatable (needs --timezone)",
    )
    add(
        "--timezone",
        metavar="ZONE",
        help="IANA zone the Tasmota devices' clocks run in, e.g. Europe/Rome (their Time has no "
        "offset; the device console's 'Status 7' shows it)",
    )
    add(
        "--esphome-node",
        action="append",
        default=[],
        metavar="PREFIX",
        help="an ESPHome node's topic prefix ('+' for all), repeatable (needs --esphome-channel)",
    )
    add(
        "--esphome-channel",
        action="append",
        default=[],
        metavar="OBJECT_ID=CHANNEL",
        help=f"map an ESPHome sensor's object id to a channel ({', '.join(_CHANNELS)}), repeatable",
    )
    add(
        "--sensor-community-listen",
        metavar="[HOST:]PORT",
        help="listen for sensor.community (airrohr) and Nettigo Air Monitor stations' POSTs",
    )
    add(
        "--purpleair-url",
        action="append",
        default=[],
        metavar="URL",
        help="a PurpleAir unit's local JSON, e.g. http://192.168.1.40/json, repeatable",
    )


def fleet_answers(args: argparse.Namespace) -> FleetAnswers:
    """The fleet flags, checked: each kind gets what it cannot default, or the flag is named."""
    timezone = args.timezone
    if args.tasmota_topic and timezone is None:
        raise FleetFlagError(
            "--tasmota-topic needs --timezone ZONE: Tasmota's Time has no offset, so the "
            "gateway must know the zone the devices' clocks run in (timezone in the source; the "
            "device console's 'Status 7' shows it), e.g. --timezone Europe/Rome"
        )
    if timezone is not None:
        _check_zone(timezone)
    channels = tuple(_esphome_channel(value) for value in args.esphome_channel)
    if args.esphome_node and not channels:
        raise FleetFlagError(
            "--esphome-node needs --esphome-channel OBJECT_ID=CHANNEL for each sensor to read "
            "(the object id is in the node's topics: <prefix>/sensor/<object_id>/state), e.g. "
            "--esphome-channel pm_10=pm10"
        )
    if channels and not args.esphome_node:
        raise FleetFlagError("--esphome-channel maps an --esphome-node's sensors: name the node")
    listen = args.sensor_community_listen
    return FleetAnswers(
        tasmota_topics=tuple(args.tasmota_topic),
        timezone=timezone if args.tasmota_topic else None,
        esphome_nodes=tuple(args.esphome_node),
        esphome_channels=channels,
        sensor_community=None if listen is None else _listen_address(listen),
        purpleair_urls=tuple(args.purpleair_url),
    )


def _check_zone(name: str) -> None:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise FleetFlagError(
            f"--timezone {name!r} is not an IANA time zone (e.g. Europe/Rome, UTC)"
        ) from exc


def _esphome_channel(value: str) -> tuple[str, str]:
    object_id, separator, channel = value.partition("=")
    if not separator or not object_id or channel not in _CHANNELS:
        raise FleetFlagError(
            f"--esphome-channel {value!r}: expected OBJECT_ID=CHANNEL, CHANNEL one of "
            f"{', '.join(_CHANNELS)}"
        )
    return object_id, channel


def _listen_address(value: str) -> tuple[str, int]:
    host, separator, port = value.rpartition(":")
    if not separator:
        host = "0.0.0.0"  # noqa: S104 - the stations are on the LAN, as the source's default
    if not port.isdigit() or not 1 <= int(port) <= _MAX_PORT or (separator and not host):
        raise FleetFlagError(
            f"--sensor-community-listen {value!r}: expected [HOST:]PORT, e.g. 8000 or "
            "192.168.1.10:8000"
        )
    return host, int(port)


def _toml(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _array(values: tuple[str, ...]) -> str:
    return f"[{', '.join(_toml(value) for value in values)}]"


def fleet_source_lines(answers: FleetAnswers, broker_lines: list[str]) -> list[str]:
    """The ``[[sources]]`` entries of the fleets asked for, commented; MQTT kinds use
    ``broker_lines`` (the broker of the rest of the configuration)."""
    lines: list[str] = []
    if answers.tasmota_topics and answers.timezone is not None:
        lines += [
            "",
            "# Tasmota devices with a PMS5003 (docs/sources.md). Set TelePeriod 60 on each device",
            "# for the one-minute models; ids are tasmota-<device topic>.",
            "[[sources]]",
            'kind = "tasmota"',
            f"topics = {_array(answers.tasmota_topics)}",
            f"timezone = {_toml(answers.timezone)}   # the devices' clocks (Time has no offset)",
            "[sources.broker]",
            *broker_lines,
        ]
    if answers.esphome_nodes:
        topics = tuple(f"{node}/sensor/+/state" for node in answers.esphome_nodes)
        channels = ", ".join(f"{_toml(oid)} = {_toml(ch)}" for oid, ch in answers.esphome_channels)
        lines += [
            "",
            "# ESPHome nodes' sensor states, one value per topic, grouped per minute",
            "# (docs/sources.md); ids are esphome-<topic prefix>.",
            "[[sources]]",
            'kind = "esphome"',
            f"topics = {_array(topics)}",
            f"channels = {{ {channels} }}",
            "[sources.broker]",
            *broker_lines,
        ]
    if answers.sensor_community is not None:
        host, port = answers.sensor_community
        lines += [
            "",
            "# sensor.community (airrohr) and Nettigo Air Monitor stations: 'Send data to own",
            "# API' with this host's address, this port and the path below; ids are",
            "# airrohr-<esp8266id or esp32id>.",
            "[[sources]]",
            'kind = "sensor_community"',
            f"host = {_toml(host)}",
            f"port = {port}",
            'path = "/data.php"',
            'pm_sensor = "PMS"   # the bundled models learned a PMS5003; an SDS011 is refused',
        ]
    if answers.purpleair_urls:
        lines += [
            "",
            '# PurpleAir units polled on the LAN; ids are purpleair-<MAC>. pm_kind = "atm": the',
            "# bundled models were trained on PMS5003 atmospheric values (PurpleAir's default is",
            '# "cf_1"; docs/sources.md).',
            "[[sources]]",
            'kind = "purpleair"',
            'pm_kind = "atm"',
        ]
        for url in answers.purpleair_urls:
            lines += ["[[sources.units]]", f"url = {_toml(url)}"]
    return lines
