"""The hand-written MQTT codec (tesla_gateway/mqtt/wire.py) that the fast path and the
benchmark share."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tesla_gateway.mqtt.wire import (
    PUBACK,
    PUBLISH,
    UINT16,
    encode_string,
    puback_packets,
    publish_fields,
    publish_packet,
    remaining_length,
    split_packets,
)

_TOPICS = st.binary(min_size=1, max_size=300)
_PAYLOADS = st.binary(max_size=20_000)
_MESSAGE = st.tuples(
    _TOPICS, _PAYLOADS, st.integers(1, 65_535), st.sampled_from([0, 1]), st.booleans()
)


def _decode_length(encoded: bytes) -> int:
    return sum((byte & 0x7F) << (7 * i) for i, byte in enumerate(encoded))


@given(st.integers(0, 268_435_455))
def test_remaining_length_round_trips_in_one_to_four_bytes(length: int) -> None:
    encoded = remaining_length(length)
    assert 1 <= len(encoded) <= 4
    assert all(byte & 0x80 for byte in encoded[:-1]) and not encoded[-1] & 0x80
    assert _decode_length(encoded) == length


@given(st.lists(_MESSAGE, min_size=1, max_size=8), st.booleans(), st.data())
def test_publish_packets_split_and_decode_back_whatever_the_read_boundaries(
    messages: list[tuple[bytes, bytes, int, int, bool]], v5: bool, data: st.DataObject
) -> None:
    stream = b"".join(
        publish_packet(topic, payload, packet_id, qos, retain=retain, v5=v5)
        for topic, payload, packet_id, qos, retain in messages
    )
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=5)))
    buffer = bytearray()
    decoded: list[tuple[int, bytes]] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        buffer += stream[start:end]
        packets, used = split_packets(buffer)
        del buffer[:used]
        decoded += packets
    assert not buffer
    assert len(decoded) == len(messages)
    for (first, body), (topic, payload, packet_id, qos, retain) in zip(
        decoded, messages, strict=True
    ):
        assert (first >> 4, (first >> 1) & 0x03, bool(first & 0x01)) == (PUBLISH, qos, retain)
        fields = publish_fields(body, qos, v5)
        assert fields is not None
        length, mid, position = fields
        assert body[2 : 2 + length] == topic
        assert mid == (packet_id if qos else 0)
        assert body[position:] == payload


def test_publish_fields_leaves_properties_aliases_and_malformed_bodies_to_paho() -> None:
    with_properties = UINT16.pack(1) + b"t" + UINT16.pack(7) + b"\x02\x01\x01" + b"payload"
    assert publish_fields(with_properties, 1, v5=True) is None
    topic_alias = UINT16.pack(0) + UINT16.pack(7) + b"\x00" + b"payload"
    assert publish_fields(topic_alias, 1, v5=True) is None
    assert publish_fields(b"\x00", 0, v5=False) is None  # shorter than a topic length
    assert publish_fields(UINT16.pack(1) + b"t", 1, v5=False) is None  # no packet id


def test_pubacks_for_several_messages_are_one_write_of_plain_pubacks() -> None:
    packets, used = split_packets(puback_packets([1, 300, 65_535]))
    assert used == 12
    assert packets == [(PUBACK << 4, UINT16.pack(mid)) for mid in (1, 300, 65_535)]


# -- exact bytes at the boundaries (survivors of make mutation) ---------------------------------


def test_remaining_lengths_switch_to_two_bytes_at_128() -> None:
    assert remaining_length(127) == b"\x7f"
    assert remaining_length(128) == b"\x80\x01"
    assert remaining_length(16_383) == b"\xff\x7f"
    assert remaining_length(16_384) == b"\x80\x80\x01"


def test_a_publish_packet_with_the_defaults_is_qos_1_unretained_mqtt_3() -> None:
    assert publish_packet(b"t", b"p") == b"\x32\x06\x00\x01t\x00\x00p"
    assert (
        encode_string("t\u00e9") == b"\x00\x03t\xc3\xa9" and encode_string(b"ab") == b"\x00\x02ab"
    )


def test_packets_split_only_when_whole_whatever_their_length_bytes() -> None:
    big = publish_packet(b"t", bytes(200))  # remaining length 205: two bytes
    small = publish_packet(b"u", b"x")
    assert split_packets(big + small) == (
        [(big[0], big[3:]), (small[0], small[2:])],
        len(big) + len(small),
    )
    assert split_packets(big[:1]) == ([], 0)  # no length byte yet
    assert split_packets(big[:2]) == ([], 0)  # the first of two length bytes only
    assert split_packets(big[:-1]) == ([], 0)  # the body one byte short
    assert split_packets(bytes([0xE0, 0x00])) == ([(0xE0, b"")], 2)  # no body at all
    huge = bytes([PUBLISH << 4]) + remaining_length(3_000_000)
    assert split_packets(huge + bytes(10)) == ([], 0)
    large = publish_packet(b"t", bytes(20_000))  # remaining length 20,005: three bytes
    assert split_packets(large + small) == (
        [(large[0], large[4:]), (small[0], small[2:])],
        len(large) + len(small),
    )
    assert split_packets(large[:-1]) == ([], 0)
