"""A cluster gateway ends after SIGTERM, whatever its servers do (issue 29: a gateway of the demo
logged nothing after ``shutdown_requested`` and was SIGKILLed 30 s later).

Before: nats-py awaits every reply with ``asyncio.wait_for``, which on Python 3.11 drops a
cancellation arriving in the loop pass its reply does; the member's heartbeat loop then beat on
forever after the shutdown cancelled it (also in the middle of a release), and the daemon
waited for it. With its only server stopped (SIGSTOP), the last tick's calibrated values were
retried for a minute and the connection's drain waited for the server another 20-40 s.

The first two tests run a member in this process against a real nats-server and make that race
happen instead of waiting for it (a reply resolved and the cancellation issued in one loop pass,
awaited with the real ``asyncio.wait_for``, as nats-py does). The others run real gateway
processes; "exits" means within 60 s (an upper bound on slow CI, never a timing assertion).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from devkit.cluster_demo.config import ClusterGatewayConfig, write_cluster_config
from devkit.nats_servers import NatsServer
from devkit.pty import PtySerial
from tesla_gateway.cluster.engine import Engine
from tesla_gateway.cluster.member import ClusterMember
from tests.cluster.harness import (
    PERIOD_S,
    WINDOW,
    ClusterGateway,
    balanced,
    replay_into,
    value_of,
    wait_for,
    write_config,
)
from tests.cluster.owners import make_member, member_config, until
from tests.gateway.e2e.harness import SerialNode
from tests.support.models import ModelFactory

pytest.importorskip("nats")

EXIT_S = 60.0  # "exits": an upper bound on slow CI, never a timing assertion


async def _reply_racing_the_cancel(task: asyncio.Task[None]) -> None:
    """Within ``task``: a reply and the shutdown's cancellation of ``task`` in one loop pass,
    awaited as nats-py awaits every reply; on Python 3.11 the cancellation is lost."""
    loop = asyncio.get_running_loop()
    reply: asyncio.Future[None] = loop.create_future()
    loop.call_soon(reply.set_result, None)
    loop.call_soon(task.cancel)
    await asyncio.wait_for(reply, 5.0)  # nats-py's own way, on purpose
    assert task.cancelling(), "the race did not happen: the test proves nothing"


def _owned(member: ClusterMember) -> int:
    partitions = member.stats()["partitions"]
    assert isinstance(partitions, dict)
    return sum(1 for info in partitions.values() if info["ready"])


async def _ended(task: asyncio.Task[None]) -> None:
    done, _ = await asyncio.wait({task}, timeout=EXIT_S)
    assert task in done, "the member went on after the shutdown cancelled it"
    assert task.cancelled() or task.exception() is None


def test_a_cancellation_lost_in_a_heartbeat_still_ends_the_member(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        member = make_member(member_config(nats_server.url, partitions=2))
        task = asyncio.create_task(member.run())
        await until(task, lambda: _owned(member) == 2, "both partitions owned")
        leases = member._leases
        assert leases is not None
        beat = leases.heartbeat

        async def heartbeat() -> None:
            await beat()
            await _reply_racing_the_cancel(task)

        monkeypatch.setattr(leases, "heartbeat", heartbeat)
        await _ended(task)
        assert member.counters.released == 2  # and it left cleanly, partitions handed back

    asyncio.run(scenario())


def test_a_cancellation_lost_in_a_release_still_ends_the_member(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        config = member_config(nats_server.url, partitions=2)
        first, second = make_member(config, "g0"), make_member(config, "g1")
        task = asyncio.create_task(first.run())
        await until(task, lambda: _owned(first) == 2, "both partitions owned by g0")
        unpin, raced = Engine.unpin, list[int]()

        async def unpin_racing(engine: Engine, partition: int) -> None:
            await unpin(engine, partition)
            if engine is first._engine and not raced:  # g0 giving a partition to g1
                raced.append(partition)
                await _reply_racing_the_cancel(task)

        monkeypatch.setattr(Engine, "unpin", unpin_racing)
        joining = asyncio.create_task(second.run())
        try:
            await _ended(task)
            assert raced  # the cancellation came in the middle of a rebalance's release
            assert first.counters.released == 2  # the one given to g1, the other at the leave
        finally:
            joining.cancel()
            await asyncio.wait({joining}, timeout=EXIT_S)

    asyncio.run(scenario())


def _log_events(gateway: ClusterGateway) -> str:
    return gateway.log.read_text(encoding="utf-8", errors="replace")


def test_sigterm_while_the_only_server_is_stopped_exits(
    nats_server: NatsServer, model_factory: ModelFactory, tmp_path: Path
) -> None:
    """Closed periods wait for the last tick (a tick wanted settles for 10 minutes), then the
    server is SIGSTOPped: the last tick's calibrated values, the leave and the close all meet a
    server that takes the bytes and never answers."""
    model = model_factory.get(window_length=WINDOW, period_seconds=PERIOD_S).path
    config = write_cluster_config(
        ClusterGatewayConfig(
            work_dir=tmp_path / "g",
            gateway_id="g",
            model_dirs=(model,),
            servers=[nats_server.url],
            mqtt_port=nats_server.mqtt_port,
            replicas=1,
            grace_s=60,
            settle_s=600,
            status_interval_s=0.2,
        )
    )
    start = round(time.time() - (WINDOW + 3) * PERIOD_S, 3)
    sent = [
        (sensor, start + step * 0.5, value_of(sensor, start + step * 0.5))
        for step in range(4 * (WINDOW + 3))
        for sensor in ("a1", "b2", "c3")
    ]
    gateway = ClusterGateway(tmp_path / "g", "g", config)
    stopped = False
    try:
        gateway.start()
        gateway.wait_ready(wait_sources=False)
        wait_for(lambda: balanced([gateway]), "the gateway owning every partition")
        replay_into(nats_server.url, sent)
        wait_for(lambda: gateway.cluster().get("decoded", 0) >= len(sent), "every reading in")
        os.kill(nats_server.pid, signal.SIGSTOP)
        stopped = True
        code = gateway.stop(timeout_s=EXIT_S)
    finally:
        if stopped:
            os.kill(nats_server.pid, signal.SIGCONT)
        gateway.stop()
    assert code == 0, f"exit {code}: {gateway.log_tail(30)}"
    log = _log_events(gateway)
    assert "cluster_calibrated_publish_abandoned" in log  # the last tick's values given up
    assert "gateway_stopped" in log


def test_sigterm_with_local_readings_queued_and_the_server_down_exits(
    nats_server: NatsServer, pty_serial: PtySerial, model_factory: ModelFactory, tmp_path: Path
) -> None:
    """A serial node's readings (a pty: no board here) queue for the stream while the only
    server is down; SIGTERM drops them, counted and logged, and the gateway exits."""
    model = model_factory.get(window_length=WINDOW, period_seconds=PERIOD_S).path
    serial = f'[[sources]]\nkind = "node"\nport = "{pty_serial.path}"\nreconnect_initial_s = 0.05'
    config = write_config(
        tmp_path / "g",
        "g",
        model,
        [nats_server.url],
        nats_server.mqtt_port,
        replicas=1,
        sources=serial,
    )
    board = SerialNode(pty_serial, "serial-1")
    gateway = ClusterGateway(tmp_path / "g", "g", config)
    try:
        gateway.start()
        board.wait_opened()
        gateway.wait_ready(wait_sources=False)
        wait_for(lambda: balanced([gateway]), "the gateway owning every partition")
        nats_server.kill()
        now = time.time()
        for step in range(8):
            board.send(now + step * 0.25, 10.0 + step)
        wait_for(
            lambda: "cluster_local_publish_retry" in _log_events(gateway),
            "the first reading retried while the server is down",
        )
        code = gateway.stop(timeout_s=EXIT_S)
    finally:
        gateway.stop()
    assert code == 0, f"exit {code}: {gateway.log_tail(30)}"
    log = _log_events(gateway)
    assert "cluster_local_readings_abandoned" in log
    assert "gateway_stopped" in log
