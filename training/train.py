"""Train one model on one (region, feature) with the paper's protocol and write a run directory.

The run directory holds everything needed to reproduce, evaluate and export the model:
``config.json``, ``model.keras``, ``history.json``, ``metrics.json`` and ``data.json``.
Windows stream from :class:`training.data.WindowSet` (strided views of the gridded series), so
memory grows with the raw series, not with N × windows.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import keras
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tesla_gateway.contract.manifest import (
    DataSummary,
    ErrorMetrics,
    InputRange,
    TargetRange,
    TestMetrics,
)
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.contract.time_of_day import HOUR_CHANNELS, is_hour_channel
from training.batches import WindowBatches
from training.data import (
    CoLocationData,
    SensorSplit,
    WindowSet,
    clean,
    load_dataset,
    paper_split,
    to_grid,
)
from training.errors import DataError, DivergedTrainingError, RunDirError
from training.harm import compare_on
from training.history_fit import fine_tune
from training.metrics import LinearCalibration, error_metrics
from training.models import ModelConfig, TeslaConfig, build_model

T = TypeVar("T")

__all__ = [
    "PreparedData",
    "RunResult",
    "TrainConfig",
    "WindowBatches",
    "covariate_scales",
    "input_range",
    "load_result",
    "load_run",
    "predict_windows",
    "prepare_data",
    "target_range",
    "train",
    "training_indices",
    "write_run",
]

PREDICT_CHUNK = 4096


class TrainConfig(BaseModel):
    """One training run; every field has the paper's value or a documented choice as default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = Field(default="ispra-1min", description="Name in training.data's registry.")
    data_path: Path | None = Field(default=None, description="Folder or file; default: shared.")
    dataset_options: dict[str, int | float | str] = Field(
        default_factory=dict, description="Loader options, e.g. target='opcn3' or n_sensors=4."
    )
    window_length: int = Field(default=360, ge=1, description="N, periods per window.")
    max_interpolated_periods: int = Field(
        default=30, ge=0, description="Gap policy: longest gap filled by interpolation."
    )
    channels: tuple[str, ...] = Field(
        default=("raw",),
        description="Input channels: 'raw' first, then covariates like 'rh' and/or the hour of "
        "the day ('hour_sin', 'hour_cos', both or neither; derived from the period's start).",
    )
    model: ModelConfig = Field(default_factory=TeslaConfig)
    epochs: int = Field(default=10, ge=1, description="Paper: 10.")
    batch_size: int = Field(default=32, ge=1, description="Paper: 32.")
    learning_rate: float = Field(default=1e-3, gt=0, description="Adam step size.")
    early_stopping_patience: int = Field(default=3, ge=1)
    seed: int = 0
    max_train_windows: int | None = Field(
        default=None, ge=1, description="Cap on training windows (random subset) for quick runs."
    )
    input_scale: float | None = Field(
        default=None, gt=0, description="Divisor for inputs; default: 99th percentile of train raw."
    )
    partial_history_fraction: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description=(
            "Share of training windows truncated to a log-uniform K in 1..N periods, edge-padded "
            "as the gateway pads a young sensor (training/history.py); above 0 the model "
            "calibrates from one period of history. Early stopping still watches whole windows."
        ),
    )
    partial_history_epochs: int = Field(
        default=0,
        ge=0,
        description=(
            "0: truncated windows mixed in from the first epoch. Above 0: train on whole windows "
            "first, then fine-tune this many epochs with truncated ones and keep the epoch with "
            "the best short-history validation RMSE (training/history_fit.py)."
        ),
    )
    partial_history_learning_rate: float = Field(
        default=1e-4, gt=0, description="Adam step size of the short-history fine-tuning."
    )
    partial_history_tolerance: float = Field(
        default=0.01,
        ge=0,
        description="Fine-tuned weights are kept only while the whole-window validation RMSE "
        "stays within this share of the first phase's.",
    )
    unknown_hour_fraction: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description=(
            "Share of training windows whose hour channels are set to UNKNOWN_HOUR over the "
            "whole window, so the model still calibrates when the hour is not known (a node "
            "without a clock). Needs the hour channels."
        ),
    )
    left_out_sensors: tuple[str, ...] = Field(
        default=(),
        description=(
            "Training sensors left out: the earlier folds of one unit fewer. No training sets it "
            "now; kept so their runs and every run's config.json (extra keys forbidden) load."
        ),
    )

    @model_validator(mode="after")
    def _hour_channels(self) -> TrainConfig:
        hours = [name for name in self.channels if is_hour_channel(name)]
        if hours and sorted(hours) != sorted(HOUR_CHANNELS):
            raise ValueError(f"the hour channels go together: {HOUR_CHANNELS}, got {hours}")
        if self.unknown_hour_fraction > 0 and not hours:
            raise ValueError(
                "unknown_hour_fraction withholds the hour channels: add "
                f"{HOUR_CHANNELS} to channels or leave it at 0"
            )
        return self


