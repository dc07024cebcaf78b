"""Outputs no concentration could be are published without a value, flagged ``implausible``.

The rule (tesla_gateway/models/plausibility.py) on manifests directly, then through the real
ticker and real LiteRT graphs whose output the test chooses (``affine``: slope x newest raw +
intercept): raw 20 in, -10,000 out must never be published as ``ok``.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest
import structlog

from tesla_gateway.contract.calibrated import CalibratedReading, Interval, Quality
from tesla_gateway.contract.manifest import (
    Manifest,
    PredictionIntervals,
    TargetRange,
    write_manifest,
)
from tesla_gateway.contract.readings import Reading
from tesla_gateway.daemon.ticker import Ticker
from tesla_gateway.models.plausibility import HIGH_FACTOR, RMSE_HALF_WIDTHS, PlausibleRange
from tesla_gateway.models.watch import ModelSet
from tests.support.models import ModelFactory, TestModel

P = 60
T0 = 1_700_000_040  # a period boundary
N = 8  # the test models' window
INTERVALS = PredictionIntervals(
    level=0.9, edges=[10.0], half_widths=[5.0, 8.0], counts=[100, 100], calibration_sensor="v1"
)
TARGETS = TargetRange(min=0.0, p01=1.0, p50=30.0, p99=90.0, max=100.0)


def with_fields(model: TestModel, **update: object) -> Manifest:
    manifest = model.manifest.model_copy(update=update)
    write_manifest(model.path, manifest)
    return manifest


def tick_constant(
    model_dir: Path, series: dict[str, float]
) -> tuple[Ticker, dict[str, CalibratedReading]]:
    """Each sensor reports one constant value for N + 1 periods; the ticker and the last closed
    period's reading per sensor (its window of N is full)."""
    models = ModelSet({"pm10": model_dir})
    models.refresh()
    ticker = Ticker(models, grace_s=5.0, clock=lambda: float(T0))
    for period in range(N + 1):
        for sensor, value in series.items():
            ticker.ingest(Reading(sensor, T0 + period * P + 1, {"pm10": value}))
    out = asyncio.run(ticker.tick())
    return ticker, {r.sensor_id: r for r in out if r.period_start == T0 + (N - 1) * P}


# -- the rule ---------------------------------------------------------------------------------


def test_below_zero_is_implausible_only_beyond_the_bin_half_width(
    model_factory: ModelFactory,
) -> None:
    manifest = model_factory.get().manifest.model_copy(
        update={"intervals": INTERVALS, "target_range": TARGETS}
    )
    bound = PlausibleRange.of(manifest)
    values = [-4.99, -5.01, 0.0, 399.0, 401.0, math.nan, math.inf, -math.inf]
    raw = [20.0] * len(values)
    assert bound.implausible(values, raw).tolist() == [
        False,  # interval [-4.99, 0.01] still reaches zero
        True,  # interval [-5.01, -0.01] lies wholly below zero
        False,
        False,  # 4 x max(target max 100, raw 20) = 400
        True,
        True,
        True,
        True,
    ]
    # A sensor reading far beyond the training range raises the ceiling with it.
    assert bound.implausible([3000.0, 3000.0], [800.0, 700.0]).tolist() == [False, True]
    assert "below zero" in bound.reason(-5.01, 20.0)
    assert "target_range.max" in bound.reason(401.0, 20.0)


def test_a_manifest_without_intervals_or_target_range_falls_back_to_what_it_has(
    model_factory: ModelFactory,
) -> None:
    manifest = model_factory.get().manifest  # validation RMSE 1, input max 500, no intervals
    assert manifest.intervals is None and manifest.target_range is None
    bound = PlausibleRange.of(manifest)
    width = RMSE_HALF_WIDTHS * manifest.validation.rmse
    ceiling = HIGH_FACTOR * manifest.input_range.max
    assert bound.implausible(
        [-width + 0.01, -width - 0.01, ceiling - 1, ceiling + 1], [20.0] * 4
    ).tolist() == [False, True, False, True]
    assert bound.trained_max_source == "input_range.max"


