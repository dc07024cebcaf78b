"""The fleet sources' mappings: each device's documented payload (tests/fixtures/fleet) becomes
the validated reading named in the fixture, and each kind of bad payload is refused with its
reason. Pure functions on real config objects; the HTTP listener and client over real sockets
are in test_fleet_http.py, the daemon end to end in tests/gateway/e2e/test_fleet_sources.py."""

from __future__ import annotations

import contextlib
import json
import re
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tesla_gateway.contract.readings import Reading, ReadingRejectedError, RejectReason
from tesla_gateway.daemon.config import GatewayConfig, load_config
from tesla_gateway.errors import ConfigError
from tesla_gateway.sources.esphome import (
    EsphomeGrouper,
    EsphomeSourceConfig,
    parse_state,
    split_topic,
)
from tesla_gateway.sources.purpleair import PurpleAirSourceConfig, decode_purpleair
from tesla_gateway.sources.sensor_community import (
    SensorCommunitySourceConfig,
    decode_sensor_community,
)
from tesla_gateway.sources.tasmota import TasmotaSourceConfig, decode_tasmota

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "fleet"


def fixture(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return document


def utc(text: str) -> float:
    return datetime.fromisoformat(text).astimezone(UTC).timestamp()


def assert_reading(reading: Reading, expected: dict[str, Any]) -> None:
    assert reading.sensor_id == expected["sensor_id"]
    assert dict(reading.values) == pytest.approx(expected["values"])
    if "timestamp_utc" in expected:
        assert reading.timestamp == utc(expected["timestamp_utc"])


# -- Tasmota -----------------------------------------------------------------------------------

TASMOTA = TasmotaSourceConfig(kind="tasmota", timezone="UTC")


def tasmota(
    document: dict[str, Any],
    config: TasmotaSourceConfig = TASMOTA,
    received_at: float | None = None,
) -> Reading:
    stamp = fixture("tasmota_sensor.json")["expected"]["timestamp_utc"]
    return decode_tasmota(
        json.dumps(document).encode(),
        device="tasmota_9229FE",
        received_at=utc(stamp) + 30 if received_at is None else received_at,
        config=config,
    )


def test_tasmota_sensor_payload_maps_onto_a_reading() -> None:
    case = fixture("tasmota_sensor.json")
    assert_reading(tasmota(case["payload"]), case["expected"])


def test_tasmota_cf1_fahrenheit_zone_and_epoch() -> None:
    payload = fixture("tasmota_sensor.json")["payload"]
    cf1 = tasmota(payload, TasmotaSourceConfig(kind="tasmota", timezone="UTC", pm_kind="cf_1"))
    assert (cf1.values["pm1"], cf1.values["pm2_5"], cf1.values["pm10"]) == (7, 11, 13)
    fahrenheit = tasmota({**payload, "TempUnit": "F", "BME280": {"Temperature": 50.0}})
    assert fahrenheit.values["temp_c"] == pytest.approx(10.0)
    assert "rh" not in fahrenheit.values
    rome = TasmotaSourceConfig(kind="tasmota", timezone="Europe/Rome")  # CEST: UTC+2 in May
    received = utc("2024-05-08T18:27:52Z")
    assert tasmota(payload, rome, received).timestamp == utc("2024-05-08T18:27:22Z")
    with_offset = {**payload, "Time": "2024-05-08T22:27:22+02:00"}
    assert tasmota(with_offset).timestamp == utc("2024-05-08T20:27:22Z")
    epoch = {**payload, "Time": "garbage is ignored when Epoch is there", "Epoch": 1715200042}
    assert tasmota(epoch).timestamp == 1715200042


def test_tasmota_needs_the_devices_timezone(tmp_path: Path) -> None:
    """Tasmota's Time has no offset by default: a source without timezone is refused at load
    with the key named, rather than read as UTC (issue 27)."""
    with pytest.raises(ValidationError, match=r"set timezone on this Tasmota source"):
        TasmotaSourceConfig.model_validate({"kind": "tasmota"})
    config = tmp_path / "gateway.toml"
    config.write_text(
        'gateway_id = "gw"\nstate_dir = "s"\n[[models]]\nfeature = "pm10"\nmodel_dir = "m"\n'
        '[[sources]]\nkind = "tasmota"\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(config, environ={})
    assert "sources[0]: set timezone on this Tasmota source" in str(caught.value)


@pytest.mark.parametrize(
    ("zone", "local_time", "hours"),
    [
        ("Europe/Rome", "2024-05-08T22:27:22", 2),  # east of UTC: was future_timestamp
        ("America/New_York", "2024-05-08T16:27:22", -4),  # west: was shifted 4 h back, silently
        ("Asia/Kathmandu", "2024-05-09T02:12:22", 5.75),
    ],
)
def test_a_local_time_read_in_the_wrong_zone_is_refused_naming_timezone(
    zone: str, local_time: str, hours: float
) -> None:
    payload = {**fixture("tasmota_sensor.json")["payload"], "Time": local_time}
    received = utc("2024-05-08T20:27:40Z")  # 18 s after the measurement
    with pytest.raises(ReadingRejectedError) as caught:
        tasmota(payload, TASMOTA, received)
    assert caught.value.reason is (
        RejectReason.FUTURE_TIMESTAMP if hours > 0 else RejectReason.STALE_TIMESTAMP
    )
    assert f"{hours:+g} h from its receive time" in caught.value.detail
    assert "set timezone on this tasmota source" in caught.value.detail
    right = TasmotaSourceConfig(kind="tasmota", timezone=zone)
    assert tasmota(payload, right, received).timestamp == utc("2024-05-08T20:27:22Z")


def test_a_device_clock_off_by_minutes_is_not_taken_for_a_zone() -> None:
    """Only a whole number of quarter hours (within two minutes) reads as a zone offset: a clock
    three minutes behind is accepted with its own time, as the clock checks downstream expect."""
    payload = {**fixture("tasmota_sensor.json")["payload"], "Time": "2024-05-08T20:24:40"}
    reading = tasmota(payload, TASMOTA, utc("2024-05-08T20:27:40Z"))
    assert reading.timestamp == utc("2024-05-08T20:24:40Z")
    late = {**payload, "Time": "2024-05-08T20:07:40"}  # 20 min: between two quarter hours
    assert tasmota(late, TASMOTA, utc("2024-05-08T20:27:40Z")).timestamp == utc(
        "2024-05-08T20:07:40Z"
    )


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xff\xfe", RejectReason.BAD_ENCODING),
        (b"{not json", RejectReason.BAD_JSON),
        (b"[1, 2]", RejectReason.SCHEMA),
        (b'{"Time": "2024-05-08T20:27:22", "BME280": {"Temperature": 20}}', RejectReason.NO_VALUES),
        (b'{"PMS5003": {"PM2.5": "x"}}', RejectReason.SCHEMA),
        (b'{"PMS5003": {"PM2.5": 9}, "Time": "yesterday"}', RejectReason.SCHEMA),
        (b'{"PMS5003": {"PM2.5": 9, "PM10": 5000}}', RejectReason.OUT_OF_RANGE),
        (b'{"PMS5003": {"PM2.5": 9}, "Time": "2019-01-01T00:00:00"}', RejectReason.STALE_TIMESTAMP),
        (b" " * 20_000, RejectReason.TOO_LARGE),
        (b'{"PMS5003": {"PM2.5": 9}, "Epoch": 1' + b"0" * 400 + b"}", RejectReason.OUT_OF_RANGE),
    ],
)
def test_tasmota_bad_payloads_are_refused_with_their_reason(
    payload: bytes, reason: RejectReason
) -> None:
    with pytest.raises(ReadingRejectedError) as caught:
        decode_tasmota(
            payload, device="t1", received_at=utc("2024-05-08T20:28:00Z"), config=TASMOTA
        )
    assert caught.value.reason is reason


