"""Pure parts of issue 17: conformal intervals, the EU GDE yardstick, the harm guard and the
``train`` flags (no training here: the pipeline tests exercise them on a real run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tesla_gateway.contract import manifest as manifest_schema
from tesla_gateway.contract.manifest import ErrorMetrics, Manifest, PredictionIntervals
from training.cli import build_parser, train_config
from training.conformal import MIN_PER_BIN, conformal_rank, fit_intervals, score_intervals
from training.data import WindowSet
from training.equivalence import (
    daily_means,
    equivalence,
    expanded_relative_uncertainty,
    orthogonal_regression,
)
from training.errors import DataError, HarmfulModelError
from training.harm import check_not_harmful, compare_on
from training.metrics import LinearCalibration

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "models" / "pm10-ispra-1min"


def _heteroscedastic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Predictions over 2-100 and references whose error grows with the level (10 %)."""
    rng = np.random.default_rng(seed)
    predicted = rng.uniform(2, 100, n)
    return predicted, predicted + rng.normal(0, 0.1 * predicted)


def test_conformal_rank_is_the_finite_sample_quantile() -> None:
    # ceil((n + 1) * 0.9): 100 scores -> the 91st smallest, 9 -> the 9th (all of them).
    assert conformal_rank(100, 0.9) == 91
    assert conformal_rank(9, 0.9) == 9


def test_intervals_widen_with_the_level_and_cover_fresh_data() -> None:
    predicted, reference = _heteroscedastic(5000, seed=1)
    intervals = fit_intervals(predicted, reference, sensor="v", level=0.9)
    assert len(intervals.half_widths) == 5 and sum(intervals.counts) == 5000
    assert intervals.half_widths == sorted(set(intervals.half_widths))
    fresh = score_intervals(intervals, *_heteroscedastic(20000, seed=2))
    assert 0.88 <= fresh.coverage <= 0.92
    # One width for all levels would be as wide at 5 µg/m³ as at 90: the bins are what keeps
    # clean-air intervals narrow.
    low, high = intervals.interval(5.0)
    assert high - low < 0.5 * intervals.half_widths[-1]


def test_bin_widths_are_the_conformal_order_statistic() -> None:
    predicted = np.full(MIN_PER_BIN, 10.0)
    residuals = np.arange(1, MIN_PER_BIN + 1, dtype=float)  # |y - ŷ| = 1 … 100
    intervals = fit_intervals(predicted, predicted + residuals, sensor="v", level=0.9)
    assert intervals.edges == [] and intervals.half_widths == [91.0]
    assert intervals.interval(10.0) == (0.0, 101.0)  # the low end is clipped at 0


def test_too_few_validation_pairs_give_no_intervals() -> None:
    with pytest.raises(DataError, match="need at least"):
        fit_intervals(np.ones(20), np.ones(20), sensor="v")


def test_ties_that_starve_a_bin_step_down_one_bin_at_a_time() -> None:
    # 200 equal predictions in the middle: 5, 4 and 3 bins leave one with fewer than 100 pairs,
    # 2 bins do not (trying 5, 3 and 1 only would end with one bin).
    predicted = np.concatenate([np.linspace(1, 50, 150), np.full(200, 100.0),
                                np.linspace(150, 200, 150)])  # fmt: skip
    reference = predicted + np.random.default_rng(0).normal(0, 1, 500)
    intervals = fit_intervals(predicted, reference, sensor="v")
    assert intervals.edges == [100.0] and intervals.counts == [150, 350]  # 100.0 goes up


def test_exactly_min_per_bin_pairs_fill_a_bin() -> None:
    predicted = np.arange(200, dtype=float)
    intervals = fit_intervals(predicted, predicted + 1.0, sensor="v")
    assert intervals.counts == [100, 100]
    one_bin = fit_intervals(predicted[:150], predicted[:150] + 1.0, sensor="v")
    assert one_bin.counts == [150] and one_bin.edges == []
    # The largest score is the quantile when ceil((n + 1) * level) is n itself.
    top = fit_intervals(predicted[:100], predicted[:100] + np.arange(100.0), sensor="v",
                        level=0.99)  # fmt: skip
    assert top.half_widths == [99.0]


