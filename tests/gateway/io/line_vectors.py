"""Builds tests/vectors/line_protocol.json: the shared vectors of the serial line protocol.

The Python decoder is checked against the file by test_line_protocol.py; the firmware's host
tests read the same file. Regenerate after a deliberate protocol change with
``.venv/bin/python -m tests.gateway.io.line_vectors`` and review the diff.
"""

from __future__ import annotations

import json
from pathlib import Path

from tesla_gateway.sources.line_protocol import (
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    TIME_MAX_S,
    TIME_MIN_S,
    crc16_ccitt_false,
    encode_hello,
    encode_hello_request,
    encode_line,
    encode_reading,
    encode_time,
)

VECTORS_PATH = Path(__file__).resolve().parents[2] / "vectors" / "line_protocol.json"


def framed(body: str) -> bytes:
    """A line with a correct checksum around any body (to build semantically bad lines)."""
    raw = body.encode("latin-1")
    return raw + b"*" + f"{crc16_ccitt_false(raw):04X}".encode() + b"\n"


def _ok(name: str, line: bytes, expect: dict[str, object]) -> dict[str, object]:
    return {"name": name, "line_hex": line.hex(), "expect": {"ok": expect}}


def _reject(name: str, line: bytes, reason: str) -> dict[str, object]:
    return {"name": name, "line_hex": line.hex(), "expect": {"reject": reason}}


