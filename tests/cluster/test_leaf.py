"""The edge layout of docs/deployment.md: a Pi's leaf nats-server (deploy/nats/leaf.conf, its own
JetStream domain) under a real 3-node hub cluster where a real gateway runs in cluster mode. Nodes
publish MQTT to the leaf; the uplink (a TCP relay standing for the Pi's network link) is cut and
restored: the readings published meanwhile reach the hub's readings stream when it returns, none
lost, none twice, and the gateway calibrates every period once and in order. The node is a paho
client (no board here); the servers, the streams and the gateway are real."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import ServiceUnavailableError
from paho.mqtt.enums import CallbackAPIVersion

from devkit.broker import free_ports
from devkit.lifecycle import StartStop
from devkit.nats_servers import NatsCluster, NatsServer, nats_server_executable
from tests.cluster.harness import (
    PERIOD_S,
    WINDOW,
    ClusterGateway,
    balanced,
    expected_periods,
    stream_messages,
    value_of,
    wait_for,
    write_config,
)
from tests.support.models import ModelFactory

nats = pytest.importorskip("nats")

ROOT = Path(__file__).resolve().parents[2]
LEAF_CONF = ROOT / "deploy" / "nats" / "leaf.conf"
HUB_CONF = ROOT / "deploy" / "nats" / "hub.conf"
EDGE_SCRIPT = ROOT / "deploy" / "nats" / "edge_streams.py"
USERS_CONF = ROOT / "deploy" / "nats" / "users.conf"
# The environment deploy/nats/users.conf and the leaf's uplink read (a systemd EnvironmentFile).
PASSWORDS = {
    "TESLA_NATS_GATEWAY_PASSWORD": "gateway-secret",
    "TESLA_NATS_NODE_PASSWORD": "node-secret",
    "TESLA_NATS_READER_PASSWORD": "reader-secret",
    "TESLA_NATS_LEAF_PASSWORD": "leaf-secret",
}
SENSORS = ["e1", "e2", "e3", "e4"]
DOMAIN = "edge1"


class Uplink(StartStop):
    """A TCP relay between the leaf and a hub node standing for the Pi's network link:
    ``stop()`` cuts it (the listener and every connection), ``start()`` restores it on the same
    port, so the leaf's reconnects are refused while it is down."""

    def __init__(self, target_port: int) -> None:
        self.port = free_ports(1)[0]
        self._target = target_port
        self._up = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._up.is_set():
            return
        listener = socket.create_server(("127.0.0.1", self.port))
        listener.settimeout(0.1)
        self._up.set()
        self._thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._thread.start()

    def _accept(self, listener: socket.socket) -> None:
        with listener:
            while self._up.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                upstream = socket.create_connection(("127.0.0.1", self._target))
                with self._lock:
                    self._sockets += [client, upstream]
                for source, sink in ((client, upstream), (upstream, client)):
                    threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def stop(self) -> None:
        self._up.clear()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close(sock)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _render_leaf_conf(leaf: NatsServer, uplink_port: int) -> str:
    """deploy/nats/leaf.conf as shipped, with this test's ports, store and uplink."""
    text = LEAF_CONF.read_text(encoding="utf-8")
    swaps = [
        (r"listen: 127\.0\.0\.1:4222", f"listen: 127.0.0.1:{leaf.port}"),
        (r"http: 127\.0\.0\.1:8222", f"http: 127.0.0.1:{leaf.http_port}"),
        (r"store_dir: /var/lib/nats", f"store_dir: {json.dumps(str(leaf.store_dir))}"),
        (r"listen: 0\.0\.0\.0:1883", f"listen: 127.0.0.1:{leaf.mqtt_port}"),
        (r"urls: \[[^\]]*\]", f'urls: ["nats-leaf://127.0.0.1:{uplink_port}"]'),
    ]
    for pattern, replacement in swaps:
        text, count = re.subn(pattern, replacement, text)
        assert count == 1, f"deploy/nats/leaf.conf no longer has {pattern!r}"
    (leaf.config_path.parent / "users.conf").write_text(  # included from beside it
        USERS_CONF.read_text(encoding="utf-8"), encoding="utf-8"
    )
    return text


def _as_gateway(url: str) -> str:
    """A client URL of the leaf with the gateway role of users.conf (the deploy script's)."""
    password = PASSWORDS["TESLA_NATS_GATEWAY_PASSWORD"]
    return url.replace("nats://", f"nats://gateway:{password}@", 1)


