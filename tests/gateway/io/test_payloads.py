"""The JSON reading payloads: every documented variant, every reject reason, and fuzzing."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tesla_gateway.contract.readings import ReadingRejectedError, RejectReason
from tesla_gateway.sources import payloads, payloads_fast
from tesla_gateway.sources.payload_rules import MILLISECONDS_THRESHOLD, PayloadRules, epoch_seconds
from tesla_gateway.sources.payloads import DecodedPayload, decode_payload, decode_payload_fully

NOW = 1_700_000_000.0
RULES = PayloadRules(max_payload_bytes=4096, max_batch=10)


def decode(payload: bytes | str, topic_sensor_id: str | None = None) -> DecodedPayload:
    raw = payload.encode() if isinstance(payload, str) else payload
    return decode_payload(
        raw, topic_sensor_id=topic_sensor_id, received_at=NOW, source="test", rules=RULES
    )


@pytest.mark.parametrize(
    ("payload", "timestamp"),
    [
        ('{"sensor": "s1", "ts": 1699999940, "pm10": 12.5}', 1699999940.0),
        ('{"sensor": "s1", "ts": 1699999940.5, "pm10": 12.5}', 1699999940.5),
        ('{"sensor": "s1", "ts": 1699999940123, "pm10": 12.5}', 1699999940.123),
        ('{"sensor": "s1", "timestamp": "2023-11-14T22:12:20Z", "pm10": 12.5}', 1699999940.0),
        ('{"sensor": "s1", "time": "2023-11-14T23:12:20+01:00", "pm10": 12.5}', 1699999940.0),
        ('{"sensor": "s1", "pm10": 12.5}', NOW),
    ],
)
def test_timestamp_variants(payload: str, timestamp: float) -> None:
    [reading] = decode(payload).readings
    assert reading.sensor_id == "s1"
    assert reading.timestamp == pytest.approx(timestamp)
    assert dict(reading.values) == {"pm10": 12.5}


def test_all_fields_and_aliases() -> None:
    payload = {
        "sensor": "s1",
        "ts": NOW,
        "pm1": 1,
        "pm25": 2.5,
        "pm10": 10,
        "humidity": 55,
        "temperature": -3.5,
    }
    [reading] = decode(json.dumps(payload)).readings
    assert dict(reading.values) == {
        "pm1": 1.0,
        "pm2_5": 2.5,
        "pm10": 10.0,
        "rh": 55.0,
        "temp_c": -3.5,
    }


def test_sensor_from_topic_and_agreement() -> None:
    [reading] = decode('{"pm10": 3}', topic_sensor_id="t7").readings
    assert reading.sensor_id == "t7"
    assert decode('{"sensor": "t7", "pm10": 3}', topic_sensor_id="t7").readings
    with pytest.raises(ReadingRejectedError) as info:
        decode_one('{"sensor": "other", "pm10": 3}', topic_sensor_id="t7")
    assert info.value.reason is RejectReason.BAD_SENSOR_ID


def decode_one(payload: str, topic_sensor_id: str | None = None) -> None:
    """Decode a single-object payload and re-raise its element reject, if any."""
    result = decode(payload, topic_sensor_id)
    if result.rejects:
        raise result.rejects[0]


def test_batch_keeps_good_elements_and_rejects_bad_ones() -> None:
    batch = [
        {"sensor": "a", "ts": NOW - 60, "pm10": 1},
        {"sensor": "a", "ts": NOW, "pm10": -1},
        {"sensor": "b", "ts": NOW, "pm2_5": 4},
        "not an object",
    ]
    result = decode(json.dumps(batch))
    assert [(r.sensor_id, r.timestamp) for r in result.readings] == [("a", NOW - 60), ("b", NOW)]
    assert [e.reason for e in result.rejects] == [RejectReason.NEGATIVE, RejectReason.SCHEMA]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xff\xfe{}", RejectReason.BAD_ENCODING),
        (b'{"sensor": "s1", "pm10": ', RejectReason.BAD_JSON),
        (b"[" * 2000 + b"]" * 2000, RejectReason.BAD_JSON),
        (b'"just a string"', RejectReason.SCHEMA),
        (b"[]", RejectReason.NO_VALUES),
        (json.dumps([{"sensor": "s", "pm10": 1}] * 11).encode(), RejectReason.TOO_LARGE),
        (b'{"sensor": "s1", "pm10": 1, "pad": "' + b"x" * 5000 + b'"}', RejectReason.TOO_LARGE),
    ],
)
def test_whole_payload_rejects(payload: bytes, reason: RejectReason) -> None:
    with pytest.raises(ReadingRejectedError) as info:
        decode(payload)
    assert info.value.reason is reason


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ('{"sensor": "s1", "pm10": "12"}', RejectReason.SCHEMA),
        ('{"sensor": "s1", "pm10": true}', RejectReason.SCHEMA),
        ('{"sensor": "s1", "pm10": 1, "co2": 400}', RejectReason.UNKNOWN_FIELD),
        ('{"pm10": 1}', RejectReason.SCHEMA),
        ('{"sensor": "bad/id", "pm10": 1}', RejectReason.BAD_SENSOR_ID),
        ('{"sensor": "s1"}', RejectReason.NO_VALUES),
        ('{"sensor": "s1", "pm10": NaN}', RejectReason.NOT_FINITE),
        ('{"sensor": "s1", "pm10": Infinity}', RejectReason.NOT_FINITE),
        ('{"sensor": "s1", "pm10": -0.5}', RejectReason.NEGATIVE),
        ('{"sensor": "s1", "pm10": 5000}', RejectReason.OUT_OF_RANGE),
        ('{"sensor": "s1", "rh": 101}', RejectReason.BAD_COVARIATE),  # nothing else: no reading
        ('{"sensor": "s1", "ts": 1700000900, "pm10": 1}', RejectReason.FUTURE_TIMESTAMP),
        ('{"sensor": "s1", "ts": 1000, "pm10": 1}', RejectReason.STALE_TIMESTAMP),
        ('{"sensor": "s1", "ts": "2023-11-14T22:12:20", "pm10": 1}', RejectReason.SCHEMA),
        ('{"sensor": "s1", "ts": "yesterday", "pm10": 1}', RejectReason.SCHEMA),
    ],
)
def test_element_rejects(payload: str, reason: RejectReason) -> None:
    with pytest.raises(ReadingRejectedError) as info:
        decode_one(payload)
    assert info.value.reason is reason


def test_unknown_sensor_policy() -> None:
    rules = PayloadRules(allowed_sensors=frozenset({"known"}))
    result = decode_payload(
        b'{"sensor": "stranger", "pm10": 1}',
        topic_sensor_id=None,
        received_at=NOW,
        source="test",
        rules=rules,
    )
    assert [e.reason for e in result.rejects] == [RejectReason.UNKNOWN_SENSOR]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                ["sensor", "ts", "time", "timestamp", "pm10", "pm2_5", "pm1", "rh", "temp_c", "x"]
            )
            | st.text(max_size=8),
            children,
            max_size=6,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_fuzz_structured_json_never_raises_anything_but_a_reject(document: object) -> None:
    payload = json.dumps(document).encode()
    try:
        result = decode(payload, topic_sensor_id=None)
    except ReadingRejectedError:
        return
    for reading in result.readings:
        assert reading.values


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_bytes_never_raise_anything_but_a_reject(payload: bytes) -> None:
    with contextlib.suppress(ReadingRejectedError):
        decode(payload, topic_sensor_id="s1")


reading_like = st.dictionaries(
    st.sampled_from(sorted(payloads._FIELD_OF_KEY)) | st.sampled_from(["x", "co2"]),
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats()
    | st.text(max_size=70),
    max_size=7,
)


@settings(max_examples=1000, deadline=None)
@given(reading_like)
def test_plain_fast_path_agrees_with_the_model(element: dict[str, object]) -> None:
    """The pydantic-free path reads exactly what ReadingPayload reads, or defers to it."""
    fields = payloads._plain_fields(element)
    try:
        model = payloads.ReadingPayload.model_validate(element)
    except ValidationError:
        assert fields is None
        return
    if fields is None:
        return  # deferring is always allowed
    sensor, ts, values, seq = fields
    assert sensor == model.sensor
    assert _same(ts, model.ts)
    assert seq == model.seq
    assert list(values) == list(model.values())
    assert all(_same(a, b) for a, b in zip(values.values(), model.values().values(), strict=True))


def _same(a: object, b: object) -> bool:
    """Equal, with NaN equal to NaN."""
    nans = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return a == b or nans


def test_plain_fast_path_takes_the_usual_payloads() -> None:
    assert payloads._plain_fields({"ts": 1_700_000_000, "pm10": 12.5}) is not None
    assert payloads._plain_fields({"sensor": "s1", "time": "2023-11-14T22:12:20Z", "pm25": 3})


def test_the_optional_sequence_number_is_carried_into_the_reading() -> None:
    [numbered] = decode('{"sensor": "s1", "seq": 4294967295, "pm10": 1}').readings
    assert numbered.seq == 2**32 - 1
    [plain] = decode('{"sensor": "s1", "pm10": 1}').readings
    assert plain.seq is None
    assert payloads.ReadingPayload.model_validate({"seq": 7, "pm10": 1}).seq == 7


@pytest.mark.parametrize("seq", ["-1", "4294967296", "1.0", "true", '"5"'])
def test_a_sequence_number_must_be_a_uint32(seq: str) -> None:
    with pytest.raises(ReadingRejectedError) as info:
        decode_one(f'{{"sensor": "s1", "seq": {seq}, "pm10": 1}}')
    assert info.value.reason is RejectReason.SCHEMA


# -- the C path (msgspec) against the full rules ------------------------------------------------

needs_msgspec = pytest.mark.skipif(
    not payloads_fast.FAST_DECODE_AVAILABLE, reason="msgspec is not installed on this platform"
)

any_value = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
)
times = st.sampled_from(
    [NOW - 30, NOW, NOW * 1000, NOW + 299, NOW + 301, NOW - 59, NOW - 61, NOW - 10**7, -1.0]
) | st.sampled_from(["2023-11-14T22:12:20Z", "2023-11-14T22:12:20", "junk"])
CHANNEL_KEYS = ["pm1", "pm2_5", "pm25", "pm10", "rh", "humidity", "temp_c", "temperature"]
# Mostly what nodes send, with every kind of near miss: the two paths must part nowhere.
value_of_key = {
    "sensor": st.sampled_from(["s1", "s2", "bad id", "", "x" * 65]),
    "seq": st.integers(min_value=-2, max_value=2**32 + 1) | st.sampled_from([0, 2**32 - 1]),
    **dict.fromkeys(("ts", "timestamp", "time"), times),
    **{
        key: st.floats(min_value=0, max_value=85)
        | st.integers(min_value=0, max_value=85)
        | st.sampled_from([-0.0, -1.0, 100.0, 100.5, 1000.0, 1000.5, -40.0, -40.5, 85.5])
        for key in CHANNEL_KEYS
    },
}


@st.composite
def plain_elements(draw: st.DrawFn) -> dict[str, object]:
    rare = st.integers(0, 19).map(lambda n: n == 0)
    keys = [draw(st.sampled_from(["ts", "ts", "timestamp", "time", "none"]))]
    if draw(rare):
        keys.append(draw(st.sampled_from(["ts", "timestamp", "time"])))  # two spellings
    keys += draw(st.lists(st.sampled_from(["sensor", "seq"]), max_size=2, unique=True))
    keys += draw(st.lists(st.sampled_from(CHANNEL_KEYS), max_size=3, unique=True))
    if draw(rare):
        keys.append("x")
    element: dict[str, object] = {}
    for key in keys:
        if key == "none":
            continue
        near_miss = key == "x" or draw(rare)
        element[key] = draw(any_value if near_miss else value_of_key[key])
    return element


RULE_VARIANTS = [
    RULES,
    PayloadRules(max_payload_bytes=200, max_batch=3, max_age_s=None),
    PayloadRules(allowed_sensors=frozenset({"s1"}), max_future_s=0.0, max_age_s=60.0),
]


@needs_msgspec
@settings(max_examples=1500, deadline=None)
@given(
    st.one_of(plain_elements(), st.lists(plain_elements(), max_size=4)),
    st.sampled_from([None, "s1", "s2"]),
    st.sampled_from(range(len(RULE_VARIANTS))),
)
@example({"ts": NOW + 301, "pm10": 3.0}, "s1", 0)  # the boundaries, always tried
@example({"ts": NOW - 61, "pm10": 3.0}, "s1", 2)
@example({"ts": NOW * 1000, "rh": 100, "humidity": None}, None, 0)
@example([{"sensor": "s2", "pm10": 1}], "s1", 0)
@example({"sensor": "s2", "pm10": 1}, None, 2)
def test_the_c_path_reads_exactly_what_the_full_rules_read(
    document: object, topic_sensor_id: str | None, rules_index: int
) -> None:
    """Whatever msgspec accepts, the full rules accept identically; the rest it defers."""
    payload = json.dumps(document).encode()
    rules = RULE_VARIANTS[rules_index]
    kwargs = {
        "topic_sensor_id": topic_sensor_id,
        "received_at": NOW,
        "source": "test",
        "rules": rules,
    }
    fast = payloads_fast.decode_plain_payload(payload, **kwargs)  # type: ignore[arg-type]
    if fast is None:
        return  # deferring is always allowed
    try:
        full = payloads.decode_payload_fully(payload, **kwargs)  # type: ignore[arg-type]
    except ReadingRejectedError as exc:
        raise AssertionError(f"the C path took what the rules reject: {exc}") from exc
    assert full.rejects == ()
    assert fast == full.readings
    for a, b in zip(fast, full.readings, strict=True):
        assert list(a.values) == list(b.values)  # same order of channels
        assert all(type(v) is float for v in a.values.values())
        assert math.copysign(1.0, a.timestamp) == math.copysign(1.0, b.timestamp)


@needs_msgspec
@pytest.mark.parametrize(
    "payload",
    [
        '{"ts": 1699999940, "pm10": 12.5, "seq": 3}',
        '{"sensor": "s1", "timestamp": 1699999940123, "pm25": 3, "humidity": 40.5}',
        '[{"ts": 1699999940, "pm10": 1}, {"time": 1699999941, "pm10": 2, "temp_c": -3}]',
        '{"sensor": "s1", "pm1": 0, "pm2_5": 1000, "pm10": 7, "rh": 100, "temperature": 85}',
    ],
)
def test_the_c_path_takes_what_nodes_send(payload: str) -> None:
    fast = payloads_fast.decode_plain_payload(
        payload.encode(), topic_sensor_id="s1", received_at=NOW, source="test", rules=RULES
    )
    assert fast is not None
    assert fast == decode(payload, topic_sensor_id="s1").readings


@pytest.mark.parametrize(
    "payload",
    [
        '{"ts": 1699999940, "pm10": 12.5, "pm10": 13.5}',  # duplicate key: the last wins
        '{"ts": 1699999940, "pm10": -1}',
        '{"ts": 1699999940, "pm2_5": 1, "pm25": 2}',
        '{"ts": "2023-11-14T22:12:20Z", "pm10": 1e400}',
        '{"ts": NaN, "pm10": 1}',
        '{"ts": 1699999940, "pm10": 1, "x": 2}',
        '[{"pm10": 1}, {"pm10": true}]',
    ],
)
def test_with_and_without_the_c_path_every_payload_ends_the_same(
    payload: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The platforms without msgspec (32-bit Raspberry Pi OS) get the same answers."""

    def outcome() -> object:
        try:
            decoded = decode(payload, topic_sensor_id="s1")
        except ReadingRejectedError as exc:
            return exc.reason, exc.detail
        return decoded.readings, [(r.reason, r.detail) for r in decoded.rejects]

    with_c_path = outcome()
    monkeypatch.setattr(payloads_fast, "_DECODER", None)
    assert outcome() == with_c_path


