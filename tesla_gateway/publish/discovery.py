"""Home Assistant MQTT discovery: sensors appear in Home Assistant unconfigured (docs/mqtt.md).

Devices: the gateway itself (a ``binary_sensor`` of device class ``connectivity`` on its status
topic) and one device per sensor, linked to the gateway by ``via_device``. Entities of a sensor,
per feature: the calibrated value (the main sensor; raw value, model, quality flags and the
prediction interval are its attributes, from the state topic's JSON), the raw value (a
diagnostic sensor), and, once the monitor publishes them, health and drift (diagnostic
``binary_sensor``s of device class ``problem``). Every config carries the ``origin`` block and a
``default_entity_id`` (the replacement of the removed ``object_id``). A sensor's entities are
available only while both the gateway and the sensor are (``availability_mode: all``): the
sensor's own availability topic goes ``offline`` when it stops reporting
(:mod:`tesla_gateway.publish.availability`).

In cluster mode (``cluster=True``) a sensor's entities are the cluster's, not a gateway's: their
unique ids and config topics take the node of the shared prefix (``tesla/cluster`` gives
``tesla_cluster``), so every gateway announces the same entities and a sensor that moves to
another gateway keeps them; they name no ``via_device``, and their availability is the sensor's
own topic only, which its current owner publishes: one gateway's death (its will on its own
status topic) leaves them available while another gateway calibrates them. Each gateway still
has its own device and status entity.

A config is retained on ``<discovery_prefix>/<component>/tesla_<gateway>/<object>/config``; an
empty retained payload on the same topic removes the entity (:meth:`Discovery.removals`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Literal

from tesla_gateway import __version__
from tesla_gateway.publish.topics import DocumentKind, TopicScheme

__all__ = ["DEVICE_CLASSES", "FEATURES", "Discovery", "DiscoveryMessage"]

# Home Assistant's sensor device classes for particulate matter.
DEVICE_CLASSES = {"pm1": "pm1", "pm2_5": "pm25", "pm10": "pm10"}
FEATURES = tuple(DEVICE_CLASSES)
_FEATURE_NAMES = {"pm1": "PM1", "pm2_5": "PM2.5", "pm10": "PM10"}
_UNSAFE_TOPIC = re.compile(r"[^A-Za-z0-9_-]")
_UNSAFE_SLUG = re.compile(r"[^a-z0-9]+")
# Home Assistant's CONCENTRATION_MICROGRAMS_PER_CUBIC_METER, with the Greek mu (U+03BC) its
# constants now use (home-assistant/core pylint/plugins/hass_enforce_greek_micro_char.py).
_UNIT = "\u03bcg/m\u00b3"
_DISPLAY_PRECISION = 1  # µg/m³ to a tenth: the sensors' own resolution is 1 µg/m³
_ORIGIN_NAME = "tesla-gateway"
_MANUFACTURER = "tesla-gateway"

Component = Literal["sensor", "binary_sensor"]


@dataclass(frozen=True, slots=True)
class DiscoveryMessage:
    """One retained discovery config (or, with an empty payload, its removal)."""

    topic: str
    payload: bytes


def _id_part(name: str) -> str:
    """A sensor or gateway id as part of a topic level or ``unique_id``, one-to-one.

    Ids may hold '.', which topic levels may not: replacing it with '_' made ``a.b`` and ``a_b``
    one entity, and evicting one removed the other's. An id without '.' is kept as it is (what
    earlier versions published, so existing entities survive an upgrade). An id with '.' becomes
    '-' followed by the id with '-' written '-m' and '.' written '-d': ids start with a letter or
    digit, so the leading '-' keeps the two forms apart, and the escape is prefix-free, so two
    dotted ids never meet either.
    """
    if "." not in name:
        return name
    return "-" + name.replace("-", "-m").replace(".", "-d")


def _slug(text: str) -> str:
    """An entity id's object part: lowercase ``[a-z0-9_]``, no leading, trailing or double '_'."""
    return _UNSAFE_SLUG.sub("_", text.lower()).strip("_") or "sensor"


