"""Training batches gathered on demand from a WindowSet, with the share of short histories and
of windows without the hour that teach a model to calibrate young sensors and clockless nodes."""

from __future__ import annotations

import math

import keras
import numpy as np
import numpy.typing as npt

from training.data import WindowSet
from training.data.hours import withhold_hour
from training.history import sample_history, truncate

__all__ = ["WindowBatches"]


class WindowBatches(keras.utils.PyDataset):
    """Batches gathered on demand from a WindowSet, reshuffled every epoch; with
    ``partial_history_fraction`` that share of each batch's windows is truncated to a random
    history (training/history.py), and with ``unknown_hour_fraction`` that share has its hour
    channels withheld (training/data/hours.py), both drawn anew every time a batch is made."""

    def __init__(
        self,
        windows: WindowSet,
        indices: npt.NDArray[np.int64],
        batch_size: int,
        seed: int,
        partial_history_fraction: float = 0.0,
        *,
        unknown_hour_fraction: float = 0.0,
    ) -> None:
        super().__init__()
        self.windows = windows
        self.indices = indices.copy()
        self.batch_size = batch_size
        self.partial_history_fraction = partial_history_fraction
        self.unknown_hour_fraction = unknown_hour_fraction
        self.rng = np.random.default_rng(seed)
        self.rng.shuffle(self.indices)

    def __len__(self) -> int:
        return math.ceil(len(self.indices) / self.batch_size)

    def __getitem__(self, index: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        chosen = self.indices[index * self.batch_size : (index + 1) * self.batch_size]
        x, y = self.windows.gather(np.sort(chosen))
        if self.partial_history_fraction > 0:
            n = self.windows.window_length
            x = truncate(x, sample_history(self.rng, len(x), n, self.partial_history_fraction))
        if self.unknown_hour_fraction > 0:
            which = self.rng.random(len(x)) < self.unknown_hour_fraction
            x = withhold_hour(x, self.windows.channels, which)
        return x, y

    def on_epoch_end(self) -> None:
        self.rng.shuffle(self.indices)
