"""OTA, health, drift, availability and discovery in cluster mode, end to end: a real 3-node
nats-server cluster (R3), three real gateway processes, MQTT through nats-server's MQTT listener.

One signed release pushed on the releases topic is installed by every member, and every sensor's
calibrated values then carry the new model version. Health and drift documents come, on the
cluster-wide topics, from the gateway that owns the sensor's partition, from one gateway at a
time; after a SIGKILL they come from the new owner. Each gateway's status (its last will) is its
own: the dead one's says ``offline``, no sensor's availability does (but that of a sensor that
went quiet as its owner died: its new owner says it), and the sensors' discovery entities are
the cluster's (one set, not one per gateway), tied to no gateway's status.

The nodes and the reference station are simulated by threads publishing what they would (no
board or regulatory monitor exists here); everything else is real.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

from devkit.cluster_demo.streams import sensor_partitions
from devkit.nats_servers import NatsCluster
from tesla_gateway.ota.install import install_release
from tesla_gateway.ota.release import verify_release
from tesla_gateway.publish.discovery import Discovery
from tesla_gateway.publish.topics import TopicScheme
from tests.cluster.harness import (
    PERIOD_S,
    WAIT_S,
    WINDOW,
    ClusterGateway,
    Feeder,
    balanced,
    placement,
    sharing,
    stream_messages,
    value_of,
    wait_for,
    write_config,
)
from tests.support.models import ModelFactory
from tests.support.releases import ReleaseKit

pytest.importorskip("nats")
pytestmark = pytest.mark.reliability  # fault injection (short form: part of make test)

CO_LOCATED = "co"  # the sensor beside the reference station
SENSORS = [CO_LOCATED, *(f"s{index:02d}" for index in range(11))]
REFERENCE = "ref-1"
PREFIX = "tesla/cluster"


def _extra(key: Path) -> str:
    """OTA, fast health and drift, and a reference far from the sensor (a drift at once)."""
    return f"""
[ota]
public_key_file = "{key}"

[health]
publish_interval_s = 1
min_periods = 2

[drift]
window_pairs = 10
min_pairs = 3
rmse_abs = 5
rmse_ratio = 0

[pairs]
reference_grace_s = 1

