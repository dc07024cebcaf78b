"""Readings from serial ports: Arduino nodes (line protocol) and bare PMS5003 sensors.

Each configured port gets one supervised task that opens it, reads until it disappears, and
reopens it with backoff when it comes back (a USB adapter unplugged and replugged). Reading uses
pyserial with ``timeout=0`` and ``loop.add_reader`` on its file descriptor: the event loop is told
when bytes are waiting and the read never blocks, so a port costs no thread and cancellation is
immediate. (A blocking read in ``asyncio.to_thread`` cannot be interrupted: shutdown would wait
for the read timeout and every port would pin a worker thread.) Writes (``NodeLink.send_line``,
used by OTA in issue 5) are rare and may block on a full UART buffer, so they go through
``asyncio.to_thread`` with a write timeout. A node is told the time (``T``, node_time.py) after
each hello and every hour, in the standard offset of the gateway's ``timezone``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Literal

import serial
import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tesla_gateway.contract.readings import (
    SENSOR_ID_PATTERN,
    Reading,
    ReadingRejectedError,
    RejectReason,
    validate_reading,
)
from tesla_gateway.errors import GatewayError
from tesla_gateway.ingest.ingest_log import commit_queued
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.sources.line_protocol import (
    Hello,
    HelloRequest,
    Line,
    LineSplitter,
    NodeReading,
    OtaFrame,
    decode_line,
    encode_hello_request,
)
from tesla_gateway.sources.node_time import NodeTime
from tesla_gateway.sources.pms5003 import Pms5003Frame, Pms5003Parser

__all__ = [
    "NodeLink",
    "NodePortConfig",
    "Pms5003PortConfig",
    "SerialLinkDownError",
    "SerialSource",
    "SerialSourceConfig",
]

_READ_CHUNK = 4096
_HELLO_RETRY_S = 5.0  # a node reporting without a hello is asked again at most this often


class SerialLinkDownError(GatewayError):
    """A line could not be written because the node's port is not open (unplugged?)."""


class _PortConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    port: Path = Field(
        description=(
            "Device path. Prefer a stable name (/dev/serial/by-id/... or a udev symlink) so the "
            "port is found again after re-plugging."
        )
    )
    reconnect_initial_s: float = Field(
        default=0.5, gt=0, description="First delay before reopening a missing port; doubles."
    )
    reconnect_max_s: float = Field(default=30.0, gt=0, description="Longest reopen delay.")
    max_future_s: float = Field(
        default=300.0, ge=0, description="Readings further in the future are rejected."
    )


class NodePortConfig(_PortConfig):
    """An Arduino node speaking the line protocol (docs/serial-protocol.md)."""

    kind: Literal["node"] = "node"
    baud: int = Field(default=115_200, gt=0, description="UART speed.")
    allowed_sensors: list[str] | None = Field(
        default=None,
        description=(
            "The sensor ids this port may report (a node that relays several sensors); others "
            "are rejected (unknown_sensor). Unset: only the id the node announced in its hello "
            "(others: sensor_not_owned)."
        ),
    )
    max_clock_skew_s: float = Field(
        default=300.0,
        ge=0,
        description="A node timestamp further ahead than this is replaced by the receive time.",
    )
    max_backlog_s: float = Field(
        default=3600.0,
        ge=0,
        description="A node timestamp older than this is replaced by the receive time.",
    )
    write_timeout_s: float = Field(
        default=5.0, gt=0, description="Longest wait for one line to be written to the node."
    )


class Pms5003PortConfig(_PortConfig):
    """A Plantower PMS5003 wired straight to a USB-UART adapter."""

    kind: Literal["pms5003"]
    baud: int = Field(default=9_600, gt=0, description="UART speed; the sensor uses 9600.")
    sensor_id: str = Field(description="Sensor id its readings are published under.")

    @field_validator("sensor_id")
    @classmethod
    def _valid_sensor_id(cls, value: str) -> str:
        if not SENSOR_ID_PATTERN.fullmatch(value):
            raise ValueError(f"must match {SENSOR_ID_PATTERN.pattern}")
        return value


