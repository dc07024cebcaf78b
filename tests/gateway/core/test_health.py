"""Reference-free health signals of one (sensor, feature): pure, fed one closed period at a time."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tesla_gateway.contract.calibrated import Quality
from tesla_gateway.contract.manifest import InputRange
from tesla_gateway.monitor.health import HealthConfig, HealthFlag, SensorHealth

RANGE = InputRange(min=1.0, p01=2.0, p50=40.0, p99=140.0, max=180.0)
OK = (Quality.OK,)


def feed(
    health: SensorHealth,
    values: list[float] | np.ndarray,
    *,
    start: int = 0,
    quality: tuple[Quality, ...] = OK,
    skip: frozenset[int] = frozenset(),
) -> None:
    for offset, value in enumerate(values):
        if offset in skip:
            continue
        health.update(start + offset, float(value), quality, RANGE, now=float(start + offset))


def noisy(n: int, seed: int = 0, level: float = 40.0) -> np.ndarray:
    return level + np.random.default_rng(seed).normal(0.0, 2.0, n).round(2)


def test_a_healthy_sensor_has_no_flags() -> None:
    health = SensorHealth(HealthConfig())
    feed(health, noisy(200))
    report = health.report(RANGE, now=200.0)
    assert report.flags == ()
    assert report.window_periods == 60 and report.observed == 60
    assert report.dropout_fraction == 0.0 and report.spike_fraction == 0.0
    assert report.range_distance == 0.0
    assert report.recent_mean == pytest.approx(40.0, abs=2.0)


def test_stuck_after_k_identical_period_means_and_cleared_by_a_change() -> None:
    config = HealthConfig(stuck_periods=5)
    health = SensorHealth(config)
    feed(health, [*noisy(20), 33.0, 33.0, 33.0, 33.0])
    assert HealthFlag.STUCK not in health.report(RANGE, 24.0).flags
    health.update(24, 33.0, OK, RANGE, 24.0)
    report = health.report(RANGE, 24.0)
    assert HealthFlag.STUCK in report.flags and report.stuck_periods == 5
    health.update(25, 33.5, OK, RANGE, 25.0)
    assert HealthFlag.STUCK not in health.report(RANGE, 25.0).flags


def test_dropouts_are_the_share_of_missing_grid_periods_in_the_window() -> None:
    config = HealthConfig(window_periods=20, min_periods=5, max_dropout_fraction=0.2)
    health = SensorHealth(config)
    feed(health, noisy(40), skip=frozenset({25, 27, 29, 31, 33}))  # 5 of the last 20 missing
    report = health.report(RANGE, 40.0)
    assert report.dropout_fraction == pytest.approx(5 / 20)
    assert HealthFlag.DROPOUTS in report.flags
    feed(health, noisy(20, seed=1), start=40)  # the holes scroll out
    assert health.report(RANGE, 60.0).dropout_fraction == 0.0


def test_a_gap_longer_than_the_window_empties_it() -> None:
    config = HealthConfig(window_periods=10, min_periods=3)
    health = SensorHealth(config)
    feed(health, noisy(10))
    health.update(100, 40.0, OK, RANGE, 100.0)
    report = health.report(RANGE, 100.0)
    assert report.observed == 1 and report.dropout_fraction == pytest.approx(0.9)
    assert HealthFlag.DROPOUTS in report.flags


def test_spikes_beyond_the_robust_bound_are_counted_and_do_not_inflate_it() -> None:
    config = HealthConfig(window_periods=50, min_periods=10, max_spike_fraction=0.05)
    health = SensorHealth(config)
    values = noisy(50)
    values[[20, 30, 40]] = 400.0  # three single-period spikes
    feed(health, values)
    report = health.report(RANGE, 50.0)
    # Each spike is two jumps (up and back down); both exceed the bound.
    assert report.spike_fraction == pytest.approx(6 / 50)
    assert HealthFlag.SPIKES in report.flags
    assert report.spike_bound is not None and report.spike_bound < 30.0  # not inflated


def test_gap_policy_rejections_share() -> None:
    config = HealthConfig(window_periods=20, min_periods=5, max_gap_fraction=0.2)
    health = SensorHealth(config)
    feed(health, noisy(15))
    feed(health, noisy(5, seed=2), start=15, quality=(Quality.GAP,))
    report = health.report(RANGE, 20.0)
    assert report.gap_fraction == pytest.approx(5 / 20)
    assert HealthFlag.GAP_REJECTS in report.flags


def test_leaving_the_training_domain_is_flagged() -> None:
    config = HealthConfig(window_periods=20, min_periods=5)
    health = SensorHealth(config)
    feed(health, noisy(20))
    feed(health, noisy(10, seed=3, level=160.0), start=20)  # above p99 (140), below max (180)
    report = health.report(RANGE, 30.0)
    assert report.above_p99_fraction == pytest.approx(10 / 20)
    assert report.above_max_fraction == 0.0
    assert HealthFlag.OUT_OF_DOMAIN in report.flags
    feed(health, noisy(30, seed=4, level=160.0), start=30)  # the recent mean follows
    report = health.report(RANGE, 60.0)
    assert report.range_distance == pytest.approx((160.0 - 140.0) / (140.0 - 2.0), abs=0.03)
    # Without a model (no range) nothing is judged against the domain.
    assert HealthFlag.OUT_OF_DOMAIN not in SensorHealth(config).report(None, 30.0).flags


def test_missing_channel_and_offline() -> None:
    health = SensorHealth(HealthConfig(offline_after_s=100.0))
    health.update(0, 20.0, (Quality.MISSING_CHANNEL,), RANGE, now=1000.0)
    assert health.report(RANGE, now=1000.0).flags == (HealthFlag.MISSING_CHANNEL,)
    health.update(1, 21.0, OK, RANGE, now=1001.0)
    assert health.report(RANGE, now=1050.0).flags == ()
    assert health.report(RANGE, now=1102.0).flags == (HealthFlag.OFFLINE,)


def test_one_implausible_output_raises_the_flag_until_it_leaves_the_window() -> None:
    """A withheld (implausible) calibration flags the sensor at once, before ``min_periods``,
    and the flag clears once a whole window has passed without one."""
    config = HealthConfig(window_periods=10, min_periods=5)
    health = SensorHealth(config)
    health.update(0, 20.0, (Quality.IMPLAUSIBLE,), RANGE, now=0.0)
    report = health.report(RANGE, now=0.0)
    assert report.flags == (HealthFlag.IMPLAUSIBLE,)
    assert report.implausible_fraction == 1.0
    assert report.figures()["implausible_fraction"] == 1.0
    feed(health, noisy(9), start=1)
    report = health.report(RANGE, now=9.0)
    assert HealthFlag.IMPLAUSIBLE in report.flags
    assert report.implausible_fraction == pytest.approx(1 / 10)
    feed(health, noisy(1, seed=5), start=10)  # period 0 leaves the 10-period window
    report = health.report(RANGE, now=10.0)
    assert HealthFlag.IMPLAUSIBLE not in report.flags and report.implausible_fraction == 0.0


def test_older_periods_and_non_finite_values_are_ignored() -> None:
    health = SensorHealth(HealthConfig())
    health.update(10, 20.0, OK, RANGE, 0.0)
    health.update(9, 25.0, OK, RANGE, 0.0)
    health.update(11, float("nan"), OK, RANGE, 0.0)
    report = health.report(RANGE, 0.0)
    assert report.last_period == 10 and report.observed == 1


def test_config_rejects_min_periods_above_the_window() -> None:
    with pytest.raises(ValidationError, match="min_periods"):
        HealthConfig(window_periods=5, min_periods=10)


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(2, 30),
    steps=st.lists(
        st.tuples(st.integers(1, 40), st.floats(0, 300), st.booleans()), min_size=1, max_size=80
    ),
)
def test_window_shares_match_a_direct_count(
    window: int, steps: list[tuple[int, float, bool]]
) -> None:
    """The ring's running counts equal counting the last ``window`` grid periods directly."""
    health = SensorHealth(HealthConfig(window_periods=window, min_periods=1))
    period = 0
    seen: dict[int, tuple[float, bool]] = {}
    for advance, value, gap in steps:
        period += advance
        quality = (Quality.GAP,) if gap else OK
        health.update(period, value, quality, RANGE, 0.0)
        seen[period] = (value, gap)
    first = min(seen)
    recent = [p for p in seen if p > period - window]
    report = health.report(RANGE, 0.0)
    span = min(window, period - first + 1)
    assert report.window_periods == span
    assert report.observed == len(recent)
    assert report.dropout_fraction == pytest.approx(1 - len(recent) / span)
    assert report.gap_fraction == pytest.approx(sum(seen[p][1] for p in recent) / len(recent))
    above = sum(seen[p][0] > RANGE.p99 for p in recent) / len(recent)
    assert report.above_p99_fraction == pytest.approx(above)
