"""The challenger: fine-tuned from the champion's run or built fresh, trained on the pairs, and
its manifest (the champion's, with what changed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import keras
import numpy as np
from pydantic import TypeAdapter, ValidationError

from tesla_gateway.contract.manifest import (
    DataSummary,
    ErrorMetrics,
    Manifest,
    ModelFile,
    Precision,
    TestMetrics,
)
from tesla_gateway.models.calibrator import Calibrator
from training.conformal import DEFAULT_LEVEL, fit_intervals
from training.data import WindowSet
from training.errors import DataError, RetrainError
from training.harm import compare_on
from training.history import YOUNG_SENSOR_FRACTION, history_fields
from training.metrics import LinearCalibration, error_metrics
from training.model_dir import training_hyperparameters
from training.models import ModelConfig, build_model
from training.retrain.config import RetrainConfig
from training.retrain.data import TrainingSets
from training.retrain.inputs import Inputs
from training.train import (
    WindowBatches,
    input_range,
    load_run,
    predict_windows,
    target_range,
)

__all__ = [
    "Challenger",
    "challenger_manifest",
    "describe_challenger",
    "train_challenger",
    "with_files",
]


RUN_MATCH_TOLERANCE = 1e-3  # champion run vs champion FlatBuffer, relative to the output scale


_TRAINING_KEYS = frozenset(
    {
        "epochs",
        "batch_size",
        "learning_rate",
        "seed",
        "epochs_run",
        "retrain_mode",
        "retrained_from",
    }
)


@dataclass(frozen=True)
class Challenger:
    model: keras.Model
    model_config: Any  # one of training.models' configs
    mode: Literal["finetune", "fresh"]
    batch_size: int
    learning_rate: float
    history: dict[str, list[float]]
    validation: ErrorMetrics
    linear: LinearCalibration
    partial_history_fraction: float

    @property
    def epochs_run(self) -> int:
        return len(self.history.get("loss", []))


def train_challenger(config: RetrainConfig, inputs: Inputs, verbose: int | str) -> Challenger:
    champion = inputs.champion
    mode: Literal["finetune", "fresh"] = (
        "finetune"
        if config.mode == "finetune" or (config.mode == "auto" and config.champion_run is not None)
        else "fresh"
    )
    model, model_config = _challenger_model(config, champion, mode, inputs)
    keras.utils.set_random_seed(config.seed)
    batch_size = config.batch_size or int(champion.hyperparameters.get("batch_size", 32))
    learning_rate = config.learning_rate or float(
        champion.hyperparameters.get("learning_rate", 1e-3)
    )
    fraction = partial_history_share(config, inputs)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="mse")
    history = _fit(
        model, inputs.sets, config, batch_size, verbose, partial_history_fraction=fraction
    )
    sets = inputs.sets
    if sets.validation is not None:
        validation = error_metrics(
            predict_windows(model, sets.validation), sets.validation.targets()
        )
    else:  # no validation period: the figure is on the training pairs (stated in the report)
        validation = error_metrics(predict_windows(model, sets.train), sets.train.targets())
    return Challenger(
        model=model,
        model_config=model_config,
        mode=mode,
        batch_size=batch_size,
        learning_rate=learning_rate,
        history=history,
        validation=validation,
        linear=LinearCalibration.fit(sets.train.current_raw(), sets.train.targets()),
        partial_history_fraction=fraction,
    )


def partial_history_share(config: RetrainConfig, inputs: Inputs) -> float:
    """The configured share, or the champion's habit: a champion that calibrates young sensors
    (from fewer than N periods) has a challenger trained to do so as well."""
    if config.partial_history_fraction is not None:
        return config.partial_history_fraction
    champion = inputs.champion
    calibrates_from = champion.min_history_periods
    if calibrates_from is not None and calibrates_from < champion.window_length:
        return YOUNG_SENSOR_FRACTION
    return 0.0


def describe_challenger(
    config: RetrainConfig, inputs: Inputs, challenger: Challenger
) -> dict[str, Any]:
    return {
        "name": config.name or inputs.champion.name,
        "version": inputs.champion.version + 1,
        "mode": challenger.mode,
        "from_run": str(config.champion_run) if challenger.mode == "finetune" else None,
        "architecture": challenger.model_config.kind,
        "window_length": inputs.window_length,
        "epochs": config.epochs,
        "epochs_run": challenger.epochs_run,
        "batch_size": challenger.batch_size,
        "learning_rate": challenger.learning_rate,
        "seed": config.seed,
        "validation": challenger.validation.model_dump(),
        "validation_on": (
            "validation period" if inputs.sets.validation is not None else "training pairs"
        ),
        "history": challenger.history,
    }


def _challenger_model(
    config: RetrainConfig,
    champion: Manifest,
    mode: Literal["finetune", "fresh"],
    inputs: Inputs,
) -> tuple[keras.Model, Any]:
    """The model to train and its config: the champion's run reloaded, or a fresh build."""
    if mode == "fresh":
        model_config = config.model or _champion_model_config(champion)
        model = build_model(
            model_config, inputs.window_length, len(inputs.channels), champion.input_scale
        )
        return model, model_config
    assert config.champion_run is not None  # the config's validator guarantees it
    if not (config.champion_run / "model.keras").is_file():
        raise RetrainError(
            f"{config.champion_run} holds no model.keras: give the champion's run directory "
            "from `train`, or retrain with mode 'fresh'"
        )
    run_config, model, _ = load_run(config.champion_run)
    if run_config.window_length != champion.window_length or run_config.channels != inputs.channels:
        raise RetrainError(
            f"{config.champion_run} trained N={run_config.window_length} on "
            f"{list(run_config.channels)}, the champion runs N={champion.window_length} on "
            f"{list(inputs.channels)}: it is not the champion's run"
        )
    _check_run_matches(model, config.champion, champion, inputs.holdout)
    return model, run_config.model