# -- a bad covariate costs the covariate, never the PM (issue 26) ------------------------------


@pytest.mark.parametrize("rh", ["400", "-50", "NaN", "1e400", '"55"', '"abc"', "true", "[1]"])
@pytest.mark.parametrize("c_path", [True, False])
def test_a_bad_covariate_is_dropped_and_counted_and_the_reading_kept(
    rh: str, c_path: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not c_path:
        monkeypatch.setattr(payloads_fast, "_DECODER", None)
    payload = f'{{"ts": 1699999940, "pm10": 12.5, "rh": {rh}, "temperature": 21}}'
    decoded = decode(payload, topic_sensor_id="s1")
    [reading] = decoded.readings
    assert dict(reading.values) == {"pm10": 12.5, "temp_c": 21.0}
    [reject] = decoded.rejects
    assert reject.reason is RejectReason.BAD_COVARIATE
    assert reject.sensor_id == "s1"
    assert reject.detail.startswith("rh") and reject.detail.endswith("rh dropped, the reading kept")
    assert reading.dropped == (reject,)


def test_a_bad_pm_value_still_rejects_the_whole_reading() -> None:
    decoded = decode(
        '[{"ts": 1699999940, "pm10": -1, "rh": 400}, {"ts": 1699999941, "rh": 400},'
        ' {"ts": 1699999942, "pm10": 3, "rh": "x", "temp_c": 99}]',
        topic_sensor_id="s1",
    )
    assert [dict(r.values) for r in decoded.readings] == [{"pm10": 3.0}]
    assert [r.reason for r in decoded.rejects] == [
        RejectReason.NEGATIVE,  # the PM is bad: the reading goes, its rh with it (one reject)
        RejectReason.BAD_COVARIATE,  # nothing but a bad rh: nothing is left
        RejectReason.BAD_COVARIATE,  # rh, not a number
        RejectReason.BAD_COVARIATE,  # temp_c above 85 °C
    ]
    assert "no other value" in decoded.rejects[1].detail


# -- both paths at the edges (survivors of make mutation) --------------------------------------

_EDGES = [
    '{"pm10": 1}',  # no time of its own: stamped at the gateway
    f'{{"ts": {NOW}, "time": {NOW}, "pm10": 1}}',  # two spellings of the time
    f'{{"ts": {NOW}, "timestamp": {NOW}, "pm10": 1}}',
    f'{{"timestamp": {NOW}, "time": {NOW}, "pm10": 1}}',
    f'{{"ts": {NOW}, "timestamp": {NOW - 60}, "time": {NOW - 120}, "pm10": 1}}',
    f'{{"ts": {NOW}, "pm10": 1}}',
    f'{{"ts": {NOW - 604_800}, "pm10": 1}}',  # exactly as old as allowed
    f'{{"ts": {NOW - 604_800.5}, "pm10": 1}}',
    f'{{"ts": {NOW + 300}, "pm10": 1}}',  # exactly as far ahead as allowed
    f'{{"ts": {NOW + 300.5}, "pm10": 1}}',
    '{"sensor": "' + "x" * 65 + '", "pm10": 1}',
    '{"sensor": "s1", "pm10": 1, "rh": "55", "humidity": 50}',
    "[" + ", ".join(['{"pm10": 1}'] * 10) + "]",  # exactly the batch limit
]


@pytest.mark.parametrize("topic_sensor_id", [None, "s1"])  # "s1": the C path reads the rest
@pytest.mark.parametrize("payload", _EDGES)
def test_at_the_edges_both_paths_end_the_same(
    payload: str, topic_sensor_id: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def outcome() -> object:
        try:
            decoded = decode(payload, topic_sensor_id=topic_sensor_id)
        except ReadingRejectedError as exc:
            return exc.reason, exc.detail
        return decoded.readings, [(r.reason, r.detail) for r in decoded.rejects]

    with_c_path = outcome()
    monkeypatch.setattr(payloads_fast, "_DECODER", None)
    assert outcome() == with_c_path


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ('{"sensor": "' + "x" * 65 + '", "pm10": 1}', RejectReason.SCHEMA),
        ('{"sensor": "s1", "pm25": 1, "pm2_5": 2}', RejectReason.UNKNOWN_FIELD),
        ('{"sensor": "s1", "pm10": 1, "rh": "55", "humidity": 50}', RejectReason.UNKNOWN_FIELD),
    ],
    ids=["sensor-65", "two-aliases", "alias-and-bad-covariate"],
)
def test_elements_the_model_refuses_are_refused(payload: str, reason: RejectReason) -> None:
    decoded = decode_payload_fully(
        payload.encode(), topic_sensor_id=None, received_at=NOW, source="test", rules=RULES
    )
    assert decoded.readings == () and [r.reason for r in decoded.rejects] == [reason]


