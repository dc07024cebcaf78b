"""Folds exchangeable with the exported model: as many units, as many epochs, no early stopping.

The earlier folds (each without one training sensor, early-stopped on the validation sensor,
the better of two seeds kept) trained on one unit fewer than the exported model, so their
residuals on a left-out unit were larger than the exported model's on a new unit (Ispra rh/temp:
fold validation RMSE 2.7-3.4 against 2.12) and the widths they set leaned wide (the exported
model's validation sensor covered 95-98 % by widths fitted on the other units). Here each
fold leaves out one unit of the *pool* (the exported model's training units and its validation
unit) and trains on all the others: as many units as the exported model, with its config and
seed, for the number of epochs the exported model kept (its early-stopped epoch, then its kept
short-history fine-tuning epochs) and no early stopping, since every pool unit is scored. A
fold's residuals on its left-out unit are then what the exported model's are on a unit it never
saw (the exchangeability jackknife+ / CV+ rests on; Barber et al. 2021).

The fold that leaves out the validation unit trains on exactly the exported model's units for
exactly its kept epochs, the run the exported model is; its predictions come from the exported
model itself, so it is not trained again.

A fold's directory (``pool-without-<unit>-e<E>+<F>-seed<S>``) is reused when its ``fold.json``
records the same config, units, epochs and number of training windows (so a change of the data or
of its cleaning trains the fold again); a seed that diverges is recorded and the next seed is
tried (up to :data:`EXTRA_SEEDS` more).
"""

from __future__ import annotations

import json
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from tesla_gateway.contract.manifest import Manifest, TrainedEpochs
from tesla_gateway.contract.series import GapPolicy
from training.data import WindowSet, clean, load_dataset, to_grid
from training.errors import DataError
from training.history import Predict
from training.models import build_model
from training.train import (
    TrainConfig,
    WindowBatches,
    covariate_scales,
    input_range,
    training_indices,
)

__all__ = [
    "EXTRA_SEEDS",
    "FOLD_FILE",
    "NOT_FROM_SEED",
    "KeptEpochs",
    "PoolFold",
    "fold_predictor",
    "kept_epochs",
    "manifest_epochs",
    "recorded_epochs",
    "train_pool_folds",
    "trained_epochs",
]

FOLD_FILE = "fold.json"
DIVERGED_FILE = "diverged.json"
EXTRA_SEEDS = 5  # Antwerp's feed-forward model diverges in its first batches on some seeds
# A run holding one of these is not its config's schedule from its seed: ``init.json``, fine-tuned
# from another model (train --init-from); ``candidate.json``, a weight average or moving average
# written by ``history_swa write-run`` (its history.json is the first phase's alone).
NOT_FROM_SEED = ("init.json", "candidate.json")