@dataclass(frozen=True)
class PreparedData:
    data: CoLocationData
    train: WindowSet
    validation: WindowSet
    test: WindowSet
    summary: DataSummary
    input_range: InputRange
    policy: GapPolicy


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    model: keras.Model
    validation: ErrorMetrics
    test: TestMetrics
    history: dict[str, list[float]]


def input_range(windows: WindowSet) -> InputRange:
    """Percentiles of the newest raw reading: the range the manifest says the model saw."""
    raw = np.asarray(windows.current_raw(), dtype=np.float64)
    p = np.percentile(raw, [0, 1, 50, 99, 100])
    return InputRange(min=p[0], p01=p[1], p50=p[2], p99=p[3], max=p[4])


def target_range(windows: WindowSet) -> TargetRange:
    """Percentiles of the windows' reference values: the outputs the model learned, which bound
    what the gateway publishes as calibrated (tesla_gateway/models/plausibility.py)."""
    targets = np.asarray(windows.targets(), dtype=np.float64)
    p = np.percentile(targets, [0, 1, 50, 99, 100])
    return TargetRange(min=p[0], p01=p[1], p50=p[2], p99=p[3], max=p[4])


def prepare_data(config: TrainConfig) -> PreparedData:
    """Load, clean, grid, split and window the data exactly as training and export see it."""
    loaded = load_dataset(config.dataset, config.data_path, **config.dataset_options)
    cleaned, report = clean(loaded)
    sensors = to_grid(cleaned)
    split = paper_split(sorted(sensors))
    unknown = sorted(set(config.left_out_sensors) - set(split.train))
    if unknown or len(config.left_out_sensors) >= len(split.train):
        raise DataError(
            f"left_out_sensors {list(config.left_out_sensors)} must be some, not all, of the "
            f"training sensors {list(split.train)}"
        )
    if config.left_out_sensors:
        kept = tuple(s for s in split.train if s not in config.left_out_sensors)
        split = SensorSplit(train=kept, validation=split.validation, test=split.test)
    policy = GapPolicy(max_interpolated_periods=config.max_interpolated_periods)

    def windows(ids: tuple[str, ...]) -> WindowSet:
        return WindowSet.build(
            [sensors[i] for i in ids], config.window_length, policy, channels=config.channels
        )

    train_set = windows(split.train)
    validation_set = windows((split.validation,))
    test_set = windows((split.test,))
    for label, window_set in (
        ("train", train_set),
        ("validation", validation_set),
        ("test", test_set),
    ):
        if len(window_set) == 0:
            raise DataError(
                f"no valid {label} windows of N={config.window_length} in {config.dataset}: "
                "use a shorter window or a longer max_interpolated_periods"
            )
    summary = DataSummary(
        source=f"{config.dataset}:{loaded.source}",
        target=loaded.target,
        train_sensors=list(split.train),
        validation_sensor=split.validation,
        test_sensor=split.test,
        rows_read=report.rows_read,
        rows_dropped=dict(report.rows_dropped),
        sensors_dropped=list(report.sensors_dropped),
        windows={
            "train": len(train_set),
            "validation": len(validation_set),
            "test": len(test_set),
        },
        attribution=loaded.attribution,
    )
    return PreparedData(
        data=cleaned,
        train=train_set,
        validation=validation_set,
        test=test_set,
        summary=summary,
        input_range=input_range(train_set),
        policy=policy,
    )


def predict_windows(model: keras.Model, windows: WindowSet) -> npt.NDArray[np.float64]:
    """Model output for every window, gathered in chunks to bound memory."""
    outputs = []
    for start in range(0, len(windows), PREDICT_CHUNK):
        x, _ = windows.gather(np.arange(start, min(start + PREDICT_CHUNK, len(windows))))
        outputs.append(np.asarray(model.predict(x, verbose=0, batch_size=1024)).reshape(-1))
    return np.concatenate(outputs).astype(np.float64) if outputs else np.empty(0)


