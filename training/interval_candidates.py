"""Which residuals set the widths: candidates for the intervals across units, measured per unit.

``python -m training.interval_candidates --model models/NAME`` (docs/benchmarks/intervals/,
"Candidates") scores, on the units nobody calibrated on, each way of setting the widths from
out-of-unit residuals, whole windows:

* ``unit-folds``: the earlier folds (training/unit_folds.py before this module), each trained
  on one unit fewer than the exported model, early-stopped on the validation sensor, the better
  of two seeds; run directories ``without-<units>-seed<S>`` under the folds directory. Nothing
  trains them any more: without them (a fresh clone) the row is left out, with a note.
* ``pool-folds``: the folds exchangeable with the exported model (training/pool_folds.py).
* ``pool-folds, level for 90 % held out``: the pool folds' residuals at the level whose mean
  leave-one-unit-out coverage over the *other* units is 90 % (nested: the scored unit chooses
  nothing).

Every unit of the pool (the training sensors and the validation sensor, the latter predicted
by the exported model) is scored with intervals fitted on the others; the test sensor is
scored too, with intervals fitted on all of them, and is not used to choose.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.manifest import load_manifest
from tesla_gateway.models.calibrator import Calibrator
from training.conformal import DEFAULT_LEVEL
from training.cross_conformal import UnitResiduals, fit_cross_unit, unit_scores
from training.errors import DataError
from training.intervals_cli import fold_epochs, model_config
from training.pool_folds import fold_predictor, train_pool_folds
from training.train import TrainConfig, prepare_data
from training.unit_folds import sensor_windows

__all__ = ["held_out", "level_for_mean_coverage", "main", "nested_level_held_out"]


def _fit(units: Sequence[UnitResiduals], level: float) -> Any:
    return fit_cross_unit(units, validation_sensor=units[0].sensor, level=level, quantile_levels=())


def held_out(units: Sequence[UnitResiduals], level: float = DEFAULT_LEVEL) -> list[float]:
    """Each unit's coverage with intervals fitted on the others at ``level``."""
    return [
        unit_scores(_fit([u for j, u in enumerate(units) if j != i], level), unit).coverage
        for i, unit in enumerate(units)
    ]


def level_for_mean_coverage(
    units: Sequence[UnitResiduals], target: float = DEFAULT_LEVEL, steps: int = 12
) -> float:
    """The level whose mean leave-one-unit-out coverage over ``units`` is ``target``
    (bisection: the coverage grows with the level)."""
    low, high = 0.5, 0.995
    for _ in range(steps):
        middle = (low + high) / 2
        if np.mean(held_out(units, middle)) < target:
            low = middle
        else:
            high = middle
    return high


def nested_level_held_out(
    units: Sequence[UnitResiduals], target: float = DEFAULT_LEVEL
) -> list[tuple[float, float, float]]:
    """Per unit: the level chosen on the other units, and its coverage and width there."""
    out = []
    for i, unit in enumerate(units):
        others = [u for j, u in enumerate(units) if j != i]
        level = level_for_mean_coverage(others, target)
        scores = unit_scores(_fit(others, level), unit)
        out.append((level, scores.coverage, scores.mean_width))
    return out


def _predict(model: keras.Model) -> Callable[[npt.NDArray[np.float32]], npt.ArrayLike]:
    return lambda x: model.predict(x, verbose=0, batch_size=1024)


def _residuals(
    sensor: str, role: str, predict: Callable[[Any], Any], windows: Any
) -> UnitResiduals:
    x, y = windows.gather(np.arange(len(windows)))
    predicted = np.asarray(predict(x), dtype=np.float64).reshape(-1)
    return UnitResiduals(sensor, role, predicted, np.asarray(y, dtype=np.float64)).finite()


def _unit_fold_predictors(
    folds_dir: Path, sensors: Sequence[str], config: TrainConfig
) -> dict[str, Any] | None:
    """The earlier folds' models of this config (the better seed on validation per left-out
    group; a directory may still hold an older config's run beside a later divergence); None
    when there are none (nothing trains them any more: a fresh clone has none)."""
    best: dict[str, tuple[float, Path]] = {}
    for metrics in folds_dir.glob("without-*-seed*/metrics.json"):
        run = metrics.parent
        recorded = TrainConfig.model_validate_json((run / "config.json").read_text("utf-8"))
        same = recorded.model_copy(update={"left_out_sensors": (), "seed": config.seed})
        if same != config:
            continue
        group = run.name.removeprefix("without-").rsplit("-seed", 1)[0]
        rmse = float(json.loads(metrics.read_text(encoding="utf-8"))["validation"]["rmse"])
        if group not in best or rmse < best[group][0]:
            best[group] = (rmse, run)
    if not best:
        return None
    out = {}
    for group, (_, run) in best.items():
        predict = _predict(keras.models.load_model(run / "model.keras"))
        out.update({sensor: predict for sensor in sensors if sensor in group.split("-")})
    missing = sorted(set(sensors) - set(out))
    if missing:
        raise DataError(f"no earlier fold under {folds_dir} left out {missing}")
    return out