class KeptEpochs(BaseModel):
    """The epochs the exported model's weights are from: its early-stopped (best validation)
    epoch and the short-history fine-tuning epoch it kept (0: the first phase's weights)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: int = Field(ge=1)
    fine_tune_epochs: int = Field(default=0, ge=0)


class _FoldRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    config: TrainConfig
    train_units: tuple[str, ...]
    left_out: str
    kept: KeptEpochs
    # the fold's training windows after cleaning: a fold trained on other data is not reused
    windows: int | None = None
    train_seconds: float | None = None
    final_loss: float | None = None


@dataclass(frozen=True)
class PoolFold:
    """One fold: the unit it left out, its run directory and the seeds that diverged first."""

    left_out: str
    train_units: tuple[str, ...]
    run_dir: Path
    seed: int
    diverged_seeds: tuple[int, ...]
    train_seconds: float | None
    final_loss: float | None

    def cost(self) -> dict[str, object]:
        """For the report: what the fold cost and what it trained on."""
        return {
            "left_out": [self.left_out],
            "train_units": list(self.train_units),
            "seed": self.seed,
            "diverged_seeds": list(self.diverged_seeds),
            "train_seconds": self.train_seconds,
            "final_loss": None if self.final_loss is None else round(self.final_loss, 4),
        }


def kept_epochs(run_dir: Path) -> KeptEpochs:
    """The kept epochs of a finished run, from its ``history.json`` (early stopping restores
    the best validation epoch; the fine-tuning records the epoch it chose)."""
    path = run_dir / "history.json"
    try:
        history = json.loads(path.read_text(encoding="utf-8"))
        val_loss = [float(v) for v in history["val_loss"]]
        chosen = history.get("fine_tune_chosen_epoch", [0.0])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(
            f"{path}: cannot read the kept epochs ({exc}); pass --fold-epochs (and "
            "--fold-fine-tune-epochs) instead"
        ) from exc
    finite = [v if np.isfinite(v) else np.inf for v in val_loss]
    return KeptEpochs(epochs=int(np.argmin(finite)) + 1, fine_tune_epochs=round(float(chosen[0])))


def trained_epochs(run_dir: Path, seed: int) -> TrainedEpochs | None:
    """What the manifest records of a run trained with ``seed``: its kept epochs, or None for
    a run whose weights are not that schedule's (:data:`NOT_FROM_SEED`: no peer trained from
    the seed for these epochs would be one)."""
    if any((run_dir / marker).is_file() for marker in NOT_FROM_SEED):
        return None
    kept = kept_epochs(run_dir)
    return TrainedEpochs(epochs=kept.epochs, fine_tune_epochs=kept.fine_tune_epochs, seed=seed)


def manifest_epochs(manifest: Manifest) -> KeptEpochs | None:
    """The kept epochs the manifest records (written at export; None before it did)."""
    recorded = manifest.trained_epochs
    if recorded is None:
        return None
    return KeptEpochs(epochs=recorded.epochs, fine_tune_epochs=recorded.fine_tune_epochs)


def recorded_epochs(folds_dir: Path) -> KeptEpochs | None:
    """The kept epochs the pool folds under ``folds_dir`` were trained for, when they agree
    (a committed default's run may be gone; its folds stay)."""
    found = set()
    for path in folds_dir.glob(f"pool-without-*/{FOLD_FILE}"):
        try:
            found.add(_FoldRecord.model_validate_json(path.read_text(encoding="utf-8")).kept)
        except (OSError, ValueError):
            continue
    return found.pop() if len(found) == 1 else None


def _grid(config: TrainConfig) -> dict[str, Any]:
    loaded = load_dataset(config.dataset, config.data_path, **config.dataset_options)
    cleaned, _ = clean(loaded)
    return dict(to_grid(cleaned))


def train_pool_folds(
    config: TrainConfig,
    pool: Sequence[str],
    scored: Sequence[str],
    kept: KeptEpochs,
    folds_dir: Path,
    *,
    verbose: int | str = 0,
) -> list[PoolFold]:
    """Per unit of ``scored`` (units of ``pool``), a model trained on the rest of the pool for
    the kept epochs (trained, or reused from ``folds_dir``)."""
    missing = sorted(set(scored) - set(pool))
    if missing or len(pool) < 2:
        raise DataError(f"pool folds: units {missing} are not in the pool {list(pool)}")
    grid = _grid(config)
    absent = sorted(set(pool) - set(grid))
    if absent:
        raise DataError(f"sensors {absent} are not in {config.dataset} after cleaning")
    policy = GapPolicy(max_interpolated_periods=config.max_interpolated_periods)
    out = []
    for unit in scored:
        units = tuple(sorted(u for u in pool if u != unit))
        windows = WindowSet.build(
            [grid[u] for u in units], config.window_length, policy, channels=config.channels
        )
        out.append(_fold(config, units, unit, kept, windows, folds_dir, verbose))
    return out


def _fold(  # noqa: PLR0917
    config: TrainConfig,
    units: tuple[str, ...],
    left_out: str,
    kept: KeptEpochs,
    windows: WindowSet,
    folds_dir: Path,
    verbose: int | str,
) -> PoolFold:
    diverged: list[int] = []
    for seed in range(config.seed, config.seed + EXTRA_SEEDS + 1):
        run_dir = (
            folds_dir / f"pool-without-{left_out}-e{kept.epochs}+{kept.fine_tune_epochs}-seed{seed}"
        )
        record = _FoldRecord(
            config=config.model_copy(update={"seed": seed}),
            train_units=units,
            left_out=left_out,
            kept=kept,
            windows=len(windows),
        )
        if _diverged(run_dir, record):
            diverged.append(seed)
            continue
        finished = _finished(run_dir, record)
        if finished is None:
            finished = _train(record, windows, run_dir, verbose)
        if finished is None:
            diverged.append(seed)
            continue
        return PoolFold(
            left_out=left_out,
            train_units=units,
            run_dir=run_dir,
            seed=seed,
            diverged_seeds=tuple(diverged),
            train_seconds=finished.train_seconds,
            final_loss=finished.final_loss,
        )
    raise DataError(
        f"every seed of the pool fold without {left_out} diverged (seeds {diverged}; see "
        f"{folds_dir}/*/{DIVERGED_FILE})"
    )


def _same(recorded: _FoldRecord, record: _FoldRecord) -> bool:
    return recorded.model_copy(update={"train_seconds": None, "final_loss": None}) == record


def _finished(run_dir: Path, record: _FoldRecord) -> _FoldRecord | None:
    """The recorded fold when ``run_dir`` holds a whole run of this record, else None."""
    try:
        recorded = _FoldRecord.model_validate_json(
            (run_dir / FOLD_FILE).read_text(encoding="utf-8")
        )
    except (OSError, ValueError):
        return None
    whole = (
        zipfile.is_zipfile(run_dir / "model.keras")
        if (run_dir / "model.keras").is_file()
        else False
    )
    return recorded if whole and _same(recorded, record) else None


def _diverged(run_dir: Path, record: _FoldRecord) -> bool:
    try:
        recorded = _FoldRecord.model_validate_json(
            (run_dir / DIVERGED_FILE).read_text(encoding="utf-8")
        )
    except (OSError, ValueError):
        return False
    return _same(recorded, record)


def _train(
    record: _FoldRecord, windows: WindowSet, run_dir: Path, verbose: int | str
) -> _FoldRecord | None:
    """Train one fold as ``training.train.train`` trains the exported model (on the same
    ``training_indices``: its ``max_train_windows`` sample), for the kept epochs and without
    validation; None (recorded) when it diverged."""
    config = record.config
    started = time.monotonic()
    keras.utils.set_random_seed(config.seed)
    input_scale = config.input_scale or max(1.0, input_range(windows).p99)
    model = build_model(
        config.model,
        config.window_length,
        len(config.channels),
        input_scale,
        channel_scales=covariate_scales(config, windows, input_scale),
    )
    model.compile(optimizer=keras.optimizers.Adam(config.learning_rate), loss="mse")
    indices = training_indices(config, windows)
    two_phases = config.partial_history_fraction > 0 and config.partial_history_epochs > 0
    first = 0.0 if two_phases else config.partial_history_fraction
    losses = _fit(model, WindowBatches(windows, indices, config.batch_size, config.seed, first),
                  record.kept.epochs, verbose)  # fmt: skip
    if two_phases and record.kept.fine_tune_epochs > 0 and np.all(np.isfinite(losses)):
        model.compile(
            optimizer=keras.optimizers.Adam(config.partial_history_learning_rate), loss="mse"
        )
        batches = WindowBatches(
            windows, indices, config.batch_size, config.seed + 1, config.partial_history_fraction
        )
        losses += _fit(model, batches, record.kept.fine_tune_epochs, verbose)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (losses and np.all(np.isfinite(losses)) and _finite_weights(model)):
        (run_dir / DIVERGED_FILE).write_text(record.model_dump_json(indent=2), encoding="utf-8")
        return None
    model.save(run_dir / "model.keras")
    done = record.model_copy(
        update={
            "train_seconds": round(time.monotonic() - started, 1),
            "final_loss": float(losses[-1]),
        }
    )
    (run_dir / FOLD_FILE).write_text(done.model_dump_json(indent=2), encoding="utf-8")
    return done


def _fit(
    model: keras.Model, batches: WindowBatches, epochs: int, verbose: int | str
) -> list[float]:
    history = model.fit(
        batches, epochs=epochs, callbacks=[keras.callbacks.TerminateOnNaN()], verbose=verbose
    )
    return [float(v) for v in history.history.get("loss", [])]


def _finite_weights(model: keras.Model) -> bool:
    return all(bool(np.all(np.isfinite(np.asarray(w)))) for w in model.get_weights())


def fold_predictor(fold: PoolFold) -> Predict:
    """The fold model's batch predictor."""
    model = keras.models.load_model(fold.run_dir / "model.keras")

    def predict(x: npt.NDArray[np.float32]) -> npt.ArrayLike:
        return model.predict(x, verbose=0, batch_size=1024)

    return predict
