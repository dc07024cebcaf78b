"""Train → export → evaluate on synthetic co-location data, through the real CLI."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tesla_gateway.contract.manifest import load_manifest, verify_model_files, write_manifest
from training.annotate import annotate_model_dir
from training.cli import main
from training.data import generate_synthetic
from training.errors import ExportVerificationError
from training.evaluate import evaluate_model_dir
from training.export import INT8_FILENAME, export_flatbuffers
from training.model_dir import export_run
from training.models import TeslaConfig
from training.release import keygen
from training.train import TrainConfig, prepare_data, train

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
    data = generate_synthetic(n_sensors=2, days=4, period_seconds=60, seed=11)
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
    # The manifest's intervals, measured on this data: coverage and width over every scored step.
    manifest = load_manifest(model_dir)
    assert manifest.intervals is not None
    scored_pairs = scored.to_numpy()
    widths = np.asarray(manifest.intervals.half_widths)[
        np.searchsorted(manifest.intervals.edges, scored["calibrated"], side="right")
    ]
    low = np.minimum(scored["calibrated"], np.maximum(0, scored["calibrated"] - widths))
    inside = (scored["reference"] >= low) & (scored["reference"] <= scored["calibrated"] + widths)
    assert result["intervals"]["n"] == len(scored_pairs) == result["n"]
    assert result["intervals"]["coverage"] == pytest.approx(float(inside.mean()), abs=1e-3)
    assert result["intervals"]["level"] == 0.9
    # The EU GDE figures on the daily means of the 2 sensors' complete days.
    equivalence = result["equivalence"]
    assert equivalence["days"] >= 3 and equivalence["limit_value"] == 30.0
    assert equivalence["meets_indicative_dqo"] == (
        equivalence["expanded_relative_uncertainty"] <= 0.5
    )
    assert manifest.validation_baselines is not None
    assert result["validation"] == manifest.validation_baselines.model_dump()


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


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncate model.keras", r"model.keras: not a Keras archive"),
        ("delete model.keras", r"model.keras: missing"),
        ("truncate metrics.json", r"metrics.json: "),
        ("delete config.json", r"config.json: missing"),
        ("garble config.json", r"config.json: "),
        ("empty metrics.json", r"metrics.json: no linear fit"),
        ("delete run", r"no such run directory"),
    ],
)
def test_export_of_a_damaged_run_names_the_file_and_what_to_do(
    run, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, message: str
) -> None:
    damaged = tmp_path / "run"
    shutil.copytree(run.run_dir, damaged)
    action, name = damage.split(" ")
    target = damaged / name
    if action == "truncate":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    elif action == "delete" and name == "run":
        shutil.rmtree(damaged)
    elif action == "delete":
        target.unlink()
    elif action == "garble":
        target.write_text('{"window_length": "many"}', encoding="utf-8")
    else:
        target.write_text("{}", encoding="utf-8")
    code = main(["export", "--run", str(damaged), "--out", str(tmp_path / "out"), "--name", "x"])
    error = capsys.readouterr().err
    assert code == 2
    assert re.search(message, error), error
    assert "Traceback" not in error
    if name != "run":
        assert "train again" in error
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_manifest_carries_intervals_and_the_validation_comparison(model_dir: Path, run) -> None:
    manifest = load_manifest(model_dir)
    # The training windows' reference values: what bounds the gateway's published outputs.
    config = TrainConfig.model_validate_json((run.run_dir / "config.json").read_text())
    targets = prepare_data(config).train.targets()
    assert manifest.target_range is not None
    assert manifest.target_range.max == pytest.approx(float(np.max(targets)))
    assert manifest.target_range.p50 == pytest.approx(float(np.median(targets)))
    assert manifest.intervals is not None and manifest.intervals.level == 0.9
    assert sum(manifest.intervals.counts) == manifest.data.windows["validation"]
    assert manifest.intervals.calibration_sensor == manifest.data.validation_sensor
    baselines = manifest.validation_baselines
    assert baselines is not None
    assert baselines.model.rmse == pytest.approx(manifest.validation.rmse, rel=1e-4)
    assert baselines.raw.n == baselines.linear.n == baselines.model.n


@pytest.fixture(scope="module")
def harmful_run(run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run with its model replaced by a deliberately bad one: 3 × the raw reading + 50."""
    import keras

    bad = tmp_path_factory.mktemp("harmful") / "run"
    shutil.copytree(run.run_dir, bad)
    inputs = keras.Input(shape=(48,))
    dense = keras.layers.Dense(1)
    model = keras.Model(inputs, dense(inputs))
    weights = np.zeros((48, 1), np.float32)
    weights[-1, 0] = 3.0
    dense.set_weights([weights, np.array([50.0], np.float32)])
    model.save(bad / "model.keras")
    return bad