def test_pairs_without_a_finite_value_are_left_out_and_any_shape_or_precision_fits() -> None:
    predicted, reference = _heteroscedastic(400, seed=4)
    clean = fit_intervals(predicted, reference, sensor="v")
    damaged_p = np.concatenate([predicted, [np.nan, 5.0, np.inf]])
    damaged_r = np.concatenate([reference, [5.0, np.nan, 5.0]])
    assert fit_intervals(damaged_p, damaged_r, sensor="v") == clean
    as_columns = fit_intervals(predicted[:, None], reference[:, None], sensor="v")
    assert as_columns == clean
    single = fit_intervals(predicted.astype(np.float32), reference.astype(np.float32),
                           sensor="v")  # fmt: skip
    exact = fit_intervals(predicted.astype(np.float32).astype(np.float64),
                          reference.astype(np.float32).astype(np.float64), sensor="v")  # fmt: skip
    assert single.half_widths == exact.half_widths  # residuals in float64 either way


def test_scores_count_the_interval_ends_as_inside_and_clip_at_zero() -> None:
    intervals = PredictionIntervals(level=0.9, edges=[10.0], half_widths=[2.0, 5.0],
                                    counts=[100, 100], calibration_sensor="v")  # fmt: skip
    predicted = np.array([1.0, 8.0, 8.0, 10.0, 10.0])
    reference = np.array([0.5, 6.0, 10.0, 15.0, 16.0])  # clipped low, both ends, upper bin
    scores = score_intervals(intervals, predicted, reference)
    assert scores.n == 5 and scores.level == 0.9
    assert scores.coverage == pytest.approx(4 / 5)  # 10 + 5 = 15 inside, 16 not
    # widths: [0, 3] (clipped), [6, 10] twice, [5, 15] twice
    assert scores.mean_width == pytest.approx((3 + 4 + 4 + 10 + 10) / 5)
    assert scores.as_dict() == {"level": 0.9, "coverage": scores.coverage,
                                "mean_width": scores.mean_width, "n": 5}  # fmt: skip
    one = score_intervals(intervals, np.array([8.0]), np.array([9.0]))
    assert (one.coverage, one.n) == (1.0, 1)
    empty = score_intervals(intervals, np.array([np.nan]), np.array([1.0]))
    assert empty.n == 0 and empty.level == 0.9
    assert np.isnan(empty.coverage) and np.isnan(empty.mean_width)


def test_manifests_without_the_new_fields_stay_valid() -> None:
    document = json.loads((DEFAULT_MODEL / "manifest.json").read_text())
    for key in ("intervals", "validation_baselines", "device_graph_absent"):
        document.pop(key, None)
    manifest = Manifest.model_validate(document)
    assert manifest.intervals is None and manifest.device_graph_absent is None


def test_interval_bins_must_match_their_edges() -> None:
    with pytest.raises(ValueError, match="2 bins need 2"):
        PredictionIntervals(level=0.9, edges=[5.0], half_widths=[1.0], counts=[100],
                            calibration_sensor="v")  # fmt: skip


def test_gde_uncertainty_matches_a_hand_computed_example() -> None:
    # x̄ = ȳ = 15; s_xx = 500, s_yy = 464, s_xy = 480.
    # b = (464 − 500 + √(36² + 4·480²)) / (2·480) = (−36 + 960.6748) / 960 = 0.963203
    # a = 15 − 15·b = 0.551957; residuals 0.448042, −1.183989, 1.183979, −0.448052
    # RSS = 3.205127; RSS/(n−2) = 1.602563; bias at 50: a + (b − 1)·50 = −1.287893
    # u_c² = 1.602563 − 0.5² + 1.658669 = 3.011232; W = 2·√3.011232 / 50 = 0.069411
    x = np.array([0.0, 10.0, 20.0, 30.0])
    y = np.array([1.0, 9.0, 21.0, 29.0])
    w, slope, intercept = expanded_relative_uncertainty(x, y, 50.0, reference_uncertainty=0.5)
    assert slope == pytest.approx(0.963203, abs=1e-5)
    assert intercept == pytest.approx(0.551957, abs=1e-5)
    assert w == pytest.approx(0.069411, abs=1e-5)


