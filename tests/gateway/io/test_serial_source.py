"""The serial source over pty pairs driven through pyserial (no Arduino or USB adapter here).

The pty's master side plays the node or the PMS5003; the gateway opens a symlink to the slave
side, as it would open /dev/serial/by-id/... on the Raspberry Pi.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import TypeAdapter
from structlog.testing import capture_logs

from devkit.pty import PtySerial
from tesla_gateway.contract.readings import Reading, RejectReason
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.sources.line_protocol import (
    TimeSync,
    decode_line,
    encode_hello,
    encode_hello_request,
    encode_line,
    encode_reading,
)
from tesla_gateway.sources.pms5003 import encode_frame
from tesla_gateway.sources.serial_source import (
    NodePortConfig,
    Pms5003PortConfig,
    SerialLinkDownError,
    SerialSource,
    SerialSourceConfig,
)
from tests.gateway.io.helpers import eventually
from tests.gateway.io.line_vectors import framed

PORT_CONFIG = TypeAdapter(SerialSourceConfig)


def node_config(path: Path, **extra: object) -> SerialSourceConfig:
    return PORT_CONFIG.validate_python(
        {
            "kind": "node",
            "port": str(path),
            "reconnect_initial_s": 0.05,
            "reconnect_max_s": 0.2,
            **extra,
        }
    )


@contextlib.asynccontextmanager
async def running(
    source: SerialSource, queue: asyncio.Queue[Reading], rejects: RejectCounter
) -> AsyncIterator[None]:
    task = asyncio.create_task(source.run(queue, rejects))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def take(queue: asyncio.Queue[Reading], n: int) -> list[Reading]:
    return [await asyncio.wait_for(queue.get(), 10) for _ in range(n)]


def test_node_lines_become_readings_with_sane_timestamps(pty_serial: PtySerial) -> None:
    now = time.time()

    async def scenario() -> tuple[list[Reading], SerialSource]:
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        source = SerialSource([node_config(pty_serial.path)])
        async with running(source, queue, RejectCounter()):
            await asyncio.wait_for(source.wait_open(pty_serial.path), 10)
            # The gateway asks the node who it is as soon as the port opens.
            await asyncio.to_thread(pty_serial.read_until, encode_hello_request())
            pty_serial.write(encode_hello("node-1", "1.0.0", "tesla-pm10", 2))
            pty_serial.write(encode_reading("node-1", 1, now - 30, {"pm10": 12.5, "rh": 40}))
            pty_serial.write(encode_reading("node-1", 2, None, {"pm2_5": 3}))  # no clock
            pty_serial.write(encode_reading("node-1", 3, 1000.0, {"pm1": 1}))  # clock not set
            pty_serial.write(
                encode_reading(
                    "node-1", 4, now, {"pm10": 20}, calibrated={"cal_pm10": 15}, model_version=2
                )
            )
            return await take(queue, 4), source

    readings, source = asyncio.run(scenario())
    assert [r.sensor_id for r in readings] == ["node-1"] * 4
    assert readings[0].timestamp == pytest.approx(now - 30, abs=1e-3)
    assert dict(readings[0].values) == {"pm10": 12.5, "rh": 40.0}
    assert readings[1].timestamp >= now  # receive time
    assert readings[2].timestamp >= now  # a 1970 node clock is not trusted
    assert dict(readings[3].values) == {"pm10": 20.0}  # raw only; the device value is advisory
    assert readings[0].source == "serial:ttyNODE0"
    assert [r.seq for r in readings] == [
        1,
        2,
        3,
        4,
    ]  # for readings_missing (tesla_gateway.ingest.sequence)
    link = source.links[str(pty_serial.path)]
    assert link.hello is None  # detached when the source stopped


def test_a_node_is_told_the_time_after_each_hello(pty_serial: PtySerial) -> None:
    """``T`` follows the hello, in the configured zone's standard offset: New York in July is
    UTC-4 on the clocks, UTC-5 in standard time, which the hour channels use."""
    july = 1_783_000_000.0  # 2026-07-02, daylight saving time in New York

    async def scenario() -> list[bytes]:
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        source = SerialSource(
            [node_config(pty_serial.path)], clock=lambda: july, timezone="America/New_York"
        )
        async with running(source, queue, RejectCounter()):
            await asyncio.wait_for(source.wait_open(pty_serial.path), 10)
            await asyncio.to_thread(pty_serial.read_until, encode_hello_request())
            times = []
            for boot in range(2):  # at boot, and again after the node restarted
                pty_serial.write(encode_hello("node-1", "1.0.0", "pm10-ispra-1min", 3 + boot))
                told = await asyncio.to_thread(pty_serial.read_until, b"\n")
                times.append(told)
            return times

    times = asyncio.run(scenario())
    assert [decode_line(line) for line in times] == [TimeSync(1_783_000_000, -5 * 3600)] * 2


def test_pms5003_frames_with_garbage_between(tmp_path: Path) -> None:
    device = PtySerial(tmp_path / "ttyPMS")
    config = PORT_CONFIG.validate_python(
        {"kind": "pms5003", "port": str(device.path), "sensor_id": "pms-a"}
    )
    assert isinstance(config, Pms5003PortConfig)
    corrupt = bytearray(encode_frame(50, 60, 70))
    corrupt[12] ^= 0x01

    async def scenario() -> tuple[list[Reading], RejectCounter]:
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        rejects = RejectCounter()
        source = SerialSource([config])
        async with running(source, queue, rejects):
            await asyncio.wait_for(source.wait_open(device.path), 10)
            stream = (
                b"\x00\xffnoise"
                + encode_frame(1, 2, 3)
                + b"\x42\x42"
                + bytes(corrupt)
                + b"\x4d"
                + encode_frame(4, 5, 6)
            )
            for start in range(0, len(stream), 7):  # the UART delivers it in small pieces
                device.write(stream[start : start + 7])
            readings = await take(queue, 2)
        return readings, rejects

    try:
        with capture_logs():
            readings, rejects = asyncio.run(scenario())
    finally:
        device.close()
    assert [dict(r.values) for r in readings] == [
        {"pm1": 1.0, "pm2_5": 2.0, "pm10": 3.0},
        {"pm1": 4.0, "pm2_5": 5.0, "pm10": 6.0},
    ]
    assert {r.sensor_id for r in readings} == {"pms-a"}
    assert rejects.count(RejectReason.BAD_CHECKSUM) == 1


def wrong_checksum(line: bytes) -> bytes:
    """The line with a CRC it cannot have. Overwriting the last two digits with "00" left one
    line in 256 intact (its CRC ended in 00), which made this test fail now and then."""
    crc = int(line[-5:-1], 16)
    return line[:-5] + f"{crc ^ 0x00FF:04X}".encode("ascii") + b"\n"


def test_every_malformed_line_is_counted_and_survived(pty_serial: PtySerial) -> None:
    now = time.time()
    bad = [
        (wrong_checksum(encode_reading("node-1", 1, now, {"pm10": 1})), RejectReason.BAD_CHECKSUM),
        (b"R,node-1,1,-,pm10=3\n", RejectReason.BAD_FRAME),
        (framed("R,node-1,1,-,co2=3"), RejectReason.UNKNOWN_FIELD),
        (framed("R,no$de,1,-,pm10=3"), RejectReason.BAD_SENSOR_ID),
        (framed("R,node-1,1,-,pm10=3\xe9"), RejectReason.BAD_ENCODING),
        (b"A" * 700 + b"\n", RejectReason.TOO_LARGE),
        (encode_reading("node-1", 1, now, {"pm10": float("nan")}), RejectReason.NOT_FINITE),
        (encode_reading("node-1", 1, now, {"pm10": -1}), RejectReason.NEGATIVE),
        (encode_reading("node-1", 1, now, {"pm10": 5000}), RejectReason.OUT_OF_RANGE),
        (encode_reading("node-1", 1, None, {}), RejectReason.NO_VALUES),
        (encode_reading("stranger", 1, now, {"pm10": 1}), RejectReason.UNKNOWN_SENSOR),
        (encode_hello("node-1", "1.0", protocol_version=9), RejectReason.BAD_FRAME),
    ]

    async def scenario() -> tuple[list[Reading], RejectCounter]:
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        rejects = RejectCounter()
        config = node_config(pty_serial.path, allowed_sensors=["node-1"])
        source = SerialSource([config])
        async with running(source, queue, rejects):
            await asyncio.wait_for(source.wait_open(pty_serial.path), 10)
            pty_serial.write(encode_hello("node-1", "1.0.0"))
            for line, _ in bad:
                pty_serial.write(line)
            pty_serial.write(encode_line("O", ["1", "chunk"]))  # reserved: ignored, not a reject
            pty_serial.write(encode_reading("node-1", 8, now, {"pm10": 7, "rh": 400}))
            pty_serial.write(encode_reading("node-1", 9, now, {"pm10": 8}))
            readings = await take(queue, 2)
        return readings, rejects

    with capture_logs():
        readings, rejects = asyncio.run(scenario())
    # A humidity of 400 % costs the humidity: the reading stays, one bad_covariate is counted.
    assert [dict(r.values) for r in readings] == [{"pm10": 7.0}, {"pm10": 8.0}]
    expected: dict[RejectReason, int] = {RejectReason.BAD_COVARIATE: 1}
    for _, reason in bad:
        expected[reason] = expected.get(reason, 0) + 1
    for reason, n in expected.items():
        assert rejects.count(reason, source="serial:ttyNODE0") == n, reason
    assert rejects.count() == len(bad) + 1


def test_unplug_and_replug_resumes_reading_and_writing(pty_serial: PtySerial) -> None:
    async def scenario() -> list[Reading]:
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        source = SerialSource([node_config(pty_serial.path)])
        link = source.links[str(pty_serial.path)]
        async with running(source, queue, RejectCounter()):
            await asyncio.wait_for(link.wait_connected(), 10)
            pty_serial.write(encode_hello("node-1", "1.0.0"))  # a node announces itself first
            pty_serial.write(encode_reading("node-1", 1, None, {"pm10": 1}))
            first = await take(queue, 1)
            with capture_logs() as logs:
                pty_serial.unplug()
                await eventually(lambda: not link.connected)
                with pytest.raises(SerialLinkDownError):
                    await link.send_line("O,1,x*0000")
                # Wait for two failed reopen attempts while unplugged.
                await eventually(
                    lambda: [log["event"] for log in logs].count("serial_open_failed") >= 2
                )
                pty_serial.replug()
                await asyncio.wait_for(link.wait_connected(), 10)
            warnings = [log["event"] for log in logs if log["log_level"] == "warning"]
            assert "serial_port_lost" in warnings
            assert warnings.count("serial_open_failed") == 1  # later failures are debug only
            await asyncio.to_thread(pty_serial.read_until, encode_hello_request())
            pty_serial.write(encode_hello("node-1", "1.0.0"))
            pty_serial.write(encode_reading("node-1", 2, None, {"pm10": 2}))
            second = await take(queue, 1)
            await link.send_line(encode_line("O", ["1", "BEGIN"]).decode())
            sent = await asyncio.to_thread(pty_serial.read_until, b"BEGIN")
            assert encode_line("O", ["1", "BEGIN"]) in sent
        return first + second

    readings = asyncio.run(scenario())
    assert [r.values["pm10"] for r in readings] == [1.0, 2.0]


def test_several_ports_at_once(tmp_path: Path) -> None:
    node = PtySerial(tmp_path / "ttyNODE1")
    pms = PtySerial(tmp_path / "ttyPMS1")
    configs = [
        node_config(node.path),
        PORT_CONFIG.validate_python(
            {"kind": "pms5003", "port": str(pms.path), "sensor_id": "pms-b"}
        ),
    ]

    async def scenario() -> list[Reading]:
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        source = SerialSource(configs)
        async with running(source, queue, RejectCounter()):
            await asyncio.wait_for(source.wait_open(node.path), 10)
            await asyncio.wait_for(source.wait_open(pms.path), 10)
            node.write(encode_hello("node-9", "1.0.0"))
            node.write(encode_reading("node-9", 1, None, {"pm10": 9}))
            pms.write(encode_frame(1, 1, 1))
            return await take(queue, 2)

    try:
        readings = asyncio.run(scenario())
    finally:
        node.close()
        pms.close()
    assert sorted(r.sensor_id for r in readings) == ["node-9", "pms-b"]


def test_a_node_reports_only_for_the_id_of_its_hello(pty_serial: PtySerial) -> None:
    """Issue 12, finding 11: a node that said hello as node-7 spoke for s1 and impostor."""
    now = time.time()

    async def scenario() -> tuple[list[Reading], RejectCounter, bytes]:
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        rejects = RejectCounter()
        source = SerialSource([node_config(pty_serial.path)])
        async with running(source, queue, rejects):
            await asyncio.wait_for(source.wait_open(pty_serial.path), 10)
            await asyncio.to_thread(pty_serial.read_until, encode_hello_request())
            # Before its hello a node is nobody: its reading is refused and it is asked again.
            pty_serial.write(encode_reading("node-7", 0, now, {"pm10": 1}))
            await eventually(lambda: rejects.count() == 1)
            asked = await asyncio.to_thread(pty_serial.read_until, encode_hello_request())
            pty_serial.write(encode_hello("node-7", "1.2.0"))
            pty_serial.write(encode_reading("s1", 1, now, {"pm10": 50}))  # an MQTT sensor's id
            pty_serial.write(encode_reading("impostor", 2, now, {"pm10": 60}))
            pty_serial.write(encode_reading("node-7", 3, now, {"pm10": 7}))
            readings = await take(queue, 1)
            await eventually(lambda: rejects.count() == 3)
        return readings, rejects, asked

    with capture_logs():
        readings, rejects, asked = asyncio.run(scenario())
    assert [(r.sensor_id, r.values["pm10"]) for r in readings] == [("node-7", 7.0)]
    assert rejects.count(RejectReason.SENSOR_NOT_OWNED, source="serial:ttyNODE0") == 3
    assert rejects.count() == 3
    assert encode_hello_request() in asked


def test_allowed_sensors_lets_a_relaying_node_report_several_ids(pty_serial: PtySerial) -> None:
    async def scenario() -> tuple[list[Reading], RejectCounter]:
        queue: asyncio.Queue[Reading] = asyncio.Queue()
        rejects = RejectCounter()
        config = node_config(pty_serial.path, allowed_sensors=["relay-a", "relay-b"])
        source = SerialSource([config])
        async with running(source, queue, rejects):
            await asyncio.wait_for(source.wait_open(pty_serial.path), 10)
            pty_serial.write(encode_hello("hub-1", "1.0.0"))
            for sensor in ("relay-a", "relay-b", "hub-1"):
                pty_serial.write(encode_reading(sensor, 1, None, {"pm10": 3}))
            readings = await take(queue, 2)
            await eventually(lambda: rejects.count() == 1)
        return readings, rejects

    with capture_logs():
        readings, rejects = asyncio.run(scenario())
    assert [r.sensor_id for r in readings] == ["relay-a", "relay-b"]
    assert rejects.count(RejectReason.UNKNOWN_SENSOR) == 1  # the port's list is the whole rule


def test_config_is_a_discriminated_union() -> None:
    assert isinstance(node_config(Path("/dev/ttyACM0")), NodePortConfig)
    with pytest.raises(ValueError, match="sensor_id"):
        PORT_CONFIG.validate_python({"kind": "pms5003", "port": "/dev/ttyUSB0"})
    with pytest.raises(ValueError, match="extra"):
        PORT_CONFIG.validate_python({"kind": "node", "port": "/dev/x", "speed": 9600})
