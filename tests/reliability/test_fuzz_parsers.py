"""Every parser that takes outside input, fuzzed with Hypothesis: no crash, no hang, and every
input accounted for (a reading, a counted reject, or a typed error its caller counts).

Inputs: MQTT topics and payloads (through the MQTT source's decode path and its RejectCounter),
serial byte streams (line splitter + line decoder), PMS5003 byte streams, configuration files
(TOML text and structures), OTA frames and OTA release bundles. Hangs are caught by Hypothesis'
per-example deadline and pytest-timeout. Each test reports how many inputs it tried and how many
were rejected, by reason.
"""

from __future__ import annotations

import json
import math
import time
import tomllib
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tesla_gateway.contract.readings import FIELD_LIMITS, ReadingRejectedError
from tesla_gateway.daemon.config import load_config
from tesla_gateway.errors import ConfigError, GatewayError
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.mqtt.inbox import InboundMessage
from tesla_gateway.sources.line_protocol import LineSplitter, decode_line, encode_reading
from tesla_gateway.sources.mqtt_source import MqttSource, MqttSourceConfig
from tesla_gateway.sources.pms5003 import Pms5003Frame, Pms5003Parser, encode_frame
from tests.reliability.harness import report

pytestmark = pytest.mark.reliability

NOW = 1_800_000_000.0
FUZZ = settings(
    max_examples=200,
    deadline=timedelta(seconds=2),  # a hang fails the example
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
_tally: dict[str, Counter[str]] = {}


def tally(name: str, outcome: str, count: int = 1) -> None:
    _tally.setdefault(name, Counter())[outcome] += count


@pytest.fixture(scope="module", autouse=True)
def _report_tally() -> Any:
    yield
    report("fuzz", {name: dict(counts) for name, counts in sorted(_tally.items())})


# -- MQTT ---------------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
reading_objects = st.fixed_dictionaries(
    {},
    optional={
        "sensor": st.text(max_size=70)
        | st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,10}", fullmatch=True),
        "ts": st.floats(NOW - 1e6, NOW + 1e3)
        | st.just(NOW * 1000)
        | st.floats()
        | st.integers(-(2**63), 2**63)
        | st.text(max_size=45)
        | st.just("2027-01-15T08:00:00Z"),
        **{name: st.floats() | st.integers(-5, 2000) | json_scalars for name in FIELD_LIMITS},
        "extra": json_scalars,
    },
)
payloads = (
    st.binary(max_size=300)
    | json_values.map(lambda v: json.dumps(v).encode())
    | reading_objects.map(lambda v: json.dumps(v).encode())
    | st.lists(reading_objects, max_size=8).map(lambda v: json.dumps(v).encode())
)
topics = (
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True).map(
        lambda s: f"sensors/{s}/raw"
    )
    | st.sampled_from(["sensors/+/raw", "sensors", "", "sensors/" + "x" * 70 + "/raw"])
    | st.text(max_size=80)
)


@FUZZ
@given(topic=topics, payload=payloads, sharded=st.booleans())
def test_mqtt_input_path(topic: str, payload: bytes, sharded: bool) -> None:
    shard = {"shard": {"index": 0, "count": 2}} if sharded else {}
    config = MqttSourceConfig.model_validate({"max_payload_bytes": 256, "max_batch": 5, **shard})
    source = MqttSource(config, gateway_id="fuzz", clock=lambda: NOW)
    rejects = RejectCounter()
    message = InboundMessage(topic=topic, payload=payload, qos=1, retain=False)
    readings = source._decode(message, rejects)
    counted = rejects.count()
    for reading in readings:
        assert reading.sensor_id == topic.split("/")[1]
        assert all(math.isfinite(v) for v in reading.values.values())
    try:
        document = json.loads(payload)
    except (ValueError, RecursionError):
        document = None
    elements = len(document) if isinstance(document, list) and 0 < len(document) <= 5 else 1
    # Each element is a reading, a counted reject, or left to another shard; a payload
    # rejected as a whole counts once.
    assert len(readings) + counted + source.other_shard in (elements, 1)
    assert counted or readings or source.other_shard
    tally("mqtt", "readings" if readings else "other_shard" if source.other_shard else "rejected")
    by_reason = rejects.snapshot()["by_reason"]
    assert isinstance(by_reason, dict)
    for reason, n in by_reason.items():
        tally("mqtt_rejects", str(reason), int(n))


# -- serial line protocol -----------------------------------------------------------------

valid_lines = st.builds(
    lambda node, seq, pm10: encode_reading(node, seq, NOW, {"pm10": pm10}),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,15}", fullmatch=True),
    st.integers(0, 2**32 - 1),
    st.floats(0, 1000).map(lambda v: round(v, 3)),
)
serial_streams = st.lists(valid_lines | st.binary(max_size=700), max_size=12)


