"""Who may do what on the shipped cluster-mode servers (deploy/nats/hub.conf, leaf.conf and the
users.conf both include): a client with no user is refused on every listener; a node may only
publish readings; a reader may only read calibrated and discovery topics; a leaf needs the hub's
leaf password. Before users.conf one MQTT publish deleted the readings stream and another forged a
lease. Real nats-servers started from the shipped files (only ports, paths and the hub's peers
changed), real paho and nats-py clients."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from devkit.nats_servers import NatsServer

nats = pytest.importorskip("nats")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "nats"
PASSWORDS = {
    "TESLA_NATS_GATEWAY_PASSWORD": "gateway-secret",
    "TESLA_NATS_NODE_PASSWORD": "node-secret",
    "TESLA_NATS_READER_PASSWORD": "reader-secret",
    "TESLA_NATS_LEAF_PASSWORD": "leaf-secret",
}
STREAM = "TESLA_READINGS"
BUCKET = "tesla_cluster"
LEAF_STREAM = "TESLA_EDGE"


def _render(conf: str, server: NatsServer, swaps: list[tuple[str, str]]) -> None:
    """The shipped file with this test's ports and paths, users.conf copied beside it."""
    text = (DEPLOY / conf).read_text(encoding="utf-8")
    for pattern, replacement in swaps:
        text, count = re.subn(pattern, replacement, text, flags=re.DOTALL)
        assert count == 1, f"deploy/nats/{conf} no longer has {pattern!r}"
    server.config_path.write_text(text, encoding="utf-8")
    (server.config_path.parent / "users.conf").write_text(
        (DEPLOY / "users.conf").read_text(encoding="utf-8"), encoding="utf-8"
    )


def _hub(work_dir: Path) -> NatsServer:
    hub = NatsServer(work_dir, name="hub1", mqtt=True, leaf_listen=True)
    _render(
        "hub.conf",
        hub,
        [
            (r"listen: 0\.0\.0\.0:4222", f"listen: 127.0.0.1:{hub.port}"),
            (r"http: 127\.0\.0\.1:8222", f"http: 127.0.0.1:{hub.http_port}"),
            (r"store_dir: /var/lib/nats", f"store_dir: {json.dumps(str(hub.store_dir))}"),
            (r"\ncluster \{.*?\n\}\n", "\n"),  # one node: its peers are not here
            (r"listen: 0\.0\.0\.0:1883", f"listen: 127.0.0.1:{hub.mqtt_port}"),
            (r"listen: 0\.0\.0\.0:7422", f"listen: 127.0.0.1:{hub.leaf_port}"),
        ],
    )
    return hub


def _leaf(work_dir: Path) -> NatsServer:
    leaf = NatsServer(work_dir, name="edge1", domain="edge1", mqtt=True)
    _render(
        "leaf.conf",
        leaf,
        [
            (r"listen: 127\.0\.0\.1:4222", f"listen: 127.0.0.1:{leaf.port}"),
            (r"http: 127\.0\.0\.1:8222", f"http: 127.0.0.1:{leaf.http_port}"),
            (r"store_dir: /var/lib/nats", f"store_dir: {json.dumps(str(leaf.store_dir))}"),
            (r"listen: 0\.0\.0\.0:1883", f"listen: 127.0.0.1:{leaf.mqtt_port}"),
        ],
    )
    return leaf


@pytest.fixture
def servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[NatsServer, NatsServer]]:
    """The hub and a Pi's leaf attached to it with the leaf password, as deployed."""
    for name, value in PASSWORDS.items():
        monkeypatch.setenv(name, value)
    hub = _hub(tmp_path / "hub")
    uplink = f"nats-leaf://leaf:{PASSWORDS['TESLA_NATS_LEAF_PASSWORD']}@127.0.0.1:{hub.leaf_port}"
    for n in (1, 2, 3):
        monkeypatch.setenv(f"TESLA_NATS_UPLINK_{n}", uplink)
    leaf = _leaf(tmp_path / "leaf")
    with hub, leaf:
        _wait(lambda: _leaves(hub) == 1, "the leaf attached with the leaf password")
        _run(_gateway_setup(hub.url))
        yield hub, leaf


def _wait(condition: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _leaves(hub: NatsServer) -> int:
    return int(hub.varz("leafz")["leafnodes"])  # type: ignore[call-overload]


def _run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coroutine)


async def _connect(url: str, user: str | None) -> Any:
    options: dict[str, object] = {"allow_reconnect": False, "connect_timeout": 5}
    if user is not None:
        options |= {"user": user, "password": PASSWORDS[f"TESLA_NATS_{user.upper()}_PASSWORD"]}
    client = nats.aio.client.Client()

    async def quiet(_error: Exception) -> None:  # a refusal is what some tests expect
        return None

    try:
        await client.connect(servers=[url], error_cb=quiet, **options)
    except BaseException:
        await client.close()  # else its transport is left to the garbage collector
        raise
    return client


