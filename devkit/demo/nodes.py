"""Simulated Arduino nodes replaying the slice at an accelerated clock (no board exists here).

A node sends each minute's reading when the replay clock reaches that minute, with the
minute's own (historical) timestamp, as a node with a working clock would. MQTT nodes publish
the documented JSON payload (docs/mqtt.md) with QoS 1; a serial node writes line-protocol ``R``
lines (docs/serial-protocol.md) to the master side of a pty whose slave side the daemon opens
as its serial port, and answers the daemon's ``Q`` with an ``H`` hello as the firmware does.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from devkit.demo import DemoError
from devkit.demo.replay_slice import SliceRow
from devkit.pty import PtySerial
from tesla_gateway.contract.readings import ReadingRejectedError
from tesla_gateway.mqtt.config import MqttBrokerConfig
from tesla_gateway.mqtt.connection import MqttConnection
from tesla_gateway.mqtt.errors import MqttError
from tesla_gateway.sources.line_protocol import (
    HelloRequest,
    LineSplitter,
    decode_line,
    encode_hello,
    encode_reading,
)

__all__ = ["MqttNode", "ReplayClock", "SentCallback", "SerialNode"]

FIRMWARE_VERSION = "1.0.0-sim"
_WRITE_TIMEOUT_S = 5.0

SentCallback = Callable[[str, SliceRow], None]


@dataclass(frozen=True, slots=True)
class ReplayClock:
    """Maps replayed (historical) time onto the wall clock: ``speed`` history seconds per second."""

    history_start: float
    speed: float
    wall_start: float  # time.monotonic() at history_start
    wall_seconds: float  # the replay stops after this long

    def wall_for(self, history: float) -> float:
        return self.wall_start + (history - self.history_start) / self.speed

    def history_now(self) -> float:
        return self.history_start + (time.monotonic() - self.wall_start) * self.speed

    @property
    def wall_end(self) -> float:
        return self.wall_start + self.wall_seconds

    async def wait_for(self, history: float) -> bool:
        """Sleep until ``history`` is due; False if it falls after the end of the replay."""
        due = self.wall_for(history)
        if due > self.wall_end:
            return False
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        return True


class MqttNode:
    """A node publishing JSON readings on ``sensors/<id>/raw`` (QoS 1)."""

    def __init__(
        self,
        sensor_id: str,
        broker: MqttBrokerConfig,
        *,
        iso_timestamps: bool,
        covariates: bool = True,
    ) -> None:
        self.sensor_id = sensor_id
        self.link = "mqtt"
        self._broker = broker
        self._iso = iso_timestamps  # the documented variants: Unix seconds or ISO-8601
        self._covariates = covariates  # False: a node without a humidity sensor (PM10 only)
        self._topic = f"sensors/{sensor_id}/raw"

    def payload(self, row: SliceRow) -> bytes:
        document: dict[str, object] = {"pm10": row.raw}
        if self._covariates:
            document.update(rh=row.rh, temp_c=row.temp_c)
        if self._iso:
            stamp = datetime.fromtimestamp(row.timestamp, UTC).isoformat()
            document["timestamp"] = stamp.replace("+00:00", "Z")
        else:
            document["sensor"] = self.sensor_id
            document["ts"] = row.timestamp
        return json.dumps(document).encode("utf-8")

    async def replay(self, rows: list[SliceRow], clock: ReplayClock, sent: SentCallback) -> None:
        connection = MqttConnection(
            self._broker, client_id=f"demo-node-{self.sensor_id}", clean_start=True, name="node"
        )
        async with connection:
            await asyncio.wait_for(connection.wait_connected(), 10.0)
            for row in rows:
                if not await clock.wait_for(row.timestamp):
                    return
                try:
                    await connection.publish(self._topic, self.payload(row), qos=1)
                except MqttError as exc:
                    raise DemoError(f"node {self.sensor_id} could not publish: {exc}") from exc
                sent(self.sensor_id, row)


class SerialNode:
    """A node speaking the line protocol over a pty (``PtySerial(..., nonblocking=True)``)."""

    def __init__(self, sensor_id: str, pty: PtySerial) -> None:
        self.sensor_id = sensor_id
        self.link = "serial"
        self._pty = pty
        self._seq = 0
        self._asked = asyncio.Event()
        self._splitter = LineSplitter()

    async def replay(self, rows: list[SliceRow], clock: ReplayClock, sent: SentCallback) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self._pty.master, self._on_readable)
        try:
            await self._write(encode_hello(self.sensor_id, FIRMWARE_VERSION))  # "boot"
            for row in rows:
                if not await clock.wait_for(row.timestamp):
                    return
                values = {"pm10": row.raw, "rh": row.rh, "temp_c": row.temp_c}
                await self._write(encode_reading(self.sensor_id, self._seq, row.timestamp, values))
                self._seq = (self._seq + 1) % 2**32
                sent(self.sensor_id, row)
        finally:
            loop.remove_reader(self._pty.master)

    async def wait_asked(self, timeout_s: float) -> None:
        """Wait for the daemon's hello request, sent whenever it opens the port."""
        loop = asyncio.get_running_loop()
        loop.add_reader(self._pty.master, self._on_readable)
        try:
            await asyncio.wait_for(self._asked.wait(), timeout_s)
        except TimeoutError as exc:
            raise DemoError(
                f"the gateway did not open the serial port {self._pty.path} within {timeout_s} s"
            ) from exc
        finally:
            loop.remove_reader(self._pty.master)

    def _on_readable(self) -> None:
        try:
            chunk = os.read(self._pty.master, 4096)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno == errno.EIO:
                return
            raise
        for item in self._splitter.feed(chunk):
            if isinstance(item, ReadingRejectedError):
                continue
            try:
                line = decode_line(item)
            except ReadingRejectedError:
                continue
            if isinstance(line, HelloRequest):
                self._asked.set()
                with contextlib.suppress(BlockingIOError):
                    os.write(self._pty.master, encode_hello(self.sensor_id, FIRMWARE_VERSION))

    async def _write(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + _WRITE_TIMEOUT_S
        while view:
            try:
                written = os.write(self._pty.master, view)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DemoError(
                        f"the gateway stopped reading the serial port {self._pty.path}"
                    ) from None
                await asyncio.sleep(0.01)
                continue
            view = view[written:]
