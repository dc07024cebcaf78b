"""What a retraining run learns from and is judged on: champion, recorded pairs, periods, windows.

Every check that needs no training runs here, before any training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tesla_gateway.contract.manifest import Manifest, load_manifest, verify_model_files
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
from training.errors import FeatureMismatchError, HoldoutError
from training.evaluate import model_channels
from training.retrain.config import RetrainConfig
from training.retrain.data import (
    Periods,
    TrainingSets,
    iso,
    masked,
    pairs_since,
    split_periods,
    training_sets,
)
from training.retrain.report import RetrainReport

__all__ = ["Inputs", "prepare"]


@dataclass(frozen=True)
class Inputs:
    champion: Manifest
    channels: tuple[str, ...]
    pairs: RecordedPairs
    cleaning: CleaningReport
    periods: Periods
    window_length: int
    holdout: WindowSet
    original: CoLocationData | None
    sets: TrainingSets


def prepare(config: RetrainConfig, report: RetrainReport) -> Inputs:
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
    return Inputs(
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