async def _gateway_setup(url: str) -> None:
    """What a gateway makes: the readings stream and the bucket with a lease in it."""
    client = await _connect(url, "gateway")
    try:
        js = client.jetstream(timeout=10)
        await js.add_stream(name=STREAM, subjects=["sensors.*.raw"])
        kv = await js.create_key_value(bucket=BUCKET)
        await kv.put("lease.0", b"g1")
    finally:
        await client.close()


async def _state(url: str) -> tuple[int | None, bytes | None]:
    """(messages in the readings stream or None when it is gone, the lease's value)."""
    client = await _connect(url, "gateway")
    try:
        js = client.jetstream(timeout=10)
        try:
            messages: int | None = (await js.stream_info(STREAM)).state.messages
        except nats.js.errors.NotFoundError:
            messages = None
        lease = await (await js.key_value(BUCKET)).get("lease.0")
        return messages, lease.value
    finally:
        await client.close()


class MqttClient:
    """A paho MQTT 3.1.1 client; ``refused`` holds the CONNACK's reason when it was refused."""

    def __init__(self, port: int, user: str | None) -> None:
        self.messages: list[str] = []
        self.connected: str | None = None
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"probe-{user}-{port}", protocol=mqtt.MQTTv311
        )
        if user is not None:
            self._client.username_pw_set(user, PASSWORDS[f"TESLA_NATS_{user.upper()}_PASSWORD"])
        self._client.on_connect = self._on_connect
        self._client.on_message = lambda _c, _u, message: self.messages.append(message.topic)
        self._client.connect("127.0.0.1", port)
        self._client.loop_start()
        _wait(lambda: self.connected is not None, "a CONNACK")

    def _on_connect(self, _c: object, _u: object, _f: object, reason: object, _p: object) -> None:
        self.connected = str(reason)

    def publish_then_a_reading(self, topic: str) -> None:
        """``topic`` at QoS 0, then a reading at QoS 1 on the same connection: once the reading
        is acknowledged, the server has handled the first publish (one connection is in order)."""
        self._client.publish(topic, b"{}", qos=0)
        self.reading("probe")

    def reading(self, sensor: str) -> None:
        payload = json.dumps({"ts": time.time(), "pm10": 12.5})
        info = self._client.publish(f"sensors/{sensor}/raw", payload, qos=1)
        info.wait_for_publish(timeout=10)

    def subscribe(self, topic: str) -> list[str]:
        granted: list[str] = []
        self._client.on_subscribe = lambda _c, _u, _m, codes, _p: granted.extend(map(str, codes))
        self._client.subscribe(topic, qos=1)
        _wait(lambda: bool(granted), "a SUBACK")
        return granted

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def test_a_client_with_no_user_is_refused_everywhere(
    servers: tuple[NatsServer, NatsServer],
) -> None:
    hub, leaf = servers
    for server in (hub, leaf):
        anonymous = MqttClient(server.mqtt_port, None)
        anonymous.close()
        assert anonymous.connected == "Not authorized", server.name
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            _run(_connect(server.url, None))


@pytest.mark.parametrize("where", ["hub", "leaf"])
def test_a_node_publishes_readings_and_nothing_else(
    servers: tuple[NatsServer, NatsServer], where: str
) -> None:
    hub, leaf = servers
    local = hub if where == "hub" else leaf
    if where == "leaf":  # the Pi's own store, the target a node on its LAN reaches first
        _run(_add_stream(leaf.url, LEAF_STREAM))
    watcher = MqttClient(hub.mqtt_port, "reader")  # would see a forged calibrated value
    node = MqttClient(local.mqtt_port, "node")
    try:
        assert watcher.subscribe("tesla/#") == ["Granted QoS 1"]
        assert node.connected == "Success"
        if where == "hub":
            node.reading("n1")
            _wait(lambda: _run(_state(hub.url))[0] == 1, "the node's reading stored")
        node.publish_then_a_reading(f"$JS/API/STREAM/DELETE/{STREAM}")
        node.publish_then_a_reading(f"$JS/API/STREAM/DELETE/{LEAF_STREAM}")
        node.publish_then_a_reading(f"$KV/{BUCKET}/lease/0")
        node.publish_then_a_reading("tesla/calibrated/n1/pm10")
        assert node.subscribe("tesla/#") == ["Unspecified error"]
        _run(_sentinel(local.url))  # published after the node's, on the same server
        _wait(lambda: "tesla/sentinel" in watcher.messages, "the sentinel")
    finally:
        node.close()
        watcher.close()
    assert "tesla/calibrated/n1/pm10" not in watcher.messages, "a node forged a value"
    messages, lease = _run(_state(hub.url))
    assert messages is not None, "a node deleted the readings stream"
    assert lease == b"g1", "a node overwrote a lease"
    if where == "leaf":
        assert _run(_has_stream(leaf.url, LEAF_STREAM)), "a node deleted the Pi's stream"


