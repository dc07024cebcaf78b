"""Turn a finished training run into a model directory: FlatBuffers + verified manifest, and the
Keras model beside them (``model.keras``, unlisted) that ``train --init-from`` fine-tunes.

The model directory is the only thing that travels from training to gateways and nodes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.manifest import (
    DataSummary,
    ErrorMetrics,
    InputChannel,
    InputRange,
    Manifest,
    TestMetrics,
    load_manifest,
    verify_model_files,
    write_manifest,
)
from training.conformal import DEFAULT_LEVEL, fit_intervals
from training.data import WindowSet
from training.errors import DataError
from training.export import ExportTargets, ExportVerification, export_flatbuffers
from training.fine_tune import write_keras
from training.harm import check_not_harmful, compare_on
from training.history import history_fields
from training.metrics import LinearCalibration
from training.pool_folds import trained_epochs
from training.train import (
    load_run,
    predict_windows,
    prepare_data,
    target_range,
)

__all__ = [
    "CHANNEL_UNITS",
    "ExportedModel",
    "check_windows",
    "evenly_spaced",
    "export_run",
    "representative_windows",
    "training_hyperparameters",
]

# the hour channels are a point on the unit circle (tesla_gateway/contract/time_of_day.py)
CHANNEL_UNITS = {"raw": "ug/m3", "rh": "%", "temp_c": "degC", "hour_sin": "1", "hour_cos": "1"}
REPRESENTATIVE_WINDOWS = 1000
REPRESENTATIVE_PEAKS = 100
CHECK_WINDOWS = 512
Array = npt.NDArray[np.float32]


@dataclass(frozen=True)
class ExportedModel:
    model_dir: Path
    manifest: Manifest
    verification: ExportVerification


def evenly_spaced(count: int, total: int) -> npt.NDArray[np.int64]:
    """At most ``count`` indices spread evenly over ``range(total)``, first and last included."""
    return np.unique(np.linspace(0, total - 1, num=min(count, total)).astype(np.int64))


def representative_windows(train: WindowSet, *peaks_only: WindowSet) -> Array:
    """The windows the integer graph's activation ranges are calibrated on.

    Evenly spaced training windows plus the highest concentrations: a range that misses rare
    high episodes clips them (on the Ispra model the peaks brought the integer RMS deviation
    from 1.05 to 0.96 µg/m³). A covariate channel (``rh``, ``temp_c``) adds the windows at both
    ends of its range, so humid, dry, hot and cold windows set the activation ranges too (with
    Ispra's 360-minute windows the evenly spaced ones already hold every reading, so it changed
    nothing there: measured 2.88 and 0.49 µg/m³ RMS with and without it; it matters for short
    windows). What made the covariate device graph pass was per-channel input scaling.
    ``peaks_only`` adds the peaks of further sets (inputs only, no reference), e.g. the
    held-back windows of a drifting sensor that reads beyond training.
    """
    chosen = [
        evenly_spaced(REPRESENTATIVE_WINDOWS, len(train)),
        np.argsort(train.current_raw())[-REPRESENTATIVE_PEAKS:],
    ]
    for channel in train.channels[1:]:
        order = np.argsort(train.current(channel))
        chosen += [order[:REPRESENTATIVE_PEAKS], order[-REPRESENTATIVE_PEAKS:]]
    parts = [train.gather(np.unique(np.concatenate(chosen)))[0]]
    for windows in peaks_only:
        parts.append(
            windows.gather(np.sort(np.argsort(windows.current_raw())[-REPRESENTATIVE_PEAKS:]))[0]
        )
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def check_windows(windows: WindowSet) -> tuple[Array, Array]:
    """Held-out windows (and their reference) an export is verified on."""
    return windows.gather(evenly_spaced(CHECK_WINDOWS, len(windows)))


def training_hyperparameters(
    model: Any, *, epochs: int, batch_size: int, learning_rate: float, seed: int, epochs_run: int
) -> dict[str, Any]:
    """The manifest's ``hyperparameters``: the model config's fields and how it was trained."""
    return {
        **{k: v for k, v in model.model_dump().items() if k != "kind"},
        "epochs": epochs,
        "batch_size": batch_size,
        "learning_rate": learning_rate,
        "seed": seed,
        "epochs_run": epochs_run,
    }


def export_run(
    run_dir: Path,
    model_dir: Path,
    *,
    name: str,
    version: int | None = None,
    targets: ExportTargets = "both-if-possible",
    force: bool = False,
    interval_level: float = DEFAULT_LEVEL,
) -> ExportedModel:
    """Export the run's model, verify the files, and write the manifest last.

    Refuses (before converting anything) a model worse than raw or linear on the validation
    sensor unless ``force``; fits the prediction intervals on the same sensor's residuals and
    records the epochs and seed the weights come from (``trained_epochs``).
    """
    config, model, metrics = load_run(run_dir)
    prepared = prepare_data(config)
    validation_predicted = predict_windows(model, prepared.validation)
    baselines = compare_on(
        prepared.validation, validation_predicted, LinearCalibration(**metrics["linear"])
    )
    check_not_harmful(baselines, prepared.summary.validation_sensor, force=force)
    sensor = prepared.summary.validation_sensor
    try:
        intervals = fit_intervals(
            validation_predicted,
            prepared.validation.targets(),
            sensor=sensor,
            level=interval_level,
        )
    except DataError:
        intervals = None  # too few validation windows: the manifest says nothing rather than guess
    short = (
        {}
        if config.partial_history_fraction == 0
        else history_fields(
            lambda x: model.predict(x, verbose=0, batch_size=1024),
            prepared.validation,
            LinearCalibration(**metrics["linear"]).predict(prepared.validation.current_raw()),
            period_seconds=prepared.data.period_seconds,
            sensor=sensor,
            level=interval_level,
        )
    )
    check, check_reference = check_windows(prepared.test)
    exported = export_flatbuffers(
        model,
        model_dir,
        representative_windows(prepared.train),
        check,
        check_reference,
        targets=targets,
    )
    write_keras(model, model_dir)  # for `train --init-from`; not in the manifest's files
    data = json.loads((run_dir / "data.json").read_text())
    feature = prepared.data.feature
    manifest = Manifest(
        name=name,
        version=version if version is not None else int(time.time()),
        architecture=config.model.kind,
        feature=feature,
        window_length=config.window_length,
        period_seconds=prepared.data.period_seconds,
        input_channels=[
            InputChannel(name=feature if channel == "raw" else channel, unit=CHANNEL_UNITS[channel])
            for channel in config.channels
        ],
        input_scale=float(metrics["input_scale"]),
        gap_policy=prepared.policy,
        files=exported.files,
        parameter_count=int(metrics["parameters"]),
        hyperparameters=training_hyperparameters(
            config.model,
            epochs=config.epochs,
            batch_size=config.batch_size,
            learning_rate=config.learning_rate,
            seed=config.seed,
            epochs_run=len(json.loads((run_dir / "history.json").read_text())["loss"]),
        ),
        validation=ErrorMetrics.model_validate(metrics["validation"]),
        test=TestMetrics.model_validate(metrics["test"]),
        input_range=InputRange.model_validate(data["input_range"]),
        data=DataSummary.model_validate(data["summary"]),
        created_at=datetime.now(UTC),
        intervals=intervals,
        validation_baselines=baselines,
        target_range=target_range(prepared.train),
        device_graph_absent=exported.device_graph_absent,
        sensor=prepared.data.sensor,  # the loader's sensor and value set (None: unknown)
        # what calibrate-intervals' folds retrain for once the run is gone
        trained_epochs=trained_epochs(run_dir, config.seed),
        **short,
    )
    write_manifest(model_dir, manifest)
    verify_model_files(model_dir, load_manifest(model_dir))
    return ExportedModel(model_dir, manifest, exported.verification)
