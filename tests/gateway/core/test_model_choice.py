"""Several models for one feature: each sensor gets the best one its channels allow.

Real LiteRT models (tiny, exported by tests.support.models): a PM-only pm10 model and a pm10
model that also takes relative humidity and temperature, served side by side.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tesla_gateway.contract.calibrated import CalibratedReading, Quality
from tesla_gateway.contract.manifest import write_manifest
from tesla_gateway.contract.readings import Reading
from tesla_gateway.daemon.ticker import Ticker
from tesla_gateway.models.watch import ModelRefusedError, ModelSet
from tesla_gateway.windows.outcome import AddOutcome
from tests.support.models import ModelFactory, TestModel

P = 60
T0 = 1_700_000_040  # a period boundary
N = 8


def reading(sensor: str, period: int, **fields: float) -> Reading:
    return Reading(sensor, T0 + period * P + 1, fields)


def pm_only(factory: ModelFactory) -> TestModel:
    return factory.get(name="pm10-plain", seed=1)


def covariate(factory: ModelFactory) -> TestModel:
    return factory.get(name="pm10-rh-temp", seed=5, extra_channels=("rh", "temp_c"))


def make_ticker(factory: ModelFactory) -> Ticker:
    models = ModelSet(
        {"pm10": pm_only(factory).path, "pm10-rh-temp": covariate(factory).path},
        features={"pm10": "pm10", "pm10-rh-temp": "pm10"},
    )
    models.refresh()
    return Ticker(models, grace_s=5.0, clock=lambda: T0 + 10_000 * P)


def run(
    ticker: Ticker, periods: range, series: dict[str, dict[str, np.ndarray]]
) -> list[CalibratedReading]:
    out: list[CalibratedReading] = []
    for period in periods:
        for sensor, channels in series.items():
            fields = {
                name: float(values[period])
                for name, values in channels.items()
                if not np.isnan(values[period])
            }
            ticker.ingest(reading(sensor, period, **fields))
        out.extend(asyncio.run(ticker.tick()))
    return out


def window(values: np.ndarray, period: int) -> np.ndarray:
    return values[period - N + 1 : period + 1].astype(np.float32)


def test_each_sensor_gets_the_model_of_the_channels_it_reports(
    model_factory: ModelFactory,
) -> None:
    ticker = make_ticker(model_factory)
    rng = np.random.default_rng(11)
    series = {
        "with-rh": {
            "pm10": rng.uniform(5, 80, 12),
            "rh": rng.uniform(30, 90, 12),
            "temp_c": rng.uniform(-2, 25, 12),
        },
        "pm-only": {"pm10": rng.uniform(5, 80, 12)},
    }
    out = run(ticker, range(12), series)
    # One reading per sensor and period (11 closed periods each), never one per model.
    keys = [(r.sensor_id, r.feature, r.period_start) for r in out]
    assert len(keys) == len(set(keys)) == 22
    calibrated = [r for r in out if r.calibrated is not None]
    assert {(r.sensor_id, r.model_name) for r in calibrated} == {
        ("with-rh", "pm10-rh-temp"),
        ("pm-only", "pm10-plain"),
    }
    for item in calibrated:
        period = round(item.period_start / P) - T0 // P
        channels = series[item.sensor_id]
        if item.sensor_id == "with-rh":
            stacked = np.stack([window(channels[c], period) for c in ("pm10", "rh", "temp_c")], -1)
            expected = covariate(model_factory).keras_predict(stacked[None])[0]
        else:
            expected = pm_only(model_factory).keras_predict(window(channels["pm10"], period)[None])[
                0
            ]
        assert item.calibrated == pytest.approx(float(expected), rel=1e-4, abs=1e-3)
    # Warm-up is published once, with the PM-only model's reason.
    warming = [r for r in out if r.calibrated is None]
    assert len(warming) == 14 and all(r.quality == (Quality.WARMING_UP,) for r in warming)
    # A PM-only sensor costs no covariate window; the PM-only model holds both sensors.
    assert ticker.store["pm10-rh-temp"].sensor_ids == ("with-rh",)
    assert set(ticker.store["pm10"].sensor_ids) == {"with-rh", "pm-only"}


def test_a_sensor_falls_back_when_humidity_stops_and_returns_when_it_is_back(
    model_factory: ModelFactory,
) -> None:
    ticker = make_ticker(model_factory)
    rng = np.random.default_rng(12)
    periods = 40
    rh = rng.uniform(30, 90, periods)
    rh[15:20] = np.nan  # five periods without humidity: longer than the gap rule (2)
    temp_c = rng.uniform(0, 20, periods)
    temp_c[15:20] = np.nan
    series = {"node": {"pm10": rng.uniform(5, 80, periods), "rh": rh, "temp_c": temp_c}}
    out = run(ticker, range(periods), series)
    by_period = {round(r.period_start / P) - T0 // P: r for r in out}
    assert len(by_period) == len(out) == periods - 1
    model_of = {period: r.model_name for period, r in by_period.items()}
    # Covariate model while its window is whole; PM-only while the hole is in the covariate
    # window (the gap rule, as in training) -- never a period without a calibration.
    assert all(r.calibrated is not None for p, r in by_period.items() if p >= N - 1)
    assert {model_of[p] for p in range(N - 1, 15)} == {"pm10-rh-temp"}
    assert {model_of[p] for p in range(15, 20 + N - 1)} == {"pm10-plain"}
    assert {model_of[p] for p in range(20 + N - 1, periods - 1)} == {"pm10-rh-temp"}


@pytest.mark.parametrize("climate_first", [False, True])
def test_pm_and_covariates_in_separate_messages_reach_the_covariate_model(
    model_factory: ModelFactory, climate_first: bool
) -> None:
    """A node that publishes PM and rh/temp apart (same timestamp) is calibrated by the
    covariate model, with the windows the joined channels make."""
    ticker = make_ticker(model_factory)
    rng = np.random.default_rng(14)
    periods = 16
    channels = {
        "pm10": rng.uniform(5, 80, periods),
        "rh": rng.uniform(30, 90, periods),
        "temp_c": rng.uniform(-2, 25, periods),
    }
    out: list[CalibratedReading] = []
    for period in range(periods):
        pm = reading("split", period, pm10=float(channels["pm10"][period]))
        climate = reading(
            "split",
            period,
            rh=float(channels["rh"][period]),
            temp_c=float(channels["temp_c"][period]),
        )
        for part in (climate, pm) if climate_first else (pm, climate):
            ticker.ingest(part)
        out.extend(asyncio.run(ticker.tick()))
    by_period = {round(r.period_start / P) - T0 // P: r for r in out}
    assert len(by_period) == len(out) == periods - 1
    # The window opens with the part that completes the channels: the first period lacks the
    # part that came before it, so the covariate model serves from one period after warm-up.
    first = N
    assert {by_period[p].model_name for p in range(first, periods - 1)} == {"pm10-rh-temp"}
    for period in range(first, periods - 1):
        stacked = np.stack([window(channels[c], period) for c in ("pm10", "rh", "temp_c")], -1)
        expected = covariate(model_factory).keras_predict(stacked[None])[0]
        assert by_period[period].calibrated == pytest.approx(float(expected), rel=1e-4, abs=1e-3)


@pytest.mark.parametrize("sharper_first", [True, False])
def test_of_two_models_with_the_same_channels_the_lower_validation_rmse_serves(
    model_factory: ModelFactory, tmp_path: Path, sharper_first: bool
) -> None:
    """The tie-break after the channel count: the model that validated better calibrates, in
    whichever slot it is listed."""
    sharper = model_factory.copy(tmp_path / "sharper", name="pm10-sharper", seed=2)
    manifest = sharper.manifest
    write_manifest(
        sharper.path,
        manifest.model_copy(
            update={"validation": manifest.validation.model_copy(update={"rmse": 0.5})}
        ),
    )
    slots = {"pm10": pm_only(model_factory).path, "pm10-sharper": sharper.path}
    if sharper_first:
        slots = dict(reversed(slots.items()))
    models = ModelSet(slots, features=dict.fromkeys(slots, "pm10"))
    models.refresh()
    ticker = Ticker(models, grace_s=5.0, clock=lambda: T0 + 10_000 * P)
    series = {"node": {"pm10": np.random.default_rng(13).uniform(5, 80, 12)}}
    calibrated = [r for r in run(ticker, range(12), series) if r.calibrated is not None]
    assert len(calibrated) == 12 - N
    assert {r.model_name for r in calibrated} == {"pm10-sharper"}


def test_the_feature_outcome_is_the_first_models(model_factory: ModelFactory) -> None:
    ticker = make_ticker(model_factory)
    outcomes = ticker.ingest(reading("pm-only", 0, pm10=10.0))
    assert outcomes == {"pm10": AddOutcome.ACCEPTED}
    assert ticker.store["pm10-rh-temp"].counts[AddOutcome.IRRELEVANT] == 1


def test_a_release_goes_to_the_slot_of_its_channels(
    model_factory: ModelFactory, tmp_path: Path
) -> None:
    models = ModelSet(
        {"pm10": pm_only(model_factory).path, "pm10-rh-temp": tmp_path / "empty"},
        features={"pm10": "pm10", "pm10-rh-temp": "pm10"},
    )
    models.refresh()
    assert models.release_slot("pm10", ("pm10",)) == "pm10"
    assert models.release_slot("pm10", ("pm10", "rh", "temp_c")) == "pm10-rh-temp"  # the empty one
    assert models.release_slot("pm2_5", ("pm2_5",)) is None
    models.adopt(
        "pm10-rh-temp", models.load_candidate("pm10-rh-temp", covariate(model_factory).path)
    )
    assert models.release_slot("pm10", ("pm10", "rh", "temp_c")) == "pm10-rh-temp"
    assert models.release_slot("pm10", ("pm10", "rh")) is None  # no slot serves those channels
    stats = models.stats()
    assert stats["pm10-rh-temp"]["feature"] == "pm10"
    assert stats["pm10-rh-temp"]["channels"] == ["pm10", "rh", "temp_c"]
    assert models.primary("pm10") is models.get("pm10")


def test_models_of_one_feature_must_share_the_period(model_factory: ModelFactory) -> None:
    models = ModelSet(
        {"pm10": pm_only(model_factory).path, "pm10-hourly": pm_only(model_factory).path},
        features={"pm10": "pm10", "pm10-hourly": "pm10"},
    )
    models.refresh()
    hourly = model_factory.get(name="hourly", period_seconds=3600, extra_channels=("rh",))
    with pytest.raises(ModelRefusedError, match=r"3600 s period but pm10's model pm10 has 60 s"):
        models.load_candidate("pm10-hourly", hourly.path)
