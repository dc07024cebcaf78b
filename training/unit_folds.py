"""Each unit's windows predicted by a model that never trained on it, whole and cut short.

The intervals across units (training/cross_conformal.py) are fitted on out-of-unit residuals:
every training sensor predicted by the fold that left it out (training/pool_folds.py), the
validation sensor by the exported model. This module builds each sensor's windows exactly as
training builds them and predicts them whole and truncated to each history length the
manifest's ``history_intervals`` use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from training.data import WindowSet, clean, load_dataset, to_grid
from training.errors import DataError
from training.history import Predict, predict_truncated
from training.train import TrainConfig

__all__ = ["UnitPredictions", "predicted_unit", "sensor_windows"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class UnitPredictions:
    """One sensor's windows predicted by a model that never trained on it."""

    sensor: str
    role: str  # "train" (from a fold) or "validation" (from the exported model)
    reference: FloatArray
    whole: FloatArray
    truncated: dict[int, FloatArray]  # history length K -> predictions on windows cut to K


def sensor_windows(config: TrainConfig, sensors: Sequence[str]) -> dict[str, WindowSet]:
    """Each named sensor's windows, built exactly as training builds them."""
    from tesla_gateway.contract.series import GapPolicy

    loaded = load_dataset(config.dataset, config.data_path, **config.dataset_options)
    cleaned, _ = clean(loaded)
    grid = to_grid(cleaned)
    missing = sorted(set(sensors) - set(grid))
    if missing:
        raise DataError(f"sensors {missing} are not in {config.dataset} after cleaning")
    policy = GapPolicy(max_interpolated_periods=config.max_interpolated_periods)
    return {
        sensor: WindowSet.build(
            [grid[sensor]], config.window_length, policy, channels=config.channels
        )
        for sensor in sensors
    }


def predicted_unit(
    sensor: str,
    role: str,
    predict: Predict,
    windows: WindowSet,
    points: Sequence[int],
) -> UnitPredictions:
    """One sensor's windows predicted whole and truncated to each of ``points``."""
    n = windows.window_length
    keys = sorted({*points, n})
    predicted = predict_truncated(predict, windows, keys)
    return UnitPredictions(
        sensor=sensor,
        role=role,
        reference=np.asarray(windows.targets(), dtype=np.float64),
        whole=predicted[n],
        truncated={k: v for k, v in predicted.items() if k < n},
    )
