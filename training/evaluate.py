"""Evaluate an exported model directory on any co-location data, through the gateway's calibrator.

The model directory is loaded and run by :class:`tesla_gateway.models.calibrator.Calibrator`, the
code that
serves it (same checks, runtime and batching), with the manifest's window length, period and gap
policy and the same cleaning and gridding as training: what is scored is what is served.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tesla_gateway.contract.manifest import (
    ErrorMetrics,
    Manifest,
    PredictionIntervals,
    TestMetrics,
)
from tesla_gateway.models.calibrator import Calibrator
from training.conformal import IntervalScores, score_intervals
from training.data import CoLocationData, WindowSet, clean, to_grid
from training.equivalence import Equivalence, equivalence
from training.errors import DataError
from training.harm import describe
from training.history import truncate
from training.metrics import error_metrics

__all__ = [
    "Evaluation",
    "HeldOutReport",
    "evaluate_model_dir",
    "evaluation_text",
    "model_channels",
]

CHUNK = 4096


@dataclass(frozen=True)
class HeldOutReport:
    """The manifest's test sensor alone (never trained on, never used to choose the model):
    where the intervals' coverage and the GDE figures mean something."""

    sensor: str
    raw: ErrorMetrics
    model: ErrorMetrics
    intervals: IntervalScores | None
    equivalence: Equivalence | None

    def as_dict(self) -> dict[str, object]:
        return {
            "sensor": self.sensor,
            "raw": self.raw.model_dump(),
            "model": self.model.model_dump(),
            "intervals": None if self.intervals is None else self.intervals.as_dict(),
            "equivalence": None if self.equivalence is None else self.equivalence.as_dict(),
        }


@dataclass(frozen=True)
class Evaluation:
    n: int
    raw: ErrorMetrics
    model: ErrorMetrics
    per_sensor: dict[str, dict[str, ErrorMetrics]]
    predictions: pd.DataFrame  # timestamp, sensor_id, raw, reference, calibrated
    validation: TestMetrics | None = None  # the manifest's raw/linear/model on validation
    intervals: IntervalScores | None = None
    equivalence: Equivalence | None = None
    test_sensor: HeldOutReport | None = None
    history_periods: int | None = None  # K of --history-periods; None: whole windows
    # coverage per unit: pooled coverage hides a unit whose intervals are too narrow (issue 28)
    intervals_per_sensor: dict[str, IntervalScores] | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "history_periods": self.history_periods,
            "test_sensor": None if self.test_sensor is None else self.test_sensor.as_dict(),
            "n": self.n,
            "raw": self.raw.model_dump(),
            "model": self.model.model_dump(),
            "validation": None if self.validation is None else self.validation.model_dump(),
            "intervals": None if self.intervals is None else self.intervals.as_dict(),
            "equivalence": None if self.equivalence is None else self.equivalence.as_dict(),
            "sensors": {
                sensor: {
                    **{name: m.model_dump() for name, m in scores.items()},
                    **self._sensor_intervals(sensor),
                }
                for sensor, scores in self.per_sensor.items()
            },
        }

    def _sensor_intervals(self, sensor: str) -> dict[str, object]:
        scores = (self.intervals_per_sensor or {}).get(sensor)
        return {} if scores is None else {"intervals": scores.as_dict()}


def model_channels(manifest: Manifest) -> tuple[str, ...]:
    """WindowSet channel names for the manifest's inputs (the feature itself is 'raw')."""
    return tuple(
        "raw" if channel.name == manifest.feature else channel.name
        for channel in manifest.input_channels
    )