def test_gde_uses_daily_means_of_complete_days_only() -> None:
    hours = pd.date_range("2024-01-01", periods=24 * 5, freq="h", tz="UTC")
    reference = 20 + 10 * np.sin(np.arange(len(hours)) / 7)
    frame = pd.DataFrame(
        {"timestamp": hours.strftime("%Y-%m-%dT%H:%M:%SZ"), "sensor_id": "s",
         "reference": reference, "calibrated": 1.1 * reference + 2}
    )  # fmt: skip
    frame.loc[frame.index[-10:], "calibrated"] = np.nan  # the last day keeps 14 of 24 hours
    assert len(daily_means(frame, 3600)) == 4
    result = equivalence(frame, feature="pm10", period_seconds=3600)
    assert result is not None and result.days == 4 and result.limit_value == 50.0
    assert result.slope == pytest.approx(1.1) and result.intercept == pytest.approx(2.0)
    # No scatter: W is the bias at the limit value, 2·(2 + 0.1·50)/50 = 28 %.
    assert result.expanded_relative_uncertainty == pytest.approx(0.28)
    assert result.meets_indicative_dqo and result.r2 == pytest.approx(1.0)


def test_a_day_with_exactly_75_percent_of_its_periods_counts() -> None:
    # Directive 2008/50/EC Annex VII: a daily value needs 75 % of the hours, so 18 of 24
    # is a day and 17 of 24 is not.
    hours = pd.date_range("2024-01-01", periods=24 * 2, freq="h", tz="UTC")
    frame = pd.DataFrame(
        {"timestamp": hours.strftime("%Y-%m-%dT%H:%M:%SZ"), "sensor_id": "s",
         "reference": 20.0, "calibrated": 21.0}
    )  # fmt: skip
    frame.loc[frame.index[18:24], "calibrated"] = np.nan  # day 1: 18 of 24 hours
    frame.loc[frame.index[24 + 17 :], "reference"] = np.nan  # day 2: 17 of 24 hours
    days = daily_means(frame, 3600)
    assert days["day"].dt.strftime("%Y-%m-%d").tolist() == ["2024-01-01"]
    assert days["periods"].tolist() == [18]


def _scores(raw: float, linear: float, model: float) -> manifest_schema.TestMetrics:
    def m(rmse: float) -> ErrorMetrics:
        return ErrorMetrics(rmse=rmse, mae=rmse, n=100)

    return manifest_schema.TestMetrics(raw=m(raw), linear=m(linear), model=m(model))


def test_the_guard_names_the_numbers_and_yields_to_force() -> None:
    with pytest.raises(HarmfulModelError, match=r"worse than the raw readings \(raw 4, linear 6"):
        check_not_harmful(_scores(4.0, 6.0, 5.0), "v1", force=False)
    with pytest.raises(HarmfulModelError, match="worse than a linear fit"):
        check_not_harmful(_scores(15.7, 3.13, 3.5), "v1", force=False)
    check_not_harmful(_scores(15.7, 3.13, 3.5), "v1", force=True)
    check_not_harmful(_scores(15.7, 3.13, 2.19), "v1", force=False)


def test_ties_are_not_harm_and_the_message_names_every_yardstick_lost_to() -> None:
    check_not_harmful(_scores(4.0, 3.0, 3.0), "v1", force=False)  # as good as linear: allowed
    with pytest.raises(HarmfulModelError) as caught:
        check_not_harmful(_scores(4.0, 6.0, 7.0), "v1", force=False)
    assert "worse than the raw readings and a linear fit" in str(caught.value)
    assert "(raw 4, linear 6, model 7 µg/m³ RMSE over 100 windows)" in str(caught.value)


