"""The calibration ladder on small synthetic data, through the real CLI: train fits raw, linear,
multilinear, growth and TESLA, export writes the winner as a model directory whose float graph
(LiteRT) and integer graph (TFLite Micro) compute the fitted formula; raw winning exports
nothing unless forced; --init-from fine-tunes a TESLA model directory (an exported one, and a
committed default copied as a fresh clone has it, without any run directory) or refuses clearly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tesla_gateway.contract.manifest import load_manifest
from training.classical import growth_divisor
from training.cli import main
from training.errors import HarmfulModelError
from training.export import graph_input, litert_predict
from training.fine_tune import (
    KERAS_FILENAME,
    InitFromError,
    check_compatible,
    init_manifest,
    init_weights,
    write_keras,
)
from training.ladder import LadderData, fit_ladder, load_ladder
from training.ladder_export import export_choice
from training.tflm import run_tflm
from training.train import TrainConfig

pytestmark = pytest.mark.slow

SYNTHETIC = {"n_sensors": 3, "days": 16, "period_seconds": 3600, "seed": 3}
CONFIG = {
    "dataset": "synthetic",
    "dataset_options": SYNTHETIC,
    "window_length": 24,
    "max_interpolated_periods": 3,
    "model": {"kind": "tesla", "d_model": 8, "heads": 2},
    "epochs": 2,
    "batch_size": 64,
    "learning_rate": 0.003,
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("ladder")
    (work / "config.json").write_text(json.dumps(CONFIG))
    run_dir = work / "run"
    assert main(["train", "--config", str(work / "config.json"), "--run-dir", str(run_dir)]) == 0
    return run_dir


@pytest.fixture(scope="module")
def exported(trained: Path) -> Path:
    out = trained.parent / "pm2_5-ladder"
    assert main(["export", "--run", str(trained), "--out", str(out), "--name", "pm2_5-ladder"]) == 0
    return out


def test_train_scores_every_candidate_on_the_same_windows(trained: Path) -> None:
    ladder = load_ladder(trained)
    assert ladder is not None
    names = [c.name for c in ladder.candidates]
    assert names == ["raw", "linear", "multilinear", "growth", "tesla"]
    counts = {c.validation.n for c in ladder.candidates if c.validation is not None}
    assert len(counts) == 1  # one set of validation windows for all
    rmse = {c.name: c.validation.rmse for c in ladder.candidates if c.validation is not None}
    # The synthetic sensors over-read with humidity growth and a gain: every fit beats raw,
    # and the growth correction (the physics the data were made with) wins.
    assert ladder.winner == "growth"
    assert rmse["growth"] < rmse["multilinear"] <= rmse["linear"] < rmse["raw"]
    assert "growth has the lowest RMSE" in ladder.reason
    assert ladder.fits["growth"].k is not None and ladder.fits["growth"].k > 0


def test_export_writes_the_winner_as_a_servable_model_directory(
    trained: Path, exported: Path
) -> None:
    manifest = load_manifest(exported)
    assert manifest.architecture == "classical-growth"
    assert manifest.channel_names == ("pm2_5", "rh")
    assert manifest.window_length == 24 and manifest.min_history_periods == 1
    assert manifest.candidates is not None and len(manifest.candidates) == 5
    assert manifest.choice is not None and manifest.choice.startswith("growth has the lowest")
    assert manifest.intervals is not None  # split conformal on the validation sensor
    assert manifest.validation_baselines is not None
    assert manifest.validation_baselines.model.rmse < manifest.validation_baselines.linear.rmse
    assert set(manifest.files) == {"float32", "int8"}
    assert "FULLY_CONNECTED" in manifest.files["int8"].ops
    # The graphs compute the fitted formula from the newest period alone.
    fit = load_ladder(trained).fits["growth"]  # type: ignore[union-attr]
    rng = np.random.default_rng(0)
    windows = np.stack(
        [rng.uniform(2, 60, (16, 24)), rng.uniform(30, 97, (16, 24))], axis=-1
    ).astype(np.float32)
    raw, rh = windows[:, -1, 0].astype(np.float64), windows[:, -1, 1].astype(np.float64)
    expected = fit.weights[0] * raw / growth_divisor(rh, fit.k or 0.0) + fit.intercept
    float_out = litert_predict((exported / "model.tflite").read_bytes(), windows)
    np.testing.assert_allclose(float_out, expected, rtol=1e-4, atol=1e-3)
    older = windows.copy()
    older[:, :-1, :] = rng.uniform(0, 500, older[:, :-1, :].shape)  # history is ignored
    np.testing.assert_allclose(
        litert_predict((exported / "model.tflite").read_bytes(), older), float_out, atol=1e-4
    )
    # The node's interpreter (TFLite Micro) runs the int8 graph and agrees with the formula.
    device = (exported / "model_int8.tflite").read_bytes()
    entry = manifest.files["int8"]
    details = {"dtype": np.int16, "quantization": (entry.input_scale, entry.input_zero_point)}
    micro = run_tflm(device, graph_input(windows, details)).reshape(-1)
    calibrated = (micro.astype(np.float64) - (entry.output_zero_point or 0)) * (
        entry.output_scale or 1.0
    )
    # within the export's own bound: a quarter of the RMSE (~4 µg/m³ here)
    assert np.sqrt(np.mean((calibrated - expected) ** 2)) < 1.0


def _csv_where_raw_wins(path: Path) -> None:
    """Three units: the training unit reads twice the reference, the validation and test units
    read it as it is, so every fit learned on the first makes the others worse than raw."""
    rng = np.random.default_rng(1)
    times = pd.date_range("2024-01-01", periods=400, freq="h", tz="UTC")
    reference = 10 + 8 * rng.random(len(times))
    rows = []
    for sensor, gain in (("A", 2.0), ("B", 1.0), ("C", 1.0)):
        raw = gain * reference + rng.normal(0, 0.5, len(times))
        rows.append(pd.DataFrame({"timestamp": times, "sensor_id": sensor, "raw": raw,
                                  "reference": reference}))  # fmt: skip
    pd.concat(rows).to_csv(path, index=False)


def test_when_nothing_beats_raw_export_says_so_and_writes_nothing(tmp_path: Path) -> None:
    _csv_where_raw_wins(tmp_path / "data.csv")
    config = TrainConfig(
        dataset="csv",
        data_path=tmp_path / "data.csv",
        dataset_options={"feature": "pm2_5"},
        window_length=6,
        max_interpolated_periods=2,
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(config.model_dump_json())
    ladder = fit_ladder(config, run_dir, {})
    assert ladder.winner is None and ladder.best_model == "linear"
    assert ladder.reason.startswith("nothing beats the raw readings on validation sensor B")
    out = tmp_path / "model"
    with pytest.raises(HarmfulModelError, match="nothing beats the raw readings"):
        export_choice(run_dir, out, name="pm2_5-none", version=1)
    assert not (out / "manifest.json").exists()
    forced = export_choice(run_dir, out, name="pm2_5-none", version=1, force=True)
    assert forced.manifest.architecture == "classical-linear"
    assert forced.manifest.choice is not None and "nothing beats" in forced.manifest.choice


def test_init_from_refuses_what_it_cannot_fine_tune(
    exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InitFromError, match="only a TESLA default"):
        init_manifest(exported)  # a classical model directory
    with pytest.raises(InitFromError, match=r"is not a valid manifest|does not exist"):
        init_manifest(tmp_path)
    default = init_manifest(Path("models/pm2_5-antwerp-1h"))
    config = TrainConfig(window_length=default.window_length, channels=("raw", "rh"))
    with pytest.raises(InitFromError) as refused:
        check_compatible(default, config, feature="pm10", period_seconds=60)
    message = str(refused.value)
    assert "feature: the default has pm2_5, these data pm10" in message
    assert "period: the default has 3600 s, these data 60 s" in message
    assert "channels: the default has pm2_5, these data pm10,rh" in message
    data = LadderData(TrainConfig.model_validate(CONFIG))
    assert data.covariates == ("rh", "temp_c")
    # Through the CLI: a default without its Keras weights (model.keras removed, no --init-run)
    # is refused before training, naming both places the weights could come from.
    bare = _copy_model_dir(Path("models/pm2_5-antwerp-1h"), tmp_path / "bare", keras=False)
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    argv = ["train", "--config", str(tmp_path / "config.json"), "--run-dir", str(tmp_path / "r")]
    assert main([*argv, "--init-from", str(bare)]) == 2
    err = capsys.readouterr().err
    assert f"{bare} has no model.keras" in err and "no --init-run was given" in err
    assert not (tmp_path / "r").exists()


def _copy_model_dir(source: Path, target: Path, *, keras: bool = True) -> Path:
    """The model directory's files as a fresh clone has them (``model.keras`` optional)."""
    target.mkdir()
    for path in source.iterdir():
        if path.is_file() and (keras or path.name != KERAS_FILENAME):
            shutil.copyfile(path, target / path.name)
    return target


