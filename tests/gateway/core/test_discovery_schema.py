"""Every discovery config the gateway builds is accepted by Home Assistant's MQTT schema
(the checker and its sources: tests/support/ha_schema.py)."""

from __future__ import annotations

import json

import pytest

from tesla_gateway import __version__
from tesla_gateway.publish.discovery import Discovery, DiscoveryMessage
from tesla_gateway.publish.topics import TopicScheme
from tests.support.ha_schema import ha_problems


def _discovery(sensor_availability: bool = True) -> Discovery:
    return Discovery(
        discovery_prefix="homeassistant",
        gateway_id="pi-kitchen.1",
        topics=TopicScheme("tesla/pi-kitchen.1"),
        sensor_availability=sensor_availability,
        support_url="https://example.org/tesla-gateway",
    )


SENSORS = ["s1", "Node.01-A", "a_b__c", "Z9"]


@pytest.mark.parametrize("sensor_availability", [True, False])
def test_every_generated_config_passes_home_assistants_schema(sensor_availability: bool) -> None:
    discovery = _discovery(sensor_availability)
    messages = [discovery.gateway()]
    for sensor in SENSORS:
        for feature in ("pm1", "pm2_5", "pm10"):
            messages += discovery.sensor(sensor, feature)
            messages += [discovery.document(sensor, feature, k) for k in ("health", "drift")]
    for message in messages:
        assert ha_problems(message) == [], message.topic
    topics = [m.topic for m in messages]
    assert len(set(topics)) == len(topics)  # one config topic per entity
    unique_ids = [json.loads(m.payload)["unique_id"] for m in messages]
    assert len(set(unique_ids)) == len(unique_ids)
    entity_ids = [json.loads(m.payload)["default_entity_id"] for m in messages]
    assert len(set(entity_ids)) == len(entity_ids)


def test_the_checker_refuses_the_payload_the_gateway_used_to_send() -> None:
    """The pre-issue-15 config (docs/mqtt.md before): object_id is gone from HA's schema."""
    old = {
        "name": "PM10 calibrated",
        "unique_id": "tesla_gw1_s1_pm10",
        "object_id": "tesla_s1_pm10",
        "device_class": "pm10",
        "unit_of_measurement": "µg/m³",
        "state_class": "measurement",
        "state_topic": "tesla/gw1/s1/pm10",
        "value_template": "{{ value_json.calibrated }}",
        "json_attributes_topic": "tesla/gw1/s1/pm10",
        "availability_topic": "tesla/gw1/status",
        "availability": [{"topic": "tesla/gw1/s1/availability"}],
        "device": {"name": "Sensor s1"},
    }
    message = DiscoveryMessage(
        "homeassistant/sensor/tesla_gw1/s1_pm10/config", json.dumps(old).encode()
    )
    assert ha_problems(message) == [
        "object_id: unknown key",
        "availability and availability_topic are exclusive",
        "device: needs identifiers or connections",
    ]


def test_a_sensor_is_its_own_device_behind_the_gateway() -> None:
    discovery = _discovery()
    gateway = json.loads(discovery.gateway().payload)
    calibrated, raw = (json.loads(m.payload) for m in discovery.sensor("Node.01-A", "pm2_5"))
    health = json.loads(discovery.document("Node.01-A", "pm2_5", "health").payload)
    drift = json.loads(discovery.document("Node.01-A", "pm2_5", "drift").payload)
    gateway_id = gateway["device"]["identifiers"][0]
    for entity in (calibrated, raw, health, drift):
        assert entity["device"]["via_device"] == gateway_id
        assert entity["device"]["identifiers"] == ["tesla_pi-kitchen_1_-Node-d01-mA"]
        assert entity["device"]["sw_version"] == __version__
        assert entity["origin"] == {
            "name": "tesla-gateway",
            "sw_version": __version__,
            "support_url": "https://example.org/tesla-gateway",
        }
        assert entity["availability_mode"] == "all"
        assert [a["topic"] for a in entity["availability"]] == [
            "tesla/pi-kitchen.1/status",
            "tesla/pi-kitchen.1/Node.01-A/availability",
        ]
        assert "object_id" not in entity
    assert gateway["state_topic"] == "tesla/pi-kitchen.1/status"
    assert gateway["device_class"] == "connectivity"
    assert calibrated["default_entity_id"] == "sensor.tesla_node_01_a_pm2_5"
    assert calibrated["suggested_display_precision"] == 1
    assert calibrated["device_class"] == "pm25"
    assert "entity_category" not in calibrated  # the main entity
    assert raw["entity_category"] == "diagnostic"
    assert raw["value_template"] == "{{ value_json.raw }}"
    assert health["entity_category"] == drift["entity_category"] == "diagnostic"
    assert health["state_topic"] == "tesla/pi-kitchen.1/Node.01-A/pm2_5/health"
    assert health["value_template"] == "{{ 'ON' if not value_json.ok else 'OFF' }}"
    assert drift["value_template"] == "{{ 'ON' if value_json.drift else 'OFF' }}"


def test_removal_clears_every_config_topic_of_the_sensor() -> None:
    discovery = _discovery()
    removals = discovery.removals("s1")
    assert all(m.payload == b"" for m in removals)
    configs = [discovery.gateway()]
    for feature in ("pm1", "pm2_5", "pm10"):
        configs += discovery.sensor("s1", feature)
        configs += [discovery.document("s1", feature, k) for k in ("health", "drift")]
    assert {m.topic for m in removals} == {m.topic for m in configs[1:]}


def _entity_keys(discovery: Discovery, sensor: str) -> tuple[set[str], set[str], set[str]]:
    """Config topics, unique_ids and device identifiers of every entity of one sensor."""
    messages: list[DiscoveryMessage] = []
    for feature in ("pm1", "pm2_5", "pm10"):
        messages += discovery.sensor(sensor, feature)
        messages += [discovery.document(sensor, feature, k) for k in ("health", "drift")]
    configs = [json.loads(m.payload) for m in messages]
    return (
        {m.topic for m in messages},
        {c["unique_id"] for c in configs},
        {i for c in configs for i in c["device"]["identifiers"]},
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [("a.b", "a_b"), ("s.1", "s_1"), ("a.b", "a-db"), ("a-b.c", "a.b-c"), ("x.y", "-x-dy"[1:])],
)
def test_two_sensor_ids_never_share_an_entity(first: str, second: str) -> None:
    """Ids that differ only where topic levels cannot ('.'): two devices, two sets of entities,
    and removing one sensor's entities leaves the other's alone."""
    discovery = _discovery()
    keys_first, keys_second = _entity_keys(discovery, first), _entity_keys(discovery, second)
    for mine, theirs in zip(keys_first, keys_second, strict=True):
        assert not mine & theirs
    removed = {m.topic for m in discovery.removals(first)}
    assert removed == keys_first[0]
    assert not removed & keys_second[0]


def test_ids_without_a_dot_keep_the_entities_earlier_versions_made() -> None:
    """An upgrade must not give Home Assistant users a second copy of every entity."""
    (message, raw) = _discovery().sensor("node-01_a", "pm10")
    config = json.loads(message.payload)
    assert message.topic == "homeassistant/sensor/tesla_pi-kitchen_1/node-01_a_pm10/config"
    assert config["unique_id"] == "tesla_pi-kitchen_1_node-01_a_pm10"
    assert config["device"]["identifiers"] == ["tesla_pi-kitchen_1_node-01_a"]
    assert raw.topic == "homeassistant/sensor/tesla_pi-kitchen_1/node-01_a_pm10_raw/config"
