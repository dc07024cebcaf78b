"""Real gateway processes in cluster mode against real nats-servers: their config, a feeder of
sensor readings into the readings stream (JetStream-acknowledged, retried under the same message
id), and readers of the calibrated stream. Nothing here is faked: the nodes are simulated only in
that a thread publishes what a node would (no Arduino board exists here)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors

from devkit.cluster_demo.config import ClusterGatewayConfig, write_cluster_config
from devkit.cluster_demo.members import balanced_placement
from devkit.cluster_demo.streams import no_stale_pulls, read_stream
from devkit.daemon import GatewayDaemon

PERIOD_S = 2
WINDOW = 4
PARTITIONS = 6
WAIT_S = 60.0  # upper bound of any wait (slow, shared CI): never a timing assertion


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def write_config(
    directory: Path,
    gateway_id: str,
    model_dir: Path,
    servers: Sequence[str],
    mqtt_port: int,
    *,
    replicas: int = 3,
    partitions: int = PARTITIONS,
    sources: str = "",
    max_kv_value_bytes: int = 512 * 1024,
) -> Path:
    """The demo's gateway.toml, but periods close by event time only (a long grace)."""
    return write_cluster_config(
        ClusterGatewayConfig(
            work_dir=directory,
            gateway_id=gateway_id,
            model_dirs=(model_dir,),
            servers=servers,
            mqtt_port=mqtt_port,
            partitions=partitions,
            replicas=replicas,
            grace_s=60,
            status_interval_s=0.2,
            max_kv_value_bytes=max_kv_value_bytes,
            extra=sources,
        )
    )


class ClusterGateway(GatewayDaemon):
    """One gateway process in cluster mode."""

    def __init__(self, directory: Path, gateway_id: str, config: Path) -> None:
        super().__init__(config, directory / "state", log=directory / "daemon.log")
        self.gateway_id = gateway_id

    def cluster(self) -> dict[str, Any]:
        document = self.status().get("cluster")
        return document if isinstance(document, dict) else {}

    def partitions(self) -> dict[int, dict[str, Any]]:
        """The partitions this gateway owns and has replayed (pulling)."""
        owned = self.cluster().get("partitions") or {}
        return {int(p): info for p, info in owned.items() if info.get("ready")}


def placement(gateways: Sequence[ClusterGateway]) -> dict[str, list[int]]:
    return {g.gateway_id: sorted(g.partitions()) for g in gateways if g.running}


def balanced(gateways: Sequence[ClusterGateway], partitions: int = PARTITIONS) -> bool:
    """Every partition owned by exactly one live gateway, none over ceil(P/G)."""
    return balanced_placement(placement(gateways), partitions)


def sharing(gateways: Sequence[ClusterGateway], servers: Sequence[str]) -> bool:
    """Balanced, and no released partition's last pull still waiting at the server (feeding
    before that may stall a partition: see :func:`no_stale_pulls`)."""
    return balanced(gateways) and no_stale_pulls(servers, PARTITIONS)


def value_of(sensor: str, timestamp: float) -> float:
    """A deterministic, varying PM10 value (so windows differ by history)."""
    phase = sum(map(ord, sensor)) % 17
    return round(15.0 + phase + 8.0 * math.sin(timestamp / 7.0 + phase), 1)


@dataclass(eq=False)
class Feeder(threading.Thread):
    """Publishes one reading per sensor every ``interval_s`` into the readings stream and keeps
    what the stream acknowledged, in order."""

    servers: Sequence[str]
    sensors: Sequence[str]
    interval_s: float = 0.5
    subject: str = "sensors"
    sent: list[tuple[str, float, float]] = field(default_factory=list)
    retries: int = 0

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, daemon=True, name="feeder")
        self._halt = threading.Event()

    def run(self) -> None:
        asyncio.run(self._feed())

    def stop(self) -> None:
        """Stop and wait; also safe before ``start`` (a test's clean-up after a failed wait)."""
        self._halt.set()
        if self.ident is not None:
            self.join(timeout=60)

    async def _feed(self) -> None:
        client = await nats.connect(servers=list(self.servers), max_reconnect_attempts=-1)
        js = client.jetstream(timeout=5)
        try:
            while not self._halt.is_set():
                now = round(time.time(), 3)
                for sensor in self.sensors:
                    value = value_of(sensor, now)
                    await publish_reading(js, self.subject, sensor, now, value, feeder=self)
                    self.sent.append((sensor, now, value))
                await asyncio.sleep(self.interval_s)
            # One reading a period later per sensor: every period before it closes by event time.
            closing = round(time.time() + PERIOD_S, 3)
            for sensor in self.sensors:
                value = value_of(sensor, closing)
                await publish_reading(js, self.subject, sensor, closing, value, feeder=self)
                self.sent.append((sensor, closing, value))
        finally:
            await client.close()


