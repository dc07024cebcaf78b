"""The default models committed under ``models/`` and how each is trained.

Choices were made on the validation sensor (never the test sensor); see README "Default models".
"""

from __future__ import annotations

from dataclasses import dataclass

from training.models import TeslaConfig
from training.train import TrainConfig

__all__ = ["DEFAULT_MODELS", "DefaultModel"]


@dataclass(frozen=True)
class DefaultModel:
    """A committed model: its training config and the seeds tried (best validation RMSE wins)."""

    name: str
    config: TrainConfig
    seeds: tuple[int, ...] = (0, 1, 2)


DEFAULT_MODELS = (
    DefaultModel(
        name="pm10-ispra-1min",
        config=TrainConfig(
            dataset="ispra-1min",
            window_length=360,
            max_interpolated_periods=30,
            model=TeslaConfig(d_model=16, heads=4),
            epochs=10,
            batch_size=32,
            learning_rate=1e-3,
        ),
    ),
    DefaultModel(
        name="pm2_5-antwerp-1h",
        config=TrainConfig(
            dataset="antwerp-hourly-pm2_5",
            window_length=168,
            max_interpolated_periods=3,
            model=TeslaConfig(d_model=16, heads=4),
            epochs=10,
            batch_size=32,
            learning_rate=1e-3,
        ),
    ),
)
