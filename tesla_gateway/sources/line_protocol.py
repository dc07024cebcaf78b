"""The ASCII line protocol spoken between the gateway and the Arduino nodes (version 1).

The specification is docs/serial-protocol.md; this module is its reference implementation.
The node simulator and the firmware's host tests use the encoder, and tests/vectors/
line_protocol.json pins both sides to the same bytes. A line is::

    <TYPE>,<field>,<field>...*<CRC>\\n

where ``CRC`` is four upper-case hex digits of CRC-16/CCITT-FALSE over every byte before ``*``.
"""

from __future__ import annotations

import binascii
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from tesla_gateway.contract.readings import SENSOR_ID_PATTERN, ReadingRejectedError, RejectReason
from tesla_gateway.errors import GatewayError

__all__ = [
    "CALIBRATED_KEYS",
    "MAX_LINE_BYTES",
    "PROTOCOL_VERSION",
    "RAW_KEYS",
    "TIME_MAX_S",
    "TIME_MIN_S",
    "Hello",
    "HelloRequest",
    "Line",
    "LineProtocolError",
    "LineSplitter",
    "NodeReading",
    "OtaFrame",
    "TimeSync",
    "crc16_ccitt_false",
    "decode_line",
    "encode_hello",
    "encode_hello_request",
    "encode_line",
    "encode_reading",
    "encode_time",
]

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 512  # including the terminating LF; room for OTA frames (issue 5)

RAW_KEYS = ("pm1", "pm2_5", "pm10", "rh", "temp_c")
CALIBRATED_KEYS = ("cal_pm1", "cal_pm2_5", "cal_pm10")
MODEL_VERSION_KEY = "mv"

_FIELD = re.compile(rb"^[\x21-\x7e]*$")  # printable ASCII without space
_NUMBER = re.compile(r"^(?:-?[0-9]{1,7}(?:\.[0-9]{1,6})?|nan)$")
_UINT = re.compile(r"^[0-9]{1,10}$")
_TIMESTAMP = re.compile(r"^[0-9]{1,10}(?:\.[0-9]{1,3})?$")
_VERSION_TEXT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,31}$")
_CRC_TEXT = re.compile(rb"^[0-9A-F]{4}$")
_UINT32_MAX = 2**32 - 1
_NONE = "-"
# The bounds of a ``T`` line's time: a gateway clock before TIME_MIN_S has not been set (a Pi
# without a real-time clock boots in the past until NTP answers) and must not teach a node.
TIME_MIN_S = 1_700_000_000  # 2023-11-14
TIME_MAX_S = 4_102_444_800  # 2100-01-01
_MAX_UTC_OFFSET_S = 14 * 3600  # the offsets of real zones (contract/time_of_day.py)
_OFFSET = re.compile(r"^-?[0-9]{1,5}$")


class LineProtocolError(GatewayError):
    """An encoder was asked to produce a line the protocol cannot carry (a caller's bug)."""


@dataclass(frozen=True, slots=True)
class Hello:
    """``H``: sent by a node at boot and when asked; announces who it is and what it runs."""

    protocol_version: int
    node_id: str
    firmware_version: str
    model_name: str | None
    model_version: int | None


@dataclass(frozen=True, slots=True)
class NodeReading:
    """``R``: one measurement, plus the node's own calibration if it runs a model."""

    node_id: str
    seq: int
    timestamp: float | None  # Unix seconds from the node's clock; None if it has none
    values: Mapping[str, float] = field(hash=False)
    calibrated: Mapping[str, float] = field(hash=False)
    model_version: int | None


@dataclass(frozen=True, slots=True)
class HelloRequest:
    """``Q``: gateway to node, "send your hello"."""


@dataclass(frozen=True, slots=True)
class OtaFrame:
    """``O``: reserved for OTA frames (issue 5); carried through undecoded."""

    fields: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TimeSync:
    """``T``: gateway to node, the wall time and the zone's standard UTC offset.

    A node has no clock; it needs the hour of the day for models that read it
    (tesla_gateway/contract/time_of_day.py) and keeps it from this line.
    """

    unix_s: int
    utc_offset_s: int


Line = Hello | NodeReading | HelloRequest | OtaFrame | TimeSync


