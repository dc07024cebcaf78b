"""Second training phase for short histories: fine-tune a whole-window model on truncated ones.

Mixing truncated windows in from the first epoch cost the PM-only Ispra model its whole-window
accuracy (validation RMSE 5.1-5.4 against 4.19 for the same 20 epochs: the short windows, whose
error cannot fall far below linear's, dominate the loss while the model still learns what a long
window says). So the model is first trained on whole windows exactly as before, then fine-tuned
for a few epochs on batches of which a share is truncated (training/history.py), at a lower
learning rate. After each epoch the validation sensor is scored at every history length of the
curve; the kept weights are those with the lowest mean short-history RMSE among the epochs whose
whole-window RMSE stays within a tolerance of the first phase's (the first phase's own weights
are a candidate, so fine-tuning can only help by this measure).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from training.history import history_points, predict_truncated
from training.metrics import error_metrics

if TYPE_CHECKING:
    from training.train import PreparedData, TrainConfig, WindowBatches

__all__ = ["FineTuning", "fine_tune"]


@dataclass
class FineTuning:
    """Per epoch (0 = before fine-tuning): whole-window and mean short-history validation RMSE."""

    whole_rmse: list[float] = field(default_factory=list)
    short_rmse: list[float] = field(default_factory=list)
    chosen_epoch: int = 0

    def as_history(self) -> dict[str, list[float]]:
        """For the run's history.json."""
        return {
            "fine_tune_whole_rmse": self.whole_rmse,
            "fine_tune_short_rmse": self.short_rmse,
            "fine_tune_chosen_epoch": [float(self.chosen_epoch)],
        }


def _score(model: keras.Model, prepared: PreparedData, n: int) -> tuple[float, float]:
    """Whole-window RMSE and the mean RMSE over the curve's shorter histories (validation)."""
    points = history_points(n, prepared.data.period_seconds)
    predicted = predict_truncated(
        lambda x: model.predict(x, verbose=0, batch_size=1024), prepared.validation, points
    )
    reference = prepared.validation.targets()
    rmse = {k: error_metrics(values, reference).rmse for k, values in predicted.items()}
    short = [value for k, value in rmse.items() if k < n]
    return rmse[n], float(np.mean(short)) if short else rmse[n]


def fine_tune(
    model: keras.Model,
    config: TrainConfig,
    prepared: PreparedData,
    batches: WindowBatches,
    *,
    verbose: int | str = "auto",
) -> FineTuning:
    """Run ``config.partial_history_epochs`` epochs on ``batches`` (which truncate a share of
    their windows) and leave the model with the chosen epoch's weights."""
    n = config.window_length
    whole, short = _score(model, prepared, n)
    record = FineTuning(whole_rmse=[whole], short_rmse=[short])
    limit = whole * (1 + config.partial_history_tolerance)
    best: tuple[float, list[Any]] = (short, model.get_weights())
    model.compile(optimizer=keras.optimizers.Adam(config.partial_history_learning_rate), loss="mse")
    for epoch in range(1, config.partial_history_epochs + 1):
        model.fit(batches, epochs=1, verbose=verbose)
        whole, short = _score(model, prepared, n)
        record.whole_rmse.append(whole)
        record.short_rmse.append(short)
        if np.isfinite(short) and whole <= limit and short < best[0]:
            best = (short, model.get_weights())
            record.chosen_epoch = epoch
    model.set_weights(best[1])
    return record
