"""Champion/challenger retraining from the pairs a gateway recorded beside a reference.

``retrain(config, out_dir)``:

1. reads the champion model directory (its manifest fixes N, period, channels, architecture and
   version) and the recorded pairs of its feature;
2. holds back the most recent part of the pairs (a duration or a share of the recorded periods);
   the periods before it train the challenger, their most recent share selects its epoch;
3. trains the challenger: fine-tuned from the champion's Keras model when its run directory is
   given, else built fresh with the champion's architecture, on the pairs (and the original
   training data, when given);
4. scores champion and challenger on the held-back period through the evaluate path (their float
   FlatBuffers under LiteRT, as the gateway runs them) on the same windows;
5. accepts the challenger only if its RMSE beats the champion's by the configured margin; then
   exports it with the champion's version + 1, signs a release (given a key) and pushes it
   (given a broker).

Every input, figure and decision goes to ``report.json`` and ``report.md`` in the output
directory, also when the challenger is rejected or the run fails. Each step is the code the
``train``, ``export`` and ``evaluate`` commands run (run directory, representative set, export
and verification, manifest fields, scoring through the gateway's calibrator); this module only
decides what to feed them.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import keras
import numpy as np
import pandas as pd
from pydantic import TypeAdapter, ValidationError

from gateway.calibrator import Calibrator
from gateway.errors import GatewayError
from gateway.manifest import (
    DataSummary,
    ErrorMetrics,
    Manifest,
    ModelFile,
    Precision,
    TestMetrics,
    load_manifest,
    sha256_file,
    verify_model_files,
    write_manifest,
)
from training.data import (
    CleaningReport,
    CoLocationData,
    RecordedPairs,
    WindowSet,
    clean,
    load_dataset,
    read_pairs,
    to_grid,
)
from training.data.frame import unix_seconds
from training.errors import (
    ExportVerificationError,
    FeatureMismatchError,
    HoldoutError,
    RetrainError,
    TrainingError,
)
from training.evaluate import Evaluation, evaluate_model_dir, model_channels
from training.export import (
    FLOAT_FILENAME,
    INT8_FILENAME,
    convert_float,
    export_flatbuffers,
    export_float_graph,
    float_model_file,
)
from training.metrics import LinearCalibration, error_metrics
from training.model_dir import check_windows, representative_windows, training_hyperparameters
from training.models import ModelConfig, build_model
from training.retrain.config import RetrainConfig
from training.retrain.data import (
    Periods,
    TrainingSets,
    iso,
    masked,
    only_references_from,
    pairs_since,
    split_periods,
    training_sets,
)
from training.retrain.report import RetrainReport
from training.train import (
    TrainConfig,
    WindowBatches,
    input_range,
    load_run,
    predict_windows,
    write_run,
)

__all__ = ["RetrainResult", "decide", "retrain"]

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
_SCORED = ("raw", "linear", "champion", "challenger")


@dataclass(frozen=True)
class RetrainResult:
    decision: Literal["accepted", "rejected"]
    reason: str
    out_dir: Path
    report: RetrainReport
    model_dir: Path | None
    release_dir: Path | None
    topic: str | None

    @property
    def accepted(self) -> bool:
        return self.decision == "accepted"


@dataclass(frozen=True)
class _Inputs:
    champion: Manifest
    channels: tuple[str, ...]
    pairs: RecordedPairs
    cleaning: CleaningReport
    periods: Periods
    window_length: int
    holdout: WindowSet
    original: CoLocationData | None
    sets: TrainingSets


@dataclass(frozen=True)
class _Challenger:
    model: keras.Model
    model_config: Any  # one of training.models' configs
    mode: Literal["finetune", "fresh"]
    batch_size: int
    learning_rate: float
    history: dict[str, list[float]]
    validation: ErrorMetrics
    linear: LinearCalibration

    @property
    def epochs_run(self) -> int:
        return len(self.history.get("loss", []))


@dataclass
class _Comparison:
    scores: dict[str, ErrorMetrics]  # raw, linear, champion, challenger
    per_sensor: dict[str, dict[str, ErrorMetrics]]
    predictions: pd.DataFrame
    evaluated_sha256: str
    recorded: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.scores["champion"].n

    def figures(self) -> dict[str, Any]:
        return {
            **{name: metrics.model_dump() for name, metrics in self.scores.items()},
            "n": self.n,
            "per_sensor": {
                sensor: {name: m.model_dump() for name, m in scores.items()}
                for sensor, scores in self.per_sensor.items()
            },
            "recorded_by_gateway": self.recorded,
        }


def decide(
    champion_rmse: float, challenger_rmse: float, margin: float, min_improvement: float
) -> tuple[bool, str]:
    """Accept only a challenger at most ``(1 - margin)`` x and ``min_improvement`` below."""
    required = _required_rmse(champion_rmse, margin, min_improvement)
    terms = f"champion {champion_rmse:.3f}, margin {margin:.1%}, min improvement {min_improvement}"
    if challenger_rmse < champion_rmse and challenger_rmse <= required:
        return True, (f"challenger RMSE {challenger_rmse:.3f} <= {required:.3f} required ({terms})")
    return False, f"challenger RMSE {challenger_rmse:.3f} > {required:.3f} required ({terms})"


def retrain(config: RetrainConfig, out_dir: Path, *, verbose: int | str = 0) -> RetrainResult:
    """Train, compare and (if better) release a challenger; the report is written in any case."""
    if out_dir.exists() and any(out_dir.iterdir()):
        raise RetrainError(f"{out_dir} is not empty; each retraining run needs its own directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    report = RetrainReport(
        created_at=iso(datetime.now(UTC).timestamp()), config=config.model_dump(mode="json")
    )
    try:
        return _retrain(config, out_dir, report, verbose)
    except (TrainingError, GatewayError) as exc:
        report.failed(exc)
        report.write(out_dir)
        raise


def _retrain(
    config: RetrainConfig, out_dir: Path, report: RetrainReport, verbose: int | str
) -> RetrainResult:
    """The stages in order; each returns its result and the report section it fills."""
    if config.key is not None:
        from training.release import load_private_key

        load_private_key(config.key)  # a bad key fails now, not after training
    inputs = _prepare(config, report)
    challenger = _train_challenger(config, inputs, verbose)
    report.challenger = _describe_challenger(config, inputs, challenger)
    manifest = _challenger_manifest(config, inputs, challenger)
    comparison = _score(config, inputs, challenger, manifest, out_dir)
    report.figures = comparison.figures()

    champion_rmse = comparison.scores["champion"].rmse
    challenger_rmse = comparison.scores["challenger"].rmse
    accepted, reason = decide(champion_rmse, challenger_rmse, config.margin, config.min_improvement)
    report.margin = _describe_margin(config, champion_rmse, challenger_rmse)
    report.decision = "accepted" if accepted else "rejected"
    report.reason = reason

    test = TestMetrics(
        raw=comparison.scores["raw"],
        linear=comparison.scores["linear"],
        model=comparison.scores["challenger"],
    )
    run_dir = out_dir / "run"
    _save_run(run_dir, inputs, challenger, manifest, test)
    report.challenger["run_dir"] = str(run_dir)
    model_dir: Path | None = None
    if accepted:
        model_dir = out_dir / "model"
        exported = _export(
            challenger.model,
            model_dir,
            manifest=manifest,
            inputs=inputs,
            test=test,
            target=config.target,
        )
        released_sha256 = sha256_file(model_dir / FLOAT_FILENAME)
        report.challenger.update(
            export=exported,
            model_dir=str(model_dir),
            float32_sha256=released_sha256,
            float32_is_the_evaluated_file=released_sha256 == comparison.evaluated_sha256,
        )
        report.release = _release(config, model_dir, out_dir / "release")
    report.write(out_dir)
    release = report.release
    return RetrainResult(
        decision="accepted" if accepted else "rejected",
        reason=reason,
        out_dir=out_dir,
        report=report,
        model_dir=model_dir,
        release_dir=Path(release["path"]) if release else None,
        topic=release["topic"] if release else None,
    )


def _prepare(config: RetrainConfig, report: RetrainReport) -> _Inputs:
    """Champion, pairs, periods and windows; every check that needs no training runs here.

    Each section goes into the report as soon as it is known, so a run stopped by a check
    still shows what it found.
    """
    champion = load_manifest(config.champion)
    verify_model_files(config.champion, champion)
    channels = model_channels(champion)
    report.champion = _describe_model(config.champion, champion)

    pairs = _read_pairs(config, champion)
    cleaned, cleaning = clean(pairs.data)
    report.data = _describe_pairs(config, pairs, cleaning)
    if cleaned.frame.empty:
        raise HoldoutError(f"no pair in {pairs.directory} survives cleaning; see the report")
    periods = split_periods(cleaned, config.holdout, config.validation_fraction)
    report.data.update(holdout=config.holdout.describe(), periods=periods.as_json())

    window_length = config.window_length or champion.window_length
    sensors = to_grid(cleaned)
    holdout = WindowSet.build(
        masked(sensors.values(), periods.holdout_start, math.inf),
        window_length,
        champion.gap_policy,
        channels,
    )
    if len(holdout) < config.min_holdout_windows:
        raise HoldoutError(
            f"only {len(holdout)} window(s) of N={window_length} with a reference in the "
            f"held-back period ({periods.as_json()['held_back']}); at least "
            f"{config.min_holdout_windows} are needed: record longer, hold back more, or lower "
            "min_holdout_windows"
        )
    original = _load_original(config, champion)
    if original is not None:
        report.data["original"] = {
            "dataset": config.dataset,
            "source": original.source,
            "sensors": list(original.sensor_ids),
        }
    sets = training_sets(
        sensors,
        original,
        periods,
        (window_length, champion.gap_policy, channels),
        min_train_windows=config.min_train_windows,
        pairs_weight=config.pairs_weight,
        max_original_windows=config.max_original_windows,
        seed=config.seed,
    )
    report.data["windows"] = {**sets.counts, "held_back": len(holdout)}
    return _Inputs(
        champion=champion,
        channels=channels,
        pairs=pairs,
        cleaning=cleaning,
        periods=periods,
        window_length=window_length,
        holdout=holdout,
        original=original,
        sets=sets,
    )


def _describe_pairs(
    config: RetrainConfig, pairs: RecordedPairs, cleaning: CleaningReport
) -> dict[str, Any]:
    described: dict[str, Any] = {
        "pairs": {
            **pairs.summary(),
            "cleaning": {
                "rows_kept": cleaning.rows_kept,
                "rows_dropped": dict(cleaning.rows_dropped),
                "values_nulled": dict(cleaning.values_nulled),
                "sensors_dropped": list(cleaning.sensors_dropped),
            },
        }
    }
    if config.since is not None:
        described["since"] = config.since.isoformat()
    return described


def _train_challenger(config: RetrainConfig, inputs: _Inputs, verbose: int | str) -> _Challenger:
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
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="mse")
    history = _fit(model, inputs.sets, config, batch_size, verbose)
    sets = inputs.sets
    if sets.validation is not None:
        validation = error_metrics(
            predict_windows(model, sets.validation), sets.validation.targets()
        )
    else:  # no validation period: the figure is on the training pairs (stated in the report)
        validation = error_metrics(predict_windows(model, sets.train), sets.train.targets())
    return _Challenger(
        model=model,
        model_config=model_config,
        mode=mode,
        batch_size=batch_size,
        learning_rate=learning_rate,
        history=history,
        validation=validation,
        linear=LinearCalibration.fit(sets.train.current_raw(), sets.train.targets()),
    )


def _describe_challenger(
    config: RetrainConfig, inputs: _Inputs, challenger: _Challenger
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


def _describe_margin(
    config: RetrainConfig, champion_rmse: float, challenger_rmse: float
) -> dict[str, float]:
    return {
        "relative": config.margin,
        "absolute": config.min_improvement,
        "required_rmse": _required_rmse(champion_rmse, config.margin, config.min_improvement),
        "improvement": champion_rmse - challenger_rmse,
        "improvement_fraction": (
            (champion_rmse - challenger_rmse) / champion_rmse if champion_rmse > 0 else 0.0
        ),
    }


def _score(
    config: RetrainConfig,
    inputs: _Inputs,
    challenger: _Challenger,
    manifest: Manifest,
    out_dir: Path,
) -> _Comparison:
    """Champion and challenger through the evaluate path (float FlatBuffer, as served)."""
    holdout_data = only_references_from(inputs.pairs.data, inputs.periods.holdout_start)
    champion_eval = evaluate_model_dir(config.champion, holdout_data)
    candidate_dir = out_dir / ".candidate"
    candidate_dir.mkdir()
    try:
        (candidate_dir / FLOAT_FILENAME).write_bytes(convert_float(challenger.model))
        float_file = float_model_file(candidate_dir / FLOAT_FILENAME)
        placeholder = TestMetrics(
            raw=challenger.validation, linear=challenger.validation, model=challenger.validation
        )
        write_manifest(candidate_dir, _with_files(manifest, {"float32": float_file}, placeholder))
        challenger_eval = evaluate_model_dir(candidate_dir, holdout_data)
        evaluated_sha256 = float_file.sha256
    finally:
        shutil.rmtree(candidate_dir, ignore_errors=True)
    comparison = _compare(champion_eval, challenger_eval, challenger.linear, evaluated_sha256)
    comparison.recorded = _recorded_figures(inputs.pairs, inputs.periods.holdout_start)
    if comparison.n < config.min_holdout_windows:
        raise HoldoutError(
            f"champion and challenger share only {comparison.n} scored window(s) in the "
            f"held-back period; at least {config.min_holdout_windows} are needed"
        )
    comparison.predictions.to_csv(
        out_dir / "holdout_predictions.csv", index=False, float_format="%.4f"
    )
    return comparison


def _describe_model(model_dir: Path, manifest: Manifest) -> dict[str, Any]:
    return {
        "model_dir": str(model_dir),
        "name": manifest.name,
        "version": manifest.version,
        "architecture": manifest.architecture,
        "feature": manifest.feature,
        "window_length": manifest.window_length,
        "period_seconds": manifest.period_seconds,
        "channels": list(manifest.channel_names),
        "max_interpolated_periods": manifest.gap_policy.max_interpolated_periods,
    }


def _read_pairs(config: RetrainConfig, champion: Manifest) -> RecordedPairs:
    try:
        pairs = read_pairs(
            config.pairs, feature=champion.feature, period_seconds=champion.period_seconds
        )
    except FeatureMismatchError as exc:
        raise FeatureMismatchError(
            f"the champion {champion.name} calibrates {champion.feature}: {exc}"
        ) from exc
    stamps = unix_seconds(pairs.data.frame["timestamp"]).astype(np.int64)
    off_grid = np.flatnonzero(stamps % champion.period_seconds)
    if off_grid.size:
        raise FeatureMismatchError(
            f"{pairs.directory}: {off_grid.size} pair(s) do not start a {champion.period_seconds} s"
            f" period of the champion's grid (first at {iso(float(stamps[off_grid[0]]))}): were "
            "they recorded for another model?"
        )
    missing = [c for c in model_channels(champion) if c not in ("raw", *pairs.data.covariates)]
    if missing:
        raise FeatureMismatchError(
            f"the champion reads channel(s) {missing} that the pairs in {pairs.directory} never "
            "carry: the sensors must send them"
        )
    return pairs if config.since is None else pairs_since(pairs, config.since)


def _load_original(config: RetrainConfig, champion: Manifest) -> CoLocationData | None:
    if config.dataset is None:
        return None
    options = dict(config.dataset_options)
    if config.dataset in ("csv", "pairs"):
        options.setdefault("period_seconds", champion.period_seconds)
    loaded = load_dataset(config.dataset, config.data_path, **options)
    if loaded.feature != champion.feature:
        raise FeatureMismatchError(
            f"dataset {config.dataset} measures {loaded.feature}, the champion {champion.feature}"
        )
    if loaded.period_seconds != champion.period_seconds:
        raise FeatureMismatchError(
            f"dataset {config.dataset} is on a {loaded.period_seconds} s grid, the champion on "
            f"{champion.period_seconds} s"
        )
    cleaned, _ = clean(loaded)
    return cleaned


def _challenger_model(
    config: RetrainConfig,
    champion: Manifest,
    mode: Literal["finetune", "fresh"],
    inputs: _Inputs,
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
        WindowBatches(sets.train, sets.indices, batch_size, config.seed),
        validation_data=validation_data,
        epochs=config.epochs,
        callbacks=callbacks,
        verbose=verbose,
    )
    return {k: [float(v) for v in values] for k, values in history.history.items()}


def _summary(inputs: _Inputs) -> DataSummary:
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


def _challenger_manifest(
    config: RetrainConfig, inputs: _Inputs, challenger: _Challenger
) -> Manifest:
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
        data=_summary(inputs).model_dump(mode="json"),
        created_at=datetime.now(UTC).isoformat(),
    )
    try:
        return Manifest.model_validate(document)
    except ValidationError as exc:
        raise RetrainError(f"the challenger's manifest is invalid: {exc}") from exc


def _with_files(
    manifest: Manifest, files: Mapping[Precision, ModelFile], test: TestMetrics
) -> Manifest:
    document = manifest.model_dump(mode="json")
    document["files"] = {key: value.model_dump(mode="json") for key, value in files.items()}
    document["test"] = test.model_dump()
    return Manifest.model_validate(document)


def _compare(
    champion: Evaluation, challenger: Evaluation, linear: LinearCalibration, evaluated_sha256: str
) -> _Comparison:
    """Scores on the windows both models calibrated and that have a reference."""
    keys = ["sensor_id", "timestamp"]
    left = champion.predictions.rename(columns={"calibrated": "champion"})
    right = challenger.predictions[[*keys, "calibrated"]].rename(
        columns={"calibrated": "challenger"}
    )
    joined = left.merge(right, on=keys, how="inner", validate="one_to_one")
    joined = joined[np.isfinite(joined["reference"])].reset_index(drop=True)
    joined["linear"] = linear.predict(joined["raw"].to_numpy())

    def scores(frame: pd.DataFrame) -> dict[str, ErrorMetrics]:
        target = frame["reference"].to_numpy()
        return {name: error_metrics(frame[name].to_numpy(), target) for name in _SCORED}

    return _Comparison(
        scores=scores(joined),
        per_sensor={
            str(sensor): scores(group) for sensor, group in joined.groupby("sensor_id", sort=True)
        },
        predictions=joined[["timestamp", "sensor_id", "raw", "reference", *_SCORED[1:]]],
        evaluated_sha256=evaluated_sha256,
    )


def _recorded_figures(pairs: RecordedPairs, start: float) -> dict[str, Any]:
    """What the gateway itself published in the held-back period, by model version."""
    recorded = pairs.recorded
    held = recorded[unix_seconds(recorded["timestamp"]) >= start]
    held = held[np.isfinite(held["calibrated"]) & np.isfinite(held["reference"])]
    by_version = {
        str(int(version)): error_metrics(
            group["calibrated"].to_numpy(), group["reference"].to_numpy()
        ).model_dump()
        for version, group in held.groupby("model_version", sort=True)
    }
    overall = error_metrics(held["calibrated"].to_numpy(), held["reference"].to_numpy())
    return {"all": overall.model_dump(), "by_model_version": by_version}


def _save_run(
    run_dir: Path,
    inputs: _Inputs,
    challenger: _Challenger,
    manifest: Manifest,
    test: TestMetrics,
) -> None:
    """A run directory in ``train``'s layout, so the next retraining can fine-tune from it."""
    write_run(
        run_dir,
        config=TrainConfig(
            dataset="pairs",
            data_path=inputs.pairs.directory,
            window_length=inputs.window_length,
            max_interpolated_periods=inputs.champion.gap_policy.max_interpolated_periods,
            channels=inputs.channels,
            model=challenger.model_config,
            epochs=int(manifest.hyperparameters["epochs"]),
            batch_size=challenger.batch_size,
            learning_rate=challenger.learning_rate,
            seed=int(manifest.hyperparameters["seed"]),
            input_scale=inputs.champion.input_scale,
        ),
        model=challenger.model,
        history=challenger.history,
        validation=challenger.validation,
        test=test,
        linear=challenger.linear,
        input_scale=inputs.champion.input_scale,
        summary=manifest.data,
        input_range=manifest.input_range,
    )