def test_the_baselines_are_scored_on_the_validation_windows() -> None:
    targets = np.array([10.0, 20.0, 30.0, 40.0], dtype=np.float32)
    current = np.array([12.0, 18.0, 33.0, 41.0], dtype=np.float32)
    windows = WindowSet(
        window_length=1,
        channels=("raw",),
        sensor_ids=("v",),
        period_seconds=(60,),
        first_periods=(0,),
        filled=(current[None, :].astype(np.float64),),
        sensor=np.zeros(4, dtype=np.int32),
        end=np.arange(4, dtype=np.int64),
        targets=targets,
        current_raw=current,
    )
    scores = compare_on(windows, targets + 0.5, LinearCalibration(slope=1.0, intercept=-1.0))
    assert scores.raw.rmse == pytest.approx(np.sqrt((4 + 4 + 9 + 1) / 4))
    assert scores.linear.rmse == pytest.approx(np.sqrt((1 + 9 + 4 + 0) / 4))  # raw - 1
    assert scores.model.rmse == pytest.approx(0.5)
    assert scores.raw.n == scores.linear.n == scores.model.n == 4


def test_train_flags_choose_channels_feature_and_period(tmp_path: Path) -> None:
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(
        {"dataset": "csv", "epochs": 2, "dataset_options": {"feature": "pm2_5"}}
    ))  # fmt: skip
    args = build_parser().parse_args(
        ["train", "--config", str(config_file), "--run-dir", str(tmp_path / "run"),
         "--channels", "raw, rh,temp_c", "--feature", "pm10", "--period", "600"]
    )  # fmt: skip
    config = train_config(args)
    assert config.channels == ("raw", "rh", "temp_c")
    assert config.dataset_options == {"feature": "pm10", "period_seconds": 600}
    assert config.epochs == 2 and config.dataset == "csv"
    plain = train_config(build_parser().parse_args(
        ["train", "--config", str(config_file), "--run-dir", str(tmp_path / "run")]
    ))  # fmt: skip
    assert plain.channels == ("raw",) and plain.dataset_options == {"feature": "pm2_5"}


# -- the GDE figures' edges (survivors of make mutation) --------------------------------------


def _days(reference: list[float], calibrated: list[float]) -> pd.DataFrame:
    """Whole UTC days of hourly pairs, constant within each day (exact daily means)."""
    hours = pd.date_range("2024-01-01", periods=24 * len(reference), freq="h", tz="UTC")
    return pd.DataFrame(
        {"timestamp": hours.strftime("%Y-%m-%dT%H:%M:%SZ"), "sensor_id": "s",
         "reference": np.repeat(reference, 24), "calibrated": np.repeat(calibrated, 24)}
    )  # fmt: skip


def test_gde_needs_three_days_and_a_feature_with_a_limit_value() -> None:
    assert equivalence(_days([10, 20], [12, 21]), feature="pm10", period_seconds=3600) is None
    three = _days([10, 20, 30], [12, 21, 33])
    assert equivalence(three, feature="pm10", period_seconds=3600) is not None
    assert equivalence(three, feature="rh", period_seconds=3600) is None
    with pytest.raises(ValueError, match="needs at least 3"):
        expanded_relative_uncertainty(np.array([1.0, 2.0]), np.array([1.0, 2.5]), 50.0)
    w, _, _ = expanded_relative_uncertainty(
        np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.5, 3.0]), 50
    )
    assert w > 0


def test_gde_figures_in_full() -> None:
    """W exactly at the indicative objective meets it (W <= 50 %), and every field is there."""
    result = equivalence(
        _days([10, 20, 30], [22.5, 32.5, 42.5]), feature="pm10", period_seconds=3600
    )
    assert result is not None
    assert result.as_dict() == {
        "averaging": "daily (UTC days with >= 75 % of periods)",
        "days": 3,
        "limit_value": 50.0,
        "reference_uncertainty": 0.0,
        "slope": 1.0,
        "intercept": 12.5,
        "r2": pytest.approx(1.0),
        "expanded_relative_uncertainty": 0.5,  # 2 x 12.5 / 50: the bias alone
        "dqo_indicative": 0.5,
        "meets_indicative_dqo": True,
    }


