"""Evaluate an exported model directory on any co-location data, through the gateway's calibrator.

The model directory is loaded and run by :class:`gateway.calibrator.Calibrator`, the code that
serves it (same checks, runtime and batching), with the manifest's window length, period and gap
policy and the same cleaning and gridding as training: what is scored is what is served.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gateway.calibrator import Calibrator
from gateway.manifest import ErrorMetrics, Manifest
from training.data import CoLocationData, WindowSet, clean, to_grid
from training.errors import DataError
from training.metrics import error_metrics

__all__ = ["Evaluation", "evaluate_model_dir", "model_channels"]

CHUNK = 4096


@dataclass(frozen=True)
class Evaluation:
    n: int
    raw: ErrorMetrics
    model: ErrorMetrics
    per_sensor: dict[str, dict[str, ErrorMetrics]]
    predictions: pd.DataFrame  # timestamp, sensor_id, raw, reference, calibrated

    def as_json(self) -> dict[str, object]:
        return {
            "n": self.n,
            "raw": self.raw.model_dump(),
            "model": self.model.model_dump(),
            "sensors": {
                sensor: {name: m.model_dump() for name, m in scores.items()}
                for sensor, scores in self.per_sensor.items()
            },
        }


def model_channels(manifest: Manifest) -> tuple[str, ...]:
    """WindowSet channel names for the manifest's inputs (the feature itself is 'raw')."""
    return tuple(
        "raw" if channel.name == manifest.feature else channel.name
        for channel in manifest.input_channels
    )


def evaluate_model_dir(model_dir: Path, data: CoLocationData) -> Evaluation:
    """Calibrate every window the model can calibrate and score those with a reference."""
    calibrator = Calibrator.load(model_dir)
    manifest = calibrator.manifest
    if data.period_seconds != manifest.period_seconds:
        raise DataError(
            f"the data is on a {data.period_seconds} s grid but the model expects "
            f"{manifest.period_seconds} s: load it with period_seconds={manifest.period_seconds}"
        )
    cleaned, _ = clean(data)
    sensors = to_grid(cleaned)
    windows = WindowSet.build(
        list(sensors.values()),
        manifest.window_length,
        manifest.gap_policy,
        channels=model_channels(manifest),
        require_target=False,
    )
    if len(windows) == 0:
        raise DataError(
            f"no window of {manifest.window_length} periods is complete in this data "
            f"(gaps over {manifest.gap_policy.max_interpolated_periods} periods break windows)"
        )
    calibrated = np.concatenate(
        [
            calibrator.calibrate(windows.gather(np.arange(i, min(i + CHUNK, len(windows))))[0])
            for i in range(0, len(windows), CHUNK)
        ]
    ).astype(np.float64)
    meta = windows.meta()
    predictions = pd.DataFrame(
        {
            "timestamp": meta["timestamp"].dt.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "sensor_id": meta["sensor_id"].to_numpy(),
            "raw": windows.current_raw().astype(np.float64),
            "reference": windows.targets().astype(np.float64),
            "calibrated": calibrated,
        }
    )
    scored = predictions[np.isfinite(predictions["reference"])]
    per_sensor = {
        str(sensor): {
            "raw": error_metrics(group["raw"].to_numpy(), group["reference"].to_numpy()),
            "model": error_metrics(group["calibrated"].to_numpy(), group["reference"].to_numpy()),
        }
        for sensor, group in scored.groupby("sensor_id", sort=True)
    }
    return Evaluation(
        n=len(scored),
        raw=error_metrics(scored["raw"].to_numpy(), scored["reference"].to_numpy()),
        model=error_metrics(scored["calibrated"].to_numpy(), scored["reference"].to_numpy()),
        per_sensor=per_sensor,
        predictions=predictions,
    )
