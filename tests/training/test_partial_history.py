"""Training on truncated histories: the augmentation, the manifest's curve and intervals, and
``evaluate --history-periods``, on synthetic co-location data through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tesla_gateway.contract.manifest import ErrorMetrics, HistoryPoint, load_manifest
from tesla_gateway.contract.series import pad_history
from tesla_gateway.models.calibrator import Calibrator
from training.data import generate_synthetic
from training.errors import DataError
from training.evaluate import evaluate_model_dir
from training.history import calibrates_from, history_points, sample_history, truncate
from training.history_report import HistoryTarget, measure, write_report
from training.model_dir import export_run
from training.models import TeslaConfig
from training.train import TrainConfig, WindowBatches, prepare_data, train

OPTIONS: dict[str, int | float | str] = {"n_sensors": 4, "days": 2, "period_seconds": 60, "seed": 5}
N = 48


def test_sample_history_truncates_the_asked_share_log_uniformly() -> None:
    history = sample_history(np.random.default_rng(0), 200_000, 360, 0.5)
    short = history[history < 360]
    assert short.size / history.size == pytest.approx(0.5, abs=0.01)
    assert short.min() == 1
    # log-uniform: as many windows below sqrt(361) = 19 periods as above it
    assert np.mean(short < 19) == pytest.approx(0.5, abs=0.02)
    assert (sample_history(np.random.default_rng(0), 10, 360, 0.0) == 360).all()
    with pytest.raises(DataError):
        sample_history(np.random.default_rng(0), 10, 360, 1.5)


def test_history_points_span_one_to_n_with_the_usual_horizons() -> None:
    assert history_points(360, 60) == (1, 2, 4, 7, 15, 26, 60, 97, 180, 360)
    assert {1, 24, 48, 168} <= set(history_points(168, 3600))
    assert history_points(3, 60) == (1, 2, 3)


def _point(periods: int, rmse: float, linear: float | None = 10.0) -> HistoryPoint:
    return HistoryPoint(
        periods=periods,
        model=ErrorMetrics(rmse=rmse, mae=rmse, n=9),
        linear=None if linear is None else ErrorMetrics(rmse=linear, mae=linear, n=9),
    )


def test_a_model_calibrates_from_where_it_stays_within_2_percent_of_linear() -> None:
    assert calibrates_from([_point(1, 10.1), _point(4, 9.0), _point(8, 5.0)]) == 1
    assert calibrates_from([_point(1, 10.3), _point(4, 9.0), _point(8, 5.0)]) == 4
    # a bump further on counts too: from there on means at every longer history
    assert calibrates_from([_point(1, 9.0), _point(4, 10.5), _point(8, 5.0)]) == 8
    assert calibrates_from([_point(1, 12.0, None), _point(8, 5.0, None)]) == 1


def test_truncate_is_the_contracts_padding_on_the_time_axis() -> None:
    x = np.random.default_rng(1).normal(size=(5, N, 3)).astype(np.float32)
    np.testing.assert_array_equal(truncate(x, 7), pad_history(x, 7, axis=1))
    assert (truncate(x, 7)[:, : N - 7] == x[:, N - 7 : N - 6]).all()


def _config(fraction: float) -> TrainConfig:
    return TrainConfig(
        dataset="synthetic",
        dataset_options=OPTIONS,
        window_length=N,
        max_interpolated_periods=10,
        model=TeslaConfig(d_model=8, heads=2),
        epochs=2,
        batch_size=64,
        learning_rate=3e-3,
        partial_history_fraction=fraction,
    )


def test_batches_truncate_the_asked_share_of_windows() -> None:
    prepared = prepare_data(_config(0.5))
    indices = np.arange(len(prepared.train), dtype=np.int64)
    batches = WindowBatches(prepared.train, indices, 512, seed=0, partial_history_fraction=0.5)
    x, _ = batches[0]
    whole, _ = prepared.train.gather(np.sort(batches.indices[:512]))
    changed = np.any(x != whole, axis=1)
    assert 0.3 < changed.mean() < 0.55  # a truncation to K = N or a flat start changes nothing
    assert np.array_equal(x[:, -1], whole[:, -1])  # the newest period is always real
    plain = WindowBatches(prepared.train, indices, 512, seed=0)
    assert np.array_equal(plain[0][0], prepared.train.gather(np.sort(plain.indices[:512]))[0])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = train(_config(0.5), tmp_path_factory.mktemp("run"), verbose=0)
    out = tmp_path_factory.mktemp("models") / "pm2_5-short"
    export_run(run.run_dir, out, name="pm2_5-short", version=3, force=True)
    return out


@pytest.mark.slow
def test_the_manifest_says_from_when_it_calibrates_and_how_the_error_grows(
    model_dir: Path,
) -> None:
    manifest = load_manifest(model_dir)
    assert manifest.history_curve is not None and manifest.history_intervals is not None
    assert manifest.min_history_periods == calibrates_from(manifest.history_curve)
    assert manifest.calibrates_from == manifest.min_history_periods
    assert [p.periods for p in manifest.history_curve] == list(history_points(N, 60))
    whole = manifest.history_curve[-1]
    assert whole.periods == N
    assert whole.model.rmse == pytest.approx(manifest.validation.rmse, rel=1e-4)
    assert all(p.linear == whole.linear for p in manifest.history_curve)
    assert [b.min_periods for b in manifest.history_intervals] == list(history_points(N, 60))[:-1]
    assert manifest.intervals_for(N) == manifest.intervals
    assert manifest.intervals_for(1) == manifest.history_intervals[0].intervals


@pytest.mark.slow
def test_a_model_trained_on_whole_windows_keeps_the_old_manifest(tmp_path: Path) -> None:
    run = train(_config(0.0).model_copy(update={"epochs": 1}), tmp_path / "run", verbose=0)
    export_run(run.run_dir, tmp_path / "m", name="pm2_5-whole", version=1, force=True)
    manifest = load_manifest(tmp_path / "m")
    assert manifest.min_history_periods is None and manifest.calibrates_from == N
    assert manifest.history_curve is None and manifest.history_intervals is None


@pytest.mark.slow
def test_evaluate_with_k_periods_scores_the_padded_windows(model_dir: Path) -> None:
    data = generate_synthetic(n_sensors=2, days=2, period_seconds=60, seed=11)
    whole = evaluate_model_dir(model_dir, data)
    assert evaluate_model_dir(model_dir, data, history_periods=N).model == whole.model
    one = evaluate_model_dir(model_dir, data, history_periods=1)
    assert one.n == whole.n and one.history_periods == 1
    # with one period, every window is its newest reading repeated N times
    calibrator = Calibrator.load(model_dir)
    raw = one.predictions["raw"].to_numpy(dtype=np.float32)
    constant = np.repeat(raw[:, None], N, axis=1)
    np.testing.assert_allclose(
        one.predictions["calibrated"], calibrator.calibrate(constant), rtol=1e-5, atol=1e-4
    )
    with pytest.raises(DataError, match="history-periods"):
        evaluate_model_dir(model_dir, data, history_periods=N + 1)


@pytest.mark.slow
def test_evaluate_cli_takes_history_periods(model_dir: Path, tmp_path: Path) -> None:
    data = generate_synthetic(n_sensors=2, days=2, period_seconds=60, seed=11)
    frame = data.frame.assign(timestamp=data.frame["timestamp"].dt.strftime("%Y-%m-%dT%H:%M:%SZ"))
    csv_path = tmp_path / "colocation.csv"
    frame[["timestamp", "sensor_id", "raw", "reference"]].to_csv(csv_path, index=False)
    command = [sys.executable, "-m", "training", "evaluate", "--model", str(model_dir)]
    completed = subprocess.run(
        [*command, "--csv", str(csv_path), "--history-periods", "4"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert "newest 4 of 48 periods (the model calibrates from " in completed.stdout
    refused = subprocess.run(
        [*command, "--csv", str(csv_path), "--history-periods", "0", "--json"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 2 and "1..48" in refused.stderr
    json_run = subprocess.run(
        [*command, "--csv", str(csv_path), "--history-periods", "2", "--json"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert json.loads(json_run.stdout.strip().splitlines()[-1])["history_periods"] == 2


@pytest.mark.slow
def test_two_phases_keep_the_whole_window_accuracy(tmp_path: Path) -> None:
    """Whole windows first, then fine-tuning on truncated ones: the kept epoch's whole-window
    validation RMSE is within the tolerance of the first phase's, and the model is that epoch's."""
    config = _config(0.5).model_copy(
        update={"epochs": 2, "partial_history_epochs": 2, "partial_history_tolerance": 0.05}
    )
    result = train(config, tmp_path / "run", verbose=0)
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    whole, short = history["fine_tune_whole_rmse"], history["fine_tune_short_rmse"]
    assert len(whole) == len(short) == 3 and len(history["loss"]) == 2
    chosen = int(history["fine_tune_chosen_epoch"][0])
    assert whole[chosen] <= whole[0] * 1.05
    assert short[chosen] == min(
        s for s, w in zip(short, whole, strict=True) if w <= whole[0] * 1.05
    )
    assert result.validation.rmse == pytest.approx(whole[chosen], rel=1e-5)


@pytest.mark.slow
def test_history_curve_writes_the_json_table_and_plot(model_dir: Path, tmp_path: Path) -> None:
    data = generate_synthetic(**OPTIONS)  # type: ignore[arg-type]
    report = measure(model_dir, data, points=(1, 4, N), baseline_dir=model_dir)
    manifest = load_manifest(model_dir)
    assert [p.periods for p in report.points] == [1, 4, N]
    assert report.linear_rmse == manifest.test.linear.rmse
    assert report.points[-1].rmse == pytest.approx(manifest.test.model.rmse, rel=1e-3)
    assert all(p.baseline_rmse == pytest.approx(p.rmse) for p in report.points)
    easy, hard = HistoryTarget(1, 100.0, "easy"), HistoryTarget(4, 0.0, "impossible")
    written = write_report(report, tmp_path, (easy, hard))
    assert [path.suffix for path in written] == [".json", ".md", ".png"]
    document = json.loads(written[0].read_text())
    assert [t["met"] for t in document["targets"]] == [True, False]
    assert document["targets"][1]["worst_ratio"] == report.ratio_from(4)
    text = written[1].read_text()
    assert "| easy | worst" in text and "| **no** |" in text
    assert "whole window (K = N) within 2% of before | +0.0% vs before | yes" in text
    assert written[2].read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(DataError, match="reach down"):
        measure(model_dir, data, points=(4, N)).ratio_from(1)
