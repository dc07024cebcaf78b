"""Progress display: one bar over the grid's cells, one over the running epoch (tqdm, stderr).

The cell bar shows which (dataset, N, model, seed) runs and its stage, with the grid's time left
estimated from the cells done so far; the epoch bar shows ``model epoch e/E`` with the loss and
the epoch's time left.

``training.train.train`` builds its own ``fit`` call and takes no callbacks, so while a cell
trains :meth:`Progress.training` wraps ``keras.Model.fit`` to append the epoch bar's callback,
and restores it afterwards. (If ``train`` grows a ``callbacks`` argument, pass the callback there
and drop the wrapper.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import keras
from tqdm.auto import tqdm

__all__ = ["Progress"]


class _EpochBar(keras.callbacks.Callback):
    """Drives a tqdm bar: reset each epoch, one step per batch, loss and val_loss as postfix."""

    def __init__(self, bar: tqdm, label: str) -> None:
        super().__init__()
        self.bar = bar
        self.label = label

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.bar.reset(total=self.params.get("steps") or 0)
        self.bar.set_description(f"{self.label} epoch {epoch + 1}/{self.params.get('epochs')}")

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.bar.update(1)
        if logs and "loss" in logs and batch % 25 == 0:
            self.bar.set_postfix(loss=f"{float(logs['loss']):.4g}", refresh=False)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs and "val_loss" in logs:
            self.bar.set_postfix(
                loss=f"{float(logs.get('loss', float('nan'))):.4g}",
                val_loss=f"{float(logs['val_loss']):.4g}",
            )


class Progress:
    """The benchmark's progress display; ``enabled=False`` draws nothing (tests, logs)."""

    def __init__(self, total_cells: int, *, enabled: bool) -> None:
        self.enabled = enabled
        self.cells = tqdm(total=total_cells, desc="cells", unit="cell", position=0,
                          disable=not enabled, dynamic_ncols=True)  # fmt: skip

    def start(self, label: str) -> None:
        self.cells.set_description(label)
        self.cells.set_postfix_str("training")

    def stage(self, text: str) -> None:
        self.cells.set_postfix_str(text)

    def finish(self, message: str) -> None:
        self.cells.update(1)
        if self.enabled:
            tqdm.write(message)

    def note(self, message: str) -> None:
        if self.enabled:
            tqdm.write(message)

    def close(self) -> None:
        self.cells.close()

    @contextmanager
    def training(self, label: str) -> Iterator[None]:
        """While the block runs, every ``Model.fit`` also drives the epoch bar."""
        if not self.enabled:
            yield
            return
        bar = tqdm(total=0, desc=label, unit="batch", position=1, leave=False, dynamic_ncols=True)
        original = keras.Model.fit

        def fit(model: keras.Model, *args: Any, **kwargs: Any) -> Any:
            callbacks = [*(kwargs.pop("callbacks", None) or []), _EpochBar(bar, label)]
            return original(model, *args, callbacks=callbacks, **kwargs)

        keras.Model.fit = fit
        try:
            yield
        finally:
            keras.Model.fit = original
            bar.close()
