"""Home Assistant discovery through the real daemon and mosquitto (issue 15).

One sensor reports a few readings and goes quiet: its discovery configs (the gateway's device,
calibrated, raw, health) appear and pass Home Assistant's schema (tests/support/ha_schema.py),
its availability topic goes ``online`` then, once quiet for ``sensor_offline_after_s``,
``offline`` while the gateway stays online; when admission evicts it, every config and its
availability are cleared (empty retained payloads), so a Home Assistant that starts afterwards
finds nothing of it.
"""

from __future__ import annotations

import json
from pathlib import Path

from devkit.broker import Mosquitto
from tesla_gateway.publish.discovery import DiscoveryMessage
from tests.gateway.e2e.harness import (
    GATEWAY_ID,
    MODEL,
    PREFIX,
    Daemon,
    MqttNodes,
    P,
    grid_base,
    wait_for,
    write_config,
)
from tests.gateway.io.helpers import Collector
from tests.support.ha_schema import ha_problems
from tests.support.models import ModelFactory

SENSOR = "ha-1"
NODE = f"homeassistant/sensor/tesla_{GATEWAY_ID}"
BINARY = f"homeassistant/binary_sensor/tesla_{GATEWAY_ID}"
CONFIGS = [
    f"{BINARY}/gateway_status/config",
    f"{NODE}/{SENSOR}_pm10/config",
    f"{NODE}/{SENSOR}_pm10_raw/config",
    f"{BINARY}/{SENSOR}_pm10_health/config",
]
AVAILABILITY = f"{PREFIX}/{SENSOR}/availability"


def _configure(config: Path) -> None:
    text = config.read_text(encoding="utf-8")
    for old, new in (
        ("[publisher]\n", "[publisher]\ndiscovery = true\nsensor_offline_after_s = 0.5\n"),
        ("save_interval_s = 600", "save_interval_s = 0.3"),  # the eviction sweep runs with it
        ("allow_unknown = true", "allow_unknown = true\nevict_idle_s = 1.5"),
    ):
        assert old in text
        text = text.replace(old, new)
    config.write_text(text + "[health]\npublish_interval_s = 0.2\n", encoding="utf-8")


def test_discovery_appears_a_quiet_sensor_goes_unavailable_and_eviction_removes_it(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    config = write_config(tmp_path, mosquitto, model.path)
    _configure(config)
    seen = Collector(mosquitto, ["homeassistant/#", f"{PREFIX}/#"])
    mqtt = MqttNodes(mosquitto)
    try:
        daemons.append(Daemon(config, tmp_path / "state"))
        base = grid_base(5)
        for period in range(3):
            mqtt.send(SENSOR, base + period * P + 1, 20.0 + period)

        def configs_present() -> bool:
            return all(seen.on(topic) for topic in CONFIGS)

        wait_for(configs_present, "the discovery configs")
        for topic in CONFIGS:
            message = DiscoveryMessage(topic, seen.on(topic)[0])
            assert ha_problems(message) == [], topic
        calibrated = json.loads(seen.on(CONFIGS[1])[0])
        assert calibrated["availability"][1]["topic"] == AVAILABILITY
        assert calibrated["device"]["via_device"] == f"tesla_{GATEWAY_ID}"

        wait_for(lambda: seen.on(AVAILABILITY)[:2] == [b"online", b"offline"], "offline")
        assert seen.on(f"{PREFIX}/status")[-1] == b"online"  # the gateway itself is up

        def removed() -> bool:
            return all(seen.on(topic)[-1:] == [b""] for topic in [*CONFIGS[1:], AVAILABILITY])

        wait_for(removed, "the configs removed at eviction")
        assert seen.on(CONFIGS[0])[-1] != b""  # the gateway's device stays
        wait_for(lambda: daemons[-1].status()["admission"]["evicted"] == 1, "evicted counted")
    finally:
        mqtt.close()
        seen.close()
    late = Collector(mosquitto, ["homeassistant/#", f"{PREFIX}/{SENSOR}/availability"])
    try:  # a Home Assistant starting now: only the gateway's retained config is left
        wait_for(lambda: late.on(CONFIGS[0]), "the gateway's retained config")
        assert {m.topic for m in late.messages} == {CONFIGS[0]}
    finally:
        late.close()
    assert daemons[-1].stop() == 0
