"""Cluster mode end to end: a real 3-node nats-server cluster (streams at R3) and real gateway
processes. A gateway SIGKILLed: its partitions are calibrated by the others within the issue's
10 s; a fourth gateway joins: placement rebalances and its partitions start warm; over the run
every (sensor, period) is in the calibrated stream exactly once, and each value is what one
gateway alone computes from the same readings (no window re-warmed). The stream's leader
SIGKILLed: no acknowledged reading lost, no period missing or doubled."""

from __future__ import annotations

import contextlib
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.cluster_demo.streams import sensor_partitions
from devkit.nats_servers import NatsCluster, NatsServer
from tests.cluster.harness import (
    PARTITIONS,
    PERIOD_S,
    WINDOW,
    ClusterGateway,
    Feeder,
    balanced,
    by_id,
    expected_periods,
    placement,
    replay_into,
    sharing,
    stream_leader,
    stream_messages,
    wait_calibrated,
    wait_for,
    write_config,
)
from tests.support.models import ModelFactory

pytest.importorskip("nats")
pytestmark = pytest.mark.reliability  # fault injection (short form: part of make test)

SENSORS = [f"s{index:02d}" for index in range(24)]
FAILOVER_PROMISE_S = 10.0  # issue 29: a dead gateway's partitions are calibrated within 10 s


def _gateway(
    tmp_path: Path,
    name: str,
    model: Path,
    cluster: NatsCluster,
    node: int,
    *,
    max_kv_value_bytes: int = 512 * 1024,
) -> ClusterGateway:
    config = write_config(
        tmp_path / name,
        name,
        model,
        cluster.urls,
        cluster.mqtt_ports[node],
        max_kv_value_bytes=max_kv_value_bytes,
    )
    gateway = ClusterGateway(tmp_path / name, name, config)
    gateway.start()
    return gateway


@contextlib.contextmanager
def _two_gateways_fed(
    tmp_path: Path, model: Path, cluster: NatsCluster
) -> Iterator[tuple[list[ClusterGateway], Feeder]]:
    """Two gateways sharing the partitions, fed for 3 periods; stopped (resumed if paused)."""
    gateways = [_gateway(tmp_path, f"g{i}", model, cluster, i) for i in range(2)]
    feeder = Feeder(cluster.urls, SENSORS[:12])
    try:
        for gateway in gateways:
            gateway.wait_ready(wait_sources=False)
        wait_for(lambda: sharing(gateways, cluster.urls), "two gateways sharing the partitions")
        feeder.start()
        time.sleep(3 * PERIOD_S)
        yield gateways, feeder
    finally:
        feeder.stop()
        for gateway in gateways:
            if gateway.running:
                gateway.process.send_signal(signal.SIGCONT)
            gateway.stop()


def _each_period_once(
    messages: list[tuple[str, dict[str, Any], float]], expected: set[str]
) -> None:
    """Every expected (sensor, feature, period) in the calibrated stream, each once."""
    ids = Counter(msg_id for msg_id, _, _ in messages)
    assert [key for key, count in ids.items() if count > 1] == []  # none twice
    assert set(ids) == expected  # none missing, none made up


def _check_against_one_gateway(
    tmp_path: Path,
    server: NatsServer,
    model: Path,
    feeder: Feeder,
    calibrated: dict[str, dict[str, object]],
) -> None:
    """The same readings through one gateway on its own server: every document equal."""
    config = write_config(
        tmp_path / "alone", "alone", model, [server.url], server.mqtt_port, replicas=1
    )
    with ClusterGateway(tmp_path / "alone", "alone", config) as alone:
        alone.wait_ready(wait_sources=False)
        wait_for(lambda: balanced([alone]), "the single gateway owning every partition")
        replay_into(server.url, feeder.sent)
        expected = expected_periods(feeder.sent)
        wait_calibrated([server.url], expected, "the single gateway's calibrated values")
        reference = by_id(stream_messages([server.url], "TESLA_CALIBRATED"))
        alone.check_alive()
    assert set(reference) == expected
    differing = [key for key in sorted(expected) if calibrated[key] != reference[key]]
    assert not differing, (
        f"{len(differing)} of {len(expected)} values differ from one gateway's, e.g. "
        f"{differing[0]}: {calibrated[differing[0]]} vs {reference[differing[0]]}"
    )