# -- ESPHome -----------------------------------------------------------------------------------


def test_esphome_states_of_one_node_group_into_one_reading() -> None:
    case = fixture("esphome_states.json")
    config = EsphomeSourceConfig(kind="esphome", channels=case["channels"], group_s=60)
    grouper = EsphomeGrouper(config, group_s=60, grace_s=5)
    start = 1_715_200_040.0  # 20 s into a 60 s window
    for offset, (topic, payload) in enumerate(case["messages"]):
        node, object_id = split_topic(topic)
        assert node == case["node"]
        channel = config.channels.get(object_id)
        if channel is None:
            assert object_id == "wifi_signal"  # not mapped: ignored
            continue
        assert grouper.add(node, channel, parse_state(payload.encode()), start + offset) == ([], [])
    assert grouper.close_due(start + 40 + 4.9) == ([], [])  # window end + grace not reached
    readings, rejects = grouper.close_due(start + 40 + 5)
    assert rejects == []
    (reading,) = readings
    assert_reading(reading, case["expected"])
    assert reading.timestamp == start + 4  # the receive time of the window's latest value
    assert reading.stamped_at_gateway  # the gateway's clock: a clock step re-anchors it


def test_esphome_window_closes_on_a_later_value_and_averages() -> None:
    config = EsphomeSourceConfig(kind="esphome", channels={"pm2_5": "pm2_5"}, group_s=10)
    grouper = EsphomeGrouper(config, group_s=10, grace_s=5)
    grouper.add("n1", "pm2_5", 4.0, 1_715_200_000.0)
    grouper.add("n1", "pm2_5", 8.0, 1_715_200_003.0)
    readings, _ = grouper.add("n1", "pm2_5", 30.0, 1_715_200_011.0)
    assert [dict(r.values) for r in readings] == [{"pm2_5": 6.0}]
    grouper.add("n2", "rh", 50.0, 1_715_200_012.0)  # covariate only: no reading
    readings, rejects = grouper.close_due(1_715_200_030.0)
    assert [dict(r.values) for r in readings] == [{"pm2_5": 30.0}]
    assert [exc.reason for exc in rejects] == [RejectReason.NO_VALUES]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"nan", RejectReason.NOT_FINITE),
        (b"ON", RejectReason.SCHEMA),
        (b"\xff", RejectReason.SCHEMA),
        (b"1" * 64, RejectReason.TOO_LARGE),
    ],
)
def test_esphome_bad_states_are_refused(payload: bytes, reason: RejectReason) -> None:
    with pytest.raises(ReadingRejectedError) as caught:
        parse_state(payload)
    assert caught.value.reason is reason


