"""Give a model directory intervals calibrated across units (``calibrate-intervals``).

Trains (or reuses) the folds exchangeable with the model (training/pool_folds.py: each leaves out
one training sensor and trains on the rest and the validation sensor, for the model's kept
epochs), predicts every training sensor with the fold that left it out and the validation and
test sensors with the directory's float graph (run by the gateway's calibrator),
fits the cross-unit intervals (training/cross_conformal.py) for whole windows and for every
short-history bucket the manifest has, and rewrites only ``manifest.json``. The returned report
holds the before/after coverage and width per unit (docs/benchmarks/intervals/), and what the
gateway's adaptive conformal inference reaches when each unit's pairs, in time order, are
replayed through it beside a reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tesla_gateway.contract.manifest import (
    HistoryIntervals,
    Manifest,
    PredictionIntervals,
    UnitCoverage,
    load_manifest,
    verify_model_files,
    write_manifest,
)
from tesla_gateway.models.calibrator import Calibrator
from tesla_gateway.monitor.drift import DriftConfig
from training.conformal import DEFAULT_LEVEL
from training.cross_conformal import (
    UnitResiduals,
    fit_cross_unit,
    held_out_coverage_intervals,
    replay_adaptive,
    unit_scores,
)
from training.data import WindowSet
from training.errors import DataError
from training.pool_folds import KeptEpochs, PoolFold, fold_predictor, train_pool_folds
from training.train import TrainConfig, prepare_data
from training.unit_folds import UnitPredictions, predicted_unit, sensor_windows

__all__ = ["ACI_GAMMA", "IntervalReport", "calibrate_model_dir", "report_table"]

ACI_GAMMA = DriftConfig().interval_gamma  # the gateway's default step, for the replay


@dataclass(frozen=True)
class IntervalReport:
    """What ``calibrate-intervals`` did, with figures per unit before and after."""

    model: str
    manifest: Manifest
    rows: list[dict[str, Any]]  # one per (unit, history length): before / after
    folds: list[dict[str, object]]
    kept: KeptEpochs  # the exported model's kept epochs, which every fold trained for
    predictions: list[UnitPredictions]  # every unit's out-of-unit predictions, test last

    def as_json(self) -> dict[str, Any]:
        assert self.manifest.intervals is not None
        return {
            "model": self.model,
            "method": self.manifest.intervals.method,
            "calibration_sensors": self.manifest.intervals.calibration_sensors,
            "half_widths": self.manifest.intervals.half_widths,
            "edges": self.manifest.intervals.edges,
            "fold_epochs": self.kept.model_dump(),
            "folds": self.folds,
            "units": self.rows,
        }


def _whole(unit: UnitPredictions) -> UnitResiduals:
    return UnitResiduals(unit.sensor, unit.role, unit.whole, unit.reference)


def _cut(unit: UnitPredictions, k: int) -> UnitResiduals:
    return UnitResiduals(unit.sensor, unit.role, unit.truncated[k], unit.reference)


def _row(
    unit: UnitResiduals, periods: int | None, before: PredictionIntervals | None, new: UnitCoverage
) -> dict[str, Any]:
    old = None if before is None else unit_scores(before, unit)
    return {
        "sensor": unit.sensor,
        "role": unit.role,
        "history_periods": periods,
        "n": len(unit.finite().predicted),
        "before_coverage": None if old is None else round(old.coverage, 4),
        "before_width": None if old is None else round(old.mean_width, 3),
        "after_coverage": round(new.coverage, 4),
        "after_width": round(new.mean_width, 3),
    }


def calibrate_model_dir(
    model_dir: Path,
    config: TrainConfig,
    folds_dir: Path,
    *,
    kept: KeptEpochs,
    level: float = DEFAULT_LEVEL,
    aci_gamma: float = ACI_GAMMA,
    verbose: int | str = 0,
) -> IntervalReport:
    """Fit cross-unit intervals for ``model_dir`` (trained with ``config`` and kept after
    ``kept`` epochs) and rewrite its manifest; ``folds_dir`` holds the fold runs (reused when
    their config, units and epochs match)."""
    manifest = load_manifest(model_dir)
    prepared = prepare_data(config)
    summary = prepared.summary
    if (
        config.window_length != manifest.window_length
        or summary.train_sensors != manifest.data.train_sensors
        or summary.validation_sensor != manifest.data.validation_sensor
    ):
        raise DataError(
            f"{model_dir}: the config's window length and sensors ({config.window_length}, "
            f"train {summary.train_sensors}, validation {summary.validation_sensor}) are not "
            f"the model's ({manifest.window_length}, train {manifest.data.train_sensors}, "
            f"validation {manifest.data.validation_sensor}): pass the config it was trained with"
        )
    pool = [*summary.train_sensors, summary.validation_sensor]
    runs = train_pool_folds(config, pool, summary.train_sensors, kept, folds_dir, verbose=verbose)
    points = [entry.min_periods for entry in manifest.history_intervals or []]
    units = _fold_predictions(runs, sensor_windows(config, summary.train_sensors), points)
    calibrator = Calibrator.load(model_dir)
    units.append(
        predicted_unit(
            summary.validation_sensor, "validation", calibrator.calibrate, prepared.validation,
            points,
        )
    )  # fmt: skip
    test = predicted_unit(summary.test_sensor, "test", calibrator.calibrate, prepared.test, points)
    sensor = summary.validation_sensor

    whole = [_whole(unit) for unit in units]
    intervals = fit_cross_unit(whole, validation_sensor=sensor, level=level)
    fitted = [*held_out_coverage_intervals(whole, validation_sensor=sensor, level=level)]
    fitted.append(intervals)  # the test unit: the intervals as published
    scored = [*whole, _whole(test)]
    held = [unit_scores(i, unit.finite()) for i, unit in zip(fitted, scored, strict=True)]
    intervals = intervals.model_copy(update={"unit_coverage": held})
    rows = [
        _row(unit.finite(), None, manifest.intervals, score)
        for unit, score in zip(scored, held, strict=True)
    ]
    for row, unit, unit_intervals in zip(rows, scored, fitted, strict=True):
        adapted = replay_adaptive(unit_intervals, unit, gamma=aci_gamma)
        row["aci_coverage"] = round(adapted.coverage, 4)
        row["aci_width"] = round(adapted.mean_width, 3)
    history = _history_intervals(manifest, units, test, points, sensor, level, rows)
    updated = manifest.model_copy(
        update={
            "intervals": intervals,
            **({} if history is None else {"history_intervals": history}),
        }
    )
    updated = Manifest.model_validate(updated.model_dump())
    write_manifest(model_dir, updated)
    verify_model_files(model_dir, load_manifest(model_dir))
    folds = [run.cost() for run in runs]
    return IntervalReport(manifest.name, updated, rows, folds, kept, [*units, test])


def _fold_predictions(
    runs: Sequence[PoolFold], windows: dict[str, WindowSet], points: Sequence[int]
) -> list[UnitPredictions]:
    """Every left-out training sensor's windows predicted by the fold that left it out."""
    return [
        predicted_unit(run.left_out, "train", fold_predictor(run), windows[run.left_out], points)
        for run in runs
    ]


