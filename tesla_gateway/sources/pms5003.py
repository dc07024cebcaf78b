"""Plantower PMS5003 frames, as the sensor sends them over its UART (9600 8N1).

A frame is 32 bytes: ``0x42 0x4D``, a big-endian length that is always 28 (13 data words and the
checksum), 13 big-endian data words, and a checksum word equal to the sum of the first 30 bytes.
Words 4-6 are the "atmospheric environment" PM1, PM2.5 and PM10 in µg/m³ (words 1-3 are the
"CF=1" factory-calibration values meant for indoor use). The parser accepts arbitrary chunks,
resynchronises on the start bytes after garbage, and reports bad frames instead of raising.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tesla_gateway.contract.readings import ReadingRejectedError, RejectReason

__all__ = [
    "FRAME_LENGTH",
    "START",
    "Pms5003Frame",
    "Pms5003Parser",
    "encode_frame",
]

START = b"\x42\x4d"
FRAME_LENGTH = 32
_LENGTH_FIELD = 28
_DATA = struct.Struct(">13H")


@dataclass(frozen=True, slots=True)
class Pms5003Frame:
    """The decoded data words of one frame."""

    pm1_cf1: int
    pm2_5_cf1: int
    pm10_cf1: int
    pm1_atm: int
    pm2_5_atm: int
    pm10_atm: int
    counts: tuple[int, int, int, int, int, int]  # particles >0.3, 0.5, 1, 2.5, 5, 10 µm per 0.1 L
    reserved: int

    def values(self) -> dict[str, float]:
        """The atmospheric-environment PM values, named as in :data:`FIELD_LIMITS`."""
        return {
            "pm1": float(self.pm1_atm),
            "pm2_5": float(self.pm2_5_atm),
            "pm10": float(self.pm10_atm),
        }


def encode_frame(
    pm1_atm: int,
    pm2_5_atm: int,
    pm10_atm: int,
    *,
    cf1: tuple[int, int, int] | None = None,
    counts: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0),
    reserved: int = 0,
) -> bytes:
    """Build a valid frame (for tests and the node simulator)."""
    cf1_values = cf1 if cf1 is not None else (pm1_atm, pm2_5_atm, pm10_atm)
    words = (*cf1_values, pm1_atm, pm2_5_atm, pm10_atm, *counts, reserved)
    head = START + struct.pack(">H", _LENGTH_FIELD) + _DATA.pack(*words)
    return head + struct.pack(">H", sum(head) & 0xFFFF)


class Pms5003Parser:
    """Incremental frame parser; keeps at most one partial frame between calls."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.skipped_bytes = 0  # garbage discarded while hunting for a start sequence

    def feed(self, chunk: bytes) -> list[Pms5003Frame | ReadingRejectedError]:
        """Frames and rejects found in the stream so far, in order."""
        out: list[Pms5003Frame | ReadingRejectedError] = []
        buffer = self._buffer
        buffer += chunk
        while True:
            start = buffer.find(START)
            if start < 0:
                # Keep a trailing 0x42: it may be the first half of a start sequence.
                keep = 1 if buffer.endswith(START[:1]) else 0
                self.skipped_bytes += len(buffer) - keep
                del buffer[: len(buffer) - keep]
                break
            if start:
                self.skipped_bytes += start
                del buffer[:start]
            if len(buffer) < 4:
                break
            (length,) = struct.unpack_from(">H", buffer, 2)
            if length != _LENGTH_FIELD:
                out.append(
                    ReadingRejectedError(
                        RejectReason.BAD_FRAME, f"PMS5003 length field {length}, expected 28"
                    )
                )
                del buffer[:1]  # a false start: hunt again from the next byte
                continue
            if len(buffer) < FRAME_LENGTH:
                break
            frame = bytes(buffer[:FRAME_LENGTH])
            (checksum,) = struct.unpack_from(">H", frame, 30)
            computed = sum(frame[:30]) & 0xFFFF
            if checksum != computed:
                out.append(
                    ReadingRejectedError(
                        RejectReason.BAD_CHECKSUM,
                        f"PMS5003 checksum {checksum:#06x} != computed {computed:#06x}",
                    )
                )
                del buffer[:1]  # the real frame may start inside this one
                continue
            del buffer[:FRAME_LENGTH]
            words = _DATA.unpack_from(frame, 4)
            out.append(
                Pms5003Frame(
                    pm1_cf1=words[0],
                    pm2_5_cf1=words[1],
                    pm10_cf1=words[2],
                    pm1_atm=words[3],
                    pm2_5_atm=words[4],
                    pm10_atm=words[5],
                    counts=(words[6], words[7], words[8], words[9], words[10], words[11]),
                    reserved=words[12],
                )
            )
        return out
