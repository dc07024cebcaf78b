"""``train --init-from MODEL_DIR``: start from what a committed default learned from months of
data and fine-tune it on the user's few weeks, instead of training TESLA from nothing.

The default's manifest is the authority on what it can be fine-tuned to: the same feature,
grid period and input channels (a window of N periods, N being the default's). Anything else
is refused with what differs. The Keras weights come from ``model.keras`` in the model
directory or from the run directory that produced it (``--init-run``; ``make models`` writes
``runs/<name>-seed<k>``, the seed is in the manifest's hyperparameters): the FlatBuffers carry
folded constants, not the weights a fine-tuning needs.

Fine-tuning: Adam at :data:`FINE_TUNE_LEARNING_RATE`, early stopping on the user's
validation sensor, and the default *as it is* counts as epoch 0: when no epoch beats it, its
weights are kept (the report says so).
"""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np

from tesla_gateway.contract.manifest import Manifest, load_manifest
from tesla_gateway.errors import ManifestError
from training.errors import TrainingError
from training.harm import compare_on
from training.metrics import LinearCalibration, error_metrics
from training.models import TeslaConfig
from training.train import (
    PreparedData,
    RunResult,
    TrainConfig,
    WindowBatches,
    load_run,
    predict_windows,
    write_run,
)

__all__ = [
    "FINE_TUNED_DIR",
    "FINE_TUNE_LEARNING_RATE",
    "InitFromError",
    "check_compatible",
    "fine_tune_run",
    "init_manifest",
    "init_weights",
]

FINE_TUNE_LEARNING_RATE = 1e-4
FINE_TUNED_DIR = "fine-tuned"
# The defaults calibrate from a sensor's first period because half of their training windows
# were truncated (training/history.py); fine-tuning keeps at least that mix so it stays so.
PARTIAL_HISTORY_FRACTION = 0.5


class InitFromError(TrainingError):
    """The model to start from cannot be fine-tuned on these data (or has no weights)."""


def init_manifest(model_dir: Path) -> Manifest:
    """The default's manifest; a clear error when ``model_dir`` is not a model directory."""
    try:
        manifest = load_manifest(model_dir)
    except ManifestError as exc:
        raise InitFromError(f"--init-from {model_dir}: {exc}") from exc
    if manifest.architecture != "tesla":
        raise InitFromError(
            f"--init-from {model_dir} is a {manifest.architecture!r} model: only a TESLA default "
            "can be fine-tuned (a classical fit is refitted from scratch by every train)"
        )
    return manifest


def check_compatible(
    manifest: Manifest, config: TrainConfig, *, feature: str, period_seconds: int
) -> None:
    """Refuse data the default cannot be fine-tuned on, saying what differs."""
    channels = tuple(feature if c == "raw" else c for c in config.channels)
    problems = [
        f"{label}: the default has {want}, these data {got}"
        for label, want, got in (
            ("feature", manifest.feature, feature),
            ("period", f"{manifest.period_seconds} s", f"{period_seconds} s"),
            ("channels", ",".join(manifest.channel_names), ",".join(channels)),
            ("window N", manifest.window_length, config.window_length),
        )
        if want != got
    ]
    if problems:
        raise InitFromError(
            f"cannot fine-tune {manifest.name} on these data: {'; '.join(problems)}. Fine-tune "
            "a default of the same feature, period and channels (--channels, --period), or "
            "train from scratch without --init-from"
        )


def init_weights(model_dir: Path, init_run: Path | None, manifest: Manifest) -> keras.Model:
    """The default's Keras model, checked to be the one its manifest describes."""
    beside = model_dir / "model.keras"
    if beside.is_file():
        model = keras.models.load_model(beside)
    elif init_run is not None:
        _, model, _ = load_run(init_run)
    else:
        raise InitFromError(
            f"{model_dir} carries FlatBuffers only, no Keras weights to fine-tune: pass the run "
            f"directory that produced it with --init-run (`make models` writes "
            f"runs/{manifest.name}-seed{manifest.hyperparameters.get('seed', 0)})"
        )
    if int(model.count_params()) != manifest.parameter_count:
        raise InitFromError(
            f"the Keras model has {model.count_params()} parameters, {manifest.name}'s manifest "
            f"{manifest.parameter_count}: --init-run is not the run this default came from"
        )
    return model


