"""Train → export → evaluate on synthetic co-location data, through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gateway.manifest import load_manifest, verify_model_files
from training.data import generate_synthetic
from training.model_dir import export_run
from training.models import TeslaConfig
from training.train import TrainConfig, train

pytestmark = pytest.mark.slow

OPTIONS: dict[str, int | float | str] = {"n_sensors": 4, "days": 2, "period_seconds": 60, "seed": 5}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    config = TrainConfig(
        dataset="synthetic",
        dataset_options=OPTIONS,
        window_length=48,
        max_interpolated_periods=10,
        model=TeslaConfig(d_model=8, heads=2),
        epochs=3,
        batch_size=64,
        learning_rate=3e-3,
    )
    run_dir = tmp_path_factory.mktemp("run")
    return train(config, run_dir, verbose=0)


@pytest.fixture(scope="module")
def model_dir(run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models") / "pm2_5-synthetic"
    export_run(run.run_dir, out, name="pm2_5-synthetic", version=7, force=True)
    return out


def test_training_lowers_the_loss_and_writes_the_run(run) -> None:
    assert run.history["loss"][-1] < run.history["loss"][0]
    for name in ("model.keras", "config.json", "history.json", "metrics.json", "data.json"):
        assert (run.run_dir / name).is_file()
    # The model is compared with raw readings and a linear fit on the same test windows.
    assert run.test.raw.n == run.test.linear.n == run.test.model.n > 0


def test_manifest_describes_the_directory(model_dir: Path, run) -> None:
    manifest = load_manifest(model_dir)
    verify_model_files(model_dir, manifest)
    assert manifest.version == 7
    assert manifest.window_length == 48
    assert manifest.period_seconds == 60
    assert manifest.feature == "pm2_5"
    assert manifest.gap_policy.max_interpolated_periods == 10
    assert manifest.files["float32"].batch == "dynamic"
    assert manifest.files["int8"].tflm_arena_bytes is not None
    assert manifest.test == run.test
    assert (
        manifest.data.test_sensor
        == sorted(generate_synthetic(n_sensors=4, days=2, seed=5).frame["sensor_id"].unique())[-1]
    )


def test_evaluate_cli_on_a_plain_csv(model_dir: Path, tmp_path: Path) -> None:
    data = generate_synthetic(n_sensors=2, days=1, period_seconds=60, seed=11)
    frame = data.frame.assign(timestamp=data.frame["timestamp"].dt.strftime("%Y-%m-%dT%H:%M:%SZ"))[
        ["timestamp", "sensor_id", "raw", "reference"]
    ]
    csv_path = tmp_path / "colocation.csv"
    frame.to_csv(csv_path, index=False)
    predictions = tmp_path / "predictions.csv"
    completed = subprocess.run(
        [
            sys.executable, "-m", "training", "evaluate", "--model", str(model_dir),
            "--csv", str(csv_path), "--json", "--predictions", str(predictions),
        ],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["n"] > 0
    assert set(result["raw"]) >= {"rmse", "mae"} and set(result["model"]) >= {"rmse", "mae"}
    written = pd.read_csv(predictions)
    assert list(written.columns) == ["timestamp", "sensor_id", "raw", "reference", "calibrated"]
    scored = written.dropna(subset=["reference"])
    rmse = float(np.sqrt(np.mean((scored["calibrated"] - scored["reference"]) ** 2)))
    assert rmse == pytest.approx(result["model"]["rmse"], rel=1e-3)


def test_evaluate_cli_reports_a_bad_csv_clearly(model_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("when,who,value\n1,2,3\n")
    completed = subprocess.run(
        [sys.executable, "-m", "training", "evaluate", "--model", str(model_dir),
         "--csv", str(bad)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 2
    assert "bad.csv" in completed.stderr and "timestamp" in completed.stderr