def crc16_ccitt_false(data: bytes) -> int:
    """CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF, no reflection, no final xor).

    ``binascii.crc_hqx`` is exactly that CRC in C once started from 0xFFFF.
    """
    return binascii.crc_hqx(data, 0xFFFF)


# -- encoding ----------------------------------------------------------------------------


def encode_line(line_type: str, fields: Sequence[str]) -> bytes:
    """Frame one line: type, comma-separated fields, ``*``, CRC, LF."""
    if len(line_type) != 1 or not "A" <= line_type <= "Z":
        raise LineProtocolError(f"line type must be one upper-case letter, got {line_type!r}")
    for value in fields:
        # ASCII first: outside it a field is refused, never encoded (a lone surrogate of a
        # file name cannot be) nor read as the '?' it would become
        if (
            not value.isascii()
            or not _FIELD.fullmatch(value.encode("ascii"))
            or "," in value
            or "*" in value
        ):
            raise LineProtocolError(
                f"field {value!r} must be printable ASCII without space, ',' or '*'"
            )
    body = ",".join([line_type, *fields]).encode("ascii")
    line = body + b"*" + f"{crc16_ccitt_false(body):04X}".encode("ascii") + b"\n"
    if len(line) > MAX_LINE_BYTES:
        raise LineProtocolError(f"line of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
    return line


def encode_hello(
    node_id: str,
    firmware_version: str,
    model_name: str | None = None,
    model_version: int | None = None,
    *,
    protocol_version: int = PROTOCOL_VERSION,
) -> bytes:
    _check_node_id(node_id)
    return encode_line(
        "H",
        [
            str(protocol_version),
            node_id,
            firmware_version,
            model_name if model_name is not None else _NONE,
            str(model_version) if model_version is not None else _NONE,
        ],
    )


def encode_reading(
    node_id: str,
    seq: int,
    timestamp: float | None,
    values: Mapping[str, float],
    *,
    calibrated: Mapping[str, float] | None = None,
    model_version: int | None = None,
) -> bytes:
    """Encode an ``R`` line; keys are written in the protocol's fixed order."""
    _check_node_id(node_id)
    if not 0 <= seq <= _UINT32_MAX:
        raise LineProtocolError(f"seq must be a uint32, got {seq}")
    calibrated = calibrated or {}
    if calibrated and model_version is None:
        raise LineProtocolError("calibrated values need the model_version that produced them")
    unknown = (set(values) - set(RAW_KEYS)) | (set(calibrated) - set(CALIBRATED_KEYS))
    if unknown:
        raise LineProtocolError(f"unknown keys {sorted(unknown)}")
    fields = [node_id, str(seq), _format_timestamp(timestamp)]
    fields += [f"{key}={_format_number(values[key])}" for key in RAW_KEYS if key in values]
    fields += [
        f"{key}={_format_number(calibrated[key])}" for key in CALIBRATED_KEYS if key in calibrated
    ]
    if model_version is not None:
        fields.append(f"{MODEL_VERSION_KEY}={model_version}")
    return encode_line("R", fields)


def encode_hello_request() -> bytes:
    return encode_line("Q", [])


def encode_time(unix_s: int, utc_offset_s: int) -> bytes:
    """``T,<unix seconds>,<standard UTC offset seconds>``; refuses what a node would reject."""
    if not TIME_MIN_S <= unix_s <= TIME_MAX_S:
        raise LineProtocolError(
            f"time {unix_s} is outside {TIME_MIN_S}..{TIME_MAX_S}: is the gateway's clock set?"
        )
    if not -_MAX_UTC_OFFSET_S <= utc_offset_s <= _MAX_UTC_OFFSET_S:
        raise LineProtocolError(f"UTC offset {utc_offset_s} s is not a zone's (at most ±14 h)")
    return encode_line("T", [str(unix_s), str(utc_offset_s)])


def _check_node_id(node_id: str) -> None:
    if not SENSOR_ID_PATTERN.fullmatch(node_id):
        raise LineProtocolError(f"node id {node_id!r} must match {SENSOR_ID_PATTERN.pattern}")


def _format_number(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        raise LineProtocolError("infinite values cannot be encoded; send nan for a failed sensor")
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return "0" if text in {"", "-0"} else text


def _format_timestamp(timestamp: float | None) -> str:
    if timestamp is None:
        return _NONE
    if not math.isfinite(timestamp) or timestamp < 0:
        raise LineProtocolError(f"timestamp must be a non-negative number, got {timestamp}")
    text = f"{timestamp:.3f}".rstrip("0").rstrip(".")
    return text


# -- decoding ----------------------------------------------------------------------------


def decode_line(raw: bytes) -> Line:
    """Decode one line (with or without its CR/LF); raise :class:`ReadingRejectedError`."""
    line = raw.rstrip(b"\n").rstrip(b"\r")
    if len(line) + 1 > MAX_LINE_BYTES:
        raise ReadingRejectedError(
            RejectReason.TOO_LARGE, f"line of {len(line) + 1} bytes exceeds {MAX_LINE_BYTES}"
        )
    if not _FIELD.fullmatch(line):
        raise ReadingRejectedError(RejectReason.BAD_ENCODING, "line is not printable ASCII")
    body, star, crc_text = line.rpartition(b"*")
    if not star or not _CRC_TEXT.fullmatch(crc_text):
        raise ReadingRejectedError(RejectReason.BAD_FRAME, "line does not end in *XXXX checksum")
    expected = crc16_ccitt_false(body)
    if int(crc_text, 16) != expected:
        raise ReadingRejectedError(
            RejectReason.BAD_CHECKSUM,
            f"checksum {crc_text.decode()} != computed {expected:04X}",
        )
    parts = body.decode("ascii").split(",")
    line_type, fields = parts[0], parts[1:]
    if "*" in body.decode("ascii"):
        raise ReadingRejectedError(RejectReason.BAD_FRAME, "'*' inside a line")
    if line_type == "R":
        return _decode_reading(fields)
    if line_type == "H":
        return _decode_hello(fields)
    if line_type == "Q" and not fields:
        return HelloRequest()
    if line_type == "O":
        return OtaFrame(fields=tuple(fields))
    if line_type == "T":
        return _decode_time(fields)
    raise ReadingRejectedError(RejectReason.BAD_FRAME, f"unknown line type {line_type[:8]!r}")


def _decode_hello(fields: list[str]) -> Hello:
    if len(fields) != 5:
        raise ReadingRejectedError(RejectReason.BAD_FRAME, f"hello has {len(fields)} fields, not 5")
    version_text, node_id, firmware, model_name, model_version_text = fields
    if not _UINT.fullmatch(version_text):
        raise ReadingRejectedError(RejectReason.BAD_FRAME, "hello protocol version not a number")
    version = int(version_text)
    if version != PROTOCOL_VERSION:
        raise ReadingRejectedError(
            RejectReason.BAD_FRAME,
            f"node speaks protocol version {version}, this gateway speaks {PROTOCOL_VERSION}; "
            "update the gateway or the node firmware",
        )
    _check_wire_node_id(node_id)
    if not _VERSION_TEXT.fullmatch(firmware):
        raise ReadingRejectedError(RejectReason.BAD_FRAME, "hello firmware version is malformed")
    name: str | None = None
    model_version: int | None = None
    if model_name != _NONE:
        if not _VERSION_TEXT.fullmatch(model_name):
            raise ReadingRejectedError(RejectReason.BAD_FRAME, "hello model name is malformed")
        name = model_name
    if model_version_text != _NONE:
        model_version = _parse_uint(model_version_text, "model version")
    return Hello(
        protocol_version=version,
        node_id=node_id,
        firmware_version=firmware,
        model_name=name,
        model_version=model_version,
    )


def _decode_reading(fields: list[str]) -> NodeReading:
    if len(fields) < 3:
        raise ReadingRejectedError(RejectReason.BAD_FRAME, "reading needs node id, seq and time")
    node_id, seq_text, ts_text = fields[:3]
    _check_wire_node_id(node_id)
    seq = _parse_uint(seq_text, "seq")
    timestamp: float | None = None
    if ts_text != _NONE:
        if not _TIMESTAMP.fullmatch(ts_text):
            raise ReadingRejectedError(RejectReason.BAD_FRAME, "reading timestamp is malformed")
        timestamp = float(ts_text)
    values: dict[str, float] = {}
    calibrated: dict[str, float] = {}
    model_version: int | None = None
    for pair in fields[3:]:
        key, equals, text = pair.partition("=")
        if not equals:
            raise ReadingRejectedError(RejectReason.BAD_FRAME, f"{pair[:40]!r} is not key=value")
        if (
            key in values
            or key in calibrated
            or (key == MODEL_VERSION_KEY and model_version is not None)
        ):
            raise ReadingRejectedError(RejectReason.BAD_FRAME, f"key {key!r} repeated")
        if key == MODEL_VERSION_KEY:
            model_version = _parse_uint(text, "model version")
        elif key in RAW_KEYS or key in CALIBRATED_KEYS:
            if not _NUMBER.fullmatch(text):
                raise ReadingRejectedError(
                    RejectReason.BAD_FRAME, f"{key} value {text[:20]!r} is not a number"
                )
            target = values if key in RAW_KEYS else calibrated
            target[key] = float(text)
        else:
            raise ReadingRejectedError(RejectReason.UNKNOWN_FIELD, f"unknown key {key[:40]!r}")
    if calibrated and model_version is None:
        raise ReadingRejectedError(
            RejectReason.BAD_FRAME, "calibrated values without the model version (mv=)"
        )
    return NodeReading(
        node_id=node_id,
        seq=seq,
        timestamp=timestamp,
        values=MappingProxyType(values),
        calibrated=MappingProxyType(calibrated),
        model_version=model_version,
    )


def _decode_time(fields: list[str]) -> TimeSync:
    if len(fields) != 2:
        raise ReadingRejectedError(RejectReason.BAD_FRAME, f"time has {len(fields)} fields, not 2")
    unix_text, offset_text = fields
    if not _UINT.fullmatch(unix_text) or not TIME_MIN_S <= int(unix_text) <= TIME_MAX_S:
        raise ReadingRejectedError(
            RejectReason.BAD_FRAME, f"time {unix_text[:20]!r} is not in {TIME_MIN_S}..{TIME_MAX_S}"
        )
    if not _OFFSET.fullmatch(offset_text) or abs(int(offset_text)) > _MAX_UTC_OFFSET_S:
        raise ReadingRejectedError(
            RejectReason.BAD_FRAME, f"UTC offset {offset_text[:20]!r} is not a zone's (±14 h)"
        )
    return TimeSync(unix_s=int(unix_text), utc_offset_s=int(offset_text))


def _check_wire_node_id(node_id: str) -> None:
    if not SENSOR_ID_PATTERN.fullmatch(node_id):
        raise ReadingRejectedError(
            RejectReason.BAD_SENSOR_ID, f"node id {node_id[:64]!r} is not a valid sensor id"
        )


def _parse_uint(text: str, what: str) -> int:
    if not _UINT.fullmatch(text) or int(text) > _UINT32_MAX:
        raise ReadingRejectedError(RejectReason.BAD_FRAME, f"{what} {text[:20]!r} is not a uint32")
    return int(text)


# -- framing -----------------------------------------------------------------------------


class LineSplitter:
    """Cuts a byte stream into lines, bounded: an over-long line is rejected once and skipped."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._max = max_line_bytes
        self._buffer = bytearray()
        self._discarding = False

    def feed(self, chunk: bytes) -> list[bytes | ReadingRejectedError]:
        """Complete lines (terminator removed) and rejects, in stream order."""
        out: list[bytes | ReadingRejectedError] = []
        self._buffer += chunk
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            if self._discarding:
                self._discarding = False
            elif len(line) + 1 > self._max:
                out.append(self._too_long())
            elif line.rstrip(b"\r"):
                out.append(line)
        if len(self._buffer) >= self._max:
            if not self._discarding:
                out.append(self._too_long())
                self._discarding = True
            self._buffer.clear()
        return out

    def _too_long(self) -> ReadingRejectedError:
        return ReadingRejectedError(
            RejectReason.TOO_LARGE, f"line longer than {self._max} bytes; skipped to the next LF"
        )


def iter_lines(chunks: Iterable[bytes]) -> list[bytes | ReadingRejectedError]:
    """Split a whole stream at once (tests and offline tools)."""
    splitter = LineSplitter()
    out: list[bytes | ReadingRejectedError] = []
    for chunk in chunks:
        out.extend(splitter.feed(chunk))
    return out