def _export(
    model: keras.Model,
    model_dir: Path,
    *,
    manifest: Manifest,
    inputs: _Inputs,
    test: TestMetrics,
    target: Literal["gateway", "node"],
) -> dict[str, Any]:
    """Both FlatBuffers, verified, and the manifest last (as ``export_run`` does).

    A gateway runs only the float graph: when the device graph fails its verification (its
    bound is a share of the model's own error, tight for an accurate challenger), a gateway
    release ships the verified float graph alone and the report says why. A node release needs
    the device graph, so there the failure stands.
    """
    # The integer graph's ranges also see the highest held-back readings: a drifting sensor
    # reads beyond the training range (inputs only, no reference, so nothing about the score
    # leaks into the model).
    representative = representative_windows(inputs.sets.train, inputs.holdout)
    check, check_reference = check_windows(inputs.holdout)
    described: dict[str, Any] = {"device_graph": "verified"}
    try:
        exported = export_flatbuffers(model, model_dir, representative, check, check_reference)
        files: dict[Precision, ModelFile] = dict(exported.files)
        described["verification"] = exported.verification.as_dict()
    except ExportVerificationError as exc:
        if target == "node":
            raise
        (model_dir / INT8_FILENAME).unlink(missing_ok=True)
        files = {"float32": export_float_graph(model, model_dir, check)}
        described["device_graph"] = f"left out (gateway release): {exc}"
    write_manifest(model_dir, _with_files(manifest, files, test))
    verify_model_files(model_dir, load_manifest(model_dir))
    described["files"] = sorted(files)
    return described


def _required_rmse(champion_rmse: float, margin: float, min_improvement: float) -> float:
    return min(champion_rmse * (1.0 - margin), champion_rmse - min_improvement)


def _release(config: RetrainConfig, model_dir: Path, release_dir: Path) -> dict[str, Any] | None:
    if config.key is None:
        return None
    from gateway.ota.release import key_id
    from training.release import build_release, load_private_key, push_release

    build_release(model_dir, config.target, config.key, release_dir)
    public = bytes(load_private_key(config.key).verify_key)
    described: dict[str, Any] = {
        "path": str(release_dir),
        "target": config.target,
        "key_id": key_id(public),
        "signed": True,
        "topic": None,
        "pushed": False,
    }
    if config.push is not None:
        described["topic"] = push_release(
            release_dir, config.push, topic_prefix=config.topic_prefix
        )
        described["pushed"] = True
        described["broker"] = f"{config.push.host}:{config.push.port}"
    return described