def _edge_streams(side: str, server: str) -> str:
    done = subprocess.run(  # the deploy script as an operator runs it
        [sys.executable, str(EDGE_SCRIPT), side, "--server", server, "--domain", DOMAIN],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _edge_readings(servers: list[str]) -> list[tuple[str, float]]:
    """(sensor, ts) of every edge reading in the hub's readings stream, in stream order."""

    async def run() -> list[tuple[str, float]]:
        client = await nats.connect(servers=servers)
        js = client.jetstream(timeout=10)
        found: list[tuple[str, float]] = []
        try:
            total = (await js.stream_info("TESLA_READINGS")).state.messages
            if total == 0:
                return found
            subscription = await js.pull_subscribe(">", stream="TESLA_READINGS")
            seen = 0
            while seen < total:
                for message in await subscription.fetch(500, timeout=5):
                    seen += 1
                    sensor = message.subject.rsplit(".", 1)[1]
                    if sensor in SENSORS:
                        found.append((sensor, float(json.loads(message.data)["ts"])))
                    await message.ack()
            await subscription.unsubscribe()
        finally:
            await client.close()
        return found

    # Right after a leaf's uplink drops or returns, the hub may answer a JetStream request with
    # no responder for a moment (seen under load): ask again, a few times.
    for _ in range(9):
        with contextlib.suppress(ServiceUnavailableError, NatsTimeoutError):
            return asyncio.run(run())
        time.sleep(0.5)
    return asyncio.run(run())


def _leaf_stream_count(leaf: NatsServer) -> int:
    streams = leaf.varz("jsz?streams=true")["account_details"]
    assert isinstance(streams, list)
    for account in streams:
        for stream in account.get("stream_detail") or []:
            if stream["name"] == "TESLA_EDGE":
                return int(stream["state"]["messages"])
    return 0


def _hub(work_dir: Path) -> NatsCluster:
    """The hub cluster, its nodes keeping their leafnode URLs to themselves: a leaf would
    otherwise learn them and reconnect around the relay (a real cut takes every path)."""
    cluster = NatsCluster(work_dir, leaf_listen=True)
    for server in cluster.servers:
        text = server.config_path.read_text(encoding="utf-8")
        assert "leafnodes {\n" in text
        text = text.replace("leafnodes {\n", "leafnodes {\n  no_advertise: true\n")
        server.config_path.write_text(text, encoding="utf-8")
    return cluster


def _leaves(hub: NatsCluster) -> int:
    return sum(int(s.varz("leafz")["leafnodes"]) for s in hub.servers)  # type: ignore[call-overload]


def _calibrated(servers: list[str]) -> list[tuple[str, dict[str, Any], float]]:
    """The calibrated stream, or nothing while a reader's consumer is refused (a 503 while
    the R3 stream settles is the engine's, not the layout's)."""
    try:
        return stream_messages(servers, "TESLA_CALIBRATED")
    except nats.errors.Error:
        return []


class Node:
    """What a node does: one MQTT 3.1.1 QoS 1 reading per sensor per round, to the leaf."""

    def __init__(self, port: int) -> None:
        self.sent: list[tuple[str, float, float]] = []
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id="edge-node", protocol=mqtt.MQTTv311
        )
        self._client.username_pw_set("node", PASSWORDS["TESLA_NATS_NODE_PASSWORD"])
        self._client.connect("127.0.0.1", port)
        self._client.loop_start()

    def publish_for(self, seconds: float, interval_s: float = 0.5) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.round(round(time.time(), 3))
            time.sleep(interval_s)

    def round(self, timestamp: float) -> None:
        for sensor in SENSORS:
            value = value_of(sensor, timestamp)
            payload = json.dumps({"ts": timestamp, "pm10": value})
            info = self._client.publish(f"sensors/{sensor}/raw", payload, qos=1)
            info.wait_for_publish(timeout=10)
            assert info.is_published(), "the leaf did not acknowledge a QoS 1 publish"
            self.sent.append((sensor, timestamp, value))

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def test_shipped_configs_are_valid() -> None:
    uplinks = {f"TESLA_NATS_UPLINK_{n}": f"nats-leaf://leaf:x@hub{n}:7422" for n in (1, 2, 3)}
    for conf in (HUB_CONF, LEAF_CONF):
        checked = subprocess.run(  # fixed argv
            [str(nats_server_executable()), "-t", "-c", str(conf)],
            env={**os.environ, **PASSWORDS, **uplinks},
            capture_output=True,
            text=True,
            check=False,
        )
        assert checked.returncode == 0, checked.stderr