def test_esphome_topic_shape_is_checked() -> None:
    assert split_topic("home/air/sensor/pm2_5/state") == ("home/air", "pm2_5")
    with pytest.raises(ReadingRejectedError):
        split_topic("air/binary_sensor/x/state")


# -- sensor.community -------------------------------------------------------------------------

SENSOR_COMMUNITY = SensorCommunitySourceConfig(kind="sensor_community")


def sensor_community(
    document: object, config: SensorCommunitySourceConfig = SENSOR_COMMUNITY
) -> Reading:
    return decode_sensor_community(
        json.dumps(document).encode(), received_at=1_715_200_042.0, config=config
    )


def test_sensor_community_post_maps_onto_a_reading() -> None:
    case = fixture("sensor_community_post.json")
    reading = sensor_community(case["payload"])
    assert_reading(reading, case["expected"])
    assert reading.timestamp == 1_715_200_042.0  # the station sends no time: receive time


def test_nettigo_air_monitor_on_an_esp32_posts_esp32id() -> None:
    """NAM on an ESP32 names its chip esp32id; it was answered 400 'no esp8266id' (issue 27)."""
    case = fixture("nam_esp32_post.json")
    assert_reading(sensor_community(case["payload"]), case["expected"])
    neither = {key: value for key, value in case["payload"].items() if key != "esp32id"}
    with pytest.raises(ReadingRejectedError, match="no esp8266id or esp32id") as caught:
        sensor_community(neither)
    assert caught.value.reason is RejectReason.BAD_SENSOR_ID