def _champion_model_config(champion: Manifest) -> Any:
    values = {k: v for k, v in champion.hyperparameters.items() if k not in _TRAINING_KEYS}
    try:
        return TypeAdapter(ModelConfig).validate_python({"kind": champion.architecture, **values})
    except ValidationError as exc:
        raise RetrainError(
            f"the champion's architecture {champion.architecture!r} with hyperparameters "
            f"{values} is not a model training can build ({exc.error_count()} problem(s)); "
            "give its run directory to fine-tune, or a model config for a fresh challenger"
        ) from exc


def _check_run_matches(
    model: keras.Model, champion_dir: Path, champion: Manifest, windows: WindowSet
) -> None:
    """The run must be the one the champion was exported from: same outputs on a few windows."""
    x, _ = windows.gather(np.arange(min(len(windows), 64)))
    keras_out = np.asarray(model.predict(x, verbose=0)).reshape(-1)
    litert_out = Calibrator.load(champion_dir).calibrate(x)
    scale = max(float(np.max(np.abs(keras_out))), 1e-6)
    difference = float(np.max(np.abs(keras_out - litert_out)))
    if difference > RUN_MATCH_TOLERANCE * scale:
        raise RetrainError(
            f"the run's Keras model and the champion's FlatBuffer disagree by {difference:.3g} "
            f"on held-back windows: the run directory is not the champion's {champion.name} "
            f"v{champion.version}"
        )


def _fit(
    model: keras.Model,
    sets: TrainingSets,
    config: RetrainConfig,
    batch_size: int,
    verbose: int | str,
    *,
    partial_history_fraction: float,
) -> dict[str, list[float]]:
    callbacks: list[keras.callbacks.Callback] = []
    validation_data = None
    if sets.validation is not None:
        validation_data = sets.validation.gather(np.arange(len(sets.validation)))
        callbacks.append(
            keras.callbacks.EarlyStopping(
                monitor="val_loss",
                patience=config.early_stopping_patience,
                restore_best_weights=True,
            )
        )
    history = model.fit(
        WindowBatches(sets.train, sets.indices, batch_size, config.seed, partial_history_fraction),
        validation_data=validation_data,
        epochs=config.epochs,
        callbacks=callbacks,
        verbose=verbose,
    )
    return {k: [float(v) for v in values] for k, values in history.history.items()}


