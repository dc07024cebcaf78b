"""OTA frames on the serial line (docs/ota-protocol.md, protocol version 1).

Every frame is an ``O`` line of the line protocol (same CRC-16, same 512-byte limit)::

    gateway -> node   O,B,TOTA,<version>,<chunk_size>,<descriptor b64>,<signature b64>   begin
                      O,C,<seq>,<crc32 hex>,<payload b64>                              chunk
                      O,F                                                              finish
                      O,M                                                              commit
                      O,X                                                              abort
    node -> gateway   O,S,<code>,<next_seq>                                            status

The status codes and their messages are the table in the specification; the firmware mirrors
them in firmware/src/ota_codes.h and tests/vectors/ota_protocol.json pins both sides.
"""

from __future__ import annotations

import base64
import binascii
import enum
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from tesla_gateway.ota.descriptor import DESCRIPTOR_SIZE
from tesla_gateway.ota.errors import OtaFrameError
from tesla_gateway.sources.line_protocol import encode_line

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "MAX_CHUNK_SIZE",
    "OTA_MAGIC",
    "OTA_PROTOCOL_VERSION",
    "Abort",
    "Begin",
    "Chunk",
    "Commit",
    "Finish",
    "OtaMessage",
    "OtaStatus",
    "Status",
    "chunk_count",
    "crc32",
    "decode_ota",
    "encode_ota",
    "status_message",
]

OTA_MAGIC = "TOTA"
OTA_PROTOCOL_VERSION = 1
DEFAULT_CHUNK_SIZE = 256
MAX_CHUNK_SIZE = 360  # base64 480 chars: "O,C,4294967295,FFFFFFFF," + 480 + "*XXXX\n" = 510 B
_UINT = re.compile(r"^[0-9]{1,10}$")
_HEX8 = re.compile(r"^[0-9A-F]{8}$")


class OtaStatus(enum.IntEnum):
    """Status codes a node answers with; 0-9 progress, 10+ errors. Mirrored in firmware."""

    OK = 0
    VERIFIED = 1
    ACTIVE = 2
    ROLLED_BACK = 3
    BAD_FRAME = 10
    BAD_MAGIC = 11
    UNSUPPORTED_VERSION = 12
    BAD_DESCRIPTOR = 13
    BAD_SIGNATURE = 14
    DOWNGRADE = 15
    INCOMPATIBLE = 16
    TOO_LARGE = 17
    NO_SESSION = 20
    CRC_MISMATCH = 21
    OUT_OF_SEQUENCE = 22
    INCOMPLETE = 23
    SHA_MISMATCH = 24
    NOT_VERIFIED = 25
    FLASH_ERROR = 30


_MESSAGES: dict[OtaStatus, str] = {
    OtaStatus.OK: "accepted; send the chunk numbered next_seq",
    OtaStatus.VERIFIED: "image complete, sha256 and signature valid; send commit",
    OtaStatus.ACTIVE: "new model active and passed its self-test",
    OtaStatus.ROLLED_BACK: "new model failed to load or its self-test; previous model restored",
    OtaStatus.BAD_FRAME: "malformed OTA frame; check that gateway and firmware speak the same "
    "protocol version",
    OtaStatus.BAD_MAGIC: "handshake magic is not TOTA; the sender is not an OTA gateway",
    OtaStatus.UNSUPPORTED_VERSION: "OTA protocol version not supported; update the gateway or "
    "the node firmware so both speak the same version",
    OtaStatus.BAD_DESCRIPTOR: "image descriptor malformed, or of a format the node's firmware "
    "predates (format 2 states min_history); reflash the node with current firmware, or "
    "re-create the release with `tesla-train release --target node`",
    OtaStatus.BAD_SIGNATURE: "descriptor signature does not verify with the node's public key; "
    "sign the release with the key the firmware was built with",
    OtaStatus.DOWNGRADE: "model version is not newer than the one running; publish a higher "
    "version",
    OtaStatus.INCOMPATIBLE: "model is for another model name, window length or a larger arena "
    "than this firmware has; build firmware for it or release a compatible model",
    OtaStatus.TOO_LARGE: "image larger than the node's model slot; shrink the model or "
    "repartition the flash",
    OtaStatus.NO_SESSION: "no transfer in progress; send begin first",
    OtaStatus.CRC_MISMATCH: "chunk CRC-32 mismatch; resend from next_seq",
    OtaStatus.OUT_OF_SEQUENCE: "unexpected chunk number; resend from next_seq",
    OtaStatus.INCOMPLETE: "finish before every chunk arrived; resend from next_seq",
    OtaStatus.SHA_MISMATCH: "image sha256 differs from the descriptor; the transfer restarts "
    "from chunk 0",
    OtaStatus.NOT_VERIFIED: "commit before a verified image; send finish first",
    OtaStatus.FLASH_ERROR: "flash write or erase failed; power-cycle the node, replace it if "
    "it persists",
}


def status_message(code: int) -> str:
    """The actionable message of a status code (unknown codes say so)."""
    try:
        return _MESSAGES[OtaStatus(code)]
    except ValueError:
        return f"unknown status code {code}; update the gateway"


@dataclass(frozen=True, slots=True)
class Begin:
    """Handshake: which image follows, in chunks of ``chunk_size`` bytes."""

    chunk_size: int
    descriptor: bytes
    signature: bytes
    version: int = OTA_PROTOCOL_VERSION
    magic: str = OTA_MAGIC