def build_vectors() -> dict[str, object]:
    reading = encode_reading("node-7", 42, 1700000000, {"pm1": 3.2, "pm2_5": 7.5, "pm10": 12.25})
    corrupted = bytearray(reading)
    corrupted[reading.index(b"12.25")] = ord("9")  # a flipped digit, checksum unchanged
    hello = encode_hello("node-7", "1.2.0", "tesla-pm10", 3)  # checksum E70C has letters
    assert hello[-5:-1] != hello[-5:-1].lower()
    bad_crc = reading[:-5] + (b"0000" if not reading.endswith(b"*0000\n") else b"0001") + b"\n"
    vectors = [
        _ok(
            "hello with model",
            hello,
            {
                "type": "H",
                "protocol_version": PROTOCOL_VERSION,
                "node_id": "node-7",
                "firmware_version": "1.2.0",
                "model_name": "tesla-pm10",
                "model_version": 3,
            },
        ),
        _ok(
            "hello without model",
            encode_hello("node-8", "0.9.1"),
            {
                "type": "H",
                "protocol_version": PROTOCOL_VERSION,
                "node_id": "node-8",
                "firmware_version": "0.9.1",
                "model_name": None,
                "model_version": None,
            },
        ),
        _ok(
            "reading, raw PM with node time",
            reading,
            {
                "type": "R",
                "node_id": "node-7",
                "seq": 42,
                "timestamp": 1700000000.0,
                "values": {"pm1": 3.2, "pm2_5": 7.5, "pm10": 12.25},
                "calibrated": {},
                "model_version": None,
            },
        ),
        _ok(
            "reading without a clock",
            encode_reading("node-7", 0, None, {"pm10": 0.0}),
            {
                "type": "R",
                "node_id": "node-7",
                "seq": 0,
                "timestamp": None,
                "values": {"pm10": 0.0},
                "calibrated": {},
                "model_version": None,
            },
        ),
        _ok(
            "reading with climate and on-device calibration",
            encode_reading(
                "node-7",
                4294967295,
                1700000060.25,
                {"pm1": 1, "pm2_5": 2, "pm10": 30.5, "rh": 64.5, "temp_c": -3.75},
                calibrated={"cal_pm10": 21.125, "cal_pm2_5": 1.5},
                model_version=3,
            ),
            {
                "type": "R",
                "node_id": "node-7",
                "seq": 4294967295,
                "timestamp": 1700000060.25,
                "values": {"pm1": 1.0, "pm2_5": 2.0, "pm10": 30.5, "rh": 64.5, "temp_c": -3.75},
                "calibrated": {"cal_pm2_5": 1.5, "cal_pm10": 21.125},
                "model_version": 3,
            },
        ),
        _ok(
            "CRLF terminator tolerated",
            reading[:-1] + b"\r\n",
            {
                "type": "R",
                "node_id": "node-7",
                "seq": 42,
                "timestamp": 1700000000.0,
                "values": {"pm1": 3.2, "pm2_5": 7.5, "pm10": 12.25},
                "calibrated": {},
                "model_version": None,
            },
        ),
        _ok("hello request", encode_hello_request(), {"type": "Q"}),
        _ok(
            "OTA frame (reserved, fields carried through)",
            encode_line("O", ["1", "BEGIN", "abc"]),
            {"type": "O", "fields": ["1", "BEGIN", "abc"]},
        ),
        _ok(
            "time, a zone east of UTC",
            encode_time(1767225600, 3600),
            {"type": "T", "unix_s": 1767225600, "utc_offset_s": 3600},
        ),
        _ok(
            "time, a zone west of UTC",
            encode_time(1780000123, -18000),
            {"type": "T", "unix_s": 1780000123, "utc_offset_s": -18000},
        ),
        _ok(
            "time, earliest with the widest offset west",
            encode_time(TIME_MIN_S, -50400),
            {"type": "T", "unix_s": TIME_MIN_S, "utc_offset_s": -50400},
        ),
        _ok(
            "time, latest with the widest offset east",
            encode_time(TIME_MAX_S, 50400),
            {"type": "T", "unix_s": TIME_MAX_S, "utc_offset_s": 50400},
        ),
        _reject("time from an unset clock", framed("T,86400,0"), "bad_frame"),
        _reject("time just before the earliest", framed(f"T,{TIME_MIN_S - 1},0"), "bad_frame"),
        _reject("time just after the latest", framed(f"T,{TIME_MAX_S + 1},0"), "bad_frame"),
        _reject("time offset beyond 14 h", framed("T,1767225600,50401"), "bad_frame"),
        _reject("time offset beyond -14 h", framed("T,1767225600,-50401"), "bad_frame"),
        _reject("time offset with a plus sign", framed("T,1767225600,+3600"), "bad_frame"),
        _reject("time with a fraction", framed("T,1767225600.5,0"), "bad_frame"),
        _reject("time without its offset", framed("T,1767225600"), "bad_frame"),
        _reject("time with a field too many", framed("T,1767225600,0,0"), "bad_frame"),
        _reject("checksum does not match", bad_crc, "bad_checksum"),
        _reject("payload corrupted in transit", bytes(corrupted), "bad_checksum"),
        _reject("lower-case checksum", hello[:-5] + hello[-5:-1].lower() + b"\n", "bad_frame"),
        _reject("no checksum", b"R,node-7,1,-,pm10=3\n", "bad_frame"),
        _reject("unknown line type", framed("Z,1,2"), "bad_frame"),
        _reject("future protocol version", framed("H,2,node-7,1.0.0,-,-"), "bad_frame"),
        _reject("hello with too few fields", framed("H,1,node-7"), "bad_frame"),
        _reject("unknown key", framed("R,node-7,1,-,co2=400"), "unknown_field"),
        _reject("invalid node id", framed("R,node!7,1,-,pm10=3"), "bad_sensor_id"),
        _reject("repeated key", framed("R,node-7,1,-,pm10=3,pm10=4"), "bad_frame"),
        _reject(
            "calibration without model version", framed("R,node-7,1,-,cal_pm10=3"), "bad_frame"
        ),
        _reject("exponent notation", framed("R,node-7,1,-,pm10=1e5"), "bad_frame"),
        _reject("seq beyond uint32", framed("R,node-7,4294967296,-,pm10=3"), "bad_frame"),
        _reject("reading without time field", framed("R,node-7,1"), "bad_frame"),
        _reject("malformed timestamp", framed("R,node-7,1,17e8,pm10=3"), "bad_frame"),
        _reject("not key=value", framed("R,node-7,1,-,pm10"), "bad_frame"),
        _reject("non-ASCII byte", framed("R,node-7,1,-,pm10=3\xb5"), "bad_encoding"),
        _reject("space inside a line", framed("R,node-7,1,-, pm10=3"), "bad_encoding"),
        _reject(
            "longer than the maximum",
            framed("O," + "A" * (MAX_LINE_BYTES - 6)),
            "too_large",
        ),
    ]
    return {
        "protocol": "tesla-gateway serial line protocol (docs/serial-protocol.md)",
        "protocol_version": PROTOCOL_VERSION,
        "max_line_bytes": MAX_LINE_BYTES,
        "crc": {"name": "CRC-16/CCITT-FALSE", "check_input": "123456789", "check_value": "29B1"},
        "vectors": vectors,
    }


def render() -> str:
    return json.dumps(build_vectors(), indent=2, ensure_ascii=True) + "\n"


if __name__ == "__main__":
    VECTORS_PATH.write_text(render(), encoding="utf-8")
    print(f"wrote {VECTORS_PATH}")