def _tesla_config(manifest: Manifest) -> TeslaConfig:
    fields = set(TeslaConfig.model_fields) - {"kind"}
    return TeslaConfig.model_validate(
        {k: v for k, v in manifest.hyperparameters.items() if k in fields}
    )


def fine_tune_run(
    config: TrainConfig,
    prepared: PreparedData,
    model_dir: Path,
    run_dir: Path,
    *,
    init_run: Path | None = None,
    model: keras.Model | None = None,
    learning_rate: float = FINE_TUNE_LEARNING_RATE,
    verbose: int | str = "auto",
) -> RunResult:
    """Fine-tune the default on ``prepared`` and write the run to ``run_dir/fine-tuned``
    (``model``: its weights already loaded by :func:`init_weights`)."""
    manifest = init_manifest(model_dir)
    check_compatible(
        manifest,
        config,
        feature=prepared.data.feature,
        period_seconds=prepared.data.period_seconds,
    )
    if model is None:
        model = init_weights(model_dir, init_run, manifest)
    config = config.model_copy(
        update={
            "model": _tesla_config(manifest),
            "learning_rate": learning_rate,
            "partial_history_fraction": max(
                config.partial_history_fraction, PARTIAL_HISTORY_FRACTION
            ),
            "partial_history_epochs": 0,
        }
    )
    keras.utils.set_random_seed(config.seed)
    validation_x, validation_y = prepared.validation.gather(np.arange(len(prepared.validation)))
    as_is = error_metrics(predict_windows(model, prepared.validation), validation_y)
    as_is_test = error_metrics(predict_windows(model, prepared.test), prepared.test.targets())
    initial = [np.array(w) for w in model.get_weights()]
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="mse")
    history = model.fit(
        WindowBatches(
            prepared.train,
            np.arange(len(prepared.train), dtype=np.int64),
            config.batch_size,
            config.seed,
            config.partial_history_fraction,
        ),
        validation_data=(validation_x, validation_y),
        epochs=config.epochs,
        callbacks=[
            keras.callbacks.EarlyStopping(
                monitor="val_loss",
                patience=config.early_stopping_patience,
                restore_best_weights=True,
            ),
            keras.callbacks.TerminateOnNaN(),
        ],
        verbose=verbose,
    )
    values = {k: [float(v) for v in vs] for k, vs in history.history.items()}
    tuned = error_metrics(predict_windows(model, prepared.validation), validation_y)
    kept_as_is = not np.isfinite(tuned.rmse) or tuned.rmse >= as_is.rmse
    if kept_as_is:
        model.set_weights(initial)
    values["as_is_validation_rmse"] = [as_is.rmse]
    values["kept_as_is"] = [float(kept_as_is)]
    linear = LinearCalibration.fit(prepared.train.current_raw(), prepared.train.targets())
    validation_predicted = predict_windows(model, prepared.validation)
    validation = error_metrics(validation_predicted, validation_y)
    test = compare_on(prepared.test, predict_windows(model, prepared.test), linear)
    out = run_dir / FINE_TUNED_DIR
    write_run(
        out,
        config=config,
        model=model,
        history=values,
        validation=validation,
        test=test,
        linear=linear,
        input_scale=manifest.input_scale,
        summary=prepared.summary,
        input_range=prepared.input_range,
        validation_baselines=compare_on(prepared.validation, validation_predicted, linear),
    )
    (out / "init.json").write_text(
        json.dumps({"from": manifest.name, "version": manifest.version, "kept_as_is": kept_as_is,
                    "as_is_validation": as_is.model_dump(),
                    "as_is_test": as_is_test.model_dump()}, indent=2) + "\n",
        encoding="utf-8",
    )  # fmt: skip
    return RunResult(out, model, validation, test, values)
