"""Rolling error of calibrated vs reference, the drift threshold, and drift hysteresis."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tesla_gateway.monitor.drift import (
    DriftChange,
    DriftConfig,
    DriftDetector,
    ErrorFigures,
    HarmDetector,
    RollingError,
    drift_threshold,
    linear_residual_rmse,
)

finite = st.floats(0, 1000, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(window=st.integers(1, 20), triples=st.lists(st.tuples(finite, finite, finite), max_size=60))
def test_rolling_error_covers_exactly_the_last_pairs(
    window: int, triples: list[tuple[float, float, float]]
) -> None:
    rolling = RollingError(window)
    for calibrated, raw, reference in triples:
        rolling.add(calibrated, raw, reference)
    figures = rolling.figures()
    recent = np.array(triples[-window:], dtype=np.float64).reshape(-1, 3)
    assert figures.pairs == len(recent)
    if not len(recent):
        assert math.isnan(figures.rmse)
        return
    error = recent[:, 0] - recent[:, 2]
    raw_error = recent[:, 1] - recent[:, 2]
    assert figures.rmse == pytest.approx(np.sqrt(np.mean(error**2)), rel=1e-9, abs=1e-9)
    assert figures.mae == pytest.approx(np.mean(np.abs(error)), rel=1e-9, abs=1e-9)
    assert figures.raw_rmse == pytest.approx(np.sqrt(np.mean(raw_error**2)), rel=1e-9, abs=1e-9)
    assert figures.raw_mae == pytest.approx(np.mean(np.abs(raw_error)), rel=1e-9, abs=1e-9)


def test_reset_forgets_the_pairs() -> None:
    rolling = RollingError(3)
    rolling.add(10.0, 20.0, 9.0)
    rolling.reset()
    assert len(rolling) == 0 and rolling.figures().as_dict()["rmse"] is None


def test_threshold_is_the_smallest_configured() -> None:
    assert drift_threshold(DriftConfig(rmse_abs=0, rmse_ratio=2.0), 4.0) == 8.0
    assert drift_threshold(DriftConfig(rmse_abs=5.0, rmse_ratio=2.0), 4.0) == 5.0
    assert drift_threshold(DriftConfig(rmse_abs=10.0, rmse_ratio=2.0), 4.0) == 8.0
    assert drift_threshold(DriftConfig(rmse_abs=10.0, rmse_ratio=2.0), None) == 10.0
    assert drift_threshold(DriftConfig(rmse_abs=10.0, rmse_ratio=0), 4.0) == 10.0
    assert drift_threshold(DriftConfig(rmse_abs=0, rmse_ratio=0), 4.0) is None


def test_config_rejects_min_pairs_above_the_window() -> None:
    with pytest.raises(ValidationError, match="min_pairs"):
        DriftConfig(window_pairs=10, min_pairs=11)


def figures(rmse: float, pairs: int = 100) -> ErrorFigures:
    return ErrorFigures(pairs=pairs, rmse=rmse, mae=rmse, raw_rmse=rmse, raw_mae=rmse)


def test_drift_is_raised_above_and_cleared_only_below_the_hysteresis_band() -> None:
    detector = DriftDetector(DriftConfig(min_pairs=10, clear_fraction=0.8))
    assert detector.evaluate(figures(20.0, pairs=9), 10.0) is None  # too few pairs
    assert detector.evaluate(figures(5.0), 10.0) is DriftChange.CONFIRMED_CLEAR  # first judgement
    assert detector.evaluate(figures(9.9), 10.0) is None
    assert detector.evaluate(figures(10.5), 10.0) is DriftChange.RAISED
    assert detector.active
    assert detector.evaluate(figures(9.0), 10.0) is None  # inside the band: still drifting
    assert detector.evaluate(figures(12.0), 10.0) is None
    assert detector.evaluate(figures(7.9), 10.0) is DriftChange.CLEARED
    assert not detector.active
    assert detector.evaluate(figures(9.0), 10.0) is None
    assert detector.evaluate(figures(50.0), None) is None  # no threshold: never judged


def test_first_judgement_may_raise_at_once() -> None:
    detector = DriftDetector(DriftConfig(min_pairs=1))
    assert detector.evaluate(figures(30.0), 10.0) is DriftChange.RAISED


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0, 30, allow_nan=False), min_size=1, max_size=100))
def test_hysteresis_state_follows_its_rule(rmses: list[float]) -> None:
    """Raised only above the threshold, cleared only below the band, never two of a kind."""
    threshold, clear = 10.0, 0.8
    detector = DriftDetector(DriftConfig(min_pairs=1, clear_fraction=clear))
    active = False
    last_change: DriftChange | None = None
    for rmse in rmses:
        change = detector.evaluate(figures(rmse), threshold)
        if change is DriftChange.RAISED:
            assert rmse > threshold and not active and last_change is not DriftChange.RAISED
            active, last_change = True, change
        elif change is DriftChange.CLEARED:
            assert rmse < clear * threshold and active
            active, last_change = False, change
        else:
            assert not (not active and rmse > threshold)
            assert not (active and rmse < clear * threshold)
        assert detector.active == active


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=3, max_size=40))
def test_the_linear_baseline_is_the_least_squares_line_per_degree_of_freedom(
    pairs: list[tuple[float, float]],
) -> None:
    raw, reference = (np.array(column, dtype=np.float64) for column in zip(*pairs, strict=True))
    got = linear_residual_rmse(raw, reference)
    if np.ptp(raw) < 1e-6:
        return  # a constant raw has no line (NaN, or a fit as good as its noise)
    slope, intercept = np.polyfit(raw, reference, 1)
    residual = reference - (slope * raw + intercept)
    expected = math.sqrt(float(residual @ residual) / (len(pairs) - 2))
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_harm_is_raised_beyond_the_margin_and_cleared_at_the_baseline() -> None:
    config = DriftConfig(window_pairs=10, min_pairs=5, harm_margin=0.1)
    harm = HarmDetector(config)

    def figures(rmse: float, raw: float, linear: float, pairs: int = 5) -> ErrorFigures:
        return ErrorFigures(pairs, rmse, rmse, raw, raw, linear)

    assert harm.evaluate(figures(20.0, 1.0, 1.0, pairs=4)) is None  # too few pairs
    assert harm.evaluate(figures(1.05, 1.0, 5.0)) is None  # within the margin of raw
    assert harm.evaluate(figures(1.2, 5.0, 1.0)) is DriftChange.RAISED  # worse than the line
    assert harm.worse_than(figures(1.2, 5.0, 1.0)) == ["linear"]
    assert harm.evaluate(figures(1.05, 5.0, 1.0)) is None  # hysteresis: still above the line
    assert harm.evaluate(figures(0.9, 5.0, 1.0)) is DriftChange.CLEARED
    assert harm.evaluate(figures(3.0, 2.0, math.nan)) is DriftChange.RAISED  # no line: raw only
