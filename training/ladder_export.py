"""Export the ladder's choice as a model directory the gateway and nodes serve as they serve TESLA.

A TESLA winner goes through :func:`training.model_dir.export_run` unchanged; a classical one is
built as a tiny window graph (training/classical.py) and goes through the same FlatBuffer
export and verification (LiteRT, the integer graph, TFLite Micro), the same guard, the same
split conformal intervals on the validation sensor and the same manifest. Both manifests then
carry every candidate's validation figures and why the exported one won.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from tesla_gateway.contract.manifest import (
    InputChannel,
    Manifest,
    PredictionIntervals,
    load_manifest,
    verify_model_files,
    write_manifest,
)
from training.classical import ClassicalFit
from training.conformal import DEFAULT_LEVEL, fit_intervals
from training.errors import DataError, HarmfulModelError
from training.export import ExportTargets, export_flatbuffers
from training.harm import check_not_harmful, compare_on
from training.ladder import Ladder, LadderData, load_ladder
from training.metrics import LinearCalibration, error_metrics
from training.model_dir import (
    CHANNEL_UNITS,
    ExportedModel,
    check_windows,
    export_run,
    representative_windows,
)
from training.train import TrainConfig, input_range, target_range

__all__ = ["DEVICE_RANGE_FLOOR", "DEVICE_RANGE_HEADROOM", "export_choice"]

# The integer graph's activation ranges come from the representative windows; a straight line
# is expected to extrapolate, so its peak windows enter again with the reading stretched to
# DEVICE_RANGE_HEADROOM times the training maximum and at least DEVICE_RANGE_FLOOR µg/m³
# (measured: without it a validation reading at 1.4x the training maximum came out 19 µg/m³
# low, clipped at the range's end). 16-bit activations keep a step of 0.03 µg/m³ at 1,000.
DEVICE_RANGE_HEADROOM = 4.0
DEVICE_RANGE_FLOOR = 1000.0
HEADROOM_WINDOWS = 20


def _chosen(ladder: Ladder, candidate: str | None, force: bool) -> str:
    names = [c.name for c in ladder.candidates if c.validation is not None]
    if candidate is not None:
        if candidate not in names or candidate == "raw":
            raise DataError(
                f"--candidate {candidate!r} is not a fitted calibration of this run: choose from "
                f"{[n for n in names if n != 'raw']}"
            )
        return candidate
    if ladder.winner is not None:
        return ladder.winner
    if not force or ladder.best_model is None:
        raise HarmfulModelError(ladder.reason)
    return ladder.best_model


def export_choice(
    run_dir: Path,
    model_dir: Path,
    *,
    name: str,
    version: int | None = None,
    targets: ExportTargets = "both-if-possible",
    force: bool = False,
    candidate: str | None = None,
    interval_level: float = DEFAULT_LEVEL,
) -> ExportedModel:
    """Export the ladder's winner (or ``candidate``); a run without a ladder exports its TESLA."""
    ladder = load_ladder(run_dir)
    if ladder is None:
        return export_run(run_dir, model_dir, name=name, version=version, targets=targets,
                          force=force, interval_level=interval_level)  # fmt: skip
    chosen = _chosen(ladder, candidate, force)
    choice = (
        ladder.reason
        if chosen == ladder.winner
        else f"{chosen} exported by request; {ladder.reason}"
    )
    if chosen in ladder.runs:
        exported = export_run(run_dir / ladder.runs[chosen], model_dir, name=name,
                              version=version, targets=targets, force=force,
                              interval_level=interval_level)  # fmt: skip
        manifest = exported.manifest.model_copy(
            update={"candidates": list(ladder.candidates), "choice": choice}
        )
        write_manifest(model_dir, manifest)
        verify_model_files(model_dir, load_manifest(model_dir))
        return ExportedModel(model_dir, manifest, exported.verification)
    return _export_classical(
        run_dir, model_dir, ladder, ladder.fits[chosen], name=name, version=version,
        targets=targets, force=force, choice=choice, interval_level=interval_level,
    )  # fmt: skip


def _representative(data: LadderData, channels: tuple[str, ...]) -> np.ndarray:
    train = data.windows(channels, "train")
    base = representative_windows(train)
    peaks, _ = train.gather(np.sort(np.argsort(train.current_raw())[-HEADROOM_WINDOWS:]))
    stretched = peaks.copy()
    peak = max(float(np.max(train.current_raw())), 1e-6)
    factor = max(DEVICE_RANGE_HEADROOM, DEVICE_RANGE_FLOOR / peak)
    if stretched.ndim == 2:
        stretched *= factor
    else:
        stretched[:, :, 0] *= factor
    return np.concatenate([base, stretched])


def _export_classical(
    run_dir: Path,
    model_dir: Path,
    ladder: Ladder,
    fit: ClassicalFit,
    *,
    name: str,
    version: int | None,
    targets: ExportTargets,
    force: bool,
    choice: str,
    interval_level: float,
) -> ExportedModel:
    config = TrainConfig.model_validate_json((run_dir / "config.json").read_text("utf-8"))
    data = LadderData(config)
    train, validation, test = (
        data.windows(fit.channels, r) for r in ("train", "validation", "test")
    )
    sensor = data.split.validation
    line = ladder.fits.get("linear")  # the ladder's own line: a linear winner ties, not loses
    linear = (
        LinearCalibration.fit(train.current_raw(), train.targets())
        if line is None
        else LinearCalibration(slope=line.weights[0], intercept=line.intercept)
    )
    validation_predicted = fit.predict(validation)
    baselines = compare_on(validation, validation_predicted, linear)
    check_not_harmful(baselines, sensor, force=force)
    intervals: PredictionIntervals | None
    try:
        intervals = fit_intervals(validation_predicted, validation.targets(), sensor=sensor,
                                  level=interval_level)  # fmt: skip
    except DataError:
        intervals = None  # too few validation windows: the manifest says nothing rather than guess
    check, check_reference = check_windows(test)
    exported = export_flatbuffers(
        fit.keras_model(config.window_length), model_dir, _representative(data, fit.channels),
        check, check_reference, targets=targets,
    )  # fmt: skip
    feature = data.data.feature
    manifest = Manifest(
        name=name,
        version=version if version is not None else int(time.time()),
        architecture=fit.architecture,
        feature=feature,
        window_length=config.window_length,
        period_seconds=data.data.period_seconds,
        input_channels=[
            InputChannel(name=feature if c == "raw" else c, unit=CHANNEL_UNITS[c])
            for c in fit.channels
        ],
        input_scale=fit.scales[0],
        gap_policy=data.policy,
        files=exported.files,
        parameter_count=fit.parameters,
        hyperparameters=fit.hyperparameters(),
        validation=error_metrics(validation_predicted, validation.targets()),
        test=compare_on(test, fit.predict(test), linear),
        input_range=input_range(train),
        data=data.summary(fit.channels),
        created_at=datetime.now(UTC),
        intervals=intervals,
        validation_baselines=baselines,
        target_range=target_range(train),
        device_graph_absent=exported.device_graph_absent,
        sensor=data.data.sensor,
        min_history_periods=1,  # it reads the newest period alone
        candidates=list(ladder.candidates),
        choice=choice,
    )
    write_manifest(model_dir, manifest)
    verify_model_files(model_dir, load_manifest(model_dir))
    return ExportedModel(model_dir, manifest, exported.verification)
