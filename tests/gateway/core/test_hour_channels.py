"""A model may read the hour of the day (``hour_sin``, ``hour_cos``): no sensor sends it, the
windows derive it from each period's start in the sensors' zone by the contract's rule
(tesla_gateway/contract/time_of_day.py), the ring stores only what readings bring, and the
model that reads the hour is chosen, replaced and agreed on by the channels readings bring."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tesla_gateway.cluster.agreement import differences, shared_settings
from tesla_gateway.cluster.config import ClusterConfig
from tesla_gateway.contract.calibrated import CalibratedReading, Quality
from tesla_gateway.contract.geometry import WindowGeometry, WindowGeometryError
from tesla_gateway.contract.manifest import write_manifest
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.contract.time_of_day import (
    hour_phase,
    neutral_hours,
    standard_offset_seconds,
    system_zone,
    utc_offset_for,
    window_hours,
)
from tesla_gateway.daemon.cli import main
from tesla_gateway.daemon.config import GatewayConfig, load_config
from tesla_gateway.daemon.ticker import Ticker
from tesla_gateway.models.choice import model_rank
from tesla_gateway.models.watch import ModelSet
from tesla_gateway.windows.ring import ModelWindows
from tests.support.models import ModelFactory

P = 60
T0 = 1_700_000_040  # a period boundary
HOURS = ("pm10", "hour_sin", "hour_cos")


def _geometry(n: int = 4, channels: tuple[str, ...] = HOURS) -> WindowGeometry:
    return WindowGeometry(n, P, channels, GapPolicy(max_interpolated_periods=1))


def _feed(windows: ModelWindows, periods: dict[int, float], sensor: str = "a") -> None:
    for period, value in periods.items():
        windows.add(Reading(sensor, T0 + period * P + 1, {"pm10": value}), 0.0)


def _expected_hours(newest: int, n: int, offset: int) -> np.ndarray:
    """[N, 2]: the hour of each position's period start, oldest first."""
    return np.array(
        [hour_phase((newest - n + 1 + j) * P, offset) for j in range(n)], dtype=np.float32
    )


def test_the_hour_channels_are_derived_for_each_position_and_padded_like_the_pm() -> None:
    windows = ModelWindows(_geometry(n=4))
    windows.min_history_periods = 1
    windows.utc_offset_s = 3600
    _feed(windows, {0: 10.0, 1: 12.0, 2: 14.0, 3: 16.0, 4: 18.0, 5: 20.0})  # 0..4 close
    ready = windows.ready_windows()
    assert ready.windows.shape == (5, 4, 3)  # [B, N, C] in the model's channel order
    assert list(ready.quality) == [()] * 5
    base = T0 // P
    whole = ready.windows[4]  # periods 1..4: a whole window
    np.testing.assert_array_equal(whole[:, 0], [12.0, 14.0, 16.0, 18.0])
    np.testing.assert_allclose(whole[:, 1:], _expected_hours(base + 4, 4, 3600), atol=1e-6)
    young = ready.windows[1]  # two periods of history: the older two repeat the oldest
    real = _expected_hours(base + 1, 2, 3600)
    np.testing.assert_allclose(young[:, 1:], [real[0], real[0], real[0], real[1]], atol=1e-6)
    np.testing.assert_array_equal(young[:, 0], [10.0, 10.0, 10.0, 12.0])