def test_readings_without_a_time_are_stamped_at_the_gateway() -> None:
    (stamped,) = decode('{"pm10": 1}', topic_sensor_id="s1").readings
    (own,) = decode(f'{{"ts": {NOW - 5}, "pm10": 1}}', topic_sensor_id="s1").readings
    assert stamped.stamped_at_gateway and not own.stamped_at_gateway


def test_the_limits_are_inclusive() -> None:
    rules = PayloadRules(max_payload_bytes=64, max_batch=2, max_future_s=10.0)
    element = '{"sensor": "s1", "pm10": 1}'
    exact = element + " " * (64 - len(element))
    kwargs = {"topic_sensor_id": None, "received_at": NOW, "source": "test", "rules": rules}
    assert len(decode_payload_fully(exact.encode(), **kwargs).readings) == 1  # type: ignore[arg-type]
    batch = f"[{element}, {element}]".encode()
    assert len(decode_payload_fully(batch, **kwargs).readings) == 2  # type: ignore[arg-type]
    iso_ahead = '{"sensor": "s1", "ts": "2023-11-14T22:15:00Z", "pm10": 1}'  # 100 s ahead
    decoded = decode_payload_fully(iso_ahead.encode(), **kwargs)  # type: ignore[arg-type]
    assert [r.reason for r in decoded.rejects] == [RejectReason.FUTURE_TIMESTAMP]


def test_epoch_numbers_from_the_threshold_on_are_milliseconds() -> None:
    assert epoch_seconds(MILLISECONDS_THRESHOLD) == MILLISECONDS_THRESHOLD / 1000.0
    assert epoch_seconds(MILLISECONDS_THRESHOLD - 1) == MILLISECONDS_THRESHOLD - 1


def test_a_seq_out_of_range_is_refused_and_a_plain_reading_drops_nothing() -> None:
    for seq in (-1, 2**32):
        decoded = decode(f'{{"sensor": "s1", "seq": {seq}, "pm10": 1}}')
        assert decoded.readings == () and len(decoded.rejects) == 1
    (plain,) = decode('{"sensor": "s1", "seq": 7, "pm10": 1}').readings
    assert plain.seq == 7 and plain.dropped == ()  # (consumers iterate it: never None)


def test_pm1_is_kept_when_the_model_reads_the_element() -> None:
    # The bad rh sends the element through ReadingPayload (not the plain path).
    (reading,) = decode('{"sensor": "s1", "pm1": 1, "pm10": 2, "rh": "55"}').readings
    assert dict(reading.values) == {"pm1": 1.0, "pm10": 2.0}
