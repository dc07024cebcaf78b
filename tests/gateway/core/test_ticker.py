"""Ticks: warm-up and gaps flagged with the raw value, valid windows calibrated in one batch."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from tesla_gateway.contract.calibrated import CalibratedReading, Quality
from tesla_gateway.contract.manifest import PredictionIntervals, write_manifest
from tesla_gateway.contract.readings import Reading
from tesla_gateway.daemon.ticker import Ticker
from tesla_gateway.models.watch import ModelSet
from tesla_gateway.windows.ring import ModelWindows
from tests.support.models import ModelFactory

P = 60
T0 = 1_700_000_040  # a period boundary


class Clock:
    """Wall clock under the test's control (the wall-clock fallback is what is tested)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_ticker(models: dict[str, Path], clock: Clock) -> Ticker:
    model_set = ModelSet(models)
    model_set.refresh()
    return Ticker(model_set, grace_s=5.0, clock=clock)


def values(sensor: str, period: int, **fields: float) -> Reading:
    return Reading(sensor, T0 + period * P + 1, fields)


def test_warm_up_then_calibrated_in_one_batch(model_factory: ModelFactory) -> None:
    model = model_factory.get()  # N = 8
    clock = Clock(T0)
    ticker = make_ticker({"pm10": model.path}, clock)
    rng = np.random.default_rng(3)
    series = {s: rng.uniform(5, 80, 10) for s in ("a", "b", "c")}
    published: list[CalibratedReading] = []
    for period in range(10):
        for sensor, data in series.items():
            ticker.ingest(values(sensor, period, pm10=float(data[period])))
        published.extend(asyncio.run(ticker.tick()))
    # periods 0..8 closed (period 9 is still open): 0..6 warming up, 7 and 8 calibrated
    assert len(published) == 27
    warm = [r for r in published if r.quality == (Quality.WARMING_UP,)]
    assert len(warm) == 21 and all(r.calibrated is None for r in warm)
    assert {r.raw for r in warm if r.sensor_id == "a"} == {float(v) for v in series["a"][:7]}
    ok = [r for r in published if r.quality == (Quality.OK,)]
    assert len(ok) == 6
    assert ticker.counters.last_batch == {"pm10": 3}  # one invoke for all three sensors
    for reading in ok:
        period = int(reading.period_start // P) - T0 // P
        window = series[reading.sensor_id][period - 7 : period + 1].astype(np.float32)
        expected = model.keras_predict(window[None])[0]
        assert reading.calibrated is not None
        np.testing.assert_allclose(reading.calibrated, expected, rtol=1e-4, atol=1e-3)
        assert (reading.model_name, reading.model_version, reading.unit) == (
            "test-tesla",
            1,
            "ug/m3",
        )
        assert reading.raw == float(series[reading.sensor_id][period])


def test_gap_longer_than_policy_is_flagged_not_calibrated(model_factory: ModelFactory) -> None:
    model = model_factory.get()  # N = 8, up to 2 periods interpolated
    ticker = make_ticker({"pm10": model.path}, Clock(T0))
    for period in [*range(8), 11, 12]:  # 3 missing periods
        ticker.ingest(values("a", period, pm10=10.0 + period))
    out = asyncio.run(ticker.tick())
    assert [r.quality for r in out][-2:] == [(Quality.OK,), (Quality.GAP,)]
    assert out[-1].calibrated is None and out[-1].raw == 21.0


def test_wall_clock_fallback_closes_the_last_period(model_factory: ModelFactory) -> None:
    model = model_factory.get()
    clock = Clock(T0 + 30)
    ticker = make_ticker({"pm10": model.path}, clock)
    ticker.ingest(values("a", 0, pm10=3.0))
    assert asyncio.run(ticker.tick()) == []
    clock.now = T0 + P + 5.0  # period end + grace
    [reading] = asyncio.run(ticker.tick())
    assert (reading.raw, reading.quality) == (3.0, (Quality.WARMING_UP,))
    assert reading.period_start == T0


def test_out_of_domain_is_advisory(model_factory: ModelFactory) -> None:
    model = model_factory.get()  # training inputs max 500
    ticker = make_ticker({"pm10": model.path}, Clock(T0))
    for period in range(9):
        ticker.ingest(values("a", period, pm10=700.0 if period == 3 else 20.0))
    last = asyncio.run(ticker.tick())[-1]
    assert last.quality == (Quality.OK, Quality.OUT_OF_DOMAIN)
    assert last.calibrated is not None


def test_two_models_and_a_missing_channel(model_factory: ModelFactory) -> None:
    pm10 = model_factory.get()
    pm25 = model_factory.get(feature="pm2_5", window_length=4, seed=2, extra_channels=("rh",))
    ticker = make_ticker({"pm10": pm10.path, "pm2_5": pm25.path}, Clock(T0))
    for period in range(9):
        ticker.ingest(values("full", period, pm10=10.0, pm2_5=5.0, rh=50.0))
        ticker.ingest(values("norh", period, pm10=10.0, pm2_5=5.0))
    out = asyncio.run(ticker.tick())
    last = {(r.sensor_id, r.feature): r for r in out}
    assert last["full", "pm10"].quality == (Quality.OK,)
    assert last["norh", "pm10"].quality == (Quality.OK,)
    assert last["full", "pm2_5"].quality == (Quality.OK,)
    assert last["norh", "pm2_5"].quality == (Quality.MISSING_CHANNEL,)
    assert last["norh", "pm2_5"].calibrated is None and last["norh", "pm2_5"].raw == 5.0
    window = np.tile(np.array([5.0, 50.0], dtype=np.float32), (1, 4, 1))
    expected = pm25.keras_predict(window)[0]
    calibrated = last["full", "pm2_5"].calibrated
    assert calibrated is not None
    np.testing.assert_allclose(calibrated, expected, rtol=1e-4, atol=1e-3)
    assert ticker.counters.calibrated > 0 and ticker.counters.flagged["missing_channel"] > 0


def test_new_model_geometry_resets_windows(model_factory: ModelFactory, tmp_path: Path) -> None:
    target = tmp_path / "pm10"
    model_factory.copy(target)
    ticker = make_ticker({"pm10": target}, Clock(T0))
    ticker.ingest(values("a", 0, pm10=1.0))
    assert ticker.store["pm10"].sensor_ids == ("a",)
    import shutil

    shutil.rmtree(target)
    model_factory.copy(target, window_length=6, version=2, seed=4)
    ticker.models.refresh()
    assert ticker.sync_models() == ["pm10"]
    assert ticker.store["pm10"].geometry.window_length == 6
    assert len(ticker.store["pm10"].sensor_ids) == 0


def test_the_ticker_is_the_windows_one_door(model_factory: ModelFactory) -> None:
    # Snapshots, restored windows, admission's view and eviction, and the stats all go through
    # the ticker, which builds its own window store.
    model = model_factory.get()
    ticker = make_ticker({"pm10": model.path}, Clock(T0))
    for period in range(3):
        for sensor in ("a", "b"):
            ticker.ingest(values(sensor, period, pm10=10.0 + period))
    assert ticker.sensor_windows == 2
    assert set(ticker.last_seen()) == {"a", "b"}
    (feature, state), *others = ticker.snapshot()
    assert feature == "pm10" and not others

    restored = make_ticker({"pm10": model.path}, Clock(T0))
    restored.install(feature, ModelWindows.from_state(state))
    assert restored.last_seen() == ticker.last_seen()
    assert restored.remove_sensors(["a"]) == 1
    stats = restored.stats()
    windows = stats["windows"]
    assert isinstance(windows, dict) and windows["pm10"]["sensors"] == 1
    assert stats["readings_in"] == 0
    assert stats["ticker"] == restored.counters.as_dict()
    assert ticker.stats()["readings_in"] == 6


def test_calibrated_readings_carry_the_manifest_interval(
    model_factory: ModelFactory, tmp_path: Path
) -> None:
    model = model_factory.copy(tmp_path / "model")
    intervals = PredictionIntervals(
        level=0.9, edges=[0.0], half_widths=[1.5, 4.0], counts=[100, 100], calibration_sensor="v1"
    )
    write_manifest(model.path, model.manifest.model_copy(update={"intervals": intervals}))
    ticker = make_ticker({"pm10": model.path}, Clock(T0))
    published: list[CalibratedReading] = []
    for period in range(10):
        ticker.ingest(values("a", period, pm10=20.0 + period))
        published.extend(asyncio.run(ticker.tick()))
    assert all(r.interval is None for r in published if r.calibrated is None)
    ok = [r for r in published if r.calibrated is not None]
    assert len(ok) == 2
    for reading in ok:
        assert reading.calibrated is not None and reading.interval is not None
        width = 4.0 if reading.calibrated >= 0 else 1.5
        value = reading.calibrated
        low, high = min(value, max(0.0, value - width)), value + width
        assert (reading.interval.low, reading.interval.high) == (low, high)
        assert reading.interval.level == 0.9