def _test_metrics(
    model: keras.Model, prepared: PreparedData, linear: LinearCalibration
) -> TestMetrics:
    target = prepared.test.targets()
    current = prepared.test.current_raw()
    return TestMetrics(
        raw=error_metrics(current, target),
        linear=error_metrics(linear.predict(current), target),
        model=error_metrics(predict_windows(model, prepared.test), target),
    )


def covariate_scales(
    config: TrainConfig, windows: WindowSet, input_scale: float
) -> tuple[float, ...] | None:
    """Per-channel divisors for a TESLA model with covariates: ``input_scale`` for PM, then
    the 99th percentile of each covariate's absolute value on the training windows (at least
    1). None for one channel or another architecture (they keep one scale)."""
    if len(config.channels) == 1 or not isinstance(config.model, TeslaConfig):
        return None
    covariates = (
        max(1.0, float(np.percentile(np.abs(windows.current(channel)), 99)))
        for channel in config.channels[1:]
    )
    return (input_scale, *covariates)


def training_indices(config: TrainConfig, windows: WindowSet) -> npt.NDArray[np.int64]:
    """The windows a run trains on: all, or a seeded sample of ``max_train_windows``."""
    indices = np.arange(len(windows), dtype=np.int64)
    if config.max_train_windows is not None and len(indices) > config.max_train_windows:
        rng = np.random.default_rng(config.seed)
        indices = np.sort(rng.choice(indices, config.max_train_windows, replace=False))
    return indices


def _refuse_diverged(
    config: TrainConfig, predicted: npt.NDArray[np.floating], history: dict[str, list[float]]
) -> None:
    """A model that predicts NaN or inf is a failed run: its scores over the finite pairs left
    would be empty (an RMSE of 0 over n = 0), and it must never be exported or ranked."""
    bad = int(np.count_nonzero(~np.isfinite(predicted)))
    if bad == 0:
        return
    losses = history.get("loss", [])
    epoch = next((i + 1 for i, v in enumerate(losses) if not np.isfinite(v)), None)
    where = f"the training loss became NaN or inf in epoch {epoch}; " if epoch else ""
    raise DivergedTrainingError(
        f"training diverged: {where}the model predicts NaN or inf for {bad} of {predicted.size} "
        f"validation windows (model {config.model.kind}, seed {config.seed}, learning rate "
        f"{config.learning_rate}). Lower the learning rate or try another seed."
    )


def train(config: TrainConfig, run_dir: Path, *, verbose: int | str = "auto") -> RunResult:
    """Fit the configured model and write the run directory."""
    keras.utils.set_random_seed(config.seed)
    prepared = prepare_data(config)
    input_scale = config.input_scale or max(1.0, prepared.input_range.p99)
    channel_scales = covariate_scales(config, prepared.train, input_scale)
    model = build_model(
        config.model, config.window_length, len(config.channels), input_scale,
        channel_scales=channel_scales,
    )  # fmt: skip
    model.compile(optimizer=keras.optimizers.Adam(config.learning_rate), loss="mse")
    validation_x, validation_y = prepared.validation.gather(np.arange(len(prepared.validation)))
    indices = training_indices(config, prepared.train)
    two_phases = config.partial_history_fraction > 0 and config.partial_history_epochs > 0
    history = model.fit(
        WindowBatches(
            prepared.train,
            indices,
            config.batch_size,
            config.seed,
            0.0 if two_phases else config.partial_history_fraction,
            unknown_hour_fraction=config.unknown_hour_fraction,
        ),
        validation_data=(validation_x, validation_y),
        epochs=config.epochs,
        callbacks=[
            keras.callbacks.EarlyStopping(
                monitor="val_loss",
                patience=config.early_stopping_patience,
                restore_best_weights=True,
            ),
            keras.callbacks.TerminateOnNaN(),  # a diverged run stops at once, not after N epochs
        ],
        verbose=verbose,
    )
    history_values = {k: [float(v) for v in vs] for k, vs in history.history.items()}
    if two_phases:
        batches = WindowBatches(
            prepared.train, indices, config.batch_size, config.seed + 1,
            config.partial_history_fraction, unknown_hour_fraction=config.unknown_hour_fraction,
        )  # fmt: skip
        history_values.update(
            fine_tune(model, config, prepared, batches, verbose=verbose).as_history()
        )
    linear = LinearCalibration.fit(prepared.train.current_raw(), prepared.train.targets())
    validation_predicted = predict_windows(model, prepared.validation)
    _refuse_diverged(config, validation_predicted, history_values)
    validation = error_metrics(validation_predicted, validation_y)
    baselines = compare_on(prepared.validation, validation_predicted, linear)
    test = _test_metrics(model, prepared, linear)

    write_run(
        run_dir,
        config=config,
        model=model,
        history=history_values,
        validation=validation,
        test=test,
        linear=linear,
        input_scale=input_scale,
        channel_scales=channel_scales,
        summary=prepared.summary,
        input_range=prepared.input_range,
        validation_baselines=baselines,
    )
    return RunResult(run_dir, model, validation, test, history_values)


