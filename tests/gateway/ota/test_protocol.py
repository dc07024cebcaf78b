"""OTA frames and the node receiver against tests/vectors/ota_protocol.json (shared with C++)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from tesla_gateway.contract.readings import ReadingRejectedError
from tesla_gateway.ota.descriptor import DESCRIPTOR_SIZE, ImageDescriptor
from tesla_gateway.ota.errors import MalformedReleaseError, OtaFrameError
from tesla_gateway.ota.protocol import (
    MAX_CHUNK_SIZE,
    OTA_MAGIC,
    Begin,
    Chunk,
    OtaStatus,
    Status,
    chunk_count,
    crc32,
    decode_ota,
    encode_ota,
    status_message,
)
from tesla_gateway.sources.line_protocol import MAX_LINE_BYTES, OtaFrame, decode_line
from tests.gateway.ota.ota_vectors import VECTORS_PATH, render
from tests.support.virtual_node import FirmwareProfile, OtaReceiver

VECTORS = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))


def test_committed_vectors_are_current() -> None:
    assert VECTORS_PATH.read_text(encoding="utf-8") == render(), (
        "regenerate with `.venv/bin/python -m tests.gateway.ota.ota_vectors` and review the diff"
    )


def test_crc32_check_value() -> None:
    assert f"{crc32(b'123456789'):08X}" == VECTORS["crc32"]["check_value"]


def test_every_code_has_a_message_and_the_table_is_complete() -> None:
    table = {entry["code"]: entry for entry in VECTORS["status_codes"]}
    assert set(table) == {int(code) for code in OtaStatus}
    for code in OtaStatus:
        assert table[code]["name"] == code.name.lower()
        assert table[code]["message"] == status_message(code)
        assert len(status_message(code)) > 20
    assert "unknown status code" in status_message(99)


def _fields(line_hex: str) -> tuple[str, ...]:
    line = decode_line(bytes.fromhex(line_hex))
    assert isinstance(line, OtaFrame)
    return line.fields


@pytest.mark.parametrize("vector", VECTORS["frames"], ids=lambda v: v["name"])
def test_frames_decode_as_specified(vector: dict[str, object]) -> None:
    raw = bytes.fromhex(str(vector["line_hex"]))
    assert len(raw) <= MAX_LINE_BYTES
    message = decode_ota(_fields(str(vector["line_hex"])))
    expect = dict(vector["expect"])  # type: ignore[call-overload]
    kind = expect.pop("kind")
    assert encode_ota(message) == raw
    if kind == "B":
        assert isinstance(message, Begin)
        assert message.chunk_size == expect["chunk_size"]
        assert message.descriptor.hex() == expect["descriptor_hex"]
        assert message.signature.hex() == expect["signature_hex"]
    elif kind == "C":
        assert isinstance(message, Chunk)
        assert (message.seq, message.crc, message.payload.hex()) == (
            expect["seq"],
            expect["crc"],
            expect["payload_hex"],
        )
    elif kind == "S":
        assert message == Status(int(expect["code"]), int(expect["next_seq"]))


@pytest.mark.parametrize("vector", VECTORS["signatures"], ids=lambda v: v["name"])
def test_signatures(vector: dict[str, object]) -> None:
    key = VerifyKey(bytes.fromhex(VECTORS["public_key_hex"]))
    message = bytes.fromhex(str(vector["message_hex"]))
    signature = bytes.fromhex(str(vector["signature_hex"]))
    try:
        key.verify(message, signature)
        valid = True
    except BadSignatureError:
        valid = False
    assert valid is vector["valid"]


@pytest.mark.parametrize("vector", VECTORS["descriptors"], ids=lambda v: v["name"])
def test_descriptor_vector(vector: dict[str, Any]) -> None:
    raw = bytes.fromhex(vector["hex"])
    if not vector["valid"]:
        with pytest.raises(MalformedReleaseError):
            ImageDescriptor.decode(raw)
        return
    decoded = ImageDescriptor.decode(raw)
    fields = vector["fields"]
    assert decoded.model_name == fields["model_name"]
    assert decoded.image_sha256.hex() == fields["image_sha256"]
    assert (decoded.model_version, decoded.image_size) == (
        fields["model_version"],
        fields["image_size"],
    )
    assert (decoded.window_length, decoded.arena_bytes) == (
        fields["window_length"],
        fields["arena_bytes"],
    )
    assert decoded.min_history_periods == fields["min_history_periods"]
    assert decoded.encode() == raw


def _receiver() -> OtaReceiver:
    node = VECTORS["node"]
    profile = FirmwareProfile(
        model_name=node["model_name"],
        window_length=node["window_length"],
        arena_bytes=node["arena_bytes"],
        input_scale=1.0,
        output_scale=1.0,
        slot_bytes=node["slot_bytes"],
    )
    version = int(node["active_version"])
    return OtaReceiver(profile, bytes.fromhex(VECTORS["public_key_hex"]), lambda: version)


@pytest.mark.parametrize("scenario", VECTORS["scenarios"], ids=lambda v: v["name"])
def test_receiver_scenarios(scenario: dict[str, object]) -> None:
    """Feed each line as the node would: the line protocol first, then the OTA receiver."""
    receiver = _receiver()
    for step in scenario["steps"]:  # type: ignore[attr-defined]
        raw = bytes.fromhex(step["line_hex"])
        try:
            line = decode_line(raw)
        except ReadingRejectedError:
            assert step["answer"] is None  # a damaged line is dropped; the gateway resends
            continue
        assert isinstance(line, OtaFrame)
        status = receiver.handle_fields(line.fields)
        if step["answer"] is None:
            assert status is None
        else:
            assert status is not None
            assert [status.code, status.next_seq] == step["answer"]
            assert encode_ota(status).hex() == step["answer_hex"]


@given(st.lists(st.text(alphabet="ABCOSTXFM0123456789+/=,", max_size=40), max_size=7))
def test_decoder_never_crashes(fields: list[str]) -> None:
    try:
        decode_ota(fields)
    except OtaFrameError as exc:
        assert exc.code in {int(code) for code in OtaStatus}


@given(st.integers(0, 2**32 - 1), st.binary(min_size=1, max_size=MAX_CHUNK_SIZE))
def test_chunks_round_trip_within_the_line_limit(seq: int, payload: bytes) -> None:
    line = encode_ota(Chunk(seq, payload))
    assert len(line) <= MAX_LINE_BYTES
    decoded = decode_line(line)
    assert isinstance(decoded, OtaFrame)
    assert decode_ota(decoded.fields) == Chunk(seq, payload, crc32(payload))


# -- fields at their limits (survivors of make mutation) ----------------------------------------

_DESCRIPTOR = base64.b64encode(bytes(DESCRIPTOR_SIZE)).decode()
_SIGNATURE = base64.b64encode(bytes(64)).decode()


def _begin(chunk_size: str, descriptor: str = _DESCRIPTOR) -> list[str]:
    return ["B", OTA_MAGIC, "1", chunk_size, descriptor, _SIGNATURE]


def test_chunk_sizes_from_1_to_the_maximum_are_accepted() -> None:
    for size in (1, MAX_CHUNK_SIZE):
        begin = decode_ota(_begin(str(size)))
        assert isinstance(begin, Begin) and begin.chunk_size == size
    for size in (0, MAX_CHUNK_SIZE + 1):
        with pytest.raises(OtaFrameError) as info:
            decode_ota(_begin(str(size)))
        assert info.value.code is OtaStatus.BAD_FRAME


def test_numbers_are_uint32_and_base64_is_strict() -> None:
    assert decode_ota(["S", "0", "4294967295"]) == Status(code=0, next_seq=2**32 - 1)
    for bad in ("4294967296", "-1", "1e3", "0x10"):
        with pytest.raises(OtaFrameError):
            decode_ota(["S", "0", bad])
    with pytest.raises(OtaFrameError):
        decode_ota(_begin("8", descriptor="!" + _DESCRIPTOR))


def test_the_number_of_chunks_rounds_up() -> None:
    assert [chunk_count(size, 4) for size in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]