def _encode(config: dict[str, object]) -> bytes:
    return json.dumps(config, ensure_ascii=False, sort_keys=True).encode("utf-8")


class Discovery:
    """Builds every discovery config of one gateway (pure: no I/O)."""

    def __init__(
        self,
        *,
        discovery_prefix: str,
        gateway_id: str,
        topics: TopicScheme,
        sensor_availability: bool,
        support_url: str | None = None,
        cluster: bool = False,
        expire_after_s: float | None = None,
    ) -> None:
        self._prefix = discovery_prefix
        self._gateway_id = gateway_id
        self._topics = topics
        self._sensor_availability = sensor_availability
        # The gateway's part keeps its earlier form ('.' as '_'): one gateway has one id, and
        # changing it would give every entity of a gateway named with a '.' a new unique_id.
        self._node = "tesla_" + _UNSAFE_TOPIC.sub("_", gateway_id)
        self._gateway_device_id = self._node
        self._cluster = cluster
        self._expire_after = None if expire_after_s is None else math.ceil(expire_after_s)
        # the node of the sensors' entities: the gateway's, or in a cluster the shared prefix's
        self._sensor_node = _UNSAFE_TOPIC.sub("_", topics.prefix) if cluster else self._node
        origin: dict[str, object] = {"name": _ORIGIN_NAME, "sw_version": __version__}
        if support_url is not None:
            origin["support_url"] = support_url
        self._origin = origin

    # -- topics ----------------------------------------------------------------------------

    def _config_topic(
        self, component: Component, object_id: str, *, node: str | None = None
    ) -> str:
        return f"{self._prefix}/{component}/{node or self._sensor_node}/{object_id}/config"

    def _entities(self, sensor_id: str, feature: str) -> list[tuple[Component, str]]:
        base = f"{_id_part(sensor_id)}_{feature}"
        return [
            ("sensor", base),
            ("sensor", f"{base}_raw"),
            ("binary_sensor", f"{base}_health"),
            ("binary_sensor", f"{base}_drift"),
        ]

    # -- configs ---------------------------------------------------------------------------

    def gateway(self) -> DiscoveryMessage:
        """The gateway's own device: a connectivity entity on its status topic."""
        config: dict[str, object] = {
            "name": "Status",
            "unique_id": f"{self._gateway_device_id}_status",
            "default_entity_id": f"binary_sensor.{_slug(f'tesla_{self._gateway_id}_status')}",
            "device_class": "connectivity",
            "entity_category": "diagnostic",
            "state_topic": self._topics.status,
            "payload_on": "online",
            "payload_off": "offline",
            "device": self._gateway_device(),
            "origin": self._origin,
        }
        topic = self._config_topic("binary_sensor", "gateway_status", node=self._node)
        return DiscoveryMessage(topic, _encode(config))

    def sensor(self, sensor_id: str, feature: str) -> list[DiscoveryMessage]:
        """The calibrated value and the raw value (diagnostic) of one (sensor, feature)."""
        label = _FEATURE_NAMES.get(feature, feature)
        state_topic = self._topics.state(sensor_id, feature)
        base = f"{_id_part(sensor_id)}_{feature}"
        shared: dict[str, object] = {
            "state_topic": state_topic,
            "unit_of_measurement": _UNIT,
            "state_class": "measurement",
            "suggested_display_precision": _DISPLAY_PRECISION,
            **self._shared(sensor_id),
        }
        device_class = DEVICE_CLASSES.get(feature)
        if device_class is not None:
            shared["device_class"] = device_class
        if self._expire_after is not None:  # stale values unavailable, whoever published them
            shared["expire_after"] = self._expire_after
        calibrated = {
            **shared,
            "name": f"{label} calibrated",
            "unique_id": self._unique_id(base),
            "default_entity_id": f"sensor.{_slug(f'tesla_{sensor_id}_{feature}')}",
            "value_template": "{{ value_json.calibrated }}",
            "json_attributes_topic": state_topic,
        }
        raw = {
            **shared,
            "name": f"{label} raw",
            "unique_id": self._unique_id(f"{base}_raw"),
            "default_entity_id": f"sensor.{_slug(f'tesla_{sensor_id}_{feature}_raw')}",
            "value_template": "{{ value_json.raw }}",
            "entity_category": "diagnostic",
        }
        return [
            DiscoveryMessage(self._config_topic("sensor", base), _encode(calibrated)),
            DiscoveryMessage(self._config_topic("sensor", f"{base}_raw"), _encode(raw)),
        ]

    def document(self, sensor_id: str, feature: str, kind: DocumentKind) -> DiscoveryMessage:
        """Health or drift as a diagnostic problem sensor; the document is its attributes."""
        label = _FEATURE_NAMES.get(feature, feature)
        topic = self._topics.sensor(sensor_id, feature, kind)
        object_id = f"{_id_part(sensor_id)}_{feature}_{kind}"
        problem = "not value_json.ok" if kind == "health" else "value_json.drift"
        config: dict[str, object] = {
            "name": f"{label} {'health problem' if kind == 'health' else 'drift'}",
            "unique_id": self._unique_id(object_id),
            # Readable, not one-to-one: Home Assistant suffixes an entity id already taken.
            "default_entity_id": f"binary_sensor.{_slug(f'tesla_{sensor_id}_{feature}_{kind}')}",
            "device_class": "problem",
            "entity_category": "diagnostic",
            "state_topic": topic,
            "value_template": f"{{{{ 'ON' if {problem} else 'OFF' }}}}",
            "json_attributes_topic": topic,
            **self._shared(sensor_id),
        }
        return DiscoveryMessage(self._config_topic("binary_sensor", object_id), _encode(config))

    def removals(self, sensor_id: str) -> list[DiscoveryMessage]:
        """Empty retained payloads on every config topic a sensor can have (any feature)."""
        return [
            DiscoveryMessage(self._config_topic(component, object_id), b"")
            for feature in FEATURES
            for component, object_id in self._entities(sensor_id, feature)
        ]

    # -- shared parts ----------------------------------------------------------------------

    def _unique_id(self, object_id: str) -> str:
        return f"{self._sensor_node}_{object_id}"

    def _gateway_device(self) -> dict[str, object]:
        return {
            "identifiers": [self._gateway_device_id],
            "name": f"tesla-gateway {self._gateway_id}",
            "manufacturer": _MANUFACTURER,
            "model": "TESLA calibration gateway",
            "sw_version": __version__,
        }

    def _shared(self, sensor_id: str) -> dict[str, object]:
        """Device, origin and availability of every entity of one sensor."""
        availability: list[dict[str, object]] = []
        if not self._cluster:  # in a cluster no one gateway's status speaks for a sensor
            availability.append({"topic": self._topics.status})
        if self._sensor_availability:
            availability.append({"topic": self._topics.availability(sensor_id)})
        device: dict[str, object] = {
            "identifiers": [f"{self._sensor_node}_{_id_part(sensor_id)}"],
            "name": f"Sensor {sensor_id}",
            "manufacturer": _MANUFACTURER,
            "model": "Low-cost PM sensor, TESLA-calibrated",
            "sw_version": __version__,
        }
        if not self._cluster:  # in a cluster it moves between gateways: linked to none
            device["via_device"] = self._gateway_device_id
        shared: dict[str, object] = {"device": device, "origin": self._origin}
        if availability:
            shared["availability"] = [
                {**entry, "payload_available": "online", "payload_not_available": "offline"}
                for entry in availability
            ]
            shared["availability_mode"] = "all"
        return shared
