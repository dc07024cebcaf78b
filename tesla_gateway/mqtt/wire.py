"""The MQTT packets the gateway encodes and decodes itself, defined once (MQTT 3.1.1 and 5).

paho encodes and decodes everything else. These are the packets of the hot paths, written by hand
so that a burst costs one write and no per-message objects: PUBLISH (QoS 0/1, no MQTT 5
properties) and PUBACK. The fast path (:mod:`tesla_gateway.mqtt.fast_path`) and the benchmark's
load generator and subscriber use them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

__all__ = [
    "PUBACK",
    "PUBLISH",
    "UINT16",
    "encode_string",
    "puback_packets",
    "publish_fields",
    "publish_packet",
    "remaining_length",
    "split_packets",
]

PUBLISH, PUBACK = 3, 4  # packet types (the high nibble of the first byte)
UINT16 = struct.Struct("!H")
_PUBACK_PACKET = struct.Struct("!BBH")  # fixed header, remaining length 2, packet id
_ONE_BYTE = [bytes([n]) for n in range(128)]  # remaining lengths below 128
_PUBLISH_FIRST_BYTE = {
    (qos, retain): bytes([(PUBLISH << 4) | (qos << 1) | int(retain)])
    for qos in (0, 1, 2)
    for retain in (False, True)
}


def remaining_length(length: int) -> bytes:
    """The fixed header's variable-length size: 7 bits a byte, high bit set while more follow."""
    if length < 128:
        return _ONE_BYTE[length]
    out = bytearray()
    while True:
        byte, length = length % 128, length // 128
        out.append(byte | (0x80 if length else 0))
        if not length:
            return bytes(out)


def encode_string(text: str | bytes) -> bytes:
    """An MQTT string: two bytes of length, then UTF-8."""
    data = text.encode() if isinstance(text, str) else text
    return UINT16.pack(len(data)) + data


def publish_packet(
    topic: bytes,
    payload: bytes,
    packet_id: int = 0,
    qos: int = 1,
    *,
    retain: bool = False,
    v5: bool = False,
) -> bytes:
    """One PUBLISH packet (``packet_id`` only at QoS 1; MQTT 5 with an empty property list).

    Built by concatenation with precomputed first bytes: this is the publisher's
    and the load generator's hot loop.
    """
    properties = b"\x00" if v5 else b""
    if qos:
        size = 4 + len(topic) + len(properties) + len(payload)
        head = _PUBLISH_FIRST_BYTE[qos, retain] + remaining_length(size) + UINT16.pack(len(topic))
        return head + topic + UINT16.pack(packet_id) + properties + payload
    size = 2 + len(topic) + len(properties) + len(payload)
    head = _PUBLISH_FIRST_BYTE[0, retain] + remaining_length(size) + UINT16.pack(len(topic))
    return head + topic + properties + payload


def puback_packets(packet_ids: Iterable[int]) -> bytes:
    """PUBACKs (success, no reason code) for several QoS 1 messages, as one write."""
    pack = _PUBACK_PACKET.pack
    return b"".join(pack(PUBACK << 4, 2, packet_id) for packet_id in packet_ids)


def publish_fields(body: bytes | bytearray, qos: int, v5: bool) -> tuple[int, int, int] | None:
    """Topic length, packet id (0 at QoS 0) and payload offset of a PUBLISH packet's body.

    None when the body is malformed, its topic is empty (an MQTT 5 topic alias) or it carries
    MQTT 5 properties: a full decoder (paho's) must handle it.
    """
    try:
        (length,) = UINT16.unpack_from(body, 0)
        position = 2 + length
        packet_id = 0
        if qos:
            (packet_id,) = UINT16.unpack_from(body, position)
            position += 2
        if v5:
            if body[position] != 0:
                return None
            position += 1
    except (struct.error, IndexError):
        return None
    if length == 0:
        return None
    return length, packet_id, position


def split_packets(buffer: bytes | bytearray) -> tuple[list[tuple[int, bytes]], int]:
    """Complete packets at the start of ``buffer`` as (first byte, body); bytes consumed."""
    packets: list[tuple[int, bytes]] = []
    pos, end = 0, len(buffer)
    while pos + 2 <= end:
        length, multiplier, cursor = 0, 1, pos + 1
        while cursor < end:
            byte = buffer[cursor]
            length += (byte & 0x7F) * multiplier
            multiplier *= 128
            cursor += 1
            if not byte & 0x80:
                break
        else:
            break
        if cursor + length > end:
            break
        packets.append((buffer[pos], bytes(buffer[cursor : cursor + length])))
        pos = cursor + length
    return packets, pos