def test_killed_gateway_moves_warm_and_every_period_once(
    nats_cluster: NatsCluster,
    nats_server: NatsServer,
    model_factory: ModelFactory,
    tmp_path: Path,
) -> None:
    model = model_factory.get(window_length=WINDOW, period_seconds=PERIOD_S).path
    # snapshots over 1 KiB go to the object store: the takeovers here read them from there
    small = 1024
    gateways = [
        _gateway(tmp_path, f"g{i}", model, nats_cluster, i, max_kv_value_bytes=small)
        for i in range(3)
    ]
    feeder = Feeder(nats_cluster.urls, SENSORS)
    try:
        for gateway in gateways:
            gateway.wait_ready(wait_sources=False)
        wait_for(
            lambda: sharing(gateways, nats_cluster.urls), "three gateways sharing the partitions"
        )
        feeder.start()
        time.sleep((WINDOW + 2) * PERIOD_S)  # every window whole, snapshots taken

        victim, survivors = gateways[0], gateways[1:]
        moved = sorted(victim.partitions())
        killed_at = time.time()
        victim.kill()
        wait_for(lambda: balanced(survivors), "the survivors taking the dead one's partitions")
        time.sleep(2 * PERIOD_S)

        joining = _gateway(tmp_path, "g3", model, nats_cluster, 0, max_kv_value_bytes=small)
        gateways.append(joining)
        joining.wait_ready(wait_sources=False)
        live = [*survivors, joining]
        wait_for(lambda: balanced(live) and joining.partitions(), "a rebalance to the newcomer")
        time.sleep(2 * PERIOD_S)
        feeder.stop()
        expected = expected_periods(feeder.sent)
        wait_calibrated(nats_cluster.urls, expected, "every period calibrated")
        time.sleep(1.0)  # anything calibrated twice would have arrived by now
        messages = stream_messages(nats_cluster.urls, "TESLA_CALIBRATED")
        final = placement(live)
        joined = joining.cluster()
        refused = sum(g.cluster()["calibrated_duplicates"] for g in live)
        in_objects = sum(g.cluster()["snapshots_in_object_store"] for g in live)
        dropped = [g.status()["windows"]["pm10"]["outcomes"] for g in live]
    finally:
        feeder.stop()
        for gateway in gateways:
            gateway.stop()

    _each_period_once(messages, expected)

    partition_of = sensor_partitions(nats_cluster.urls)
    moved_sensors = {s for s, p in partition_of.items() if p in moved}
    assert moved_sensors, f"the killed gateway owned no sensor ({moved}, {partition_of})"
    first_after: dict[int, float] = {}
    for msg_id, _, stored_at in messages:
        sensor = msg_id.split(".", 1)[0]
        if sensor in moved_sensors and stored_at > killed_at:
            partition = partition_of[sensor]
            first_after[partition] = min(first_after.get(partition, stored_at), stored_at)
    failover_s = max(first_after[p] - killed_at for p in {partition_of[s] for s in moved_sensors})
    print(
        f"cluster_failover_s={failover_s:.2f} partitions={moved} placement={final} "
        f"calibrated_again_refused_by_stream={refused} "
        f"readings_dropped_duplicate={sum(o.get('duplicate', 0) for o in dropped)} "
        f"late={sum(o.get('late', 0) for o in dropped)}"
    )
    assert failover_s <= FAILOVER_PROMISE_S

    # the newcomer took its partitions from snapshots (in the object store), never cold
    assert joined["acquired"] >= 1 and joined["cold_takeovers"] == 0, joined
    assert in_objects > 0

    _check_against_one_gateway(tmp_path, nats_server, model, feeder, by_id(messages))


def test_killed_stream_leader_loses_nothing(
    nats_cluster: NatsCluster, model_factory: ModelFactory, tmp_path: Path
) -> None:
    model = model_factory.get(window_length=WINDOW, period_seconds=PERIOD_S).path
    with _two_gateways_fed(tmp_path, model, nats_cluster) as (_, feeder):
        leader = stream_leader(nats_cluster.urls, "TESLA_READINGS")
        nats_cluster.server(leader).kill()
        urls = [s.url for s in nats_cluster.servers if s.name != leader]
        time.sleep(6 * PERIOD_S)
        feeder.stop()
        expected = expected_periods(feeder.sent)
        # Up to 3 min: a partition's last period closed only by the 60 s grace in 1 run of 6
        # under load until a redelivery could no longer refute a held reading (0 of 12 since;
        # docs/deployment.md), kept as a margin; a value not expected (a reading lost) fails
        # the wait at once, and _each_period_once names what is missing.
        wait_calibrated(
            urls, expected, "every period calibrated after the leader's death", timeout_s=180.0
        )
        messages = stream_messages(urls, "TESLA_CALIBRATED")
        stored = stream_messages(urls, "TESLA_READINGS")

    sent_ids = {f"{sensor}.{timestamp!r}" for sensor, timestamp, _ in feeder.sent}
    stored_ids = Counter(msg_id for msg_id, _, _ in stored)
    print(
        f"cluster_lost={len(sent_ids - set(stored_ids))} readings={len(sent_ids)} "
        f"publish_retries={feeder.retries} leader={leader}"
    )
    assert sent_ids == set(stored_ids)  # every acknowledged reading is in the stream
    assert max(stored_ids.values()) == 1  # and once
    _each_period_once(messages, expected)


def test_paused_gateway_learns_it_lost_its_partitions(
    nats_cluster: NatsCluster, model_factory: ModelFactory, tmp_path: Path
) -> None:
    """SIGSTOP past the pin TTL (a frozen Pi): the other gateway takes the partitions; on
    SIGCONT the paused one is refused its pins and leases, drops those windows, and placement
    balances again; no period missing or doubled."""
    model = model_factory.get(window_length=WINDOW, period_seconds=PERIOD_S).path
    with _two_gateways_fed(tmp_path, model, nats_cluster) as (gateways, feeder):
        paused, other = gateways
        had = sorted(paused.partitions())
        paused.process.send_signal(signal.SIGSTOP)
        wait_for(lambda: len(other.partitions()) == PARTITIONS, "the other taking everything")
        paused.process.send_signal(signal.SIGCONT)
        wait_for(lambda: paused.cluster().get("lost", 0) >= 1, "the paused one noticing")
        wait_for(lambda: balanced(gateways), "a balanced placement again")
        time.sleep(2 * PERIOD_S)
        feeder.stop()
        expected = expected_periods(feeder.sent)
        wait_calibrated(nats_cluster.urls, expected, "every period calibrated")
        time.sleep(1.0)
        messages = stream_messages(nats_cluster.urls, "TESLA_CALIBRATED")
        lost = paused.cluster()["lost"]

    print(f"paused gateway lost {lost} of its partitions {had}")
    _each_period_once(messages, expected)