def test_export_refuses_a_harmful_model_unless_forced(
    harmful_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "model"
    export = ["export", "--run", str(harmful_run), "--out", str(out), "--name", "bad"]
    assert main(export) == 2
    message = capsys.readouterr().err
    assert "worse than the raw readings and a linear fit" in message
    assert re.search(r"raw [\d.]+, linear [\d.]+, model [\d.]+ µg/m³ RMSE", message)
    assert not (out / "manifest.json").exists()  # refused before anything was written

    assert main([*export, "--force", "--targets", "gateway"]) == 0
    capsys.readouterr()
    manifest = load_manifest(out)
    assert set(manifest.files) == {"float32"}
    assert manifest.device_graph_absent == "not requested: exported with --targets gateway"
    assert manifest.validation_baselines is not None
    assert manifest.validation_baselines.model.rmse > manifest.validation_baselines.raw.rmse

    # Release and firmware commands refuse it, quoting why the device graph is absent.
    keys = keygen(tmp_path / "keys")
    node_release = ["release", "--model", str(out), "--target", "node",
                    "--key", str(keys.private_path), "--out", str(tmp_path / "r")]  # fmt: skip
    assert main(node_release) == 2
    assert "--targets gateway" in capsys.readouterr().err
    header = ["firmware-constants", "--model", str(out), "--out", str(tmp_path / "h.h")]
    assert main(header) == 2
    assert "export left it out: not requested" in capsys.readouterr().err


def test_device_graph_failure_keeps_the_gateway_graph(run, tmp_path: Path) -> None:
    """A representative set that misses the inputs' range makes the integer graph clip: the
    float graph is still written, and the manifest's reason is the verification's message."""
    check = np.random.default_rng(3).uniform(5, 80, (64, 48)).astype(np.float32)
    too_narrow = np.full((4, 48), 0.01, np.float32)
    (tmp_path / INT8_FILENAME).write_bytes(b"stale")
    kept = export_flatbuffers(run.model, tmp_path, too_narrow, check, targets="both-if-possible")
    assert set(kept.files) == {"float32"} and not (tmp_path / INT8_FILENAME).exists()
    assert kept.device_graph_absent is not None
    assert "integer FlatBuffer deviates from Keras" in kept.device_graph_absent
    assert kept.verification.integer_rms_error is None
    with pytest.raises(ExportVerificationError, match="deviates"):
        export_flatbuffers(run.model, tmp_path, too_narrow, check, targets="both")


def test_evaluate_scores_the_manifest_test_sensor_alone(model_dir: Path) -> None:
    evaluation = evaluate_model_dir(model_dir, generate_synthetic(**OPTIONS))  # type: ignore[arg-type]
    manifest = load_manifest(model_dir)
    held = evaluation.test_sensor
    assert held is not None and held.sensor == manifest.data.test_sensor
    # The same windows as training's test score, through the gateway's calibrator.
    assert held.model.n == manifest.test.model.n
    assert held.model.rmse == pytest.approx(manifest.test.model.rmse, rel=1e-3)
    assert held.intervals is not None and held.intervals.n == held.model.n
    assert 0 < held.intervals.coverage <= 1 and held.intervals.mean_width > 0
    assert evaluation.as_json()["test_sensor"] == held.as_dict()


def test_annotate_recomputes_the_trust_fields_without_retraining(
    model_dir: Path, run, tmp_path: Path
) -> None:
    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    exported = load_manifest(copy)
    write_manifest(
        copy,
        exported.model_copy(
            update={"intervals": None, "validation_baselines": None, "target_range": None}
        ),
    )
    config = TrainConfig.model_validate_json((run.run_dir / "config.json").read_text())
    annotated = annotate_model_dir(copy, config)
    assert annotated.intervals is not None and exported.intervals is not None
    assert annotated.intervals.counts == exported.intervals.counts
    np.testing.assert_allclose(annotated.intervals.edges, exported.intervals.edges, rtol=1e-3)
    np.testing.assert_allclose(
        annotated.intervals.half_widths, exported.intervals.half_widths, rtol=1e-2, atol=1e-3
    )
    assert exported.target_range is not None
    assert annotated.target_range == exported.target_range
    assert annotated.validation_baselines is not None
    assert exported.validation_baselines is not None
    assert annotated.validation_baselines.linear.rmse == pytest.approx(
        exported.validation_baselines.linear.rmse, rel=1e-4
    )
    assert load_manifest(copy).intervals == annotated.intervals