def _history_intervals(  # noqa: PLR0917 (one private step of calibrate_model_dir)
    manifest: Manifest,
    units: Sequence[UnitPredictions],
    test: UnitPredictions,
    points: Sequence[int],
    sensor: str,
    level: float,
    rows: list[dict[str, Any]],
) -> list[HistoryIntervals] | None:
    """Cross-unit intervals per short-history bucket (fitted on windows cut to the bucket's
    shortest history, as split conformal's are), with their test coverage appended to rows."""
    if manifest.history_intervals is None:
        return None
    before = {entry.min_periods: entry.intervals for entry in manifest.history_intervals}
    out = []
    for k in points:
        fitted = fit_cross_unit(
            [_cut(unit, k) for unit in units],
            validation_sensor=sensor,
            level=level,
            quantile_levels=(),  # the whole-window intervals carry the table ACI reads
        )
        cut_test = _cut(test, k).finite()
        rows.append(_row(cut_test, k, before[k], unit_scores(fitted, cut_test)))
        out.append(HistoryIntervals(min_periods=k, intervals=fitted))
    return out


def report_table(report: dict[str, Any]) -> str:
    """The per-unit before/after table of a report (:meth:`IntervalReport.as_json`) in
    Markdown: whole windows first, then the test unit per short history."""

    def cell(coverage: float | None, width: float | None) -> str:
        return "–" if coverage is None or width is None else f"{coverage:.1%} / {width:.2f}"

    lines = [
        f"**{report['model']}** ({report['method']}, calibrated on "
        f"{', '.join(report['calibration_sensors'])})",
        "",
        "| unit | role | history (periods) | n | before: coverage / width | after: coverage / "
        "width | after, adapted beside a reference (ACI) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["units"]:
        periods = "whole window" if row["history_periods"] is None else str(row["history_periods"])
        lines.append(
            f"| {row['sensor']} | {row['role']} | {periods} | {row['n']} | "
            f"{cell(row['before_coverage'], row['before_width'])} | "
            f"{cell(row['after_coverage'], row['after_width'])} | "
            f"{cell(row.get('aci_coverage'), row.get('aci_width'))} |"
        )
    return "\n".join(lines) + "\n"