# -- through the ticker -----------------------------------------------------------------------


def test_a_negative_output_beyond_its_interval_is_implausible_and_withheld(
    model_factory: ModelFactory, tmp_path: Path
) -> None:
    model = model_factory.copy(tmp_path / "m", affine=(1.0, -30.0))  # out = raw - 30
    with_fields(model, intervals=INTERVALS)
    with structlog.testing.capture_logs() as logs:
        ticker, got = tick_constant(model.path, {"low": 10.0, "edge": 27.0, "fine": 50.0})
    # raw 10 -> -20: the interval [-25, -15] lies below zero: no concentration.
    low = got["low"]
    assert low.quality == (Quality.IMPLAUSIBLE,)
    assert low.calibrated is None and low.interval is None and low.raw == 10.0
    assert (low.model_name, low.model_version) == ("test-tesla", 1)
    # raw 27 -> -3: inside its half-width of 5, published as computed.
    edge = got["edge"]
    assert edge.quality == (Quality.OK,) and edge.calibrated == pytest.approx(-3.0)
    assert edge.interval == Interval(pytest.approx(-3.0), pytest.approx(2.0), 0.9)  # type: ignore[arg-type]
    assert got["fine"].quality == (Quality.OK,) and got["fine"].calibrated == pytest.approx(20.0)
    assert ticker.counters.flagged["implausible"] == 1  # the one withheld period of "low"
    assert ticker.stats()["ticker"]["flagged"]["implausible"] == 1  # type: ignore[index]
    [warning] = [e for e in logs if e["event"] == "implausible_outputs"]
    assert warning["log_level"] == "warning"
    assert (warning["count"], warning["sensor"], warning["raw"]) == (1, "low", 10.0)
    assert warning["output"] == pytest.approx(-20.0)
    assert "below zero" in warning["reason"]


def test_a_graph_emitting_ten_thousands_is_never_ok(
    model_factory: ModelFactory, tmp_path: Path
) -> None:
    """The issue's case: raw 20 published as about -10,000 with quality ["ok"]."""
    model = model_factory.copy(tmp_path / "m", affine=(-500.0, 0.0))
    _, got = tick_constant(model.path, {"a": 20.0, "b": 0.0, "c": 700.0})
    assert got["a"].quality == (Quality.IMPLAUSIBLE,) and got["a"].calibrated is None
    assert got["b"].quality == (Quality.OK,) and got["b"].calibrated == 0.0  # -500 x 0
    # Inputs outside the training range keep the advisory flag beside the verdict.
    assert got["c"].quality == (Quality.IMPLAUSIBLE, Quality.OUT_OF_DOMAIN)
    assert got["c"].calibrated is None


def test_the_ceiling_is_four_times_the_trained_maximum_or_the_raw_reading(
    model_factory: ModelFactory, tmp_path: Path
) -> None:
    model = model_factory.copy(tmp_path / "m", affine=(5.0, 0.0))  # out = 5 x raw
    with_fields(model, target_range=TARGETS)  # trained max 100: ceiling max(400, 4 x raw)
    _, got = tick_constant(model.path, {"under": 70.0, "over": 90.0})
    assert got["under"].quality == (Quality.OK,)
    assert got["under"].calibrated == pytest.approx(350.0)
    assert got["over"].quality == (Quality.IMPLAUSIBLE,)  # 450 > 400
    assert got["over"].calibrated is None


def test_plausible_outputs_are_unchanged(model_factory: ModelFactory) -> None:
    """The bound costs nothing to a sane model: every valid window is still ``ok``."""
    model = model_factory.get()
    values = np.random.default_rng(3).uniform(5, 80, 4)
    _, got = tick_constant(model.path, {f"s{i}": float(v) for i, v in enumerate(values)})
    assert {r.quality for r in got.values()} == {(Quality.OK,)}