def test_sensor_community_sds_and_choice_of_sensor() -> None:
    sds = {
        "esp8266id": 77,
        "sensordatavalues": [
            {"value_type": "SDS_P1", "value": "20.5"},
            {"value_type": "SDS_P2", "value": "10.25"},
            {"value_type": "PMS_P2", "value": "3"},
            {"value_type": "temperature", "value": "11.0"},
            {"value_type": "humidity", "value": "80.0"},
        ],
    }
    auto = sensor_community(sds)  # PMS comes first, and has PM2.5
    assert auto.sensor_id == "airrohr-77"
    assert dict(auto.values) == {"pm2_5": 3.0, "temp_c": 11.0, "rh": 80.0}
    chosen = sensor_community(
        sds, SensorCommunitySourceConfig(kind="sensor_community", pm_sensor="SDS")
    )
    assert dict(chosen.values) == {"pm10": 20.5, "pm2_5": 10.25, "temp_c": 11.0, "rh": 80.0}


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        ([], RejectReason.SCHEMA),
        ({"sensordatavalues": []}, RejectReason.BAD_SENSOR_ID),
        ({"esp8266id": "1", "sensordatavalues": {}}, RejectReason.SCHEMA),
        ({"esp8266id": "1", "sensordatavalues": [{"value": "3"}]}, RejectReason.SCHEMA),
        (
            {
                "esp8266id": "1",
                "sensordatavalues": [{"value_type": "BME280_humidity", "value": "40"}],
            },
            RejectReason.NO_VALUES,
        ),
        (
            {"esp8266id": "1", "sensordatavalues": [{"value_type": "PMS_P2", "value": "n/a"}]},
            RejectReason.SCHEMA,
        ),
        (
            {"esp8266id": "1", "sensordatavalues": [{"value_type": "PMS_P2", "value": "-4"}]},
            RejectReason.NEGATIVE,
        ),
        (
            {"esp8266id": "bad id!", "sensordatavalues": [{"value_type": "PMS_P2", "value": "4"}]},
            RejectReason.BAD_SENSOR_ID,
        ),
    ],
)
def test_sensor_community_bad_posts_are_refused(document: object, reason: RejectReason) -> None:
    with pytest.raises(ReadingRejectedError) as caught:
        sensor_community(document)
    assert caught.value.reason is reason


def test_sensor_community_auth_must_be_a_pair() -> None:
    with pytest.raises(ValidationError, match="both username and password"):
        SensorCommunitySourceConfig(kind="sensor_community", username="station")


# -- PurpleAir ---------------------------------------------------------------------------------

PURPLEAIR = PurpleAirSourceConfig.model_validate(
    {"kind": "purpleair", "units": [{"url": "http://192.168.1.40/json"}], "max_age_s": None}
)


def purpleair(document: dict[str, Any], config: PurpleAirSourceConfig = PURPLEAIR) -> Reading:
    return decode_purpleair(
        json.dumps(document).encode(),
        received_at=utc("2025-05-08T20:28:00Z"),
        sensor_id=None,
        config=config,
    )


def test_purpleair_json_maps_onto_a_reading_averaging_agreeing_channels() -> None:
    case = fixture("purpleair_json.json")
    assert_reading(purpleair(case["payload"]), case["expected"])
    atm = PURPLEAIR.model_copy(update={"pm_kind": "atm"})
    assert purpleair(case["payload"], atm).values["pm2_5"] == pytest.approx(9.5)  # 8 and 11


def test_purpleair_channel_rule() -> None:
    payload = fixture("purpleair_json.json")["payload"]
    # 40 and 60: 20 µg/m³ apart (> 5) but 40 % of their mean (<= 70 %): agree, averaged.
    assert purpleair({**payload, "pm2_5_cf_1": 40, "pm2_5_cf_1_b": 60}).values["pm2_5"] == 50
    # 2 and 7: 111 % of their mean apart, but within 5 µg/m³: agree.
    assert purpleair({**payload, "pm2_5_cf_1": 2, "pm2_5_cf_1_b": 7}).values["pm2_5"] == 4.5
    # 10 and 40: 30 apart and 120 % of the mean: a failing laser, rejected.
    with pytest.raises(ReadingRejectedError) as caught:
        purpleair({**payload, "pm2_5_cf_1": 10, "pm2_5_cf_1_b": 40})
    assert caught.value.reason is RejectReason.CHANNEL_DISAGREEMENT
    single = {k: v for k, v in payload.items() if not k.endswith("_b")}
    assert purpleair(single).values["pm2_5"] == 8  # single-laser unit: channel A


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"SensorId": None}, RejectReason.BAD_SENSOR_ID),
        ({"DateTime": "08/05/2025 20:27"}, RejectReason.SCHEMA),
        ({"pm2_5_cf_1": "high"}, RejectReason.SCHEMA),
        ({"DateTime": "2031/05/08T20:27:22z"}, RejectReason.FUTURE_TIMESTAMP),
    ],
)
def test_purpleair_bad_answers_are_refused(change: dict[str, Any], reason: RejectReason) -> None:
    payload = {**fixture("purpleair_json.json")["payload"], **change}
    payload = {k: v for k, v in payload.items() if v is not None}
    with pytest.raises(ReadingRejectedError) as caught:
        purpleair(payload)
    assert caught.value.reason is reason


# -- a bad covariate costs the covariate, never the PM (issue 26) ------------------------------


