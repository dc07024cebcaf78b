"""Intervals across units in the contract, and a co-located sensor's coverage adapted online (ACI):
in the health document, the monitor's stats and Prometheus."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from tesla_gateway.contract.calibrated import CalibratedReading, Interval, Quality
from tesla_gateway.contract.manifest import InputRange, PredictionIntervals, load_manifest
from tesla_gateway.contract.readings import Reading
from tesla_gateway.metrics.collector import StatsCollector
from tesla_gateway.monitor.coverage import AdaptiveInterval, adapted_half_width
from tesla_gateway.monitor.drift import DriftConfig
from tesla_gateway.monitor.health import HealthConfig
from tesla_gateway.monitor.monitor import ModelInfo, Monitor
from tesla_gateway.monitor.pairs import PairsConfig
from tesla_gateway.monitor.references import ReferenceConfig
from tesla_gateway.sources.mqtt_source import MqttSourceConfig

MODELS = Path(__file__).resolve().parents[3] / "models"
LEVELS = [0.5, 0.8, 0.9, 0.95, 0.99]
# a unit calibrated on residuals |e| ~ half-normal(sigma = 1) at every level: the quantile table
TABLE = [[float(w)] * 2 for w in (0.674, 1.282, 1.645, 1.960, 2.576)]


def intervals(**changes: object) -> PredictionIntervals:
    fields: dict[str, object] = {
        "method": "cross_unit_conformal_binned",
        "level": 0.9,
        "edges": [20.0],
        "half_widths": TABLE[2],
        "counts": [500, 500],
        "calibration_sensor": "v",
        "calibration_sensors": ["a", "b", "v"],
        "quantile_levels": LEVELS,
        "quantile_half_widths": TABLE,
        **changes,
    }
    return PredictionIntervals.model_validate(fields)


def test_committed_manifests_and_older_interval_documents_still_load() -> None:
    for model_dir in sorted(p for p in MODELS.iterdir() if p.is_dir()):
        assert load_manifest(model_dir).intervals is not None
    old = json.loads((MODELS / "pm10-ispra-1min" / "manifest.json").read_text())["intervals"]
    old = {k: old[k] for k in ("level", "edges", "half_widths", "counts", "calibration_sensor")}
    loaded = PredictionIntervals.model_validate({**old, "method": "split_conformal_binned"})
    assert loaded.calibration_sensors == [] and loaded.unit_coverage == []
    assert loaded.half_width_at(30.0, 0.95) is None  # no table: the gateway falls back


def test_the_quantile_table_is_checked_and_interpolated() -> None:
    table = intervals()
    assert table.half_width_at(10.0, 0.9) == pytest.approx(1.645)
    assert table.half_width_at(10.0, 0.925) == pytest.approx((1.645 + 1.960) / 2)
    assert table.half_width_at(30.0, 0.3) == pytest.approx(0.674)  # clamped to the ends
    assert table.half_width_at(30.0, 0.999) == pytest.approx(2.576)
    with pytest.raises(ValidationError, match="grow with level"):
        intervals(quantile_half_widths=[TABLE[0], TABLE[2], TABLE[1], *TABLE[3:]])
    with pytest.raises(ValidationError, match="one row of 2 widths"):
        intervals(quantile_half_widths=TABLE[:-1])
    with pytest.raises(ValidationError, match="ascend"):
        intervals(quantile_levels=[0.5, 0.8, 0.9, 0.9, 0.99])
    with pytest.raises(ValidationError):
        intervals(method="jackknife")


def test_without_a_table_the_width_scales_as_a_normal_errors_would() -> None:
    width = adapted_half_width(
        30.0, 0.95, published_half_width=1.645, published_level=0.9, intervals=None
    )
    assert width == pytest.approx(1.960, abs=2e-3)
    assert adapted_half_width(
        30.0, 0.95, published_half_width=9.0, published_level=0.9, intervals=intervals()
    ) == pytest.approx(1.960)  # the table wins


def run_aci(scale: float, gamma: float, pairs: int, seed: int = 0) -> AdaptiveInterval:
    """A sensor whose errors are ``scale`` times those the intervals were calibrated on."""
    rng = np.random.default_rng(seed)
    table = intervals()
    state = AdaptiveInterval(0.9, gamma=gamma, window=pairs)
    for value in rng.uniform(5.0, 60.0, pairs):
        reference = value + scale * rng.normal()
        state.update(float(value), float(reference), table.interval(float(value)), table)
    return state


def test_aci_widens_a_units_interval_whose_errors_are_larger_until_it_covers() -> None:
    figures = run_aci(scale=1.4, gamma=0.01, pairs=6000).figures()
    assert figures.coverage < 0.8  # the published interval under-covers this unit
    assert 0.88 <= figures.adapted_coverage <= 0.92
    assert figures.adapted_level > 0.95 and figures.adapted_mean_width > figures.mean_width


def test_aci_narrows_a_units_interval_whose_errors_are_smaller() -> None:
    figures = run_aci(scale=0.6, gamma=0.01, pairs=6000).figures()
    assert figures.coverage > 0.98
    assert 0.88 <= figures.adapted_coverage <= 0.92
    assert figures.adapted_mean_width < figures.mean_width


def test_aci_with_gamma_zero_only_measures() -> None:
    figures = run_aci(scale=1.6, gamma=0.0, pairs=500).figures()
    assert figures.adapted_level == pytest.approx(0.9)
    assert figures.adapted_coverage == pytest.approx(figures.coverage)


P = 60
T0 = 1_578_657_600


def colocated_monitor(tmp_path: Path, table: PredictionIntervals) -> Monitor:
    reference = ReferenceConfig(
        name="ref", feature="pm10", colocated_with=["co"], mqtt=MqttSourceConfig(topics=["r"])
    )
    info = ModelInfo(
        name="m",
        version=1,
        period_seconds=P,
        input_range=InputRange(min=1.0, p01=2.0, p50=40.0, p99=140.0, max=180.0),
        test_rmse=2.0,
        intervals_for=lambda history: table,
    )
    return Monitor(
        health=HealthConfig(publish_interval_s=30.0, min_periods=5, stuck_periods=5),
        drift=DriftConfig(window_pairs=200, min_pairs=5, interval_gamma=0.05),
        pairs=PairsConfig(reference_grace_s=0.0),
        references=[reference],
        state_dir=tmp_path,
        model_info=lambda feature: info if feature == "pm10" else None,
        now=0.0,
    )


def test_a_colocated_sensor_reports_its_coverage_in_health_stats_and_prometheus(
    tmp_path: Path,
) -> None:
    table = intervals()
    mon = colocated_monitor(tmp_path, table)
    rng = np.random.default_rng(1)
    for period, truth in enumerate(rng.uniform(10.0, 50.0, 200)):
        value = float(truth + 2.0 * rng.normal())  # errors twice the calibrated ones
        low, high = table.interval(value)
        mon.observe_reference(
            "ref", Reading("ref", T0 + period * P + 5.0, MappingProxyType({"pm10": truth}), "m"),
            now=0.0,
        )  # fmt: skip
        mon.observe_tick(
            [
                CalibratedReading(
                    sensor_id="co", feature="pm10", period_start=float(T0 + period * P),
                    period_seconds=P, raw=2 * truth, calibrated=value, unit="ug/m3",
                    model_name="m", model_version=1, quality=(Quality.OK,),
                    interval=Interval(low, high, 0.9), history_periods=360, window_length=360,
                )
            ],
            now=0.0,
        )  # fmt: skip
    health = [d for d in mon.poll(now=1e10) if d.kind == "health" and d.sensor_id == "co"]
    mon.close()
    figures = health[0].document["reference"]["intervals"]  # type: ignore[index]
    assert figures["pairs"] == 200 and figures["level"] == 0.9
    assert figures["coverage"] < 0.75 < figures["adapted_coverage"]
    assert figures["adapted_level"] > 0.9
    stats = mon.stats()
    assert stats["drift"]["co/pm10"]["intervals"] == figures  # type: ignore[index]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(lambda: {"drift": stats["drift"]}))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    labels = (("feature", "pm10"), ("interval", "adapted"), ("sensor", "co"))
    assert samples["tesla_gateway_interval_coverage_ratio", labels] == figures["adapted_coverage"]
    published = (("feature", "pm10"), ("interval", "published"), ("sensor", "co"))
    assert samples[
        "tesla_gateway_interval_mean_width_micrograms_per_cubic_meter", published
    ] == pytest.approx(figures["mean_width"])
    assert samples[
        "tesla_gateway_interval_adapted_level", (("feature", "pm10"), ("sensor", "co"))
    ] == pytest.approx(figures["adapted_level"])


def test_a_pair_without_a_finite_value_or_reference_changes_nothing() -> None:
    """A NaN or infinite calibrated value or reference (a reference feed's gap) is no pair:
    the adapted level and the rolling figures stay as they were."""
    table = intervals()
    state = AdaptiveInterval(0.9, gamma=0.05, window=10)
    state.update(20.0, 40.0, table.interval(20.0), table)  # a miss: alpha_t moves
    before = (state.alpha_t, state.figures())
    for value, reference in (
        (math.nan, 20.0),
        (20.0, math.nan),
        (math.inf, 20.0),
        (20.0, -math.inf),
    ):
        state.update(value, reference, table.interval(20.0), table)
    assert (state.alpha_t, state.figures()) == before
    assert before[1].pairs == 1


def test_a_unit_that_always_misses_gets_the_whole_line_and_finite_figures() -> None:
    """ACI's alpha_t below 0 draws the whole line (it always covers): its infinite width is
    left out of the mean width, and the figures stay JSON numbers."""
    table = intervals()
    state = AdaptiveInterval(0.9, gamma=0.5, window=20)
    for _ in range(20):
        state.update(20.0, 500.0, table.interval(20.0), table)
    figures = state.figures()
    assert state.alpha_t <= 0.0 and figures.adapted_level == 1.0
    assert figures.coverage == 0.0 and 0.0 < figures.adapted_coverage < 1.0
    assert all(
        value is None or math.isfinite(value)
        for value in figures.as_dict().values()
        if isinstance(value, float)
    )
    assert math.isfinite(figures.adapted_mean_width)