def _row(name: str, units: Sequence[UnitResiduals], test: UnitResiduals) -> dict[str, Any]:
    coverage = held_out(units)
    widths = [
        unit_scores(_fit([u for j, u in enumerate(units) if j != i], DEFAULT_LEVEL), unit)
        for i, unit in enumerate(units)
    ]
    published = unit_scores(_fit(units, DEFAULT_LEVEL), test)
    return {
        "candidate": name,
        "units": {
            u.sensor: {
                "role": u.role,
                "rmse": round(float(np.sqrt(np.mean((u.reference - u.predicted) ** 2))), 3),
                "coverage": round(c, 4),
                "width": round(w.mean_width, 3),
            }
            for u, c, w in zip(units, coverage, widths, strict=True)
        },
        "mean_coverage": round(float(np.mean(coverage)), 4),
        "test": {"coverage": round(published.coverage, 4), "width": round(published.mean_width, 3)},
    }


def _unit_folds_row(
    folds_dir: Path,
    config: TrainConfig,
    windows: dict[str, Any],
    validation: UnitResiduals,
    test: UnitResiduals,
) -> dict[str, Any] | None:
    """The ``unit-folds`` row over the units of ``windows`` (the training sensors), or None
    (with a note on stderr) when no earlier fold exists."""
    sensors = list(windows)
    old = _unit_fold_predictors(folds_dir, sensors, config)
    if old is None:
        print(
            f"note: no earlier folds (without-*-seed*) of this config under {folds_dir}; "
            "the unit-folds candidate is left out",
            file=sys.stderr,
        )
        return None
    earlier = [_residuals(s, "train", old[s], windows[s]) for s in sensors]
    return _row("unit-folds", [*earlier, validation], test)


def compare(model_dir: Path, folds_dir: Path) -> dict[str, Any]:
    """Every candidate's per-unit figures for one model directory."""
    manifest = load_manifest(model_dir)
    config = model_config(model_dir, None, None)
    prepared = prepare_data(config)
    summary = prepared.summary
    calibrator = Calibrator.load(model_dir)
    validation = _residuals(
        summary.validation_sensor, "validation", calibrator.calibrate, prepared.validation
    )
    test = _residuals(summary.test_sensor, "test", calibrator.calibrate, prepared.test)
    windows = sensor_windows(config, summary.train_sensors)
    unit_folds = _unit_folds_row(folds_dir, config, windows, validation, test)
    kept = fold_epochs(None, 0, None, folds_dir, manifest=manifest)
    pool = [*summary.train_sensors, summary.validation_sensor]
    runs = train_pool_folds(config, pool, summary.train_sensors, kept, folds_dir)
    peers = [
        _residuals(run.left_out, "train", fold_predictor(run), windows[run.left_out])
        for run in runs
    ]
    rows = [] if unit_folds is None else [unit_folds]
    rows.append(_row("pool-folds", [*peers, validation], test))
    units = [*peers, validation]
    nested = nested_level_held_out(units)
    level = level_for_mean_coverage(units)
    published = unit_scores(_fit(units, level), test)
    rows.append(
        {
            "candidate": "pool-folds, level for 90 % held out",
            "units": {
                u.sensor: {
                    "role": u.role,
                    "level": round(lv, 4),
                    "coverage": round(c, 4),
                    "width": round(w, 3),
                }
                for u, (lv, c, w) in zip(units, nested, strict=True)
            },
            "mean_coverage": round(float(np.mean([c for _, c, _ in nested])), 4),
            "level": round(level, 4),
            "test": {
                "coverage": round(published.coverage, 4),
                "width": round(published.mean_width, 3),
            },
        }
    )
    return {"model": manifest.name, "fold_epochs": kept.model_dump(), "candidates": rows}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.interval_candidates")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--folds-dir", type=Path, help="default runs/interval-folds/<name>")
    parser.add_argument("--out", type=Path, help="write the figures (JSON) here")
    args = parser.parse_args(argv)
    name = load_manifest(args.model).name
    report = compare(args.model, args.folds_dir or Path("runs") / "interval-folds" / name)
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