def test_a_bad_covariate_of_any_fleet_device_is_dropped_and_the_reading_kept() -> None:
    payload = fixture("tasmota_sensor.json")["payload"]
    kept = tasmota({**payload, "BME280": {"Temperature": 21.4, "Humidity": 400}})
    assert "rh" not in kept.values and kept.values["pm10"] == 12 and kept.values["temp_c"] == 21.4
    unreadable = tasmota({**payload, "BME280": {"Temperature": "hot", "Humidity": 48.2}})
    assert "temp_c" not in unreadable.values and unreadable.values["rh"] == 48.2
    station = fixture("sensor_community_post.json")["payload"]
    values = [
        {**item, "value": "n/a"} if item["value_type"] == "BME280_humidity" else item
        for item in station["sensordatavalues"]
    ]
    airrohr = sensor_community({**station, "sensordatavalues": values})
    assert "rh" not in airrohr.values and "pm10" in airrohr.values
    unit = fixture("purpleair_json.json")["payload"]
    pa = purpleair({**unit, "current_humidity": 140, "current_temp_f": "err"})
    assert set(pa.values) == {"pm1", "pm2_5", "pm10"}
    for reading, channels in (
        (kept, ["rh"]),
        (unreadable, ["temp_c"]),
        (airrohr, ["rh"]),
        (pa, ["temp_c", "rh"]),  # what the decoder could not read, then what the rules refused
    ):
        assert [fault.reason for fault in reading.dropped] == [RejectReason.BAD_COVARIATE] * len(
            channels
        )
        assert [fault.detail.split("; ")[1] for fault in reading.dropped] == [
            f"{channel} dropped, the reading kept" for channel in channels
        ]
        assert all(fault.sensor_id == reading.sensor_id for fault in reading.dropped)


def test_a_bad_esphome_covariate_mean_is_dropped_and_the_reading_kept() -> None:
    config = EsphomeSourceConfig(kind="esphome", channels={"pm10": "pm10", "humidity": "rh"})
    grouper = EsphomeGrouper(config, group_s=60, grace_s=5)
    at = 1_715_200_000.0
    grouper.add("air", "pm10", 12.0, at)
    grouper.add("air", "rh", 400.0, at + 1)  # a failing humidity sensor
    [reading], refused = grouper.close_due(at + 70)
    assert refused == [] and dict(reading.values) == {"pm10": 12.0}
    assert [fault.reason for fault in reading.dropped] == [RejectReason.BAD_COVARIATE]


# -- configuration ---------------------------------------------------------------------------


def test_fleet_sources_are_configured_by_kind_and_strictly(tmp_path: Path) -> None:
    base = {
        "gateway_id": "gw",
        "state_dir": str(tmp_path),
        "models": [{"feature": "pm2_5", "model_dir": "m"}],
    }
    sources = [
        {"kind": "tasmota", "timezone": "Europe/Rome"},
        {"kind": "esphome", "channels": {"pm2_5": "pm2_5"}},
        {"kind": "sensor_community", "port": 8123},
        {"kind": "purpleair", "units": [{"url": "http://10.0.0.5/json"}]},
    ]
    config = GatewayConfig.model_validate({**base, "sources": sources})
    assert [type(s).__name__ for s in config.sources] == [
        "TasmotaSourceConfig",
        "EsphomeSourceConfig",
        "SensorCommunitySourceConfig",
        "PurpleAirSourceConfig",
    ]
    for bad in (
        {"kind": "tasmota", "timezone": "Mars/Olympus"},
        {"kind": "tasmota", "timezone": "UTC", "unknown": 1},
        {"kind": "esphome", "channels": {"pm2_5": "pm25"}},
        {"kind": "purpleair", "units": [{"url": "https://10.0.0.5/json"}]},
        {"kind": "purpleair", "units": [{"url": "http://10.0.0.5:99999/json"}]},
        {"kind": "purpleair", "units": [{"url": "http://10.0.0.5/jsön"}]},
        {"kind": "sensor_community", "password": "only a password"},
    ):
        with pytest.raises(ValidationError):
            GatewayConfig.model_validate({**base, "sources": [bad]})