def test_leaf_readings_reach_the_hub_once_after_an_outage(
    model_factory: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in PASSWORDS.items():  # the leaf's users.conf reads them at start
        monkeypatch.setenv(name, value)
    model = model_factory.get(window_length=WINDOW, period_seconds=PERIOD_S).path
    nats_cluster = _hub(tmp_path / "hub")
    hub = nats_cluster.servers[0]
    config = write_config(tmp_path / "g0", "g0", model, nats_cluster.urls, hub.mqtt_port)
    leaf = NatsServer(tmp_path / "leaf", name=DOMAIN, domain=DOMAIN, mqtt=True)
    uplink = Uplink(hub.leaf_port)
    leaf.config_path.write_text(_render_leaf_conf(leaf, uplink.port), encoding="utf-8")
    with (
        nats_cluster,
        uplink,
        ClusterGateway(tmp_path / "g0", "g0", config) as gateway,
        leaf,
    ):
        gateway.wait_ready(wait_sources=False)
        wait_for(lambda: balanced([gateway]), "the gateway owning every partition")
        assert "created" in _edge_streams("leaf", _as_gateway(leaf.url))
        assert "source added" in _edge_streams("hub", nats_cluster.urls[1])
        assert "already sourced" in _edge_streams("hub", nats_cluster.urls[2])
        wait_for(lambda: _leaves(nats_cluster) == 1, "the leaf attached to the hub")
        node = Node(leaf.mqtt_port)
        try:
            node.publish_for(2 * PERIOD_S)
            before = len(node.sent)
            wait_for(lambda: len(_edge_readings(nats_cluster.urls)) == before, "live readings")

            uplink.stop()
            wait_for(lambda: _leaves(nats_cluster) == 0, "the hub seeing the uplink gone")
            node.publish_for(3 * PERIOD_S)
            assert _leaf_stream_count(leaf) == len(node.sent)  # kept on the Pi
            assert len(_edge_readings(nats_cluster.urls)) == before  # nothing crossed
            outage = len(node.sent) - before

            uplink.start()
            restored_at = time.monotonic()
            held = len(node.sent)
            wait_for(
                lambda: len(_edge_readings(nats_cluster.urls)) >= held, "the outage's readings"
            )
            caught_up_s = time.monotonic() - restored_at
            node.publish_for(PERIOD_S)
            node.round(round(time.time() + PERIOD_S, 3))  # closes every period before it
        finally:
            node.close()
        sent = node.sent
        wait_for(lambda: len(_edge_readings(nats_cluster.urls)) >= len(sent), "the Pi's readings")
        expected = expected_periods(sent)
        wait_for(
            lambda: len(_calibrated(nats_cluster.urls)) >= len(expected),
            "every edge period calibrated",
        )
        time.sleep(1.0)  # a period calibrated twice or a late duplicate would be there by now
        stored = _edge_readings(nats_cluster.urls)
        calibrated = _calibrated(nats_cluster.urls)
        gateway.check_alive()

    print(
        f"edge_readings={len(sent)} during_outage={outage} at_hub={len(stored)} "
        f"outage_readings_at_hub_after_s={caught_up_s:.1f}"
    )
    assert outage > 0
    assert Counter(stored) == Counter((sensor, ts) for sensor, ts, _ in sent)  # none lost, once
    ids = Counter(msg_id for msg_id, _, _ in calibrated)
    assert [key for key, count in ids.items() if count > 1] == []
    assert set(ids) == expected
    for sensor in SENSORS:  # calibrated in order: period starts ascend in the stream
        starts = [int(i.rsplit(".", 1)[1]) for i, _, _ in calibrated if i.startswith(f"{sensor}.")]
        assert starts == sorted(starts), f"{sensor}: periods out of order {starts}"


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--domain", "edge1.x"),  # would ask $JS.edge1.x.API: nobody answers
        ("--domain", "edge>"),
        ("--domain", ""),
        ("--subject", "sensors.*"),  # a wildcard in the leaf stream's subjects
        ("--stream", "TESLA.READINGS"),
    ],
)
def test_edge_streams_refuses_a_name_that_is_no_subject_token(
    nats_server: NatsServer, option: str, value: str
) -> None:
    """A domain, subject or stream that would make wrong API subjects is refused by name,
    before anything is asked of a server (the server here would answer)."""
    argv = ["leaf", "--server", nats_server.url, "--domain", DOMAIN, option, value]
    done = subprocess.run(  # our own script
        [sys.executable, str(EDGE_SCRIPT), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"argument {option}: {value!r} is not" in done.stderr