@dataclass(frozen=True, slots=True)
class Chunk:
    seq: int
    payload: bytes
    crc: int | None = None  # None: computed from the payload when encoding


@dataclass(frozen=True, slots=True)
class Finish:
    """All chunks sent: verify sha256 and signature."""


@dataclass(frozen=True, slots=True)
class Commit:
    """Activate the verified image (boot it, self-test it, fall back if it fails)."""


@dataclass(frozen=True, slots=True)
class Abort:
    """Forget the transfer in progress."""


@dataclass(frozen=True, slots=True)
class Status:
    code: int
    next_seq: int

    @property
    def message(self) -> str:
        return status_message(self.code)


OtaMessage = Begin | Chunk | Finish | Commit | Abort | Status


def crc32(data: bytes) -> int:
    """CRC-32 (ISO-HDLC, as zlib): poly 0x04C11DB7 reflected, init and final xor 0xFFFFFFFF."""
    return zlib.crc32(data) & 0xFFFFFFFF


def chunk_count(image_size: int, chunk_size: int) -> int:
    return (image_size + chunk_size - 1) // chunk_size


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def encode_ota(message: OtaMessage) -> bytes:
    """The full line (with CRC-16 and LF) for one OTA message."""
    fields: list[str]
    if isinstance(message, Begin):
        fields = [
            "B",
            message.magic,
            str(message.version),
            str(message.chunk_size),
            _b64(message.descriptor),
            _b64(message.signature),
        ]
    elif isinstance(message, Chunk):
        crc = crc32(message.payload) if message.crc is None else message.crc
        fields = ["C", str(message.seq), f"{crc:08X}", _b64(message.payload)]
    elif isinstance(message, Finish):
        fields = ["F"]
    elif isinstance(message, Commit):
        fields = ["M"]
    elif isinstance(message, Abort):
        fields = ["X"]
    else:
        fields = ["S", str(message.code), str(message.next_seq)]
    return encode_line("O", fields)


def _uint(text: str, what: str) -> int:
    if not _UINT.fullmatch(text) or int(text) >= 2**32:
        raise OtaFrameError(f"{what} {text[:16]!r} is not a uint32", OtaStatus.BAD_FRAME)
    return int(text)


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error) as exc:
        raise OtaFrameError(f"{what} is not base64", OtaStatus.BAD_FRAME) from exc


def _expect(fields: Sequence[str], count: int, kind: str) -> None:
    if len(fields) != count:
        raise OtaFrameError(
            f"OTA {kind} frame has {len(fields)} fields, expected {count}", OtaStatus.BAD_FRAME
        )


def decode_ota(fields: Sequence[str]) -> OtaMessage:
    """Decode the fields of an ``O`` line (after the line protocol checked its CRC-16).

    Raises :class:`OtaFrameError` whose ``code`` is the status the receiver answers with.
    """
    if not fields:
        raise OtaFrameError("empty OTA frame", OtaStatus.BAD_FRAME)
    kind, rest = fields[0], fields[1:]
    if kind == "B":
        _expect(rest, 5, "begin")
        magic, version_text, size_text, descriptor_text, signature_text = rest
        if magic != OTA_MAGIC:
            raise OtaFrameError(f"magic {magic[:8]!r} is not {OTA_MAGIC}", OtaStatus.BAD_MAGIC)
        version = _uint(version_text, "protocol version")
        if version != OTA_PROTOCOL_VERSION:
            raise OtaFrameError(
                f"OTA protocol version {version}, this side speaks {OTA_PROTOCOL_VERSION}",
                OtaStatus.UNSUPPORTED_VERSION,
            )
        chunk_size = _uint(size_text, "chunk size")
        if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
            raise OtaFrameError(
                f"chunk size {chunk_size} outside 1..{MAX_CHUNK_SIZE}", OtaStatus.BAD_FRAME
            )
        descriptor = _unb64(descriptor_text, "descriptor")
        if len(descriptor) != DESCRIPTOR_SIZE:
            raise OtaFrameError(
                f"descriptor has {len(descriptor)} bytes, not {DESCRIPTOR_SIZE}",
                OtaStatus.BAD_DESCRIPTOR,
            )
        signature = _unb64(signature_text, "signature")
        if len(signature) != 64:
            raise OtaFrameError("signature is not 64 bytes", OtaStatus.BAD_SIGNATURE)
        return Begin(chunk_size=chunk_size, descriptor=descriptor, signature=signature)
    if kind == "C":
        _expect(rest, 3, "chunk")
        seq = _uint(rest[0], "chunk seq")
        if not _HEX8.fullmatch(rest[1]):
            raise OtaFrameError("chunk CRC is not 8 upper-case hex digits", OtaStatus.BAD_FRAME)
        payload = _unb64(rest[2], "chunk payload")
        if not 1 <= len(payload) <= MAX_CHUNK_SIZE:
            raise OtaFrameError(f"chunk of {len(payload)} bytes", OtaStatus.BAD_FRAME)
        return Chunk(seq=seq, payload=payload, crc=int(rest[1], 16))
    if kind == "S":
        _expect(rest, 2, "status")
        return Status(code=_uint(rest[0], "status code"), next_seq=_uint(rest[1], "next seq"))
    simple: dict[str, OtaMessage] = {"F": Finish(), "M": Commit(), "X": Abort()}
    if kind in simple:
        _expect(rest, 0, kind)
        return simple[kind]
    raise OtaFrameError(f"unknown OTA frame kind {kind[:4]!r}", OtaStatus.BAD_FRAME)