def test_each_fleet_kind_has_its_own_default_sensor_id_prefix() -> None:
    """A Tasmota device and an ESPHome node (or an MQTT sensor) called alike get distinct ids
    by default (issue 26 item 7); '' restores the bare device name."""
    tasmota_sensor = fixture("tasmota_sensor.json")
    device = tasmota_sensor["topic"].split("/")[1]
    payload = json.dumps(tasmota_sensor["payload"]).encode()
    now = utc(tasmota_sensor["expected"]["timestamp_utc"]) + 30
    defaults = {
        "tasmota": TASMOTA.sensor_id_prefix,
        "esphome": EsphomeSourceConfig(kind="esphome", channels={"pm10": "pm10"}).sensor_id_prefix,
        "sensor_community": SENSOR_COMMUNITY.sensor_id_prefix,
    }
    assert defaults == {
        "tasmota": "tasmota-",
        "esphome": "esphome-",
        "sensor_community": "airrohr-",
    }
    bare = TasmotaSourceConfig(kind="tasmota", timezone="UTC", sensor_id_prefix="")
    assert decode_tasmota(payload, device=device, received_at=now, config=bare).sensor_id == device
    assert decode_tasmota(payload, device=device, received_at=now, config=TASMOTA).sensor_id == (
        f"tasmota-{device}"
    )


# -- robustness: nothing from the wire raises anything but a counted reject -------------------

fleet_keys = st.sampled_from(
    [
        "PMS5003",
        "PM2.5",
        "PM10",
        "Time",
        "Epoch",
        "TempUnit",
        "BME280",
        "Temperature",
        "Humidity",
        "esp8266id",
        "sensordatavalues",
        "PMS_P2",
        "SDS_P1",
        "SensorId",
        "DateTime",
        "pm2_5_cf_1",
        "pm2_5_cf_1_b",
        "pm10_0_cf_1",
        "current_temp_f",
    ]
)
leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.just(10**400)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
)
values = leaves | st.lists(leaves, max_size=3) | st.dictionaries(fleet_keys, leaves, max_size=4)
items = st.lists(st.fixed_dictionaries({"value_type": fleet_keys, "value": leaves}), max_size=4)
fleet_like = leaves | st.dictionaries(fleet_keys, values | items, max_size=6)


@settings(max_examples=300, deadline=None)
@given(fleet_like)
def test_fuzz_every_decoder_raises_only_rejects(document: object) -> None:
    payload = json.dumps(document).encode()
    now = utc("2024-05-08T20:28:00Z")
    decoders = (
        lambda: decode_tasmota(payload, device="t1", received_at=now, config=TASMOTA),
        lambda: decode_sensor_community(payload, received_at=now, config=SENSOR_COMMUNITY),
        lambda: decode_purpleair(payload, received_at=now, sensor_id=None, config=PURPLEAIR),
    )
    for decode in decoders:
        with contextlib.suppress(ReadingRejectedError):
            decode()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40))
def test_fuzz_esphome_states_raise_only_rejects(payload: bytes) -> None:
    with contextlib.suppress(ReadingRejectedError):
        parse_state(payload)


def test_esphome_node_count_is_bounded() -> None:
    config = EsphomeSourceConfig(kind="esphome", channels={"pm2_5": "pm2_5"}, max_nodes=2)
    grouper = EsphomeGrouper(config, group_s=60, grace_s=5, max_nodes=2)
    at = 1_715_200_000.0
    assert grouper.add("a", "pm2_5", 1.0, at) == ([], [])
    assert grouper.add("b", "pm2_5", 1.0, at) == ([], [])
    _, rejects = grouper.add("c", "pm2_5", 1.0, at)
    assert [exc.reason for exc in rejects] == [RejectReason.UNKNOWN_SENSOR]
    assert grouper.add("a", "pm2_5", 2.0, at + 1) == ([], [])  # known nodes go on
    readings, _ = grouper.close_due(at + 70)
    assert sorted(r.sensor_id for r in readings) == ["esphome-a", "esphome-b"]


def test_the_examples_in_docs_sources_md_are_valid_configuration(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "sources.md").read_text("utf-8")
    blocks = re.findall(r"```toml\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) == 4
    head = f'gateway_id = "gw"\nstate_dir = "{tmp_path}"\n'
    head += '[[models]]\nfeature = "pm2_5"\nmodel_dir = "m"\n'
    kinds = [
        type(GatewayConfig.model_validate(tomllib.loads(head + block)).sources[0]).__name__
        for block in blocks
    ]
    assert kinds == [
        "TasmotaSourceConfig",
        "EsphomeSourceConfig",
        "SensorCommunitySourceConfig",
        "PurpleAirSourceConfig",
    ]