def test_init_from_fine_tunes_a_tesla_model_directory(trained: Path, tmp_path: Path) -> None:
    """The run's TESLA exported (by request, forced past the guard) serves as the default;
    another campaign's data fine-tune it, and the ladder reports scratch and fine-tuned."""
    default = tmp_path / "default"
    argv = ["export", "--run", str(trained), "--out", str(default), "--name", "pm2_5-default"]
    assert main([*argv, "--candidate", "tesla", "--force", "--targets", "gateway"]) == 0
    manifest = load_manifest(default)
    assert manifest.architecture == "tesla"
    # export writes the Keras model beside the FlatBuffers, outside the manifest's files
    assert (default / KERAS_FILENAME).is_file()
    assert KERAS_FILENAME not in {entry.path for entry in manifest.files.values()}
    model = init_weights(default, None, manifest)
    # without it, the run directory (--init-run) gives the weights; with neither, refused
    bare = _copy_model_dir(default, tmp_path / "bare", keras=False)
    with pytest.raises(InitFromError, match=r"has no model\.keras .* no --init-run was given"):
        init_weights(bare, None, manifest)
    assert init_weights(bare, trained, manifest).count_params() == manifest.parameter_count
    # weights that are not the FlatBuffer's (same architecture, one bias moved) are refused
    weights = model.get_weights()
    weights[-1] = weights[-1] + 0.5
    model.set_weights(weights)
    write_keras(model, bare)
    with pytest.raises(InitFromError, match="does not compute what"):
        init_weights(bare, None, manifest)
    other = {**CONFIG, "dataset_options": {**SYNTHETIC, "seed": 11, "days": 8}, "epochs": 1}
    (tmp_path / "config.json").write_text(json.dumps(other))
    run_dir = tmp_path / "run"
    argv = ["train", "--config", str(tmp_path / "config.json"), "--run-dir", str(run_dir)]
    assert main([*argv, "--init-from", str(default)]) == 0
    ladder = load_ladder(run_dir)
    assert ladder is not None
    names = [c.name for c in ladder.candidates]
    assert names[-2:] == ["tesla", "tesla-fine-tuned"]
    tuned = next(c for c in ladder.candidates if c.name == "tesla-fine-tuned")
    assert tuned.parameters == load_manifest(default).parameter_count
    init = json.loads((run_dir / "fine-tuned" / "init.json").read_text())
    assert init["from"] == "pm2_5-default"
    # never worse on validation than the default as it was (epoch 0 counts)
    metrics = json.loads((run_dir / "fine-tuned" / "metrics.json").read_text())
    assert metrics["validation"]["rmse"] <= init["as_is_validation"]["rmse"] * (1 + 1e-6)