SerialSourceConfig = Annotated[NodePortConfig | Pms5003PortConfig, Field(discriminator="kind")]


class NodeLink:
    """The write side of a node's port, and what the node said about itself."""

    def __init__(self, port: Path, *, write_timeout_s: float) -> None:
        self.port = port
        self.hello: Hello | None = None
        self.ota_handler: Callable[[OtaFrame], None] | None = None  # set by OTA (issue 5)
        self.hello_handler: Callable[[Hello], None] | None = None  # told of each hello (OTA)
        self._write_timeout_s = write_timeout_s
        self._serial: serial.Serial | None = None
        self._lock = asyncio.Lock()
        self._up = asyncio.Event()

    @property
    def connected(self) -> bool:
        return self._serial is not None

    async def wait_connected(self) -> None:
        await self._up.wait()

    async def send_line(self, line: str | bytes) -> None:
        """Write one protocol line (from the line_protocol encoders); adds the LF if absent."""
        data = line.encode("ascii") if isinstance(line, str) else bytes(line)
        if not data.endswith(b"\n"):
            data += b"\n"
        async with self._lock:
            port = self._serial
            if port is None:
                raise SerialLinkDownError(f"{self.port} is not open; is the node plugged in?")
            try:
                written = await asyncio.to_thread(port.write, data)
            except (serial.SerialException, OSError) as exc:
                raise SerialLinkDownError(f"writing to {self.port} failed: {exc}") from exc
            if written != len(data):
                raise SerialLinkDownError(
                    f"{self.port} accepted {written} of {len(data)} bytes within "
                    f"{self._write_timeout_s} s"
                )

    def _attach(self, port: serial.Serial) -> None:
        self._serial = port
        self._up.set()

    async def _detach(self) -> None:
        async with self._lock:  # never close the port under a write in progress
            self._serial = None
            self._up.clear()
            self.hello = None


class SerialSource:
    """All configured serial ports; ``run`` supervises one task per port."""

    def __init__(
        self,
        ports: Sequence[SerialSourceConfig],
        *,
        clock: Callable[[], float] = time.time,
        timezone: str | None = None,
    ) -> None:
        """``timezone``: GatewayConfig.timezone, the nodes' time's offset (None: the system's)."""
        seen: set[Path] = set()
        for config in ports:
            if config.port in seen:
                raise GatewayError(f"serial port {config.port} is configured twice")
            seen.add(config.port)
        self._ports = list(ports)
        self._clock = clock
        self._timezone = timezone
        self._open = {str(config.port): asyncio.Event() for config in ports}
        self._links = {
            str(config.port): NodeLink(config.port, write_timeout_s=config.write_timeout_s)
            for config in ports
            if isinstance(config, NodePortConfig)
        }

    def is_open(self, port: Path | str) -> bool:
        """Whether the port is open right now (for the status command and tests)."""
        return self._open[str(port)].is_set()

    async def wait_open(self, port: Path | str) -> None:
        """Return once the port is open (immediately if it is)."""
        await self._open[str(port)].wait()

    @property
    def links(self) -> Mapping[str, NodeLink]:
        """Node ports by configured path, for writing lines down to the nodes."""
        return self._links

    async def run(self, queue: asyncio.Queue[Reading], rejects: RejectCounter) -> None:
        """Run every port until cancelled."""
        async with asyncio.TaskGroup() as group:
            for config in self._ports:
                worker = _PortWorker(
                    config,
                    link=self._links.get(str(config.port)),
                    opened=self._open[str(config.port)],
                    clock=self._clock,
                    timezone=self._timezone,
                )
                group.create_task(worker.run(queue, rejects), name=f"serial:{config.port}")


