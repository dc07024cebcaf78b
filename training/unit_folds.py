"""Leave-sensor-out folds: every training sensor predicted by a model that never saw it.

Prediction intervals calibrated on one validation sensor do not see unit-to-unit differences,
the largest source of error on a new unit (issue 28). Each fold retrains the model with the
*same* config (hyperparameters, epochs, early stopping on the same validation sensor, the same
short-history fine-tuning and seed) without some training sensors, and predicts those sensors'
windows, whole and truncated to each history length the manifest's ``history_intervals`` use.
The validation sensor's out-of-unit predictions come from the exported model itself.

Sensors are dealt round-robin into at most ``folds`` groups (sorted ids): 4 folds over Ispra's
4 training boxes leave one out each; over Antwerp's 6, two groups of two and two of one. A fold's
run directory is reused when it holds a finished run of the same config, so an interrupted
calibration resumes and a second ``calibrate-intervals`` costs no training.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from training.data import WindowSet, clean, load_dataset, to_grid
from training.errors import DataError, DivergedTrainingError
from training.history import Predict, predict_truncated
from training.train import TrainConfig, load_run, train

__all__ = [
    "DEFAULT_FOLDS",
    "FoldRun",
    "UnitPredictions",
    "fold_costs",
    "fold_groups",
    "predicted_unit",
    "sensor_windows",
    "train_folds",
    "unit_predictions",
]

DEFAULT_FOLDS = 4
TIMING_FILE = "fold_timing.json"  # beside the run: what the fold cost when it was trained
EXTRA_SEEDS = 2  # further seeds a fold tries when every asked seed diverged
DIVERGED_FILE = "diverged.json"  # a seed whose training diverged (skipped, not retried)
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class FoldRun:
    """One fold: the sensors it left out, its run (the seed best on validation) and every
    seed's run directory."""

    left_out: tuple[str, ...]
    run_dir: Path
    seed_runs: tuple[Path, ...]
    diverged_seeds: tuple[int, ...] = ()


@dataclass(frozen=True)
class UnitPredictions:
    """One sensor's windows predicted by a model that never trained on it."""

    sensor: str
    role: str  # "train" (from a fold) or "validation" (from the exported model)
    reference: FloatArray
    whole: FloatArray
    truncated: dict[int, FloatArray]  # history length K -> predictions on windows cut to K


def fold_groups(train_sensors: Sequence[str], folds: int) -> list[tuple[str, ...]]:
    """Training sensors dealt round-robin into ``min(folds, len)`` groups (sorted ids)."""
    ordered = sorted(train_sensors)
    if folds < 2 or len(ordered) < 2:
        raise DataError(
            f"leave-sensor-out folds need at least 2 folds and 2 training sensors, got {folds} "
            f"folds over {ordered}"
        )
    count = min(folds, len(ordered))
    return [tuple(ordered[i::count]) for i in range(count)]


def _finished(run_dir: Path, config: TrainConfig) -> bool:
    """A whole run of this config: a run cut short (killed mid-write, a full disk, an older
    config schema) is not, and is trained again over it rather than stopping every rerun."""
    try:
        recorded = TrainConfig.model_validate_json(
            (run_dir / "config.json").read_text(encoding="utf-8")
        )
        _validation_rmse(run_dir)
    except (OSError, ValueError, KeyError, TypeError):  # ValidationError is a ValueError
        return False
    return recorded == config


def train_folds(
    config: TrainConfig,
    train_sensors: Sequence[str],
    folds_dir: Path,
    *,
    folds: int = DEFAULT_FOLDS,
    seeds: Sequence[int] = (),
    verbose: int | str = 0,
) -> list[FoldRun]:
    """Train (or reuse) each fold under ``folds_dir`` without its group, once per seed (the
    model's own selection: the defaults try two seeds and keep the better on validation; by
    default only ``config.seed``), and keep the seed best on the validation sensor."""
    runs = []
    for group in fold_groups(train_sensors, folds):
        candidates: list[Path] = []
        diverged: list[int] = []
        tried = list(seeds or (config.seed,))
        # a fold whose every seed diverges tries the next seeds, up to EXTRA_SEEDS more
        while tried:
            seed = tried.pop(0)
            run_dir = folds_dir / f"without-{'-'.join(group)}-seed{seed}"
            fold_config = config.model_copy(update={"left_out_sensors": group, "seed": seed})
            if _train_once(run_dir, fold_config, verbose):
                candidates.append(run_dir)
            else:
                diverged.append(seed)
            if not tried and not candidates and len(diverged) < len(seeds or (0,)) + EXTRA_SEEDS:
                tried.append(max(diverged) + 1)
        if not candidates:
            raise DataError(
                f"every seed of the fold without {list(group)} diverged (see {folds_dir}/*/"
                f"{DIVERGED_FILE}): try other --seeds"
            )
        best = min(candidates, key=_validation_rmse)
        runs.append(
            FoldRun(
                left_out=group,
                run_dir=best,
                seed_runs=tuple(candidates),
                diverged_seeds=tuple(diverged),
            )
        )
    return runs


