"""Builds tests/vectors/ota_protocol.json: the shared vectors of the OTA protocol.

The same file drives the Python receiver (tests/support/virtual_node.py:OtaReceiver) and the
firmware's C++ receiver (firmware/test/), so both answer every frame with the same bytes:
CRC-32 and Ed25519 checks, descriptors, frames (valid and corrupted) and receiver scenarios,
plus the status-code table both sides must mirror. Keys and images are derived from fixed seeds
(Ed25519 signatures are deterministic), so the file only changes when the protocol does.
Regenerate with ``.venv/bin/python -m tests.gateway.ota.ota_vectors`` and review the diff.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from nacl.signing import SigningKey

from tesla_gateway.ota.descriptor import DESCRIPTOR_SIZE, ImageDescriptor
from tesla_gateway.ota.protocol import (
    OTA_MAGIC,
    OTA_PROTOCOL_VERSION,
    Abort,
    Begin,
    Chunk,
    Commit,
    Finish,
    OtaMessage,
    OtaStatus,
    Status,
    crc32,
    encode_ota,
    status_message,
)
from tesla_gateway.sources.line_protocol import crc16_ccitt_false

VECTORS_PATH = Path(__file__).resolve().parents[2] / "vectors" / "ota_protocol.json"

SIGNING = SigningKey(hashlib.sha256(b"tesla-ota-test-vectors").digest())
OTHER = SigningKey(hashlib.sha256(b"tesla-ota-test-vectors-other-key").digest())
IMAGE = bytes((i * 37 + 11) % 251 for i in range(600))  # 3 chunks of 256 (256, 256, 88)
CHUNK = 256
NODE = {
    "model_name": "pm10-test",
    "window_length": 360,
    "arena_bytes": 20000,
    "slot_bytes": 65536,
    "active_version": 5,
}


def _descriptor(**changes: object) -> bytes:
    values: dict[str, object] = {
        "model_name": "pm10-test",
        "model_version": 6,
        "image_size": len(IMAGE),
        "image_sha256": hashlib.sha256(IMAGE).digest(),
        "window_length": 360,
        "arena_bytes": 17616,
        "min_history_periods": 1,
    }
    values.update(changes)
    return ImageDescriptor(**values).encode()  # type: ignore[arg-type]


def _with_word(descriptor: bytes, fmt: int, word: int) -> bytes:
    """``descriptor`` with another format byte and u16 at offset 6 (what no valid tool writes)."""
    return (
        descriptor[:4]
        + bytes([fmt])
        + descriptor[5:6]
        + word.to_bytes(2, "little")
        + descriptor[8:]
    )


def _descriptor_vectors(descriptor: bytes) -> list[dict[str, object]]:
    """The descriptor the tool writes (format 2), one from before min_history (format 1), and
    the ones both sides refuse: min_history outside 1..N, format 1 flags, an unknown format."""
    fields = {
        "model_name": "pm10-test",
        "model_version": 6,
        "image_size": len(IMAGE),
        "image_sha256": hashlib.sha256(IMAGE).hexdigest(),
        "window_length": 360,
        "arena_bytes": 17616,
    }
    cases: list[tuple[str, bytes, int | None]] = [
        ("node image", descriptor, 1),
        ("whole windows only", _descriptor(min_history_periods=360), 360),
        ("format 1 states no min_history", _descriptor(min_history_periods=None), None),
    ]
    refused = [
        ("min_history 0", _with_word(descriptor, 2, 0)),
        ("min_history above N", _with_word(descriptor, 2, 361)),
        ("format 1 with flags", _with_word(descriptor, 1, 1)),
        ("unknown format", _with_word(descriptor, 3, 1)),
    ]
    return [
        {
            "name": name,
            "hex": raw.hex(),
            "valid": True,
            "fields": {**fields, "min_history_periods": history},
        }
        for name, raw, history in cases
    ] + [{"name": name, "hex": raw.hex(), "valid": False} for name, raw in refused]


def _begin(descriptor: bytes | None = None, key: SigningKey = SIGNING) -> Begin:
    descriptor = descriptor if descriptor is not None else _descriptor()
    return Begin(CHUNK, descriptor, key.sign(descriptor).signature)


def _chunk(seq: int, *, crc: int | None = None) -> Chunk:
    return Chunk(seq, IMAGE[seq * CHUNK : (seq + 1) * CHUNK], crc)


def _raw(body: str) -> bytes:
    data = body.encode("ascii")
    return data + b"*" + f"{crc16_ccitt_false(data):04X}".encode() + b"\n"


def _step(line: bytes | OtaMessage, answer: tuple[int, int] | None) -> dict[str, object]:
    data = line if isinstance(line, bytes) else encode_ota(line)
    return {
        "line_hex": data.hex(),
        "answer_hex": None if answer is None else encode_ota(Status(*answer)).hex(),
        "answer": None if answer is None else list(answer),
    }


def _scenarios() -> list[dict[str, object]]:
    s = OtaStatus
    wrong_crc = crc32(IMAGE[:CHUNK]) ^ 0x1
    good = [(_begin(), (s.OK, 0))] + [(_chunk(i), (s.OK, i + 1)) for i in range(3)]
    line_damaged = bytearray(encode_ota(_chunk(0)))
    line_damaged[12] ^= 0x01  # a flipped bit: the line's CRC-16 no longer matches
    other_sha = _descriptor(image_sha256=hashlib.sha256(b"something else").digest())
    scenarios: dict[str, list[tuple[bytes | OtaMessage, tuple[int, int] | None]]] = {
        "complete transfer": [*good, (Finish(), (s.VERIFIED, 3))],
        "corrupted chunk is answered crc_mismatch, then resent": [
            (_begin(), (s.OK, 0)),
            (_chunk(0, crc=wrong_crc), (s.CRC_MISMATCH, 0)),
            (_chunk(0), (s.OK, 1)),
        ],
        "damaged line gets no answer": [(_begin(), (s.OK, 0)), (bytes(line_damaged), None)],
        "out of sequence": [(_begin(), (s.OK, 0)), (_chunk(1), (s.OUT_OF_SEQUENCE, 0))],
        "resume: a repeated begin reports what the node has": [
            *good[:3],
            (_begin(), (s.OK, 2)),
            (_chunk(2), (s.OK, 3)),
            (Finish(), (s.VERIFIED, 3)),
        ],
        "another image restarts from zero": [
            *good[:2],
            (_begin(_descriptor(model_version=7)), (s.OK, 0)),
        ],
        "signature by another key": [(_begin(key=OTHER), (s.BAD_SIGNATURE, 0))],
        "signature of other bytes": [
            (
                Begin(CHUNK, _descriptor(), SIGNING.sign(_descriptor(model_version=9)).signature),
                (s.BAD_SIGNATURE, 0),
            ),
        ],
        "downgrade": [(_begin(_descriptor(model_version=4)), (s.DOWNGRADE, 0))],
        "same version": [(_begin(_descriptor(model_version=5)), (s.DOWNGRADE, 0))],
        "other model": [(_begin(_descriptor(model_name="pm2_5-test")), (s.INCOMPATIBLE, 0))],
        "other window": [(_begin(_descriptor(window_length=168)), (s.INCOMPATIBLE, 0))],
        "arena too small": [(_begin(_descriptor(arena_bytes=20001)), (s.INCOMPATIBLE, 0))],
        "format 1 (no min_history) is accepted": [
            (_begin(_descriptor(min_history_periods=None)), (s.OK, 0)),
        ],
        "min_history above N is a bad descriptor": [
            (_begin(_with_word(_descriptor(), 2, 361)), (s.BAD_DESCRIPTOR, 0)),
        ],
        "min_history 0 is a bad descriptor": [
            (_begin(_with_word(_descriptor(), 2, 0)), (s.BAD_DESCRIPTOR, 0)),
        ],
        "image larger than the slot": [(_begin(_descriptor(image_size=65537)), (s.TOO_LARGE, 0))],
        "no session": [
            (_chunk(0), (s.NO_SESSION, 0)),
            (Finish(), (s.NO_SESSION, 0)),
            (Commit(), (s.NOT_VERIFIED, 0)),
        ],
        "finish too early": [*good[:2], (Finish(), (s.INCOMPLETE, 1))],
        "finish one chunk short": [*good[:3], (Finish(), (s.INCOMPLETE, 2))],
        "commit before verify": [*good[:2], (Commit(), (s.NOT_VERIFIED, 1))],
        "sha256 mismatch restarts": [
            (_begin(other_sha), (s.OK, 0)),
            *[(_chunk(i), (s.OK, i + 1)) for i in range(3)],
            (Finish(), (s.SHA_MISMATCH, 0)),
        ],
        "abort forgets the session": [
            *good[:2],
            (Abort(), (s.OK, 0)),
            (_chunk(1), (s.NO_SESSION, 0)),
        ],
        "bad magic": [(_raw("O,B,XOTA,1,256,AAAA,AAAA"), (s.BAD_MAGIC, 0))],
        "unsupported version": [(_raw("O,B,TOTA,2,256,AAAA,AAAA"), (s.UNSUPPORTED_VERSION, 0))],
        "chunk size out of range": [(_raw("O,B,TOTA,1,0,AAAA,AAAA"), (s.BAD_FRAME, 0))],
        "short descriptor": [(_raw("O,B,TOTA,1,256,AAAA,AAAA"), (s.BAD_DESCRIPTOR, 0))],
        "payload not base64": [
            (_begin(), (s.OK, 0)),
            (_raw("O,C,0,00000000,@@@@"), (s.BAD_FRAME, 0)),
        ],
        "crc not hex": [(_begin(), (s.OK, 0)), (_raw("O,C,0,0000000g,AAAA"), (s.BAD_FRAME, 0))],
        "unknown kind": [(_raw("O,Z"), (s.BAD_FRAME, 0))],
        "commit after verify is accepted (the node reboots; no status yet)": [
            *good,
            (Finish(), (s.VERIFIED, 3)),
            (Commit(), None),
        ],
    }
    return [
        {"name": name, "steps": [_step(line, answer) for line, answer in steps]}
        for name, steps in scenarios.items()
    ]


def _frames() -> list[dict[str, object]]:
    """Valid frames and what they decode to (hex for binary fields)."""
    begin = _begin()
    big = Chunk(2**32 - 1, bytes(360))
    cases: list[tuple[str, OtaMessage, dict[str, object]]] = [
        (
            "begin",
            begin,
            {
                "kind": "B",
                "chunk_size": CHUNK,
                "descriptor_hex": begin.descriptor.hex(),
                "signature_hex": begin.signature.hex(),
            },
        ),
        (
            "last chunk",
            _chunk(2),
            {"kind": "C", "seq": 2, "crc": crc32(IMAGE[512:]), "payload_hex": IMAGE[512:].hex()},
        ),
        (
            "largest chunk fits the line limit",
            big,
            {"kind": "C", "seq": 2**32 - 1, "crc": crc32(bytes(360)), "payload_hex": "00" * 360},
        ),
        ("finish", Finish(), {"kind": "F"}),
        ("commit", Commit(), {"kind": "M"}),
        ("abort", Abort(), {"kind": "X"}),
        ("status", Status(21, 7), {"kind": "S", "code": 21, "next_seq": 7}),
    ]
    return [
        {"name": name, "line_hex": encode_ota(message).hex(), "expect": expect}
        for name, message, expect in cases
    ]


def build_vectors() -> dict[str, object]:
    descriptor = _descriptor()
    signature = SIGNING.sign(descriptor).signature
    tampered = bytearray(descriptor)
    tampered[8] ^= 0x01  # the version
    return {
        "protocol": "tesla-gateway OTA protocol (docs/ota-protocol.md)",
        "protocol_version": OTA_PROTOCOL_VERSION,
        "magic": OTA_MAGIC,
        "crc32": {"name": "CRC-32/ISO-HDLC", "check_input": "123456789", "check_value": "CBF43926"},
        "status_codes": [
            {"code": int(code), "name": code.name.lower(), "message": status_message(code)}
            for code in OtaStatus
        ],
        "public_key_hex": bytes(SIGNING.verify_key).hex(),
        "descriptor_size": DESCRIPTOR_SIZE,
        "descriptors": _descriptor_vectors(descriptor),
        "signatures": [
            {
                "name": "valid",
                "message_hex": descriptor.hex(),
                "signature_hex": signature.hex(),
                "valid": True,
            },
            {
                "name": "message altered",
                "message_hex": bytes(tampered).hex(),
                "signature_hex": signature.hex(),
                "valid": False,
            },
            {
                "name": "signature altered",
                "message_hex": descriptor.hex(),
                "signature_hex": (signature[:-1] + bytes([signature[-1] ^ 0x80])).hex(),
                "valid": False,
            },
            {
                "name": "other key",
                "message_hex": descriptor.hex(),
                "signature_hex": OTHER.sign(descriptor).signature.hex(),
                "valid": False,
            },
        ],
        "image_hex": IMAGE.hex(),
        "chunk_size": CHUNK,
        "node": NODE,
        "frames": _frames(),
        "scenarios": _scenarios(),
    }


def render() -> str:
    return json.dumps(build_vectors(), indent=2) + "\n"


if __name__ == "__main__":
    VECTORS_PATH.write_text(render(), encoding="utf-8")
    print(f"wrote {VECTORS_PATH}")