def _summary(inputs: Inputs) -> DataSummary:
    pairs, original, cleaning = inputs.pairs, inputs.original, inputs.cleaning
    spans = inputs.periods.as_json()
    source = f"retrain:{pairs.data.source}"
    attribution = pairs.data.attribution
    train_sensors = list(pairs.data.sensor_ids)
    if original is not None:
        source += f"+{original.source}"
        attribution += f"; {original.attribution}"
        train_sensors += [f"original/{sensor}" for sensor in original.sensor_ids]
    return DataSummary(
        source=source,
        target="reference",
        train_sensors=train_sensors,
        validation_sensor=f"pairs {spans['validation'] or spans['training']}",
        test_sensor=f"pairs {spans['held_back']}",
        rows_read=cleaning.rows_read,
        rows_dropped=dict(cleaning.rows_dropped),
        sensors_dropped=list(cleaning.sensors_dropped),
        windows={
            "train": int(inputs.sets.indices.size),
            "validation": inputs.sets.counts["validation"],
            "test": len(inputs.holdout),
        },
        attribution=attribution,
    )


def challenger_manifest(config: RetrainConfig, inputs: Inputs, challenger: Challenger) -> Manifest:
    """The champion's manifest with what changed; files and test figures are filled later."""
    champion = inputs.champion
    document = champion.model_dump(mode="json")
    document.update(
        name=config.name or champion.name,
        version=champion.version + 1,
        architecture=challenger.model_config.kind,
        window_length=inputs.window_length,
        parameter_count=int(challenger.model.count_params()),
        hyperparameters={
            **training_hyperparameters(
                challenger.model_config,
                epochs=config.epochs,
                batch_size=challenger.batch_size,
                learning_rate=challenger.learning_rate,
                seed=config.seed,
                epochs_run=challenger.epochs_run,
            ),
            "retrain_mode": challenger.mode,
            "retrained_from": champion.version,
        },
        validation=challenger.validation.model_dump(),
        input_range=input_range(inputs.sets.train).model_dump(),
        target_range=target_range(inputs.sets.train).model_dump(),
        data=_summary(inputs).model_dump(mode="json"),
        created_at=datetime.now(UTC).isoformat(),
        **_trust_fields(inputs, challenger),
    )
    try:
        return Manifest.model_validate(document)
    except ValidationError as exc:
        raise RetrainError(f"the challenger's manifest is invalid: {exc}") from exc


def _trust_fields(inputs: Inputs, challenger: Challenger) -> dict[str, Any]:
    """The challenger's own intervals and raw/linear/model comparison on the validation period
    (the champion's describe another model); none without a validation period."""
    fields: dict[str, Any] = {
        "intervals": None,
        "validation_baselines": None,
        "device_graph_absent": None,
        # The champion's short-history figures describe the champion: measured anew or none
        # (a gateway then waits for a full window rather than trust them).
        "min_history_periods": None,
        "history_curve": None,
        "history_intervals": None,
        # the champion's epochs and seed: no recalibration may retrain the challenger's from them
        "trained_epochs": None,
    }
    validation = inputs.sets.validation
    if validation is None:
        return fields
    level = inputs.champion.intervals.level if inputs.champion.intervals else DEFAULT_LEVEL
    if challenger.partial_history_fraction > 0:
        fields |= history_fields(
            lambda x: challenger.model.predict(x, verbose=0, batch_size=1024),
            validation,
            challenger.linear.predict(validation.current_raw()),
            period_seconds=inputs.champion.period_seconds,
            sensor=",".join(validation.sensor_ids),
            level=level,
        )
    predicted = predict_windows(challenger.model, validation)
    fields["validation_baselines"] = compare_on(
        validation, predicted, challenger.linear
    ).model_dump()
    try:
        intervals = fit_intervals(
            predicted,
            validation.targets(),
            sensor=",".join(validation.sensor_ids),
            level=level,
        )
    except DataError:  # too short a validation period to set a width: say nothing
        return fields
    fields["intervals"] = intervals.model_dump()
    return fields


def with_files(
    manifest: Manifest,
    files: Mapping[Precision, ModelFile],
    test: TestMetrics,
    *,
    device_graph_absent: str | None = None,
) -> Manifest:
    document = manifest.model_dump(mode="json")
    document["files"] = {key: value.model_dump(mode="json") for key, value in files.items()}
    document["test"] = test.model_dump()
    document["device_graph_absent"] = device_graph_absent
    return Manifest.model_validate(document)