def _train_once(run_dir: Path, config: TrainConfig, verbose: int | str) -> bool:
    """Train (or reuse) one fold run; False when this config diverged (now or before)."""
    if _diverged(run_dir, config):
        return False
    if not _finished(run_dir, config):
        started = time.monotonic()
        try:
            train(config, run_dir, verbose=verbose)
        except DivergedTrainingError as exc:  # never the better seed: the others decide
            _record_divergence(run_dir, config, exc)
            return False
        (run_dir / TIMING_FILE).write_text(
            json.dumps({"train_seconds": round(time.monotonic() - started, 1)}) + "\n",
            encoding="utf-8",
        )
    return True


def _diverged(run_dir: Path, config: TrainConfig) -> bool:
    """True when this config already diverged here (a rerun does not train it again)."""
    try:
        recorded = json.loads((run_dir / DIVERGED_FILE).read_text(encoding="utf-8"))["config"]
        return TrainConfig.model_validate(recorded) == config
    except (OSError, ValueError, KeyError, TypeError):  # none, or cut short: train it again
        return False


def _record_divergence(run_dir: Path, config: TrainConfig, exc: DivergedTrainingError) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / DIVERGED_FILE).write_text(
        json.dumps({"config": config.model_dump(mode="json"), "error": str(exc)}) + "\n",
        encoding="utf-8",
    )


def _validation_rmse(run_dir: Path) -> float:
    metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    return float(metrics["validation"]["rmse"])


def sensor_windows(config: TrainConfig, sensors: Sequence[str]) -> dict[str, WindowSet]:
    """Each named sensor's windows, built exactly as training builds them."""
    from tesla_gateway.contract.series import GapPolicy

    loaded = load_dataset(config.dataset, config.data_path, **config.dataset_options)
    cleaned, _ = clean(loaded)
    grid = to_grid(cleaned)
    missing = sorted(set(sensors) - set(grid))
    if missing:
        raise DataError(f"sensors {missing} are not in {config.dataset} after cleaning")
    policy = GapPolicy(max_interpolated_periods=config.max_interpolated_periods)
    return {
        sensor: WindowSet.build(
            [grid[sensor]], config.window_length, policy, channels=config.channels
        )
        for sensor in sensors
    }


def unit_predictions(
    runs: Sequence[FoldRun],
    windows: dict[str, WindowSet],
    points: Sequence[int],
) -> list[UnitPredictions]:
    """Every left-out sensor's windows predicted by its fold's model, whole and truncated."""
    out = []
    for run in runs:
        _, model, _ = load_run(run.run_dir)

        def predict(x: npt.NDArray[np.float32]) -> npt.ArrayLike:
            return model.predict(x, verbose=0, batch_size=1024)  # noqa: B023 (used at once)

        for sensor in run.left_out:
            out.append(predicted_unit(sensor, "train", predict, windows[sensor], points))
    return out


def predicted_unit(
    sensor: str,
    role: str,
    predict: Predict,
    windows: WindowSet,
    points: Sequence[int],
) -> UnitPredictions:
    """One sensor's windows predicted whole and truncated to each of ``points``."""
    n = windows.window_length
    keys = sorted({*points, n})
    predicted = predict_truncated(predict, windows, keys)
    return UnitPredictions(
        sensor=sensor,
        role=role,
        reference=np.asarray(windows.targets(), dtype=np.float64),
        whole=predicted[n],
        truncated={k: v for k, v in predicted.items() if k < n},
    )


def fold_costs(runs: Sequence[FoldRun]) -> list[dict[str, object]]:
    """What each fold cost (every seed's training time) and each seed's validation RMSE."""
    rows = []
    for run in runs:
        seeds = []
        for run_dir in run.seed_runs:
            config = TrainConfig.model_validate_json(
                (run_dir / "config.json").read_text(encoding="utf-8")
            )
            history = json.loads((run_dir / "history.json").read_text(encoding="utf-8"))
            timing = run_dir / TIMING_FILE
            seeds.append(
                {
                    "seed": config.seed,
                    "validation_rmse": round(_validation_rmse(run_dir), 4),
                    "epochs_run": len(history["loss"]),
                    "train_seconds": json.loads(timing.read_text(encoding="utf-8"))["train_seconds"]
                    if timing.is_file()
                    else None,
                    "kept": run_dir == run.run_dir,
                }
            )
        rows.append(
            {
                "left_out": list(run.left_out),
                "seeds": seeds,
                "diverged_seeds": list(run.diverged_seeds),
            }
        )
    return rows