def test_a_gap_filled_period_gets_its_hour_and_a_missing_one_stays_missing() -> None:
    windows = ModelWindows(_geometry(n=4))
    _feed(windows, {0: 10.0, 2: 14.0, 3: 16.0, 4: 1.0})  # period 1 interpolated, 0..3 close
    ready = windows.ready_windows()
    last = ready.windows[-1]  # periods 0..3
    assert ready.quality[-1] == ()
    np.testing.assert_allclose(last[:, 1:], _expected_hours(T0 // P + 3, 4, 0), atol=1e-6)
    gappy = ModelWindows(_geometry(n=5))
    _feed(gappy, {0: 10.0, 3: 13.0, 4: 1.0})  # two missing: over the policy
    ready = gappy.ready_windows()
    assert Quality.GAP in ready.quality[-1]
    # nothing is made up where the PM is missing
    assert np.isnan(ready.windows[-1][:, 1:][np.isnan(ready.windows[-1][:, 0])]).all()


def test_an_unknown_hour_is_the_centre_of_the_circle() -> None:
    windows = ModelWindows(_geometry(n=2))
    windows.utc_offset_s = None
    _feed(windows, {0: 10.0, 1: 12.0, 2: 1.0})
    ready = windows.ready_windows()
    assert ready.windows[-1][:, 1:].tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_the_ring_holds_only_the_read_channels_and_its_state_round_trips() -> None:
    windows = ModelWindows(_geometry(n=4, channels=("pm10", "hour_sin", "rh", "hour_cos")))
    windows.utc_offset_s = -18000
    for period in range(3):
        windows.add(Reading("a", T0 + period * P + 1, {"pm10": 10.0 + period, "rh": 50.0}), 0.0)
    state = windows.export_state()
    assert state.ring.shape == (1, 2, 4)  # pm10 and rh: the hour is not stored
    restored = ModelWindows.from_state(state)
    restored.utc_offset_s = -18000
    ready = restored.ready_windows(closed_through_period=T0 // P + 2)
    newest = ready.windows[-1]
    assert newest[-1, 0] == 12.0 and newest[-1, 2] == 50.0
    sin, cos = hour_phase((T0 // P + 2) * P, -18000)
    assert newest[-1, 1] == pytest.approx(sin, abs=1e-6)
    assert newest[-1, 3] == pytest.approx(cos, abs=1e-6)


def test_window_hours_compute_each_distinct_end_once_and_refuse_odd_offsets() -> None:
    pm = np.ones((3, 6), dtype=np.float32)
    sin, cos = window_hours(pm, [100, 250, 100], P, 19800)
    assert sin.dtype == np.float32 and sin.shape == (3, 6)
    np.testing.assert_array_equal(sin[0], sin[2])
    np.testing.assert_allclose(np.hypot(sin, cos), 1.0, atol=1e-6)
    with pytest.raises(ValueError, match="14 h"):
        window_hours(pm, [1, 1, 1], P, 15 * 3600)


def test_a_geometry_reads_both_hour_channels_after_a_reading_or_none() -> None:
    for bad in (("hour_sin", "pm10", "hour_cos"), ("pm10", "hour_sin"), ("pm10", "hour_cos")):
        with pytest.raises(WindowGeometryError):
            _geometry(channels=bad)
    geometry = _geometry(channels=("pm10", "rh", "hour_cos", "hour_sin"))
    assert geometry.read_channels == ("pm10", "rh")
    assert geometry.read_positions == (0, 1)
    assert geometry.hour_positions == (3, 2)
    assert _geometry(channels=("pm10",)).hour_positions is None


def test_the_zone_is_validated_and_its_standard_offset_used() -> None:
    assert standard_offset_seconds("Europe/Rome", 1_593_561_600) == 3600  # July: DST ignored
    assert standard_offset_seconds("Asia/Kolkata", 1_593_561_600) == 19800
    assert utc_offset_for("America/New_York", 1_593_561_600) == -18000
    model = {"feature": "pm10", "model_dir": "/tmp/m"}
    base = {"gateway_id": "g", "state_dir": "/tmp/x", "models": [model]}
    with pytest.raises(ValueError, match="IANA time zone"):
        GatewayConfig.model_validate({**base, "timezone": "Europe/Atlantis"})
    assert GatewayConfig.model_validate({**base, "timezone": "Europe/Rome"}).timezone


def _hour_model(model_factory: ModelFactory, path: Path) -> Path:
    model = model_factory.copy(path, extra_channels=("hour_sin", "hour_cos"))
    write_manifest(model.path, model.manifest.model_copy(update={"min_history_periods": 1}))
    return model.path


def test_the_ticker_calibrates_pm_only_readings_with_the_hour_in_its_zone(
    model_factory: ModelFactory, tmp_path: Path
) -> None:
    path = _hour_model(model_factory, tmp_path / "model")  # N = 8
    model = model_factory.get(extra_channels=("hour_sin", "hour_cos"))
    models = ModelSet({"pm10": path})
    models.refresh()
    ticker = Ticker(models, grace_s=5.0, clock=lambda: float(T0), timezone="Asia/Kolkata")
    published: list[CalibratedReading] = []
    for period in range(10):
        ticker.ingest(Reading("a", T0 + period * P + 1, {"pm10": 20.0 + period}))
        published.extend(asyncio.run(ticker.tick()))
    assert len(published) == 9 and all(r.quality == (Quality.OK,) for r in published)
    newest = T0 // P + 8
    window = np.empty((8, 3), dtype=np.float32)
    window[:, 0] = 21.0 + np.arange(8)
    window[:, 1:] = _expected_hours(newest, 8, 19800)
    expected = model.keras_predict(window[None])[0]
    wrong_zone = window.copy()
    wrong_zone[:, 1:] = _expected_hours(newest, 8, 0)
    assert published[-1].calibrated == pytest.approx(float(expected), rel=1e-4, abs=1e-3)
    assert abs(float(model.keras_predict(wrong_zone[None])[0]) - float(expected)) > 1e-3


def test_the_hour_does_not_count_as_a_channel_the_sensor_brought(
    model_factory: ModelFactory, tmp_path: Path
) -> None:
    hour = _hour_model(model_factory, tmp_path / "hour")
    covariate = model_factory.copy(tmp_path / "rh", extra_channels=("rh", "temp_c")).path
    models = ModelSet({"pm10": hour, "pm10-rh": covariate}, features={"pm10-rh": "pm10"})
    models.refresh()
    loaded = models.loaded()
    # the covariate model is preferred for sensors that send rh and temp_c ...
    assert model_rank(loaded["pm10-rh"])[0] > model_rank(loaded["pm10"])[0]
    ticker = Ticker(models, grace_s=5.0, clock=lambda: float(T0))
    # ... and holds windows only for them: PM-only sensors cost it nothing
    assert ticker.store["pm10-rh"].admit_complete_only
    assert not ticker.store["pm10"].admit_complete_only
    # a release adding the hour to the PM-only model replaces the PM-only slot
    assert models.release_slot("pm10", ["pm10", "hour_sin", "hour_cos"]) == "pm10"
    assert models.release_slot("pm10", ["pm10"]) == "pm10"
    assert models.release_slot("pm10", ["pm10", "rh", "temp_c"]) == "pm10-rh"


def test_cluster_members_must_take_the_hour_in_the_same_zone() -> None:
    config = ClusterConfig(servers=["nats://127.0.0.1:4222"])
    geometries = {"pm10": _geometry(n=8)}
    rome = shared_settings(config, geometries, {"pm10": 3600})
    assert rome["models"]["pm10"]["hour_utc_offset_s"] == 3600
    found = differences(shared_settings(config, geometries, {"pm10": 0}), rome)
    assert found == ["models.pm10.hour_utc_offset_s: 0 here, 3600 in the cluster"]
    plain = shared_settings(config, {"pm10": _geometry(n=8, channels=("pm10",))})
    assert "hour_utc_offset_s" not in plain["models"]["pm10"]


def test_made_up_check_windows_hold_no_hour() -> None:
    windows = np.full((3, 4, 3), 25.0, dtype=np.float32)
    neutral_hours(windows, HOURS)
    assert windows[:, :, 0].tolist() == [[25.0] * 4] * 3
    assert not windows[:, :, 1:].any()
    flat = np.full((2, 4), 25.0, dtype=np.float32)
    neutral_hours(flat, ("pm10",))  # one channel: nothing to set
    assert (flat == 25.0).all()


def test_init_writes_the_sensors_zone_given_or_the_systems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "given.toml"
    assert main(["init", "--out", str(out), "--timezone", "America/Chicago"]) == 0
    assert load_config(out, environ={}).timezone == "America/Chicago"
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    assert main(["init", "--out", str(tmp_path / "system.toml")]) == 0
    assert load_config(tmp_path / "system.toml", environ={}).timezone == "Asia/Kolkata"
    monkeypatch.setenv("TZ", ":Europe/Rome")  # glibc's form
    assert system_zone() == "Europe/Rome"


def test_check_config_says_where_the_hour_is_taken(
    model_factory: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _hour_model(model_factory, tmp_path / "model")
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'gateway_id = "g"\nstate_dir = "{tmp_path / "state"}"\ntimezone = "Asia/Kolkata"\n'
        f'[[models]]\nfeature = "pm10"\nmodel_dir = "{path}"\n'
        'signature = "off"\n',
        encoding="utf-8",
    )
    main(["check-config", "--config", str(config)])
    assert "hour of the day in timezone Asia/Kolkata: UTC+05:30" in capsys.readouterr().out
