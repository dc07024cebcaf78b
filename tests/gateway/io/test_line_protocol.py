"""The serial line protocol: shared vectors, round trips, framing, and fuzzing."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tesla_gateway.contract.readings import ReadingRejectedError, RejectReason
from tesla_gateway.sources.line_protocol import (
    MAX_LINE_BYTES,
    Hello,
    HelloRequest,
    LineProtocolError,
    LineSplitter,
    NodeReading,
    OtaFrame,
    TimeSync,
    crc16_ccitt_false,
    decode_line,
    encode_hello,
    encode_line,
    encode_reading,
    encode_time,
    iter_lines,
)
from tests.gateway.io.line_vectors import VECTORS_PATH, render


def as_expectation(line: object) -> dict[str, object]:
    if isinstance(line, Hello):
        return {
            "type": "H",
            "protocol_version": line.protocol_version,
            "node_id": line.node_id,
            "firmware_version": line.firmware_version,
            "model_name": line.model_name,
            "model_version": line.model_version,
        }
    if isinstance(line, NodeReading):
        return {
            "type": "R",
            "node_id": line.node_id,
            "seq": line.seq,
            "timestamp": line.timestamp,
            "values": dict(line.values),
            "calibrated": dict(line.calibrated),
            "model_version": line.model_version,
        }
    if isinstance(line, HelloRequest):
        return {"type": "Q"}
    if isinstance(line, TimeSync):
        return {"type": "T", "unix_s": line.unix_s, "utc_offset_s": line.utc_offset_s}
    assert isinstance(line, OtaFrame)
    return {"type": "O", "fields": list(line.fields)}


def test_crc_check_value() -> None:
    assert crc16_ccitt_false(b"123456789") == 0x29B1


def bitwise_crc(data: bytes) -> int:
    """The textbook bit-at-a-time CRC-16/CCITT-FALSE, as a firmware would write it."""
    crc = 0xFFFF
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc


@given(st.binary(max_size=200))
def test_crc_equals_bitwise_crc(data: bytes) -> None:
    assert crc16_ccitt_false(data) == bitwise_crc(data)


def test_committed_vectors_are_current() -> None:
    assert VECTORS_PATH.read_text(encoding="utf-8") == render(), (
        "tests/vectors/line_protocol.json is stale: run python -m tests.gateway.io.line_vectors"
    )


VECTORS = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))["vectors"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vector(vector: dict[str, object]) -> None:
    line = bytes.fromhex(str(vector["line_hex"]))
    expect = vector["expect"]
    assert isinstance(expect, dict)
    if "ok" in expect:
        assert as_expectation(decode_line(line)) == expect["ok"]
    else:
        with pytest.raises(ReadingRejectedError) as info:
            decode_line(line)
        assert info.value.reason.value == expect["reject"]


def test_vectors_cover_every_reject_reason_the_decoder_uses() -> None:
    reasons = {v["expect"]["reject"] for v in VECTORS if "reject" in v["expect"]}
    assert reasons == {
        "bad_checksum",
        "bad_frame",
        "bad_encoding",
        "bad_sensor_id",
        "unknown_field",
        "too_large",
    }


def test_nan_is_carried_for_the_validator_to_reject() -> None:
    line = encode_reading("n1", 1, None, {"pm10": math.nan})
    decoded = decode_line(line)
    assert isinstance(decoded, NodeReading)
    assert math.isnan(decoded.values["pm10"])


def test_encoder_refuses_what_the_protocol_cannot_carry() -> None:
    with pytest.raises(LineProtocolError):
        encode_reading("bad id", 1, None, {"pm10": 1})
    with pytest.raises(LineProtocolError):
        encode_reading("n1", 1, None, {"pm10": 1}, calibrated={"cal_pm10": 1})
    with pytest.raises(LineProtocolError):
        encode_hello("n1", "1,2")
    with pytest.raises(LineProtocolError, match="clock set"):
        encode_time(86_400, 0)  # a gateway whose clock is not set teaches no node
    with pytest.raises(LineProtocolError, match="14 h"):
        encode_time(1_767_225_600, 15 * 3600)


values = st.floats(min_value=-1000, max_value=1000, allow_nan=False).map(lambda v: round(v, 3))


@settings(max_examples=300, deadline=None)
@given(
    node_id=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,20}\Z"),
    seq=st.integers(0, 2**32 - 1),
    timestamp=st.none() | st.integers(0, 2**32 - 1).map(float),
    raw=st.dictionaries(st.sampled_from(["pm1", "pm2_5", "pm10", "rh", "temp_c"]), values),
    calibrated=st.dictionaries(st.sampled_from(["cal_pm1", "cal_pm2_5", "cal_pm10"]), values),
)
def test_reading_round_trip(
    node_id: str,
    seq: int,
    timestamp: float | None,
    raw: dict[str, float],
    calibrated: dict[str, float],
) -> None:
    model_version = 7 if calibrated else None
    line = encode_reading(
        node_id, seq, timestamp, raw, calibrated=calibrated, model_version=model_version
    )
    assert len(line) <= MAX_LINE_BYTES
    decoded = decode_line(line)
    assert isinstance(decoded, NodeReading)
    assert (decoded.node_id, decoded.seq, decoded.timestamp) == (node_id, seq, timestamp)
    assert dict(decoded.values) == pytest.approx(raw, abs=1e-3)
    assert dict(decoded.calibrated) == pytest.approx(calibrated, abs=1e-3)
    assert decoded.model_version == model_version


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=600))
def test_fuzz_decoder_only_rejects(data: bytes) -> None:
    with contextlib.suppress(ReadingRejectedError):
        decode_line(data)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 200), st.integers(0, 7))
def test_any_single_bit_flip_is_caught(position: int, bit: int) -> None:
    line = bytearray(encode_reading("node-7", 42, 1700000000, {"pm2_5": 7.5, "pm10": 12.25}))
    index = position % (len(line) - 1)  # never the terminator
    line[index] ^= 1 << bit
    with pytest.raises(ReadingRejectedError):
        decode_line(bytes(line))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=30))
def test_splitter_reassembles_any_chunking(cuts: list[int]) -> None:
    lines = [encode_reading("n1", i, None, {"pm10": float(i)}) for i in range(10)]
    stream = b"".join(lines)
    chunks, position = [], 0
    for cut in cuts * 20:
        if position >= len(stream):
            break
        chunks.append(stream[position : position + cut])
        position += cut
    chunks.append(stream[position:])
    splitter = LineSplitter()
    out = [item for chunk in chunks for item in splitter.feed(chunk)]
    assert out == [line[:-1] for line in lines]


def test_splitter_skips_an_overlong_line_once_and_recovers() -> None:
    splitter = LineSplitter()
    good = encode_reading("n1", 1, None, {"pm10": 1})
    out = splitter.feed(b"x" * 300)
    out += splitter.feed(b"y" * 900)  # still the same endless line
    out += splitter.feed(b"z\n" + good)
    rejects = [item for item in out if isinstance(item, ReadingRejectedError)]
    assert [r.reason for r in rejects] == [RejectReason.TOO_LARGE]
    assert out[-1] == good[:-1]


# -- limits and refusals at their edges (survivors of make mutation) ---------------------------


def test_a_line_of_exactly_the_limit_is_carried_and_one_byte_more_is_not() -> None:
    field = "x" * (MAX_LINE_BYTES - 8)  # "O," + field + "*XXXX\n"
    line = encode_line("O", [field])
    assert len(line) == MAX_LINE_BYTES
    assert decode_line(line) == OtaFrame(fields=(field,))
    with pytest.raises(LineProtocolError):
        encode_line("O", [field + "x"])
    body = b"O," + field.encode() + b"x"
    longer = body + f"*{crc16_ccitt_false(body):04X}\n".encode()
    with pytest.raises(ReadingRejectedError) as info:
        decode_line(longer)
    assert info.value.reason is RejectReason.TOO_LARGE


def _framed(body: bytes, end: bytes = b"\n") -> bytes:
    return body + f"*{crc16_ccitt_false(body):04X}".encode() + end


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (_framed(b"R,n1,1,-,pm10=1", b" \r\n"), RejectReason.BAD_ENCODING),  # a space after it
        (_framed(b"Z"), RejectReason.BAD_FRAME),  # an unknown type, even without fields
        (_framed(b"Q,x"), RejectReason.BAD_FRAME),  # a hello request has no fields
        (_framed(b"O,a*b"), RejectReason.BAD_FRAME),  # '*' inside, checksum right
        (_framed(b"R,n1,1,-,pm10=1=2"), RejectReason.BAD_FRAME),
        (_framed(b"R,n1,1,-,cal_pm10=1,cal_pm10=2,mv=3"), RejectReason.BAD_FRAME),
        (_framed(b"R,n1,1,-,pm10=1,mv=3,mv=4"), RejectReason.BAD_FRAME),
    ],
    ids=["space", "unknown-type", "q-fields", "star", "two-equals", "repeated-cal", "repeated-mv"],
)
def test_malformed_lines_are_rejected_for_their_reason(line: bytes, reason: RejectReason) -> None:
    with pytest.raises(ReadingRejectedError) as info:
        decode_line(line)
    assert info.value.reason is reason


def test_a_model_version_may_come_before_the_values() -> None:
    reading = decode_line(_framed(b"R,n1,1,-,mv=3,cal_pm10=2,pm10=1"))
    assert isinstance(reading, NodeReading)
    assert (reading.model_version, dict(reading.values), dict(reading.calibrated)) == (
        3,
        {"pm10": 1.0},
        {"cal_pm10": 2.0},
    )
    assert decode_line(encode_line("Q", [])) == HelloRequest()


def test_line_types_are_one_upper_case_letter() -> None:
    for ok in ("A", "Z"):
        assert encode_line(ok, []).startswith(ok.encode() + b"*")
    for bad in ("a", "AB", "", "[", "@"):
        with pytest.raises(LineProtocolError):
            encode_line(bad, [])


def test_numbers_and_times_as_encoded() -> None:
    line = encode_reading("n1", 1, None, {"pm10": -0.0001, "pm2_5": 2.5})
    assert b",pm2_5=2.5,pm10=0*" in line  # a negative zero is written 0
    with pytest.raises(LineProtocolError):
        encode_reading("n1", 1, -1.0, {"pm10": 1.0})
    with pytest.raises(LineProtocolError, match="unknown keys"):
        encode_reading("n1", 1, None, {"pm10": 1.0, "co2": 400.0})
    with pytest.raises(LineProtocolError, match="unknown keys"):
        encode_reading("n1", 1, None, {"pm10": 1.0}, calibrated={"cal_co2": 1.0}, model_version=1)


def test_the_splitter_skips_an_overlong_line_once_and_keeps_every_other() -> None:
    splitter = LineSplitter(max_line_bytes=8)
    out = splitter.feed(b"12345678")  # the limit reached without a LF: rejected at once
    assert len(out) == 1 and isinstance(out[0], ReadingRejectedError)
    assert out[0].reason is RejectReason.TOO_LARGE
    assert splitter.feed(b"90\nab\n") == [b"ab"]  # the rest of it skipped, once
    assert splitter.feed(b"1234567\n") == [b"1234567"]  # 8 bytes with its LF: kept
    (rejected,) = splitter.feed(b"12345678\n")  # 9: rejected, not kept
    assert isinstance(rejected, ReadingRejectedError)
    assert splitter.feed(b"\r\n  \nXX\n\n") == [b"  ", b"XX"]  # only empty lines skipped
    assert iter_lines([b"a\nb", b"c\n"]) == [b"a", b"bc"]
    assert LineSplitter().feed(b"\nab\n") == [b"ab"]  # a LF first: an empty line, skipped


def test_a_field_holding_a_star_or_a_comma_cannot_be_encoded() -> None:
    for field in ("a*b", "a,b", "a b"):
        with pytest.raises(LineProtocolError):
            encode_line("O", [field])


def test_a_field_with_a_character_outside_ascii_is_refused_as_a_protocol_error() -> None:
    """(Was UnicodeEncodeError: the check read it as '?', a printable character.)"""
    # '\udc80': a byte of a file name os.fsdecode could not decode (surrogateescape); UTF-8
    # refuses to encode it at all (UnicodeEncodeError escaped the check)
    for field in ("caf\u00e9", "\u00b5g", "a?b\u2014", "fw-\udc80"):
        with pytest.raises(LineProtocolError, match="printable ASCII"):
            encode_line("O", [field])
    with pytest.raises(LineProtocolError):
        encode_hello("n\u00f6de", "1.0")
    assert encode_line("O", ["a?b"]).startswith(b"O,a?b*")  # a real '?' is printable ASCII
