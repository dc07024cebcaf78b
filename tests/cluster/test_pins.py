"""The pinned pull over raw $JS.API, against a real nats-server: one puller at a time gets a
partition; a puller that stopped pulling for the pin TTL is refused (423) when it comes back,
which is how a gateway learns it lost a partition; an unpin hands the partition over at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from devkit.nats_servers import NatsServer
from tesla_gateway.cluster.config import ClusterConfig
from tesla_gateway.cluster.engine import Engine, connect
from tesla_gateway.cluster.puller import PartitionPuller, PinLostError, StreamMessage

pytest.importorskip("nats")

PIN_TTL_S = 1.0


class _Taken:
    def __init__(self) -> None:
        self.messages: list[StreamMessage] = []

    def __call__(self, batch: list[StreamMessage]) -> None:
        self.messages.extend(batch)


async def _publish(engine: Engine, count: int, start: int = 0) -> None:
    for index in range(start, start + count):
        await engine.js.publish(engine.subjects.reading("s1"), f'{{"pm10": {index}}}'.encode())


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _scenario(url: str) -> dict[str, object]:
    config = ClusterConfig(servers=[url], partitions=1, replicas=1, pin_ttl_s=PIN_TTL_S)
    engine = await connect(config, "pins-test")
    try:
        first, second = _Taken(), _Taken()
        a = PartitionPuller(engine, 0, first, expires_s=0.3)
        b = PartitionPuller(engine, 0, second, expires_s=0.3)
        a_task = asyncio.create_task(a.run())
        await _publish(engine, 20)
        await _until(lambda: len(first.messages) == 20, "the first puller's messages")
        b_task = asyncio.create_task(b.run())
        await _publish(engine, 20, start=20)
        await _until(lambda: len(first.messages) == 40, "the pinned puller keeping the partition")
        only_first = not second.messages

        a_task.cancel()  # the owner falls silent (a SIGKILL, as far as the server can tell)
        silent_at = time.monotonic()
        await asyncio.gather(a_task, return_exceptions=True)
        await _publish(engine, 10, start=40)
        await _until(lambda: len(second.messages) == 10, "the pin moving to the other puller")
        moved_after_s = time.monotonic() - silent_at

        revived = PartitionPuller(engine, 0, first, expires_s=0.3)
        revived.pin_id = a.pin_id  # the old owner comes back with the pin it had
        with pytest.raises(PinLostError):
            async with asyncio.timeout(10):
                await revived.run()

        await engine.unpin(0)  # B gives the partition back: A may take it without waiting
        given_at = time.monotonic()
        c_task = asyncio.create_task(PartitionPuller(engine, 0, first, expires_s=0.3).run())
        b_task.cancel()
        await asyncio.gather(b_task, return_exceptions=True)
        await _publish(engine, 5, start=50)
        await _until(lambda: len(first.messages) == 45, "the partition after an unpin")
        handed_after_s = time.monotonic() - given_at
        c_task.cancel()
        await asyncio.gather(c_task, return_exceptions=True)
        return {
            "only_first": only_first,
            "sequences": [m.sequence for m in first.messages[:40]],
            "moved_after_s": moved_after_s,
            "handed_after_s": handed_after_s,
        }
    finally:
        await engine.close()


def test_one_puller_at_a_time_and_a_moved_pin_is_refused(nats_server: NatsServer) -> None:
    result = asyncio.run(_scenario(nats_server.url))
    print(
        f"pin moved after {result['moved_after_s']:.2f} s, unpin hand-over after "
        f"{result['handed_after_s']:.2f} s"
    )
    assert result["only_first"]
    assert result["sequences"] == list(range(1, 41))
