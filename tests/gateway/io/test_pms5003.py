"""PMS5003 frames: resynchronisation after garbage, checksum rejects, arbitrary chunking, fuzz."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tesla_gateway.contract.readings import ReadingRejectedError, RejectReason
from tesla_gateway.sources.pms5003 import FRAME_LENGTH, Pms5003Frame, Pms5003Parser, encode_frame


def test_frame_layout_matches_the_datasheet() -> None:
    frame = encode_frame(5, 12, 20, cf1=(6, 13, 21), counts=(1, 2, 3, 4, 5, 6))
    assert len(frame) == FRAME_LENGTH
    assert frame[:4] == b"\x42\x4d\x00\x1c"
    assert int.from_bytes(frame[30:], "big") == sum(frame[:30])
    [parsed] = Pms5003Parser().feed(frame)
    assert isinstance(parsed, Pms5003Frame)
    assert (parsed.pm1_cf1, parsed.pm2_5_cf1, parsed.pm10_cf1) == (6, 13, 21)
    assert parsed.values() == {"pm1": 5.0, "pm2_5": 12.0, "pm10": 20.0}  # atmospheric words
    assert parsed.counts == (1, 2, 3, 4, 5, 6)


def test_resynchronises_after_garbage_and_false_starts() -> None:
    corrupt = bytearray(encode_frame(9, 9, 9))
    corrupt[10] ^= 0xFF
    stream = (
        b"\x00\x13garbage\x42"  # a lone start byte
        + encode_frame(1, 2, 3)
        + b"\x42\x4d\x00\x05junk"  # a false start with a wrong length
        + bytes(corrupt)
        + encode_frame(4, 5, 6)
    )
    parser = Pms5003Parser()
    out = parser.feed(stream)
    frames = [item.values()["pm10"] for item in out if isinstance(item, Pms5003Frame)]
    rejects = [item.reason for item in out if isinstance(item, ReadingRejectedError)]
    assert frames == [3.0, 6.0]
    assert rejects.count(RejectReason.BAD_CHECKSUM) == 1
    assert RejectReason.BAD_FRAME in rejects
    assert parser.skipped_bytes > 0


@settings(max_examples=200, deadline=None)
@given(
    frames=st.lists(st.tuples(*[st.integers(0, 1000)] * 3), min_size=1, max_size=8),
    garbage=st.lists(
        st.binary(max_size=20).filter(lambda b: b"\x42\x4d" not in b), min_size=9, max_size=9
    ),
    cut=st.integers(1, 50),
)
def test_any_chunking_with_garbage_between_frames(
    frames: list[tuple[int, int, int]], garbage: list[bytes], cut: int
) -> None:
    stream = b"".join(g + encode_frame(*f) for g, f in zip(garbage, frames, strict=False))
    parser = Pms5003Parser()
    out = []
    for start in range(0, len(stream), cut):
        out += parser.feed(stream[start : start + cut])
    parsed = [item for item in out if isinstance(item, Pms5003Frame)]
    assert [(p.pm1_atm, p.pm2_5_atm, p.pm10_atm) for p in parsed] == frames


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=10))
def test_fuzz_parser_returns_frames_or_rejects_and_stays_bounded(chunks: list[bytes]) -> None:
    parser = Pms5003Parser()
    for chunk in chunks:
        for item in parser.feed(chunk):
            assert isinstance(item, Pms5003Frame | ReadingRejectedError)
        assert len(parser._buffer) < FRAME_LENGTH


def test_skipped_bytes_count_the_garbage_hunted_through() -> None:
    frame = encode_frame(pm1_atm=1, pm2_5_atm=2, pm10_atm=3)
    parser = Pms5003Parser()
    assert parser.feed(frame) != [] and parser.skipped_bytes == 0
    assert parser.feed(b"\x01\x02\x03") == [] and parser.skipped_bytes == 3
    assert parser.feed(b"\x07\x42") == [] and parser.skipped_bytes == 4  # 0x42 kept: 'B' of BM
    (parsed,) = parser.feed(frame[1:])
    assert isinstance(parsed, Pms5003Frame) and parser.skipped_bytes == 4
    assert len(parser.feed(b"\x09\x09" + frame)) == 1 and parser.skipped_bytes == 6
    # A false start (a wrong length field): its first byte is dropped, then hunted through.
    out = parser.feed(b"BM\x00\x05" + frame)
    assert [type(item) for item in out] == [ReadingRejectedError, Pms5003Frame]
    assert parser.skipped_bytes == 6 + 3
    bad = bytearray(frame)
    bad[-1] ^= 0xFF  # a bad checksum: dropped by one byte, then hunted through
    out = parser.feed(bytes(bad) + frame)
    assert [type(item) for item in out] == [ReadingRejectedError, Pms5003Frame]
    assert parser.skipped_bytes == 9 + FRAME_LENGTH - 1


def test_a_wrong_length_field_is_rejected_as_soon_as_it_arrives() -> None:
    (rejected,) = Pms5003Parser().feed(b"BM\x00\x05")
    assert isinstance(rejected, ReadingRejectedError)
    assert rejected.reason is RejectReason.BAD_FRAME
    assert Pms5003Parser().feed(b"BM\x00") == []


def test_the_reserved_word_is_carried_and_zero_by_default() -> None:
    (plain,) = Pms5003Parser().feed(encode_frame(pm1_atm=1, pm2_5_atm=2, pm10_atm=3))
    (marked,) = Pms5003Parser().feed(encode_frame(pm1_atm=1, pm2_5_atm=2, pm10_atm=3, reserved=7))
    assert isinstance(plain, Pms5003Frame) and isinstance(marked, Pms5003Frame)
    assert (plain.reserved, marked.reserved) == (0, 7)
