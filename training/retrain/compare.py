"""Champion against challenger on the same held-back windows, through the evaluate path (the
gateway's calibrator on each float FlatBuffer), and the acceptance rule.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tesla_gateway.contract.manifest import ErrorMetrics, Manifest, TestMetrics, write_manifest
from training.data import RecordedPairs
from training.data.frame import unix_seconds
from training.errors import HoldoutError
from training.evaluate import Evaluation, evaluate_model_dir
from training.export import FLOAT_FILENAME, convert_float, float_model_file
from training.metrics import LinearCalibration, error_metrics
from training.retrain.challenger import Challenger, with_files
from training.retrain.config import RetrainConfig
from training.retrain.data import only_references_from
from training.retrain.inputs import Inputs

__all__ = ["Comparison", "decide", "describe_margin", "score"]


_SCORED = ("raw", "linear", "champion", "challenger")


@dataclass
class Comparison:
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


def score(
    config: RetrainConfig,
    inputs: Inputs,
    challenger: Challenger,
    manifest: Manifest,
    out_dir: Path,
) -> Comparison:
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
        write_manifest(candidate_dir, with_files(manifest, {"float32": float_file}, placeholder))
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


def _compare(
    champion: Evaluation, challenger: Evaluation, linear: LinearCalibration, evaluated_sha256: str
) -> Comparison:
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

    return Comparison(
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


def describe_margin(
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


def _required_rmse(champion_rmse: float, margin: float, min_improvement: float) -> float:
    return min(champion_rmse * (1.0 - margin), champion_rmse - min_improvement)