async def publish_reading(
    js: Any, subject: str, sensor: str, timestamp: float, value: float, *, feeder: Feeder | None
) -> None:
    payload = json.dumps({"ts": timestamp, "pm10": value}).encode()
    headers = {"Nats-Msg-Id": f"{sensor}.{timestamp!r}"}
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            await js.publish(f"{subject}.{sensor}.raw", payload, headers=headers, timeout=2)
            return
        except (nats.errors.Error, TimeoutError):  # no stream leader for a while: retried
            if time.monotonic() > deadline:
                raise
            if feeder is not None:
                feeder.retries += 1
            await asyncio.sleep(0.2)


def replay_into(url: str, sent: Sequence[tuple[str, float, float]]) -> None:
    """The same readings, in the same order, into another server's stream (the reference)."""

    async def run() -> None:
        client = await nats.connect(servers=[url])
        js = client.jetstream(timeout=5)
        try:
            for sensor, timestamp, value in sent:
                await publish_reading(js, "sensors", sensor, timestamp, value, feeder=None)
        finally:
            await client.close()

    asyncio.run(run())


def expected_periods(sent: Sequence[tuple[str, float, float]]) -> set[str]:
    """Message ids of every (sensor, feature, period) that must be calibrated: every period a
    sensor had a reading in but its last (still open)."""
    periods: dict[str, set[int]] = {}
    for sensor, timestamp, _ in sent:
        periods.setdefault(sensor, set()).add(int(timestamp // PERIOD_S) * PERIOD_S)
    return {
        f"{sensor}.pm10.{start}"
        for sensor, starts in periods.items()
        for start in sorted(starts)[:-1]
    }


def stream_messages(servers: Sequence[str], stream: str) -> list[tuple[str, dict[str, Any], float]]:
    """Every message of a stream: (Nats-Msg-Id, JSON document, stored at Unix s); read_stream
    asks again while a server that just died is still asked."""
    return [(m.msg_id, m.document, m.stored_at) for m in read_stream(servers, stream)]


class UnexpectedValuesError(AssertionError):
    """The calibrated stream holds a value no test expected."""


def wait_calibrated(
    servers: Sequence[str], expected: set[str], what: str, timeout_s: float = WAIT_S
) -> None:
    """Until the calibrated stream holds every value of ``expected``; a value not expected (a
    sensor made up, a last period closed only by the grace as a reading was lost) fails it at
    once, naming it and what is missing, where a count waited out the time-out or ended
    with one missing. On time-out the failure names what is missing."""

    def arrived() -> bool:
        have = {msg_id for msg_id, _, _ in stream_messages(servers, "TESLA_CALIBRATED")}
        if unexpected := sorted(have - expected):
            missing = sorted(expected - have)
            raise UnexpectedValuesError(
                f"{what}: {len(unexpected)} calibrated values not expected, e.g. "
                f"{unexpected[:5]} ({len(missing)} missing, e.g. {missing[:5]})"
            )
        return expected <= have

    try:
        wait_for(arrived, what, timeout_s)
    except UnexpectedValuesError:
        raise
    except AssertionError as exc:
        have = {msg_id for msg_id, _, _ in stream_messages(servers, "TESLA_CALIBRATED")}
        missing = sorted(expected - have)
        raise AssertionError(f"{exc}: {len(missing)} missing, e.g. {missing[:5]}") from exc


def stream_leader(servers: Sequence[str], stream: str) -> str:
    async def run() -> str:
        client = await nats.connect(servers=list(servers))
        try:
            info = await client.jetstream(timeout=10).stream_info(stream)
            assert info.cluster is not None and info.cluster.leader is not None
            return str(info.cluster.leader)
        finally:
            await client.close()

    return asyncio.run(run())


def by_id(messages: Sequence[tuple[str, dict[str, Any], float]]) -> dict[str, dict[str, Any]]:
    return {msg_id: document for msg_id, document, _ in messages}