def test_gde_with_scatter_reports_r2_and_the_reference_uncertainty() -> None:
    frame = _days([10, 20, 30, 40], [11, 19, 32, 39])
    plain = equivalence(frame, feature="pm10", period_seconds=3600)
    known = equivalence(frame, feature="pm10", period_seconds=3600, reference_uncertainty=1.0)
    assert plain is not None and known is not None
    r = np.corrcoef([10, 20, 30, 40], [11, 19, 32, 39])[0, 1]
    assert plain.r2 == pytest.approx(r * r) and plain.r2 < 0.99
    assert known.reference_uncertainty == 1.0
    w, _, _ = expanded_relative_uncertainty(
        np.array([10.0, 20.0, 30.0, 40.0]), np.array([11.0, 19.0, 32.0, 39.0]), 50.0, 1.0
    )
    assert known.expanded_relative_uncertainty == pytest.approx(w)
    assert known.expanded_relative_uncertainty < plain.expanded_relative_uncertainty


def test_gde_defaults_to_no_reference_uncertainty_and_never_goes_below_zero() -> None:
    x = np.array([0.0, 10.0, 20.0, 30.0])
    y = np.array([1.0, 9.0, 21.0, 29.0])
    assert expanded_relative_uncertainty(x, y, 50.0) == expanded_relative_uncertainty(
        x, y, 50.0, 0.0
    )
    assert expanded_relative_uncertainty(x, x, 50.0)[0] == 0.0  # perfect agreement
    assert expanded_relative_uncertainty(x, x, 50.0, 5.0)[0] == 0.0  # clipped, not imaginary


def test_gde_computes_in_float64_whatever_it_is_given() -> None:
    x = np.array([0.0, 10.0, 20.0, 30.1], dtype=np.float32)
    y = np.array([1.0, 9.0, 21.3, 29.0], dtype=np.float32)
    wide = (x.astype(np.float64), y.astype(np.float64))
    assert orthogonal_regression(x, y) == orthogonal_regression(*wide)
    assert expanded_relative_uncertainty(x, y, 50.0) == expanded_relative_uncertainty(*wide, 50.0)


def test_uncorrelated_pairs_have_no_orthogonal_slope() -> None:
    with pytest.raises(ValueError, match="uncorrelated"):
        orthogonal_regression(np.array([1.0, 2.0, 3.0]), np.array([5.0, 5.0, 5.0]))
    frame = _days([10, 20, 30], [5, 5, 5])
    assert equivalence(frame, feature="pm10", period_seconds=3600) is None
    # s_xy of exactly 1 is an ordinary slope
    slope, _ = orthogonal_regression(np.array([0.0, 1.0]), np.array([0.0, 2.0]))
    assert slope == pytest.approx(2.0)


def test_daily_means_are_taken_over_utc_days() -> None:
    """Timestamps with an offset count in the UTC day they fall in."""
    stamps = ["2024-01-01T23:30:00+00:00", "2024-01-02T00:30:00+01:00", "2024-01-02T00:59:00+01:00"]
    frame = pd.DataFrame(
        {"timestamp": stamps, "sensor_id": "s", "reference": [1.0, 3.0, 5.0],
         "calibrated": [1.0, 3.0, 5.0]}
    )  # fmt: skip
    days = daily_means(frame, 28_800)  # 3 periods a day: 2.25 needed
    assert days["day"].dt.strftime("%Y-%m-%d").tolist() == ["2024-01-01"]
    assert days["reference"].tolist() == [3.0]


def test_ties_that_starve_four_bins_but_not_three_give_three() -> None:
    predicted = np.concatenate([np.full(120, 1.0), np.full(140, 2.0), np.full(140, 3.0)])
    reference = predicted + np.random.default_rng(1).normal(0, 1, 400)
    intervals = fit_intervals(predicted, reference, sensor="v")
    assert intervals.edges == [2.0, 3.0] and intervals.counts == [120, 140, 140]