[[references]]
name = "{REFERENCE}"
feature = "pm10"
colocated_with = ["{CO_LOCATED}"]
[references.mqtt]
topics = ["reference/{REFERENCE}"]
[references.mqtt.broker]
port = {{port}}
protocol = "3.1.1"
reconnect_initial_s = 0.1
reconnect_max_s = 1
"""


@dataclass
class Heard:
    """Every MQTT message under ``tesla/#`` and ``homeassistant/#``, with its arrival time."""

    messages: list[tuple[float, str, bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_message(self, _client: paho.Client, _data: object, message: paho.MQTTMessage) -> None:
        with self.lock:
            self.messages.append((time.monotonic(), message.topic, bytes(message.payload)))

    def on(self, topic: str, since: float = 0.0) -> list[bytes]:
        with self.lock:
            return [p for t, name, p in self.messages if name == topic and t >= since]

    def documents(self, kind: str, since: float = 0.0) -> list[dict[str, Any]]:
        """The health or drift documents heard since ``since`` (cleared topics skipped)."""
        with self.lock:
            found = [
                (name, p)
                for t, name, p in self.messages
                if t >= since and name.startswith(PREFIX + "/") and name.endswith("/" + kind)
            ]
        return [json.loads(p) for _, p in found if p]

    def topics(self) -> set[str]:
        with self.lock:
            return {name for _, name, _ in self.messages}


@pytest.fixture
def heard(nats_cluster: NatsCluster) -> Iterator[Heard]:
    found = Heard()
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="consumer")
    client.on_message = found.on_message
    client.connect("127.0.0.1", nats_cluster.mqtt_ports[0])
    client.subscribe([("tesla/#", 1), ("homeassistant/#", 1)])
    client.loop_start()
    yield found
    client.disconnect()
    client.loop_stop()


class ReferenceStation(threading.Thread):
    """Publishes the co-located sensor's value plus 200 µg/m³ every 0.5 s (far from any
    calibration: the rolling error crosses the drift threshold within min_pairs pairs)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True, name="reference")
        self._port = port
        self._halt = threading.Event()

    def run(self) -> None:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id="reference-station")
        client.connect("127.0.0.1", self._port)
        client.loop_start()
        try:
            while not self._halt.is_set():
                now = round(time.time(), 3)
                payload = json.dumps({"ts": now, "pm10": value_of(CO_LOCATED, now) + 200.0})
                client.publish(f"reference/{REFERENCE}", payload, qos=1).wait_for_publish(10)
                self._halt.wait(0.5)
        finally:
            client.disconnect()
            client.loop_stop()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)


def _gateway(
    tmp_path: Path, name: str, kit: ReleaseKit, cluster: NatsCluster, node: int
) -> ClusterGateway:
    model_dir = tmp_path / name / "pm10"  # writable: trusted only through a signed release
    first = verify_release(kit.release(kit.base_version, "gateway"), kit.public_key, None)
    install_release(first, model_dir, "pm10")
    port = cluster.mqtt_ports[node]
    config = write_config(
        tmp_path / name,
        name,
        model_dir,
        cluster.urls,
        port,
        sources=_extra(kit.keys.public_path).replace("{port}", str(port)),
    )
    text = config.read_text(encoding="utf-8").replace(
        "[publisher]\n",
        "[publisher]\ndiscovery = true\nsensor_offline_after_s = 8\ndiscovery_expire_after_s = 6\n",
    )
    config.write_text(text, encoding="utf-8")
    gateway = ClusterGateway(tmp_path / name, name, config)
    gateway.start()
    return gateway


def _owners(gateways: list[ClusterGateway], partitions: dict[str, int]) -> dict[str, str]:
    """Each sensor's owner by the gateways' own reports."""
    by_partition = {p: g for g, ps in placement(gateways).items() for p in ps}
    return {sensor: by_partition[p] for sensor, p in partitions.items()}


def _judged_by(heard: Heard, kind: str, since: float) -> dict[str, set[str]]:
    """Sensor -> the gateways whose documents of ``kind`` were heard since ``since``."""
    judges: dict[str, set[str]] = {}
    for document in heard.documents(kind, since):
        judges.setdefault(document["sensor"], set()).add(document["gateway"])
    return judges


def _version_everywhere(servers: list[str], version: int, since: float) -> bool:
    """Every sensor has a value of ``version`` stored after ``since`` (Unix s)."""
    fresh = {
        document.get("sensor") or msg_id.split(".")[0]
        for msg_id, document, stored in stream_messages(servers, "TESLA_CALIBRATED")
        if stored >= since and document.get("model_version") == version
    }
    return fresh >= set(SENSORS)


def test_ota_health_and_drift_follow_the_partitions(
    nats_cluster: NatsCluster, heard: Heard, model_factory: ModelFactory, tmp_path: Path
) -> None:
    model = model_factory.get(window_length=WINDOW, period_seconds=PERIOD_S).path
    kit = ReleaseKit(tmp_path / "releases", model_dir=model)
    old, new = kit.base_version, kit.base_version + 1
    gateways = [_gateway(tmp_path, f"g{i}", kit, nats_cluster, i) for i in range(3)]
    feeder = Feeder(nats_cluster.urls, SENSORS)
    reference = ReferenceStation(nats_cluster.mqtt_ports[1])
    try:
        for gateway in gateways:
            gateway.wait_ready(wait_sources=False)
        wait_for(
            lambda: sharing(gateways, nats_cluster.urls), "three gateways sharing the partitions"
        )
        feeder.start()
        reference.start()
        wait_for(lambda: len(sensor_partitions(nats_cluster.urls)) == len(SENSORS), "partitions")
        partitions = sensor_partitions(nats_cluster.urls)
        owners = _owners(gateways, partitions)

        # -- health and drift from each sensor's owner, one gateway per sensor -------------
        settled = time.monotonic()
        wait_for(
            lambda: set(_judged_by(heard, "health", settled)) == set(SENSORS),
            "health documents for every sensor",
        )
        wait_for(
            lambda: any(d["drift"] for d in heard.documents("drift", settled)),
            "the co-located sensor's drift raised",
        )
        assert all(len(g) == 1 for g in _judged_by(heard, "health", settled).values())
        assert {s: g.pop() for s, g in _judged_by(heard, "health", settled).items()} == owners
        assert _judged_by(heard, "drift", settled) == {CO_LOCATED: {owners[CO_LOCATED]}}
        assert {d["model_version"] for d in heard.documents("health", settled)} == {old}

        # -- one signed push: every member installs it and serves it ------------------------
        pushed_at, pushed = time.time(), time.monotonic()
        subprocess.run(  # the documented command; nats-server's MQTT listener refuses MQTT 5
            [
                sys.executable,
                "-m",
                "training",
                "push",
                "--release",
                str(kit.release(new, "gateway")),
                "--broker",
                f"127.0.0.1:{nats_cluster.mqtt_ports[2]}",
                "--protocol",
                "3.1.1",
            ],
            check=True,
            timeout=WAIT_S,
        )
        for gateway in gateways:
            topic = f"tesla/{gateway.gateway_id}/ota/gateway"

            def serving(member: ClusterGateway = gateway) -> bool:
                return bool(member.status().get("models", {}).get("pm10", {}).get("version") == new)

            def installed(status_topic: str = topic) -> bool:
                return any(json.loads(p)["status"] == "installed" for p in heard.on(status_topic))

            wait_for(serving, f"{gateway.gateway_id} serving version {new}")
            wait_for(installed, f"{gateway.gateway_id}'s 'installed' on its own OTA status topic")
        print(f"version {new} served by all 3 {time.monotonic() - pushed:.1f} s after the push")
        wait_for(
            lambda: _version_everywhere(nats_cluster.urls, new, pushed_at),
            f"every sensor calibrated by version {new}",
        )
        upgraded = time.monotonic()
        wait_for(
            lambda: (
                {
                    d["sensor"]
                    for d in heard.documents("health", upgraded)
                    if d["model_version"] == new
                }
                == set(SENSORS)
            ),
            "health documents naming the new version",
        )

        # -- the co-located sensor's owner SIGKILLed: its documents move with its partition --
        victim = next(g for g in gateways if g.gateway_id == owners[CO_LOCATED])
        survivors = [g for g in gateways if g is not victim]
        moved = {s for s, owner in owners.items() if owner == victim.gateway_id}
        # one of its sensors goes quiet, past a snapshot, before it dies: its new owner, which
        # finds it in the snapshot but hears nothing of it, must call it offline
        quiet = sorted(moved - {CO_LOCATED})[0]
        feeder.sensors = [s for s in SENSORS if s != quiet]
        time.sleep(3.0)  # snapshots every 2 s; the sensor's offline_after is 8 s
        victim.kill()
        killed = time.monotonic()
        wait_for(lambda: balanced(survivors), "the survivors taking the dead one's partitions")
        owners_after = _owners(survivors, partitions)
        print(
            f"{len(moved)} sensors moved; balanced {time.monotonic() - killed:.1f} s after the kill"
        )
        taken = time.monotonic()
        wait_for(
            lambda: set(_judged_by(heard, "health", taken)) >= set(SENSORS) - {quiet},
            "health documents for every sensor from the survivors",
        )
        wait_for(
            lambda: heard.on(f"{PREFIX}/{quiet}/availability", since=killed)[-1:] == [b"offline"],
            "the quiet sensor called offline by its new owner",
        )
        wait_for(  # raised once (a change): perhaps before the survivors were seen balanced
            lambda: any(d["drift"] for d in heard.documents("drift", killed)),
            "the co-located sensor's drift raised again by its new owner",
        )
        after = _judged_by(heard, "health", taken)
        assert all(len(g) == 1 for g in after.values()), after
        assert {s: g.pop() for s, g in after.items()} == {
            s: owner for s, owner in owners_after.items() if s in after
        }
        assert _judged_by(heard, "drift", killed) == {CO_LOCATED: {owners_after[CO_LOCATED]}}
        assert not any(victim.gateway_id in g for g in _judged_by(heard, "health", killed).values())
        assert {d["model_version"] for d in heard.documents("health", taken)} == {new}
        for gateway in survivors:
            gateway.check_alive()
    finally:
        feeder.stop()
        reference.stop() if reference.is_alive() else None
        for gateway in gateways:
            gateway.kill()

    # -- each gateway's status is its own; no sensor went unavailable ----------------------
    assert moved
    assert heard.on(f"tesla/{victim.gateway_id}/status")[-1] == b"offline"  # its last will
    for gateway in survivors:
        assert b"online" in heard.on(f"tesla/{gateway.gateway_id}/status")
    topics = heard.topics()
    assert not {f"{PREFIX}/status", f"{PREFIX}/stats"} & topics
    for sensor in set(SENSORS) - {quiet}:
        assert set(heard.on(f"{PREFIX}/{sensor}/availability")) == {b"online"}, sensor
    assert heard.on(f"{PREFIX}/{quiet}/availability")[-1] == b"offline"

    # -- one set of discovery entities, the cluster's, tied to no gateway's status -------------
    configs = {t for t in topics if t.startswith("homeassistant/") and t.endswith("/config")}
    sensor_configs = {t for t in configs if not t.endswith("/gateway_status/config")}
    assert {t.split("/")[2] for t in sensor_configs} == {"tesla_cluster"}
    assert {t.split("/")[2] for t in configs - sensor_configs} == {
        "tesla_g0",
        "tesla_g1",
        "tesla_g2",
    }
    config = json.loads(
        heard.on(f"homeassistant/sensor/tesla_cluster/{CO_LOCATED}_pm10/config")[-1]
    )
    assert [a["topic"] for a in config["availability"]] == [f"{PREFIX}/{CO_LOCATED}/availability"]
    assert "via_device" not in config["device"]
    assert config["expire_after"] == 6  # all gateways gone: unavailable all the same


def test_cluster_discovery_names_no_gateway_in_a_sensors_entities() -> None:
    """The same sensor announced by two gateways of a cluster: the same configs, byte for byte;
    one gateway alone keeps its own node, its status in every entity's availability."""

    def configs(gateway: str, *, cluster: bool) -> list[tuple[str, bytes]]:
        topics = (
            TopicScheme(PREFIX, own_prefix=f"tesla/{gateway}")
            if cluster
            else TopicScheme(f"tesla/{gateway}")
        )
        discovery = Discovery(
            discovery_prefix="homeassistant",
            gateway_id=gateway,
            topics=topics,
            sensor_availability=True,
            cluster=cluster,
            expire_after_s=180.5 if cluster else None,
        )
        messages = [*discovery.sensor("s1", "pm10"), discovery.document("s1", "pm10", "health")]
        return [(m.topic, m.payload) for m in messages]

    assert configs("g0", cluster=True) == configs("g1", cluster=True)
    calibrated, raw, health = (json.loads(p) for _, p in configs("g0", cluster=True))
    assert calibrated["expire_after"] == raw["expire_after"] == 181
    assert "expire_after" not in health  # a document: published on change only
    alone = json.loads(configs("g0", cluster=False)[0][1])
    assert [a["topic"] for a in alone["availability"]] == [
        "tesla/g0/status",
        "tesla/g0/s1/availability",
    ]
    assert alone["device"]["via_device"] == "tesla_g0"
    gateway = Discovery(
        discovery_prefix="homeassistant",
        gateway_id="g0",
        topics=TopicScheme(PREFIX, own_prefix="tesla/g0"),
        sensor_availability=True,
        cluster=True,
    ).gateway()
    assert gateway.topic == "homeassistant/binary_sensor/tesla_g0/gateway_status/config"
    assert json.loads(gateway.payload)["state_topic"] == "tesla/g0/status"


@pytest.mark.parametrize("prefix", ["tesla/cluster", "tesla/cluster/g1"])
def test_a_gateway_prefix_in_the_shared_one_is_refused_at_load(tmp_path: Path, prefix: str) -> None:
    """Its status would be another gateway's, or a sensor's topic."""
    from tesla_gateway.daemon.config import load_config
    from tesla_gateway.errors import ConfigError

    path = tmp_path / "gateway.toml"
    body = f"""
gateway_id = "g1"
state_dir = "{tmp_path / "state"}"
[[models]]
feature = "pm10"
model_dir = "{tmp_path / "model"}"
[publisher]
topic_prefix = "{{prefix}}"
[cluster]
servers = ["nats://127.0.0.1:4222"]
"""
    path.write_text(body.replace("{prefix}", "tesla/g1"), encoding="utf-8")
    assert load_config(path).cluster is not None
    path.write_text(body.replace("{prefix}", prefix), encoding="utf-8")
    with pytest.raises(ConfigError, match="status and stats need a prefix of their own"):
        load_config(path)