async def _add_stream(url: str, name: str) -> None:
    client = await _connect(url, "gateway")
    try:
        await client.jetstream(timeout=10).add_stream(name=name, subjects=["edge.>"])
    finally:
        await client.close()


async def _has_stream(url: str, name: str) -> bool:
    client = await _connect(url, "gateway")
    try:
        await client.jetstream(timeout=10).stream_info(name)
        return True
    except nats.js.errors.NotFoundError:
        return False
    finally:
        await client.close()


async def _sentinel(url: str) -> None:
    client = await _connect(url, "gateway")
    try:
        await client.publish("tesla.sentinel", b"{}")
        await client.flush()
    finally:
        await client.close()


def test_a_reader_reads_calibrated_topics_and_publishes_nothing(
    servers: tuple[NatsServer, NatsServer],
) -> None:
    hub, _ = servers
    before, _ = _run(_state(hub.url))
    reader = MqttClient(hub.mqtt_port, "reader")
    try:
        assert reader.subscribe("tesla/#") == ["Granted QoS 1"]
        assert reader.subscribe("homeassistant/#") == ["Granted QoS 1"]

        async def calibrated() -> None:
            client = await _connect(hub.url, "gateway")
            await client.publish("tesla.cluster.n1.pm10", b"{}")
            await client.flush()
            await client.close()

        _run(calibrated())
        _wait(lambda: "tesla/cluster/n1/pm10" in reader.messages, "the reader given the value")
        reader.publish_then_a_reading("tesla/cluster/n1/pm10")
    finally:
        reader.close()
    assert _run(_state(hub.url))[0] == before, "a reader's reading was stored"
    assert reader.messages.count("tesla/cluster/n1/pm10") == 1, "a reader published a value"


def test_a_leaf_without_the_leaf_password_is_refused(
    servers: tuple[NatsServer, NatsServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, _ = servers
    wrong = f"nats-leaf://leaf:guess@127.0.0.1:{hub.leaf_port}"
    for n in (1, 2, 3):
        monkeypatch.setenv(f"TESLA_NATS_UPLINK_{n}", wrong)
    intruder = _leaf(tmp_path / "intruder")
    intruder.config_path.write_text(
        intruder.config_path.read_text(encoding="utf-8").replace("edge1", "edge9"),
        encoding="utf-8",
    )
    with intruder:
        _wait(lambda: "Authorization Violation" in intruder.log_tail(50), "the hub's refusal")
        assert _leaves(hub) == 1  # the deployed leaf only


def test_a_gateway_joins_with_its_user_and_is_told_when_refused(
    servers: tuple[NatsServer, NatsServer], tmp_path: Path
) -> None:
    from tesla_gateway.cluster.config import ClusterConfig
    from tesla_gateway.cluster.engine import connect
    from tesla_gateway.cluster.errors import ClusterAuthError

    hub, _ = servers
    secret = tmp_path / "nats-password"
    secret.write_text(PASSWORDS["TESLA_NATS_GATEWAY_PASSWORD"] + "\n", encoding="utf-8")
    base = {  # beside the fixture's own stream and bucket
        "servers": [hub.url],
        "partitions": 2,
        "replicas": 1,
        "readings_stream": "GW_READINGS",
        "readings_subject": "gw",
        "calibrated_stream": "GW_CALIBRATED",
        "calibrated_subject": "gw_calibrated",
        "bucket": "gw_cluster",
    }

    async def join(config: ClusterConfig) -> list[str]:
        engine = await connect(config, "tesla-gateway-g1")
        try:
            names = await engine.js.streams_info()
            return sorted(info.config.name or "" for info in names)
        finally:
            await engine.close()

    joined = ClusterConfig.model_validate(base | {"user": "gateway", "password_file": secret})
    assert "GW_CALIBRATED" in _run(join(joined))
    for wrong in ({}, {"user": "gateway", "password": "guess"}, {"user": "node"}):
        with pytest.raises(ClusterAuthError, match=r"\[cluster\] user and password_file"):
            _run(join(ClusterConfig.model_validate(base | wrong)))


def test_cluster_credentials_stay_out_of_urls_and_logs() -> None:
    from pydantic import ValidationError

    from tesla_gateway.cluster.config import ClusterConfig

    with pytest.raises(ValidationError, match="no credentials in a URL"):
        ClusterConfig.model_validate({"servers": ["nats://gateway:secret@10.0.0.1:4222"]})
    with pytest.raises(ValidationError, match="a password needs a user"):
        ClusterConfig.model_validate({"servers": ["nats://10.0.0.1:4222"], "password": "secret"})
    config = ClusterConfig.model_validate(
        {"servers": ["nats://10.0.0.1:4222"], "user": "gateway", "password": "secret"}
    )
    assert "secret" not in repr(config)