@FUZZ
@given(stream=serial_streams, cuts=st.lists(st.integers(1, 64), min_size=1, max_size=6))
def test_serial_line_stream(stream: list[bytes], cuts: list[int]) -> None:
    data = b"".join(stream)
    splitter = LineSplitter()
    items: list[bytes | ReadingRejectedError] = []
    position, index = 0, 0
    while position < len(data):  # arbitrary chunking, as reads from a UART arrive
        size = cuts[index % len(cuts)]
        items.extend(splitter.feed(data[position : position + size]))
        position += size
        index += 1
    for item in items:
        if isinstance(item, ReadingRejectedError):
            tally("serial", item.reason.value)
            continue
        assert len(item) < 512
        try:
            decode_line(item)
            tally("serial", "decoded")
        except ReadingRejectedError as exc:
            tally("serial", exc.reason.value)


@FUZZ
@given(st.binary(max_size=600))
def test_serial_single_line(raw: bytes) -> None:
    try:
        decode_line(raw)
    except ReadingRejectedError as exc:
        tally("serial_line", exc.reason.value)
    else:
        tally("serial_line", "decoded")


# -- PMS5003 --------------------------------------------------------------------------------

frames = st.builds(
    lambda a, b, c: encode_frame(pm1_atm=a, pm2_5_atm=b, pm10_atm=c),
    st.integers(0, 1000),
    st.integers(0, 1000),
    st.integers(0, 1000),
)


@FUZZ
@given(parts=st.lists(frames | st.binary(max_size=80), max_size=10), chunk=st.integers(1, 40))
def test_pms5003_stream(parts: list[bytes], chunk: int) -> None:
    data = b"".join(parts)
    parser = Pms5003Parser()
    out: list[Pms5003Frame | ReadingRejectedError] = []
    for start in range(0, len(data), chunk):
        out.extend(parser.feed(data[start : start + chunk]))
    frames_in = sum(1 for part in parts if len(part) == 32 and part[:2] == b"BM")
    decoded = [item for item in out if isinstance(item, Pms5003Frame)]
    assert len(parser._buffer) < 32  # bounded: at most one partial frame is kept
    assert len(decoded) >= frames_in  # garbage never hides an intact frame
    for item in out:
        tally("pms5003", item.reason.value if isinstance(item, ReadingRejectedError) else "frame")


# -- configuration files -----------------------------------------------------------------------

toml_keys = st.sampled_from(
    ["gateway_id", "state_dir", "models", "sources", "publisher", "tick", "sensors", "kind", "x"]
)


def nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=3) | st.dictionaries(toml_keys, inner, max_size=4)


toml_values = st.recursive(
    st.booleans() | st.integers(-10, 10**6) | st.text(max_size=12) | st.floats(allow_nan=False),
    nested,
    max_leaves=15,
)


def toml_text(document: dict[str, Any]) -> str:
    """A tiny TOML writer (inline tables) for the fuzzed structures."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v) if not isinstance(v, float) or math.isfinite(v) else "0"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"

    return "\n".join(f"{json.dumps(k)} = {value(v)}" for k, v in document.items())


@FUZZ
@given(
    text=st.text(max_size=300) | st.dictionaries(toml_keys, toml_values, max_size=6).map(toml_text),
    env=st.dictionaries(
        st.sampled_from(
            [
                "TESLA_GATEWAY__TICK__GRACE_S",
                "TESLA_GATEWAY__SOURCES__0__PORT",
                "TESLA_GATEWAY____X",
            ]
        ),
        st.text(max_size=10),
        max_size=2,
    ),
)
def test_config_files(
    tmp_path_factory: pytest.TempPathFactory, text: str, env: dict[str, str]
) -> None:
    path = tmp_path_factory.mktemp("cfg") / "gateway.toml"
    path.write_text(text, encoding="utf-8")
    try:
        load_config(path, environ=env)
    except ConfigError as exc:
        assert str(exc)  # a message the user can act on
        tally("config", "rejected")
    else:
        tally("config", "accepted")


# -- OTA (issue 5) --------------------------------------------------------------------------


@FUZZ
@given(st.lists(st.text(max_size=40) | st.sampled_from(["B", "C", "F", "M", "X", "S"]), max_size=7))
def test_ota_frames(fields: list[str]) -> None:
    protocol = pytest.importorskip("tesla_gateway.ota.protocol")
    try:
        protocol.decode_ota(fields)
    except GatewayError as exc:
        tally("ota_frame", type(exc).__name__)
    else:
        tally("ota_frame", "decoded")


@FUZZ
@given(payloads)
def test_ota_release_bundles(payload: bytes) -> None:
    release = pytest.importorskip("tesla_gateway.ota.release")
    try:
        release.verify_release(payload, bytes(32), running_version=None)
    except GatewayError as exc:
        tally("ota_bundle", type(exc).__name__)
    else:
        raise AssertionError("a fuzzed bundle passed verification with a zero key")


def test_config_round_trip_sanity(tmp_path: Path) -> None:
    """The fuzzer's TOML writer produces TOML the parser reads back (else the fuzz is void)."""
    document = {"gateway_id": "g", "tick": {"grace_s": 1.5}, "models": [{"x": [1, 2]}]}
    assert tomllib.loads(toml_text(document)) == document
    _ = time
