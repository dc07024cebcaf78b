"""A relay between the gateway's serial port and the emulated node's UART, to inject line faults.

qemu's UART is a pty that stays open for the node's whole life; the gateway opens a
re-pluggable pty (devkit/pty.py) instead, and this relay copies bytes both ways.
It can corrupt one chunk's payload on its way to the node (the frame's CRC-32 and the line's
CRC-16 as the gateway sent them, so the node sees a damaged payload, not a damaged line) and
pull the "USB cable" on the gateway's side right after the node acknowledged a given chunk,
plugging it back after a pause (the node keeps running, as a board on its own supply would).
"""

from __future__ import annotations

import os
import select
import threading
import time
import tty
from dataclasses import dataclass, field
from pathlib import Path

from devkit.pty import PtySerial
from tesla_gateway.contract.readings import ReadingRejectedError
from tesla_gateway.ota.errors import OtaFrameError
from tesla_gateway.ota.protocol import Chunk, OtaMessage, Status, decode_ota, encode_ota
from tesla_gateway.sources.line_protocol import LineSplitter, OtaFrame, decode_line

__all__ = ["LineFaults", "SerialTap"]


@dataclass
class LineFaults:
    """Faults on the line; each fires once."""

    corrupt_chunk: int | None = None  # flip a payload bit of this chunk, keep its CRCs
    cut_after_chunk: int | None = None  # unplug once the node acknowledged this chunk
    cut_s: float = 1.0


@dataclass
class TapLog:
    """What crossed the line, for the test's assertions."""

    chunks_sent: list[int] = field(default_factory=list)  # seq of every chunk the node got
    statuses: list[Status] = field(default_factory=list)  # every status the node answered
    events: list[str] = field(default_factory=list)


class SerialTap:
    """Runs in a thread from ``start`` to ``stop``."""

    def __init__(self, node_pty: Path, gateway_side: PtySerial, faults: LineFaults) -> None:
        self._node = os.open(node_pty, os.O_RDWR | os.O_NOCTTY)
        tty.setraw(self._node)
        self._gateway = gateway_side
        self._faults = faults
        self.log = TapLog()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="serial-tap", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        os.close(self._node)

    def _run(self) -> None:
        to_node = LineSplitter()
        from_node = LineSplitter()
        while not self._stop.is_set():
            if self._gateway.plugged:
                for line in to_node.feed(self._gateway.read_available(0.005)):
                    if isinstance(line, bytes):
                        os.write(self._node, self._towards_node(line + b"\n"))
            ready, _, _ = select.select([self._node], [], [], 0.005)
            if not ready:
                continue
            data = os.read(self._node, 4096)
            for line in from_node.feed(data):
                if isinstance(line, bytes):
                    self._towards_gateway(line + b"\n")

    def _towards_node(self, line: bytes) -> bytes:
        message = _ota_message(line)
        if not isinstance(message, Chunk):
            return line
        self.log.chunks_sent.append(message.seq)
        if message.seq == self._faults.corrupt_chunk:
            self._faults.corrupt_chunk = None
            self.log.events.append(f"corrupted chunk {message.seq}")
            damaged = bytes([message.payload[0] ^ 0x01]) + message.payload[1:]
            return encode_ota(Chunk(message.seq, damaged, crc=message.crc))
        return line

    def _towards_gateway(self, line: bytes) -> None:
        status = _ota_message(line)
        if isinstance(status, Status):
            self.log.statuses.append(status)
        if not self._gateway.plugged:
            return  # cable out: the line is lost
        self._gateway.write(line)
        cut = self._faults.cut_after_chunk
        if cut is not None and isinstance(status, Status) and self.log.chunks_sent[-1:] == [cut]:
            self._faults.cut_after_chunk = None
            self.log.events.append(f"link cut after chunk {cut}")
            self._gateway.unplug()
            time.sleep(self._faults.cut_s)
            self._gateway.replug()


def _ota_message(line: bytes) -> OtaMessage | None:
    """The OTA message on a line, or None (another line type, or a line that does not parse)."""
    try:
        frame = decode_line(line)
        return decode_ota(frame.fields) if isinstance(frame, OtaFrame) else None
    except (ReadingRejectedError, OtaFrameError):
        return None
