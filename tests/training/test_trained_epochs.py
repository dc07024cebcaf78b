"""The manifest records the epochs and seed the exported weights come from (``trained_epochs``),
so a fresh clone, with no training run and no fold runs, can recalibrate a model's intervals
across units: the folds retrain for exactly those epochs (training/pool_folds.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import training.defaults
from tesla_gateway.contract.manifest import TrainedEpochs, load_manifest
from training.cli import main
from training.defaults import DefaultModel
from training.errors import DataError
from training.intervals_cli import fold_epochs
from training.model_dir import export_run
from training.models import TeslaConfig
from training.pool_folds import FOLD_FILE, KeptEpochs, kept_epochs, trained_epochs
from training.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = ("pm10-ispra-1min", "pm10-ispra-1min-rh-temp", "pm2_5-antwerp-1h")


@pytest.mark.parametrize("name", DEFAULTS)
def test_each_default_records_the_epochs_its_folds_trained_for(name: str) -> None:
    """The committed values are those of the calibration in docs/benchmarks/intervals/."""
    manifest = load_manifest(ROOT / "models" / name)
    report = json.loads((ROOT / "docs/benchmarks/intervals" / f"{name}.json").read_text())
    assert manifest.trained_epochs is not None
    assert manifest.trained_epochs.seed == manifest.hyperparameters["seed"]
    kept = manifest.trained_epochs.model_dump(exclude={"seed"})
    assert kept == report["fold_epochs"]


def test_a_manifest_written_before_the_field_still_loads(tmp_path: Path) -> None:
    document = json.loads((ROOT / "models/pm10-ispra-1min/manifest.json").read_text())
    assert document.pop("trained_epochs") == {"epochs": 19, "fine_tune_epochs": 6, "seed": 0}
    (tmp_path / "manifest.json").write_text(json.dumps(document))
    assert load_manifest(tmp_path).trained_epochs is None


def test_the_manifest_comes_before_the_folds_and_must_agree_with_the_run(tmp_path: Path) -> None:
    manifest = load_manifest(ROOT / "models/pm10-ispra-1min")
    run, folds = tmp_path / "run", tmp_path / "folds"
    # folds of another training under the folds directory: the manifest says which is the model's
    record = {"config": TrainConfig(dataset="synthetic").model_dump(mode="json"),
              "train_units": ["a"], "left_out": "b", "kept": {"epochs": 5}}  # fmt: skip
    (folds / "pool-without-b-e5+0-seed0").mkdir(parents=True)
    (folds / "pool-without-b-e5+0-seed0" / FOLD_FILE).write_text(json.dumps(record))
    wanted = KeptEpochs(epochs=19, fine_tune_epochs=6)
    assert fold_epochs(None, 0, None, folds, manifest=manifest) == wanted
    assert fold_epochs(3, 1, None, folds, manifest=manifest) == KeptEpochs(
        epochs=3, fine_tune_epochs=1
    )  # the flags still choose
    run.mkdir()
    val_loss = [5.0 - i / 10 for i in range(19)] + [4.0, 4.0, 4.0]
    history = {"loss": [1.0] * 22, "val_loss": val_loss, "fine_tune_chosen_epoch": [6.0]}
    (run / "history.json").write_text(json.dumps(history))
    assert fold_epochs(None, 0, run, folds, manifest=manifest) == wanted
    (run / "history.json").write_text(json.dumps({**history, "fine_tune_chosen_epoch": [2.0]}))
    with pytest.raises(DataError, match="exported from that run"):
        fold_epochs(None, 0, run, folds, manifest=manifest)


def test_a_run_fine_tuned_from_another_model_records_no_epochs(tmp_path: Path) -> None:
    """``train --init-from`` starts from a default's weights: retraining its epochs from the
    seed would not make a peer of it."""
    history = {"loss": [1.0] * 3, "val_loss": [3.0, 2.0, 2.5]}
    (tmp_path / "history.json").write_text(json.dumps(history))
    assert trained_epochs(tmp_path, 4) == TrainedEpochs(epochs=2, fine_tune_epochs=0, seed=4)
    (tmp_path / "init.json").write_text("{}")
    assert trained_epochs(tmp_path, 4) is None


def test_a_weight_average_candidate_run_records_no_epochs(tmp_path: Path) -> None:
    """``history_swa write-run`` writes an averaged or moving-average candidate with the first
    phase's history.json: the phase-one epochs retrained from the seed are not its peer."""
    history = {"loss": [1.0] * 3, "val_loss": [3.0, 2.0, 2.5]}
    (tmp_path / "history.json").write_text(json.dumps(history))
    assert trained_epochs(tmp_path, 0) is not None
    (tmp_path / "candidate.json").write_text(json.dumps({"candidate": "swa 2..8"}))
    assert trained_epochs(tmp_path, 0) is None


@pytest.mark.slow
def test_a_fresh_clone_recalibrates_from_the_manifest_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model directory is all a clone has: no run, no folds. The epochs and seed of the
    folds come from the manifest (before it recorded them, calibrate-intervals stopped)."""
    name = "pm2_5-synthetic"
    config = TrainConfig(
        dataset="synthetic",
        # a test sensor, a validation sensor and two trained on: two folds, each a training
        dataset_options={"n_sensors": 4, "days": 2, "period_seconds": 60, "seed": 3},
        window_length=32,
        max_interpolated_periods=10,
        model=TeslaConfig(d_model=8, heads=2),
        epochs=3,
        batch_size=64,
        learning_rate=3e-3,
        partial_history_fraction=0.5,
        seed=1,
    )
    build, clone = tmp_path / "build", tmp_path / "clone"
    train(config, build / "run", verbose=0)
    kept = kept_epochs(build / "run")
    exported = export_run(build / "run", clone / "models" / name, name=name, force=True).manifest
    assert exported.trained_epochs == TrainedEpochs(**kept.model_dump(), seed=1)
    shutil.rmtree(build)
    # a committed default of this name, whose defaults.py config says seed 0: the manifest's
    # seed (1) is the one the folds must train with
    default = DefaultModel(name=name, config=config.model_copy(update={"seed": 0}))
    monkeypatch.setattr(training.defaults, "DEFAULT_MODELS", (default,))
    monkeypatch.chdir(clone)

    assert main(["calibrate-intervals", "--model", f"models/{name}", "--report", "r.json"]) == 0
    report = json.loads((clone / "r.json").read_text())
    assert report["fold_epochs"] == kept.model_dump()
    folds = clone / "runs" / "interval-folds" / name
    tag = f"e{kept.epochs}+{kept.fine_tune_epochs}"
    trained = sorted(p.parent.name for p in folds.glob("*/model.keras"))
    assert trained == sorted(f"pool-without-{s}-{tag}-seed1" for s in exported.data.train_sensors)
    after = load_manifest(clone / "models" / name)
    assert after.intervals is not None and after.intervals.method == "cross_unit_conformal_binned"
    assert after.trained_epochs == exported.trained_epochs

    # default-models --annotate-only in the clone: the same epochs, the folds reused
    stamps = {p: p.stat().st_mtime_ns for p in folds.glob("*/model.keras")}
    assert main(["default-models", "--annotate-only", "--only", name]) == 0
    assert {p: p.stat().st_mtime_ns for p in folds.glob("*/model.keras")} == stamps
    assert load_manifest(clone / "models" / name).trained_epochs == exported.trained_epochs
