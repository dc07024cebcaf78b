"""A gateway clock past the T line's range (2100-01-01: a bad RTC, a mistyped `date -s`) tells
no node the time, as docs/serial-protocol.md promises; it used to raise LineProtocolError from
the port worker at the first hello and end the daemon's task group (an attack on the T line)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from devkit.pty import PtySerial
from tesla_gateway.contract.readings import Reading
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.sources.line_protocol import TIME_MAX_S, encode_hello, encode_hello_request
from tesla_gateway.sources.node_time import NodeTime
from tesla_gateway.sources.serial_source import SerialSource, SerialSourceConfig

FUTURE = float(TIME_MAX_S + 86_400)  # 2100-01-02


@pytest.fixture
def pty_serial(tmp_path: Path) -> Iterator[PtySerial]:
    with contextlib.closing(PtySerial(tmp_path / "ttyNODE0")) as device:
        yield device


def test_node_time_withholds_past_2100_instead_of_raising() -> None:
    keeper = NodeTime("UTC", clock=lambda: FUTURE, monotonic=lambda: 0.0)
    keeper.hello_seen()
    assert keeper.line_if_due() is None  # observed: LineProtocolError


def test_serial_port_survives_a_hello_when_the_clock_is_past_2100(pty_serial: PtySerial) -> None:
    config = TypeAdapter(SerialSourceConfig).validate_python(
        {"kind": "node", "port": str(pty_serial.path), "reconnect_initial_s": 0.05}
    )

    async def scenario() -> BaseException | None:
        source = SerialSource([config], clock=lambda: FUTURE, timezone="UTC")
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        task = asyncio.create_task(source.run(queue, RejectCounter()))
        await asyncio.wait_for(source.wait_open(pty_serial.path), 10)
        await asyncio.to_thread(pty_serial.read_until, encode_hello_request())
        pty_serial.write(encode_hello("node-1", "1.0.0", "-", None))
        await asyncio.sleep(1.0)
        if task.done():
            return task.exception()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None

    assert asyncio.run(scenario()) is None  # observed: ExceptionGroup([LineProtocolError])