def evaluate_model_dir(
    model_dir: Path,
    data: CoLocationData,
    *,
    reference_uncertainty: float = 0.0,
    history_periods: int | None = None,
) -> Evaluation:
    """Calibrate every window the model can calibrate and score those with a reference:
    error, the intervals' coverage and width, and the GDE figures on daily means.

    With ``history_periods`` K every window keeps only its newest K periods, the older ones
    edge-padded as the gateway pads a young sensor's window (the same windows are scored for
    every K, so the scores of several K make a curve), and the intervals are those the gateway
    publishes for that history.
    """
    calibrator = Calibrator.load(model_dir)
    manifest = calibrator.manifest
    if history_periods is not None and not 1 <= history_periods <= manifest.window_length:
        raise DataError(
            f"--history-periods must lie in 1..{manifest.window_length} (the model's N), "
            f"got {history_periods}"
        )
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
    history = manifest.window_length if history_periods is None else history_periods
    calibrated = np.concatenate(
        [
            calibrator.calibrate(
                truncate(windows.gather(np.arange(i, min(i + CHUNK, len(windows))))[0], history)
            )
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
    intervals = manifest.intervals_for(history)
    interval_scores, agreement = _trust_scores(
        manifest, intervals, predictions, reference_uncertainty
    )
    per_unit = (
        None
        if intervals is None
        else {
            str(sensor): score_intervals(
                intervals, group["calibrated"].to_numpy(), group["reference"].to_numpy()
            )
            for sensor, group in scored.groupby("sensor_id", sort=True)
        }
    )
    test_id = manifest.data.test_sensor
    held_out = predictions[predictions["sensor_id"] == test_id]
    test_sensor = None
    if held_out["reference"].notna().any():
        test_intervals, test_agreement = _trust_scores(
            manifest, intervals, held_out, reference_uncertainty
        )
        test_sensor = HeldOutReport(
            sensor=test_id,
            raw=per_sensor[test_id]["raw"],
            model=per_sensor[test_id]["model"],
            intervals=test_intervals,
            equivalence=test_agreement,
        )
    return Evaluation(
        n=len(scored),
        raw=error_metrics(scored["raw"].to_numpy(), scored["reference"].to_numpy()),
        model=error_metrics(scored["calibrated"].to_numpy(), scored["reference"].to_numpy()),
        per_sensor=per_sensor,
        predictions=predictions,
        validation=manifest.validation_baselines,
        intervals=interval_scores,
        equivalence=agreement,
        test_sensor=test_sensor,
        history_periods=history_periods,
        intervals_per_sensor=per_unit,
    )


def _trust_scores(
    manifest: Manifest,
    intervals: PredictionIntervals | None,
    predictions: pd.DataFrame,
    reference_uncertainty: float,
) -> tuple[IntervalScores | None, Equivalence | None]:
    """Interval coverage/width and the GDE figures of some calibrated steps."""
    scored = predictions[np.isfinite(predictions["reference"])]
    scores = (
        None
        if intervals is None
        else score_intervals(
            intervals, scored["calibrated"].to_numpy(), scored["reference"].to_numpy()
        )
    )
    agreement = equivalence(
        predictions,
        feature=manifest.feature,
        period_seconds=manifest.period_seconds,
        reference_uncertainty=reference_uncertainty,
    )
    return scores, agreement


def evaluation_text(manifest: Manifest, evaluation: Evaluation) -> str:
    """The human-readable report of ``evaluate`` (``--json`` prints :meth:`Evaluation.as_json`)."""
    unit = manifest.unit
    lines = [f"model {manifest.name} v{manifest.version}: {evaluation.n} calibrated periods"]
    if evaluation.history_periods is not None:
        lines[0] += (
            f", every window with only its newest {evaluation.history_periods} of "
            f"{manifest.window_length} periods (the model calibrates from "
            f"{manifest.calibrates_from})"
        )
    for label, scores in (("raw", evaluation.raw), ("model", evaluation.model)):
        lines.append(f"  {label:<6} RMSE {scores.rmse:8.3f}  MAE {scores.mae:8.3f}  {unit}")
    if evaluation.validation is not None:
        lines.append(
            f"  validation sensor {manifest.data.validation_sensor}: "
            f"{describe(evaluation.validation)}"
        )
    if evaluation.model.rmse > evaluation.raw.rmse:
        lines.append("  WARNING: on this data the model is worse than the raw readings")
    lines += _trust_lines("all sensors", evaluation.intervals, evaluation.equivalence, unit)
    lines += _unit_lines(manifest, evaluation, unit)
    held = evaluation.test_sensor
    if held is not None:
        lines.append(
            f"  test sensor {held.sensor}: raw RMSE {held.raw.rmse:.3f}, model RMSE "
            f"{held.model.rmse:.3f} {unit}"
        )
        lines += _trust_lines(f"test sensor {held.sensor}", held.intervals, held.equivalence, unit)
    return "\n".join(lines)


def _unit_lines(manifest: Manifest, evaluation: Evaluation, unit: str) -> list[str]:
    """Coverage per unit, each with its role for this model (trained on, validation, test or
    a unit it never saw)."""
    roles = dict.fromkeys(manifest.data.train_sensors, "trained on")
    roles[manifest.data.validation_sensor] = "validation"
    roles[manifest.data.test_sensor] = "test"
    return [
        f"    {sensor} ({roles.get(sensor, 'unseen')}): {scores.coverage:.1%} covered, mean "
        f"width {scores.mean_width:.3g} {unit} over {scores.n} periods"
        for sensor, scores in sorted((evaluation.intervals_per_sensor or {}).items())
        if scores.n > 0
    ]


def _trust_lines(
    label: str, intervals: IntervalScores | None, agreement: Equivalence | None, unit: str
) -> list[str]:
    lines = []
    if intervals is not None:
        lines.append(
            f"  {label}: {intervals.level:.0%} intervals cover {intervals.coverage:.1%}, mean "
            f"width {intervals.mean_width:.3g} {unit} over {intervals.n} periods"
        )
    if agreement is not None:
        verdict = "meets" if agreement.meets_indicative_dqo else "misses"
        lines.append(
            f"  {label}: EU GDE on {agreement.days} daily means: W = "
            f"{agreement.expanded_relative_uncertainty:.1%} at {agreement.limit_value:g} {unit} "
            f"({verdict} the 50 % indicative DQO); orthogonal slope {agreement.slope:.3f}, "
            f"intercept {agreement.intercept:.3g}, R² {agreement.r2:.3f}"
        )
    return lines
