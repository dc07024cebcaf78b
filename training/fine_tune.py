"""``train --init-from MODEL_DIR``: start from what a committed default learned from months of
data and fine-tune it on the user's few weeks, instead of training TESLA from nothing.

The default's manifest is the authority on what it can be fine-tuned to: the same feature,
grid period and input channels (a window of N periods, N being the default's). Anything else
is refused with what differs. The Keras weights come from ``model.keras`` in the model
directory (``export`` writes it, outside the manifest's ``files``: releases and the wheel carry
the FlatBuffers only) or from the run directory that produced it (``--init-run``): the
FlatBuffers carry folded constants, not the weights a fine-tuning needs. Either is checked to
compute what the directory's float graph computes before anything is trained.

Fine-tuning: Adam at :data:`FINE_TUNE_LEARNING_RATE`, early stopping on the user's
validation sensor, and the default *as it is* counts as epoch 0: when no epoch beats it, its
weights are kept (the report says so).
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path

import keras
import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.manifest import Manifest, load_manifest
from tesla_gateway.errors import ManifestError
from training.errors import TrainingError
from training.export import FLOAT_TOLERANCE, litert_predict
from training.harm import compare_on
from training.history import YOUNG_SENSOR_FRACTION
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
    "KERAS_FILENAME",
    "InitFromError",
    "check_compatible",
    "fine_tune_run",
    "init_manifest",
    "init_weights",
    "probe_windows",
    "weights_error",
    "write_keras",
]

FINE_TUNE_LEARNING_RATE = 1e-4
FINE_TUNED_DIR = "fine-tuned"
KERAS_FILENAME = "model.keras"
PROBE_WINDOWS = 32
Array = npt.NDArray[np.float32]


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


def write_keras(model: keras.Model, model_dir: Path) -> Path:
    """Write ``model.keras`` beside the FlatBuffers: what ``--init-from`` fine-tunes.

    Rebuilt from its config, so without optimizer state or compile settings, and its archive
    deflated, written atomically. The manifest does not list it.
    """
    plain = keras.Model.from_config(model.get_config())
    plain.set_weights(model.get_weights())
    target = model_dir / KERAS_FILENAME
    handle, temp_name = tempfile.mkstemp(dir=model_dir, prefix=".model-", suffix=".tmp")
    os.close(handle)
    temp = Path(temp_name)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            saved = Path(scratch) / KERAS_FILENAME
            plain.save(saved)
            with (
                zipfile.ZipFile(saved) as source,
                zipfile.ZipFile(temp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out,
            ):
                for name in source.namelist():
                    out.writestr(name, source.read(name))
        temp.chmod(0o644)  # mkstemp creates 0600
        temp.replace(target)
    finally:
        temp.unlink(missing_ok=True)
    return target


def probe_windows(manifest: Manifest, shape: tuple[int, ...], count: int = PROBE_WINDOWS) -> Array:
    """Seeded windows over the default's training input range (covariates over plausible
    humidity and temperature), ``[count, *shape]``: what weights are compared on."""
    rng = np.random.default_rng(28)
    low, high = manifest.input_range.p01, manifest.input_range.p99
    steps = rng.normal(0.0, (high - low) / 30, (count, shape[0]))
    pm = np.clip(rng.uniform(low, high, (count, 1)) + np.cumsum(steps, axis=1), low, high)
    if len(shape) == 1:
        return pm.astype(np.float32)
    windows = np.empty((count, *shape))
    windows[..., 0] = pm
    bounds = {"rh": (15.0, 98.0), "temp_c": (-10.0, 38.0)}
    for index, name in enumerate(manifest.channel_names[1:], start=1):
        lo, hi = bounds.get(name, (0.0, 100.0))
        windows[..., index] = rng.uniform(lo, hi, (count, 1)) + rng.normal(0, 1, shape[0])
    return windows.astype(np.float32)


def weights_error(model: keras.Model, model_dir: Path, manifest: Manifest) -> float:
    """Largest difference between the Keras model and the directory's float graph (LiteRT) on
    :func:`probe_windows`, relative to the largest output: within ``FLOAT_TOLERANCE`` (1e-4,
    the export's own check) when these are the weights the FlatBuffer was made from."""
    windows = probe_windows(manifest, tuple(model.input_shape[1:]))
    keras_out = np.asarray(model.predict(windows, verbose=0)).reshape(-1)
    graph = (model_dir / manifest.files["float32"].path).read_bytes()
    graph_out = litert_predict(graph, windows).reshape(-1)
    scale = max(float(np.max(np.abs(graph_out))), 1e-6)
    return float(np.max(np.abs(keras_out - graph_out))) / scale


def init_weights(model_dir: Path, init_run: Path | None, manifest: Manifest) -> keras.Model:
    """The default's Keras model (``model.keras`` beside its manifest, else ``--init-run``'s),
    checked to be the one its float graph was exported from."""
    beside = model_dir / KERAS_FILENAME
    if beside.is_file():
        source = str(beside)
        try:
            model = keras.models.load_model(beside)  # safe mode: no code is deserialised
        except Exception as exc:  # Keras raises many types for a damaged archive
            raise InitFromError(
                f"{beside} does not load ({type(exc).__name__}: {exc}): copy the model "
                "directory again, or remove it and pass --init-run"
            ) from exc
    elif init_run is not None:
        source = f"--init-run {init_run}"
        _, model, _ = load_run(init_run)
    else:
        seed = manifest.hyperparameters.get("seed", 0)
        raise InitFromError(
            f"no Keras weights to fine-tune: {model_dir} has no {KERAS_FILENAME} (`export` "
            "writes it; the FlatBuffers cannot be trained) and no --init-run was given. Pass "
            f"--init-run with the run directory that produced it (`make models` writes "
            f"runs/{manifest.name}-seed{seed}), or re-export that run into {model_dir}"
        )
    channels = len(manifest.channel_names)
    expected = (manifest.window_length,) if channels == 1 else (manifest.window_length, channels)
    if tuple(model.input_shape[1:]) != expected:  # else LiteRT fails deep inside the comparison
        raise InitFromError(
            f"{source} reads windows of shape {tuple(model.input_shape[1:])}, "
            f"{manifest.name}'s manifest {expected}: it is not the model this default was "
            "exported from"
        )
    if int(model.count_params()) != manifest.parameter_count:
        raise InitFromError(
            f"{source} has {model.count_params()} parameters, {manifest.name}'s manifest "
            f"{manifest.parameter_count}: it is not the model this default was exported from"
        )
    error = weights_error(model, model_dir, manifest)
    if not error <= FLOAT_TOLERANCE:
        raise InitFromError(
            f"{source} does not compute what {model_dir}'s float graph computes (differs by "
            f"{error:.2g} of the output, export allows {FLOAT_TOLERANCE:g}): it is not the "
            "model this default was exported from"
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
            # at least the defaults' mix, so the fine-tuned model still calibrates from one period
            "partial_history_fraction": max(config.partial_history_fraction, YOUNG_SENSOR_FRACTION),
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
