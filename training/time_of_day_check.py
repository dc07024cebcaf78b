"""Does the time of day carry what one PM reading lacks? (issue 27, an information check)

A young PM-only sensor has little but its newest reading. If a calibration on that reading plus
the hour (sin and cos of the time of day, UTC) were much better than one on the reading alone,
short histories would be limited by the inputs the model gets, not by how it is trained. Fitted
on the training sensors' windows (the newest reading of each, the windows the history curve
scores), scored on the validation and test sensors: a least-squares line, the line with the
hour, with the hour and its interactions with the reading, and a small MLP with and without the
hour. No product code uses this.

``python -m training.time_of_day_check [--out FILE.json]``
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import keras
import numpy as np
import numpy.typing as npt

from training.data import WindowSet
from training.defaults import DEFAULT_MODELS
from training.metrics import error_metrics
from training.train import prepare_data

__all__ = ["features", "main"]

Matrix = npt.NDArray[np.float64]
MLP_EPOCHS = 15
DAY_S = 86_400


def features(windows: WindowSet, *, hour: bool, interactions: bool = False) -> Matrix:
    """Per window: the newest raw reading, and optionally sin/cos of its time of day."""
    raw = windows.current_raw().astype(np.float64)
    columns = [raw]
    if hour:
        phase = 2 * np.pi * (windows.meta()["period_start_s"].to_numpy() % DAY_S) / DAY_S
        columns += [np.sin(phase), np.cos(phase)]
        if interactions:
            columns += [raw * np.sin(phase), raw * np.cos(phase)]
    return np.column_stack(columns)


def _least_squares(x: Matrix, y: Matrix, *scored: Matrix) -> list[Matrix]:
    design = np.column_stack([np.ones(len(x)), x])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    return [np.column_stack([np.ones(len(s)), s]) @ coef for s in scored]


def _mlp(x: Matrix, y: Matrix, *scored: Matrix, seed: int) -> list[Matrix]:
    keras.utils.set_random_seed(seed)
    scale = np.percentile(np.abs(x), 99, axis=0).clip(min=1.0)
    model = keras.Sequential(
        [
            keras.Input((x.shape[1],)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    model.fit(x / scale, y, epochs=MLP_EPOCHS, batch_size=256, verbose=0)
    return [np.asarray(model.predict(s / scale, verbose=0)).reshape(-1) for s in scored]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.time_of_day_check")
    parser.add_argument("--model", default="pm10-ispra-1min", help="a default model's name")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here too")
    args = parser.parse_args(argv)
    prepared = prepare_data(next(d for d in DEFAULT_MODELS if d.name == args.model).config)
    sets = {"train": prepared.train, "validation": prepared.validation, "test": prepared.test}
    y = {name: s.targets().astype(np.float64) for name, s in sets.items()}
    results: dict[str, dict[str, float]] = {}
    variants = {
        "linear": {"hour": False},
        "linear + hour": {"hour": True},
        "linear + hour + interactions": {"hour": True, "interactions": True},
    }
    for label, options in variants.items():
        x = {name: features(s, **options) for name, s in sets.items()}
        fitted = _least_squares(x["train"], y["train"], x["validation"], x["test"])
        results[label] = {
            name: error_metrics(p, y[name]).rmse
            for name, p in zip(("validation", "test"), fitted, strict=True)
        }
    for label, hour in (("mlp", False), ("mlp + hour", True)):
        x = {name: features(s, hour=hour) for name, s in sets.items()}
        per_seed = [
            _mlp(x["train"], y["train"], x["validation"], x["test"], seed=seed) for seed in (0, 1)
        ]
        for seed, fitted in enumerate(per_seed):
            results[f"{label} (seed {seed})"] = {
                name: error_metrics(p, y[name]).rmse
                for name, p in zip(("validation", "test"), fitted, strict=True)
            }
    for label, scores in results.items():
        print(f"{label:34s} validation {scores['validation']:.3f}  test {scores['test']:.3f}")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
