"""Home Assistant MQTT discovery: calibrated sensors appear in Home Assistant unconfigured.

One retained config message per (sensor, feature) under
``<discovery_prefix>/sensor/<node_id>/<object_id>/config``; the entity reads the calibrated value
from the state topic with a value template (a null calibration, e.g. during warm-up, shows as
unknown), and the raw value, model, quality flags and prediction interval as
attributes from the same JSON. Availability follows the gateway's status topic (with its will).
"""

from __future__ import annotations

import json
import re

__all__ = ["DEVICE_CLASSES", "discovery_message"]

# Home Assistant's sensor device classes for particulate matter.
DEVICE_CLASSES = {"pm1": "pm1", "pm2_5": "pm25", "pm10": "pm10"}
_FEATURE_NAMES = {"pm1": "PM1", "pm2_5": "PM2.5", "pm10": "PM10"}
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def _object_id(text: str) -> str:
    """Discovery ids allow ``[a-zA-Z0-9_-]`` only."""
    return _UNSAFE.sub("_", text)


def discovery_message(
    *,
    discovery_prefix: str,
    gateway_id: str,
    sensor_id: str,
    feature: str,
    state_topic: str,
    availability_topic: str,
) -> tuple[str, bytes]:
    """The topic and retained JSON payload announcing one calibrated sensor entity."""
    node_id = _object_id(f"tesla_{gateway_id}")
    object_id = _object_id(f"{sensor_id}_{feature}")
    label = _FEATURE_NAMES.get(feature, feature)
    config: dict[str, object] = {
        "name": f"{label} calibrated",
        "unique_id": _object_id(f"tesla_{gateway_id}_{sensor_id}_{feature}"),
        "object_id": _object_id(f"tesla_{sensor_id}_{feature}"),
        "state_topic": state_topic,
        "value_template": "{{ value_json.calibrated }}",
        "json_attributes_topic": state_topic,
        "unit_of_measurement": "µg/m³",
        "state_class": "measurement",
        "availability_topic": availability_topic,
        "payload_available": "online",
        "payload_not_available": "offline",
        "device": {
            "identifiers": [_object_id(f"tesla_{gateway_id}_{sensor_id}")],
            "name": f"Sensor {sensor_id}",
            "manufacturer": "tesla-gateway",
            "model": "Low-cost PM sensor, TESLA-calibrated",
        },
    }
    device_class = DEVICE_CLASSES.get(feature)
    if device_class is not None:
        config["device_class"] = device_class
    topic = f"{discovery_prefix}/sensor/{node_id}/{object_id}/config"
    return topic, json.dumps(config, ensure_ascii=False, sort_keys=True).encode("utf-8")
