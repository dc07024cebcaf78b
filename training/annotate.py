"""Give an already exported model directory the trust fields of issues 17 and 26 without
retraining.

The committed default models were exported before manifests carried prediction intervals, the
validation comparison and the training target range. The first two depend only on the model's
outputs on the validation sensor, so they are recomputed here from the directory's own float
graph (run by the gateway's calibrator, which matches Keras to 1e-4 of the output scale) on the
data the model was trained with; the target range is the training windows' reference values.
The FlatBuffers are untouched; only ``manifest.json`` is rewritten. A model trained on short
histories gets its history fields recomputed the same way (min_history_periods, the curve and the
per-history intervals: training/history.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tesla_gateway.contract.manifest import (
    Manifest,
    load_manifest,
    verify_model_files,
    write_manifest,
)
from tesla_gateway.models.calibrator import Calibrator
from training.conformal import DEFAULT_LEVEL, fit_intervals
from training.errors import DataError
from training.harm import compare_on
from training.history import history_fields
from training.metrics import LinearCalibration
from training.train import TrainConfig, prepare_data, target_range

__all__ = ["annotate_model_dir"]

CHUNK = 4096
SAME_MODEL_RTOL = 1e-3  # validation RMSE recomputed vs recorded: the data must be the model's


def annotate_model_dir(
    model_dir: Path, config: TrainConfig, *, level: float = DEFAULT_LEVEL
) -> Manifest:
    """Recompute intervals and the validation comparison from the float graph; rewrite the
    manifest (raises DataError when ``config`` does not reproduce the recorded validation)."""
    manifest = load_manifest(model_dir)
    if config.window_length != manifest.window_length:
        raise DataError(
            f"{model_dir}: window_length {config.window_length} in the config, "
            f"{manifest.window_length} in the manifest"
        )
    prepared = prepare_data(config)
    calibrator = Calibrator.load(model_dir)
    windows = prepared.validation
    predicted = np.concatenate(
        [
            calibrator.calibrate(windows.gather(np.arange(i, min(i + CHUNK, len(windows))))[0])
            for i in range(0, len(windows), CHUNK)
        ]
    ).astype(np.float64)
    linear = LinearCalibration.fit(prepared.train.current_raw(), prepared.train.targets())
    baselines = compare_on(windows, predicted, linear)
    if not np.isclose(baselines.model.rmse, manifest.validation.rmse, rtol=SAME_MODEL_RTOL):
        raise DataError(
            f"{model_dir}: validation RMSE {baselines.model.rmse:.4f} recomputed, "
            f"{manifest.validation.rmse:.4f} recorded: this is not the data it was trained on"
        )
    intervals = fit_intervals(
        predicted, windows.targets(), sensor=prepared.summary.validation_sensor, level=level
    )
    short = (
        {}
        if config.partial_history_fraction == 0
        else history_fields(
            calibrator.calibrate,
            windows,
            linear.predict(windows.current_raw()),
            period_seconds=prepared.data.period_seconds,
            sensor=prepared.summary.validation_sensor,
            level=level,
        )
    )
    updated = manifest.model_copy(
        update={
            "intervals": intervals,
            "validation_baselines": baselines,
            "target_range": target_range(prepared.train),
            **short,
        }
    )
    write_manifest(model_dir, Manifest.model_validate(updated.model_dump()))
    verify_model_files(model_dir, load_manifest(model_dir))
    return updated
