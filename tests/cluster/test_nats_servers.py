"""The nats-server launcher: a cluster elects a JetStream meta leader, MQTT listeners accept paho,
a leaf node with its own domain reaches the hub, and a killed node is gone."""

import asyncio
import json
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from devkit.nats_servers import NatsCluster, NatsServer

nats = pytest.importorskip("nats")


async def _js_info(url: str, subject: str = "$JS.API.INFO") -> dict[str, object]:
    client = await nats.connect(servers=[url], connect_timeout=5)
    try:
        reply = await client.request(subject, b"", timeout=5)
        document = json.loads(reply.data)
        assert isinstance(document, dict)
        return document
    finally:
        await client.close()


def test_cluster_has_jetstream_on_every_node_and_mqtt(nats_cluster: NatsCluster) -> None:
    for url in nats_cluster.urls:
        info = asyncio.run(_js_info(url))
        api = info["api"]
        assert isinstance(api, dict) and api["level"] >= 1
    meta = nats_cluster.servers[0].varz("jsz")["meta_cluster"]
    assert isinstance(meta, dict) and meta["cluster_size"] == 3
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="probe")
    client.connect("127.0.0.1", nats_cluster.mqtt_ports[1])
    assert client.publish("sensors/a/raw", b"{}", qos=1).rc == mqtt.MQTT_ERR_SUCCESS
    client.disconnect()


def test_kill_stops_one_node_and_start_brings_it_back(nats_cluster: NatsCluster) -> None:
    node = nats_cluster.servers[2]
    node.kill()
    assert not node.running and not node.healthy()
    node.start()
    assert node.healthy()


def test_leaf_with_its_own_domain_reaches_the_hub(
    nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    with NatsServer(
        tmp_path / "leaf", name="edge1", domain="edge1", leaf_remotes=nats_cluster.leaf_urls[:1]
    ) as leaf:
        info = asyncio.run(_js_info(leaf.url, "$JS.edge1.API.INFO"))
        assert info["type"] == "io.nats.jetstream.api.v1.account_info_response"
        deadline = time.monotonic() + 10
        while nats_cluster.servers[0].varz("leafz")["leafnodes"] != 1:
            assert time.monotonic() < deadline, "the leaf never attached to the hub"
            time.sleep(0.05)
