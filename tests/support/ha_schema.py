"""A checker of Home Assistant MQTT discovery configs, written from HA's schema code.

It accepts exactly the keys Home Assistant's schemas name, with their types, and is stricter in
one way: a key HA would silently drop (its discovery schemas ``REMOVE_EXTRA``) is an error here,
since it would be a typo or an option HA no longer has.

Sources (github.com/home-assistant/core):
- ``homeassistant/components/mqtt/schemas.py``, dev branch of 2026 (the probatio form, with
  ``default_entity_id``, ``entity_picture``, ``message_expiry_interval``,
  ``visible_by_default`` and without ``object_id``: MQTT_ENTITY_COMMON_SCHEMA,
  MQTT_ENTITY_DEVICE_INFO_SCHEMA, MQTT_ORIGIN_INFO_SCHEMA, the availability schemas); the
  stored commit c6ca7f5f416326437e8e652a5623aa5eff7b3d00 has the same device, origin and
  availability schemas with ``object_id`` still present.
- ``homeassistant/components/mqtt/const.py`` (dev, fetched 2026-09-02): CONF_DEFAULT_ENTITY_ID,
  CONF_SUGGESTED_DISPLAY_PRECISION, AVAILABILITY_MODES = all, any, latest.
- ``homeassistant/components/mqtt/config.py`` at a5c8209270205b905bb35a9082c39708b0d5f52f:
  MQTT_RO_SCHEMA (qos, encoding, state_topic required, value_template).
- ``homeassistant/components/mqtt/sensor.py`` (the form importing MQTT_ENTITY_COMMON_SCHEMA from
  ``.schemas``): device_class, expire_after, force_update, last_reset_value_template, name,
  options, suggested_display_precision (cv.positive_int), state_class, unit_of_measurement.
- ``homeassistant/components/mqtt/binary_sensor.py`` at 121590832b463474eb8766daa04e6a099a568a9e:
  device_class, expire_after, force_update, name, off_delay, payload_off, payload_on.
- Entity ids (``default_entity_id`` replaces ``object_id``, removed in 2026.4): HA's repair
  message asks for ``"default_entity_id": "sensor.<object_id>"``; the object part follows
  ``homeassistant.core.valid_entity_id`` (lowercase ``[a-z0-9_]``, no leading, trailing or
  double ``_``).
- Units: pylint/plugins/hass_enforce_greek_micro_char.py at
  513942cb88a53fe486c65638c5ffe815f1c41906 (micro as U+03BC).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from tesla_gateway.publish.discovery import DiscoveryMessage

Check = Callable[[Any], str | None]  # None if valid, else what is wrong


def _string(value: Any) -> str | None:
    # cv.string accepts str and coerces numbers; lists and dicts are invalid
    return (
        None
        if isinstance(value, str | int | float) and not isinstance(value, bool)
        else "not a string"
    )


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "not a boolean"


def _positive_int(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return None if ok else "not a positive int"


def _one_of(*choices: object) -> Check:
    return lambda value: None if value in choices else f"not one of {choices}"


def _subscribe_topic(value: Any) -> str | None:
    if not isinstance(value, str) or not value or "\0" in value:
        return "not a topic"
    levels = value.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            return "misplaced '#'"
        if "+" in level and level != "+":
            return "misplaced '+'"
    return None if len(value.encode()) <= 65535 else "topic too long"


def _template(value: Any) -> str | None:
    return (
        None
        if isinstance(value, str) and value.count("{{") == value.count("}}")
        else "bad template"
    )


def _url(value: Any) -> str | None:
    ok = isinstance(value, str) and re.fullmatch(r"(https?|homeassistant)://\S+", value)
    return None if ok else "not a configuration URL"


_ENTITY_ID = re.compile(r"(?!.+__)(?!_)[\da-z_]+(?<!_)\.(?!_)[\da-z_]+(?<!_)")


def _default_entity_id(platform: str) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, str) or not _ENTITY_ID.fullmatch(value):
            return "not a valid entity id"
        return None if value.split(".", 1)[0] == platform else f"not a {platform} entity id"

    return check


def _list_of(check: Check) -> Check:
    def checked(value: Any) -> str | None:
        if not isinstance(value, list):
            return "not a list"
        return next((f"[{i}]: {e}" for i, v in enumerate(value) if (e := check(v))), None)

    return checked


def _mapping(schema: Mapping[str, Check], required: frozenset[str] = frozenset()) -> Check:
    def checked(value: Any) -> str | None:
        if not isinstance(value, dict):
            return "not a mapping"
        return "; ".join(_problems(value, schema, required)) or None

    return checked


def _problems(
    config: Mapping[str, Any], schema: Mapping[str, Check], required: frozenset[str]
) -> list[str]:
    problems = [f"{key}: unknown key" for key in config if key not in schema]
    problems += [f"{key}: required" for key in required if key not in config]
    for key, value in config.items():
        if key in schema and (error := schema[key](value)):
            problems.append(f"{key}: {error}")
    return problems


_DEVICE: Check = _mapping(
    {
        "identifiers": _list_of(_string),
        "connections": _list_of(_list_of(_string)),
        "manufacturer": _string,
        "model": _string,
        "model_id": _string,
        "name": _string,
        "hw_version": _string,
        "serial_number": _string,
        "sw_version": _string,
        "via_device": _string,
        "suggested_area": _string,
        "configuration_url": _url,
    }
)
_ORIGIN: Check = _mapping(
    {"name": _string, "sw_version": _string, "support_url": _url}, frozenset({"name"})
)
_AVAILABILITY_ENTRY: Check = _mapping(
    {
        "topic": _subscribe_topic,
        "payload_available": _string,
        "payload_not_available": _string,
        "value_template": _template,
    },
    frozenset({"topic"}),
)
_COMMON: dict[str, Check] = {
    # availability (single and list forms)
    "availability_topic": _subscribe_topic,
    "availability_template": _template,
    "payload_available": _string,
    "payload_not_available": _string,
    "availability_mode": _one_of("all", "any", "latest"),
    "availability": _list_of(_AVAILABILITY_ENTRY),
    # MQTT_ENTITY_COMMON_SCHEMA
    "device": _DEVICE,
    "entity_picture": _url,
    "origin": _ORIGIN,
    "enabled_by_default": _boolean,
    "entity_category": _one_of("config", "diagnostic"),
    "icon": lambda v: None if isinstance(v, str) and ":" in v else "not an icon",
    "json_attributes_topic": _subscribe_topic,
    "json_attributes_template": _template,
    "message_expiry_interval": _positive_int,
    "unique_id": _string,
    "visible_by_default": _boolean,
    # MQTT_RO_SCHEMA
    "qos": _one_of(0, 1, 2),
    "encoding": _string,
    "state_topic": _subscribe_topic,
    "value_template": _template,
}
_SENSOR_DEVICE_CLASSES = ("pm1", "pm10", "pm25", "aqi", "humidity", "temperature")
_PLATFORMS: dict[str, dict[str, Check]] = {
    "sensor": {
        **_COMMON,
        "default_entity_id": _default_entity_id("sensor"),
        "device_class": _one_of(*_SENSOR_DEVICE_CLASSES),
        "expire_after": _positive_int,
        "force_update": _boolean,
        "last_reset_value_template": _template,
        "name": _string,
        "options": _list_of(_string),
        "suggested_display_precision": _positive_int,
        "state_class": _one_of("measurement", "measurement_angle", "total", "total_increasing"),
        "unit_of_measurement": _string,
    },
    "binary_sensor": {
        **_COMMON,
        "default_entity_id": _default_entity_id("binary_sensor"),
        "device_class": _one_of("connectivity", "problem"),
        "expire_after": _positive_int,
        "force_update": _boolean,
        "name": _string,
        "off_delay": _positive_int,
        "payload_off": _string,
        "payload_on": _string,
    },
}
_TOPIC = re.compile(
    r"(?P<prefix>[^/]+)/(?P<platform>sensor|binary_sensor)/[A-Za-z0-9_-]+/[A-Za-z0-9_-]+/config"
)


def ha_problems(message: DiscoveryMessage) -> list[str]:
    """What Home Assistant's schema would refuse in one discovery message (empty: accepted)."""
    match = _TOPIC.fullmatch(message.topic)
    if match is None:
        return [f"topic {message.topic!r} is not a discovery config topic"]
    config = json.loads(message.payload)
    platform = match["platform"]
    problems = _problems(config, _PLATFORMS[platform], frozenset({"state_topic"}))
    if "availability" in config and "availability_topic" in config:
        problems.append("availability and availability_topic are exclusive")
    if "options" in config and config.get("device_class") != "enum":
        problems.append("options needs device_class enum")
    device = config.get("device")
    if isinstance(device, dict) and not (device.get("identifiers") or device.get("connections")):
        problems.append("device: needs identifiers or connections")
    return problems