class _PortWorker:
    """One port: open, read until gone, reopen with backoff."""

    def __init__(
        self,
        config: NodePortConfig | Pms5003PortConfig,
        *,
        link: NodeLink | None,
        opened: asyncio.Event,
        clock: Callable[[], float],
        timezone: str | None = None,
    ) -> None:
        self._config = config
        self._link = link
        self._opened = opened
        self._clock = clock
        self._timezone = timezone
        self._time: NodeTime | None = None  # the node's T lines, per connection
        self._source = f"serial:{config.port.name}"
        self._log = structlog.get_logger("tesla_gateway.sources.serial").bind(
            port=str(config.port), kind=config.kind
        )
        self._hello_wanted = False  # a reading came before any hello on this connection
        self._hello_asked_at = -_HELLO_RETRY_S  # time.monotonic() of the last repeated request

    async def run(self, queue: asyncio.Queue[Reading], rejects: RejectCounter) -> None:
        delay = self._config.reconnect_initial_s
        failures = 0
        while True:
            try:
                # pyserial opens with O_NONBLOCK and a non-blocking flock, so this does not
                # block the loop; in a worker thread a cancelled open would leak the port.
                port = self._open()
            except (serial.SerialException, OSError, ValueError) as exc:
                failures += 1
                log = self._log.warning if failures == 1 else self._log.debug
                log("serial_open_failed", error=str(exc), retry_in_s=delay, failures=failures)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._config.reconnect_max_s)
                continue
            failures = 0
            delay = self._config.reconnect_initial_s
            self._log.info("serial_port_opened")
            try:
                await self._read_until_gone(port, queue, rejects)
            finally:
                self._opened.clear()
                if self._link is not None:
                    await self._link._detach()
                port.close()
            self._log.warning("serial_port_lost", retry_in_s=delay)
            await asyncio.sleep(delay)

    def _open(self) -> serial.Serial:
        write_timeout = (
            self._config.write_timeout_s if isinstance(self._config, NodePortConfig) else 1.0
        )
        return serial.Serial(
            port=str(self._config.port),
            baudrate=self._config.baud,
            timeout=0,
            write_timeout=write_timeout,
            exclusive=True,
        )

    async def _read_until_gone(
        self, port: serial.Serial, queue: asyncio.Queue[Reading], rejects: RejectCounter
    ) -> None:
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        handle_chunk = self._node_decoder() if self._link is not None else self._pms_decoder()
        fd = port.fileno()
        loop.add_reader(fd, readable.set)
        self._opened.set()
        try:
            if self._link is not None:
                self._time = NodeTime(self._timezone, clock=self._clock)
                self._link._attach(port)
                await self._link.send_line(encode_hello_request())
            while True:
                await (self._time.wait(readable) if self._time else readable.wait())
                if readable.is_set():
                    readable.clear()
                    try:
                        chunk = port.read(_READ_CHUNK)
                    except (serial.SerialException, OSError) as exc:
                        self._log.info("serial_read_failed", error=str(exc))
                        return
                    if chunk:
                        for reading in handle_chunk(chunk, rejects):
                            await queue.put(reading)
                        commit_queued(queue)  # into the ingest log as soon as parsed
                await self._ask_hello_again()
                await self._tell_time()
        except SerialLinkDownError as exc:
            self._log.info("serial_write_failed", error=str(exc))
        finally:
            loop.remove_reader(fd)

    async def _tell_time(self) -> None:
        line = self._time.line_if_due() if self._time is not None else None
        if line is not None and self._link is not None:
            await self._link.send_line(line)

    async def _ask_hello_again(self) -> None:
        """A node that reports before saying who it is (its hello got lost) is asked again."""
        if not self._hello_wanted or self._link is None:
            return
        self._hello_wanted = False
        now = time.monotonic()
        if now - self._hello_asked_at >= _HELLO_RETRY_S:
            self._hello_asked_at = now
            await self._link.send_line(encode_hello_request())

    # -- decoders: bytes -> readings, rejects counted -----------------------------------

    def _node_decoder(self) -> Callable[[bytes, RejectCounter], list[Reading]]:
        assert isinstance(self._config, NodePortConfig)
        config = self._config
        link = self._link
        splitter = LineSplitter()
        synced = False  # the first line after opening may be the tail of one sent earlier
        allowed = frozenset(config.allowed_sensors) if config.allowed_sensors else None

        def handle(chunk: bytes, rejects: RejectCounter) -> list[Reading]:
            nonlocal synced
            readings: list[Reading] = []
            for item in splitter.feed(chunk):
                try:
                    if isinstance(item, ReadingRejectedError):
                        raise item
                    line = decode_line(item)
                    synced = True
                    reading = self._from_line(line, config, link, allowed)
                except ReadingRejectedError as exc:
                    if not synced:
                        self._log.debug("serial_partial_first_line", detail=exc.detail)
                        synced = True
                        continue
                    hello = link.hello if link is not None else None
                    rejects.reject_error(
                        exc,
                        source=self._source,
                        sensor=hello.node_id if hello is not None else None,
                        where=str(config.port),
                    )
                    continue
                if reading is not None:
                    rejects.reject_dropped(reading, where=str(config.port))
                    readings.append(reading)
            return readings

        return handle

    def _from_line(
        self,
        line: Line,
        config: NodePortConfig,
        link: NodeLink | None,
        allowed: frozenset[str] | None,
    ) -> Reading | None:
        if isinstance(line, NodeReading):
            if allowed is not None:
                if line.node_id not in allowed:
                    raise ReadingRejectedError(
                        RejectReason.UNKNOWN_SENSOR,
                        f"node {line.node_id!r} is not in the configured allowed_sensors",
                    )
            else:
                self._check_owned(line, link)
            now = self._clock()
            timestamp = now
            if (
                line.timestamp is not None
                and now - config.max_backlog_s <= line.timestamp <= now + config.max_clock_skew_s
            ):
                timestamp = line.timestamp
            return validate_reading(
                line.node_id,
                timestamp,
                line.values,
                now=now,
                source=self._source,
                max_future_s=config.max_future_s,
                seq=line.seq,
            )
        if isinstance(line, Hello):
            self._on_hello(line, link)
        elif isinstance(line, OtaFrame):
            if link is not None and link.ota_handler is not None:
                link.ota_handler(line)
            else:
                self._log.debug("ota_frame_ignored", fields=len(line.fields))
        elif isinstance(line, HelloRequest):
            self._log.debug("hello_request_from_node_ignored")
        return None

    def _on_hello(self, line: Hello, link: NodeLink | None) -> None:
        if self._time is not None:
            self._time.hello_seen()  # it may have just booted: tell it the time
        if link is not None:
            link.hello = line
            if link.hello_handler is not None:
                link.hello_handler(line)
        self._log.info(
            "node_hello",
            node_id=line.node_id,
            firmware=line.firmware_version,
            model=line.model_name,
            model_version=line.model_version,
        )

    def _check_owned(self, line: NodeReading, link: NodeLink | None) -> None:
        """A node speaks only for the id of its own hello (docs/serial-protocol.md)."""
        hello = link.hello if link is not None else None
        if hello is None:
            self._hello_wanted = True
            raise ReadingRejectedError(
                RejectReason.SENSOR_NOT_OWNED,
                f"reading for {line.node_id!r} before the node's hello on this port; "
                "asking the node who it is",
            )
        if line.node_id != hello.node_id:
            raise ReadingRejectedError(
                RejectReason.SENSOR_NOT_OWNED,
                f"node {hello.node_id!r} (its hello) reported for sensor {line.node_id!r}; "
                "list the ids a relaying node may report in allowed_sensors",
            )

    def _pms_decoder(self) -> Callable[[bytes, RejectCounter], list[Reading]]:
        assert isinstance(self._config, Pms5003PortConfig)
        config = self._config
        parser = Pms5003Parser()

        def handle(chunk: bytes, rejects: RejectCounter) -> list[Reading]:
            readings: list[Reading] = []
            for item in parser.feed(chunk):
                try:
                    if isinstance(item, ReadingRejectedError):
                        raise item
                    readings.append(self._from_frame(item, config))
                except ReadingRejectedError as exc:
                    rejects.reject_error(
                        exc, source=self._source, sensor=config.sensor_id, where=str(config.port)
                    )
            return readings

        return handle

    def _from_frame(self, frame: Pms5003Frame, config: Pms5003PortConfig) -> Reading:
        now = self._clock()
        return validate_reading(
            config.sensor_id,
            now,
            frame.values(),
            now=now,
            source=self._source,
            max_future_s=config.max_future_s,
        )