def test_init_from_fine_tunes_a_committed_default_without_its_run(tmp_path: Path) -> None:
    """A fresh clone has models/ but no runs/: the committed default's model.keras is enough.
    A few days of synthetic hourly PM2.5 (the default's feature, period and N), one epoch."""
    default = _copy_model_dir(Path("models/pm2_5-antwerp-1h"), tmp_path / "default")
    manifest = load_manifest(default)
    options = {**SYNTHETIC, "days": 10, "seed": 5, "dropout_rate_per_day": 0.5}
    config = {**CONFIG, "dataset_options": options, "window_length": manifest.window_length,
              "max_interpolated_periods": 4, "epochs": 1}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    run_dir = tmp_path / "run"
    argv = ["train", "--config", str(tmp_path / "config.json"), "--run-dir", str(run_dir)]
    assert main([*argv, "--init-from", str(default)]) == 0
    ladder = load_ladder(run_dir)
    assert ladder is not None
    tuned = next(c for c in ladder.candidates if c.name == "tesla-fine-tuned")
    assert tuned.parameters == manifest.parameter_count and tuned.validation is not None
    init = json.loads((run_dir / "fine-tuned" / "init.json").read_text())
    assert (init["from"], init["version"]) == (manifest.name, manifest.version)
    metrics = json.loads((run_dir / "fine-tuned" / "metrics.json").read_text())
    assert metrics["validation"]["rmse"] <= init["as_is_validation"]["rmse"] * (1 + 1e-6)


def test_a_covariate_missing_on_one_unit_leaves_the_reading_to_compare(tmp_path: Path) -> None:
    """Humidity absent on the validation unit: no window of it holds rh, so every candidate is
    compared on the reading's windows and the humidity fits say why they were not fitted."""
    rng = np.random.default_rng(2)
    times = pd.date_range("2024-01-01", periods=300, freq="h", tz="UTC")
    reference = 10 + 8 * rng.random(len(times))
    rows = []
    for sensor, gain in (("A", 1.5), ("B", 1.4), ("C", 1.6)):
        rh = np.full(len(times), np.nan) if sensor == "B" else rng.uniform(40, 90, len(times))
        rows.append(pd.DataFrame({"timestamp": times, "sensor_id": sensor, "rh": rh,
                                  "raw": gain * reference + rng.normal(0, 0.5, len(times)),
                                  "reference": reference}))  # fmt: skip
    pd.concat(rows).to_csv(tmp_path / "data.csv", index=False)
    config = TrainConfig(dataset="csv", data_path=tmp_path / "data.csv",
                         dataset_options={"feature": "pm2_5"}, window_length=6)  # fmt: skip
    ladder = fit_ladder(config, tmp_path, {})
    scores = {c.name: c for c in ladder.candidates}
    assert scores["multilinear"].note == "too sparse for whole windows in every split"
    assert scores["growth"].validation is None
    assert ladder.winner == "linear"