def write_run(
    run_dir: Path,
    *,
    config: TrainConfig,
    model: keras.Model,
    history: dict[str, list[float]],
    validation: ErrorMetrics,
    test: TestMetrics,
    linear: LinearCalibration,
    input_scale: float,
    summary: DataSummary,
    input_range: InputRange,
    validation_baselines: TestMetrics | None = None,
    channel_scales: tuple[float, ...] | None = None,
) -> None:
    """The run directory (the one layout ``export``, ``evaluate`` and ``retrain`` read)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    model.save(run_dir / "model.keras")
    _write_json(run_dir / "config.json", config.model_dump(mode="json"))
    _write_json(run_dir / "history.json", history)
    _write_json(
        run_dir / "metrics.json",
        {
            "validation": validation.model_dump(),
            "test": test.model_dump(),
            "linear": {"slope": linear.slope, "intercept": linear.intercept},
            "input_scale": input_scale,
            "parameters": int(model.count_params()),
            **({} if channel_scales is None else {"channel_scales": list(channel_scales)}),
            **(
                {}
                if validation_baselines is None
                else {"validation_baselines": validation_baselines.model_dump()}
            ),
        },
    )
    _write_json(
        run_dir / "data.json",
        {"summary": summary.model_dump(mode="json"), "input_range": input_range.model_dump()},
    )


def load_result(run_dir: Path) -> RunResult:
    """A finished run as :class:`RunResult`, without retraining."""
    _, model, metrics = load_run(run_dir)
    history = _run_file(run_dir, "history.json", json.loads)
    try:
        validation = ErrorMetrics.model_validate(metrics["validation"])
        test = TestMetrics.model_validate(metrics["test"])
    except (KeyError, ValidationError) as exc:
        raise _damaged(run_dir, "metrics.json", f"no valid scores: {exc}") from exc
    return RunResult(
        run_dir=run_dir, model=model, validation=validation, test=test, history=history
    )


def load_run(run_dir: Path) -> tuple[TrainConfig, keras.Model, dict[str, Any]]:
    """Config, trained model and metrics of a finished run; :class:`RunDirError` naming the
    file when the directory is not a whole run (missing, truncated, not a Keras file)."""
    if not run_dir.is_dir():
        raise RunDirError(
            f"{run_dir}: no such run directory (`python -m training train --run-dir DIR` "
            "writes one)"
        )
    config = _run_file(run_dir, "config.json", TrainConfig.model_validate_json)
    metrics = _run_file(run_dir, "metrics.json", json.loads)
    if not isinstance(metrics, dict) or not isinstance(metrics.get("linear"), dict):
        raise _damaged(run_dir, "metrics.json", "no linear fit")
    model_path = run_dir / "model.keras"
    if not model_path.is_file():
        raise _damaged(run_dir, "model.keras", "missing")
    if not zipfile.is_zipfile(model_path):  # Keras calls a truncated archive "File not found"
        raise _damaged(run_dir, "model.keras", "not a Keras archive (truncated or overwritten?)")
    try:
        model = keras.models.load_model(model_path)
    except Exception as exc:  # Keras raises many types for a damaged archive
        raise _damaged(run_dir, "model.keras", f"{type(exc).__name__}: {exc}") from exc
    return config, model, metrics


def _run_file(run_dir: Path, name: str, parse: Callable[[str], T]) -> T:
    path = run_dir / name
    try:
        return parse(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise _damaged(run_dir, name, "missing") from exc
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValidationError is a ValueError
        raise _damaged(run_dir, name, str(exc).splitlines()[0]) from exc


def _damaged(run_dir: Path, name: str, why: str) -> RunDirError:
    return RunDirError(
        f"{run_dir / name}: {why}; the run directory is incomplete or damaged: train again "
        f"(`python -m training train --run-dir {run_dir}`) or restore it from a copy"
    )


def _write_json(path: Path, payload: object) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
