"""Widths scaled by a difficulty the window shows: candidates for the intervals across units.

``python -m training.interval_difficulty --model models/A --model models/B ...``
(docs/benchmarks/intervals/, "Step 4") asks whether a width that grows with something the
gateway can compute from the window it already has, without a reference, covers every unit
closer to 90 % than the binned widths (one width per bin of the calibrated value ``ŷ``).
Every candidate is fitted on the exchangeable folds' out-of-unit residuals
(training/pool_folds.py), units weighing the same, in the same ``ŷ`` bins:

* ``binned``: the published method (training/cross_conformal.py).
* ``normalised``: in each bin the unit-weighted conformal quantile ``q`` of
  ``|y − ŷ| / (d + β)``, width ``q · (d + β)`` (normalised conformal; Papadopoulos et al. 2008),
  ``β`` the calibration pairs' median ``d`` (1 when every window is flat: the binned widths).
* ``mondrian``: each bin split in two at its calibration pairs' median ``d``, one width per
  cell (a cell of fewer than ``MIN_PER_BIN`` pairs uses its whole bin's).

Every pool unit is scored with the candidate fitted on the others (leave-one-unit-out), whole
windows and every short-history bucket the manifest has; :func:`choose` applies the rule the
benchmark page wrote before any figure. The test unit is scored with the fit on the whole pool
and chooses nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.series import pad_history
from training.conformal import DEFAULT_LEVEL, MIN_PER_BIN, bin_pairs
from training.cross_conformal import weighted_quantile

__all__ = [
    "CANDIDATES",
    "DIFFICULTIES",
    "Candidate",
    "DifficultUnit",
    "WidthFit",
    "candidate_figures",
    "choose",
    "fit_widths",
    "main",
    "unit_profile",
]

FloatArray = npt.NDArray[np.float64]
_CHUNK = 4096  # windows per prediction call
Difficulty = Callable[[FloatArray, FloatArray], FloatArray]


def _recent_spread(pm: FloatArray, predicted: FloatArray) -> FloatArray:
    """Standard deviation of the newest ``N // 6`` periods (at least 2)."""
    return np.asarray(pm[:, -max(2, pm.shape[1] // 6) :].std(axis=1), dtype=np.float64)


def _spikiness(pm: FloatArray, predicted: FloatArray) -> FloatArray:
    """Mean absolute step between consecutive periods over the window."""
    return np.asarray(np.abs(np.diff(pm, axis=1)).mean(axis=1), dtype=np.float64)


def _raw_vs_calibrated(pm: FloatArray, predicted: FloatArray) -> FloatArray:
    """How far the calibration moved the newest raw reading."""
    return np.asarray(np.abs(pm[:, -1] - predicted), dtype=np.float64)


DIFFICULTIES: dict[str, Difficulty] = {
    "recent_spread": _recent_spread,
    "spikiness": _spikiness,
    "raw_vs_calibrated": _raw_vs_calibrated,
}


@dataclass(frozen=True)
class Candidate:
    name: str
    difficulty: str | None = None  # a key of DIFFICULTIES; None: the binned widths
    mondrian: bool = False


CANDIDATES = (
    Candidate("binned"),
    Candidate("normalised, recent spread", "recent_spread"),
    Candidate("normalised, spikiness", "spikiness"),
    Candidate("normalised, raw vs calibrated", "raw_vs_calibrated"),
    Candidate("Mondrian, recent spread", "recent_spread", mondrian=True),
)


@dataclass(frozen=True)
class DifficultUnit:
    """One unit's out-of-unit predictions, references and its windows' difficulties."""

    sensor: str
    role: str
    predicted: FloatArray
    reference: FloatArray
    difficulty: Mapping[str, FloatArray]

    def finite(self) -> DifficultUnit:
        keep = np.isfinite(self.predicted) & np.isfinite(self.reference)
        return DifficultUnit(
            self.sensor,
            self.role,
            self.predicted[keep],
            self.reference[keep],
            {name: values[keep] for name, values in self.difficulty.items()},
        )


@dataclass(frozen=True)
class WidthFit:
    """A fitted candidate: ``ŷ`` bin edges, and per bin its width (binned), its quantile of
    the normalised score, or its split and the two cells' widths (Mondrian)."""

    candidate: Candidate
    edges: FloatArray
    widths: FloatArray  # [bins] or, Mondrian, [bins, 2]
    beta: float = 0.0
    splits: FloatArray | None = None

    def half_widths(self, unit: DifficultUnit) -> FloatArray:
        column = np.searchsorted(self.edges, unit.predicted, side="right")
        if self.candidate.difficulty is None:
            return np.asarray(self.widths[column], dtype=np.float64)
        d = unit.difficulty[self.candidate.difficulty]
        if self.splits is not None:
            return np.asarray(
                self.widths[column, (d > self.splits[column]).astype(np.int64)], dtype=np.float64
            )
        return np.asarray(self.widths[column] * (d + self.beta), dtype=np.float64)

    def score(self, unit: DifficultUnit) -> tuple[float, float]:
        """Coverage and mean width on ``unit``, the low end clipped at 0 as the gateway does."""
        width = self.half_widths(unit)
        low = np.minimum(unit.predicted, np.maximum(0.0, unit.predicted - width))
        high = unit.predicted + width
        inside = (unit.reference >= low) & (unit.reference <= high)
        return float(inside.mean()), float(np.mean(high - low))


def _quantile(scores: FloatArray, weights: FloatArray, level: float) -> float:
    n = len(scores)
    return weighted_quantile(scores, weights, level * (n + 1) / n)


def fit_widths(
    units: Sequence[DifficultUnit], candidate: Candidate, level: float = DEFAULT_LEVEL
) -> WidthFit:
    """``candidate`` fitted on ``units``' pairs, each unit weighing the same."""
    predicted = np.concatenate([u.predicted for u in units])
    residual = np.abs(np.concatenate([u.reference - u.predicted for u in units]))
    weights = np.concatenate([np.full(len(u.predicted), 1.0 / len(u.predicted)) for u in units])
    cuts, which, counts = bin_pairs(predicted)
    edges = np.asarray(cuts, dtype=np.float64)
    bins = range(len(counts))
    if candidate.difficulty is None:
        widths = [_quantile(residual[which == b], weights[which == b], level) for b in bins]
        return WidthFit(candidate, edges, np.asarray(widths))
    d = np.concatenate([u.difficulty[candidate.difficulty] for u in units])
    if candidate.mondrian:
        splits = np.asarray([np.median(d[which == b]) for b in bins])
        cells = np.zeros((len(counts), 2))
        for b, cls in np.ndindex(cells.shape):
            chosen = (which == b) & ((d > splits[b]) == bool(cls))
            if chosen.sum() < MIN_PER_BIN:  # flat windows all fall on one side
                chosen = which == b
            cells[b, cls] = _quantile(residual[chosen], weights[chosen], level)
        return WidthFit(candidate, edges, cells, splits=splits)
    beta = float(np.median(d)) or 1.0
    score = residual / (d + beta)
    widths = [_quantile(score[which == b], weights[which == b], level) for b in bins]
    return WidthFit(candidate, edges, np.asarray(widths), beta=beta)


def candidate_figures(
    pool: Mapping[str, Sequence[DifficultUnit]],
    test: Mapping[str, DifficultUnit],
    candidate: Candidate,
) -> dict[str, Any]:
    """Per history bucket (``"whole"`` or the periods): every pool unit's held-out coverage and
    width, their mean and mean absolute deviation from the level, and the test unit's."""
    out: dict[str, Any] = {}
    for bucket, units in pool.items():
        scored = [
            fit_widths([u for j, u in enumerate(units) if j != i], candidate).score(unit)
            for i, unit in enumerate(units)
        ]
        coverage = np.asarray([c for c, _ in scored])
        test_coverage, test_width = fit_widths(units, candidate).score(test[bucket])
        out[bucket] = {
            "units": {
                u.sensor: {"role": u.role, "coverage": round(c, 4), "width": round(w, 3)}
                for u, (c, w) in zip(units, scored, strict=True)
            },
            "mean_coverage": float(coverage.mean()),
            "mean_abs_deviation": float(np.abs(coverage - DEFAULT_LEVEL).mean()),
            "mean_width": float(np.mean([w for _, w in scored])),
            "test_not_used": {"coverage": round(test_coverage, 4), "width": round(test_width, 3)},
        }
    return out


def unit_profile(unit: DifficultUnit) -> dict[str, Any]:
    """What sets a unit apart: its errors' offset and tails, its windows' median difficulties
    and how far its absolute errors follow them (Pearson correlation)."""
    error = unit.reference - unit.predicted
    return {
        "rmse": round(float(np.sqrt(np.mean(error**2))), 3),
        "mean_error": round(float(error.mean()), 3),
        "error_q05": round(float(np.quantile(error, 0.05)), 3),
        "error_q95": round(float(np.quantile(error, 0.95)), 3),
        "median_difficulty": {
            name: round(float(np.median(d)), 3) for name, d in unit.difficulty.items()
        },
        "abs_error_correlation": {
            name: round(float(np.corrcoef(np.abs(error), d)[0, 1]), 3) if np.std(d) > 0 else None
            for name, d in unit.difficulty.items()
        },
    }


def choose(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The rule of docs/benchmarks/intervals/ ("Step 4") over every model's report
    (``{"candidates": {name: figures}}``): among the candidates whose whole-window mean
    held-out coverage lies in 88-92 % for every model, the smallest mean absolute deviation
    averaged over the models (ties within 0.2 points: the narrower mean width); it replaces
    ``binned`` only when it beats it so and every short-history bucket's mean held-out coverage
    stays within |binned's − 90 %| + 1 point of 90 %."""

    def whole(name: str, key: str) -> list[float]:
        return [float(r["candidates"][name]["whole"][key]) for r in reports]

    def short_ok(name: str) -> bool:
        return all(
            abs(figures["mean_coverage"] - DEFAULT_LEVEL)
            <= abs(r["candidates"]["binned"][bucket]["mean_coverage"] - DEFAULT_LEVEL) + 0.01
            for r in reports
            for bucket, figures in r["candidates"][name].items()
            if bucket != "whole"
        )

    names = list(reports[0]["candidates"])
    deviation = {name: float(np.mean(whole(name, "mean_abs_deviation"))) for name in names}
    width = {name: float(np.mean(whole(name, "mean_width"))) for name in names}
    qualified = [n for n in names if all(0.88 <= c <= 0.92 for c in whole(n, "mean_coverage"))]
    best = min(deviation[n] for n in qualified) if qualified else None
    tied = [n for n in qualified if best is not None and deviation[n] <= best + 0.002]
    winner = min(tied, key=lambda n: width[n]) if tied else None
    replaces = (
        winner is not None
        and winner != "binned"
        and deviation[winner] < deviation["binned"]
        and short_ok(winner)
    )
    return {
        "qualified": qualified,
        "mean_abs_deviation": deviation,
        "mean_width": width,
        "winner": winner,
        "replaces_binned": replaces,
    }


def _unit_buckets(
    sensor: str, role: str, predict: Callable[[Any], Any], windows: Any, points: Sequence[int]
) -> dict[str, DifficultUnit]:
    """One unit's windows as served with ``K`` periods of history (``K`` in ``points``) and
    whole, predicted and their difficulties computed on the windows as the model saw them."""
    n = windows.window_length
    x, y = windows.gather(np.arange(len(windows)))
    out = {}
    for k in sorted({*points, n}):
        cut = pad_history(np.asarray(x, dtype=np.float32), k, axis=1)
        predicted = np.concatenate(
            [
                np.asarray(predict(cut[start : start + _CHUNK]), dtype=np.float64).reshape(-1)
                for start in range(0, len(cut), _CHUNK)
            ]
        )
        pm = np.asarray(cut if cut.ndim == 2 else cut[:, :, 0], dtype=np.float64)
        difficulty = {name: rule(pm, predicted) for name, rule in DIFFICULTIES.items()}
        unit = DifficultUnit(sensor, role, predicted, np.asarray(y, np.float64), difficulty)
        out["whole" if k == n else str(k)] = unit.finite()
    return out


def gather(
    model_dir: Path, folds_dir: Path
) -> tuple[dict[str, list[DifficultUnit]], dict[str, DifficultUnit]]:
    """Every pool unit's (from the fold that left it out; the validation unit from the
    exported model) and the test unit's difficult units, per history bucket."""
    from tesla_gateway.contract.manifest import load_manifest
    from tesla_gateway.models.calibrator import Calibrator
    from training.intervals_cli import fold_epochs, model_config
    from training.pool_folds import fold_predictor, train_pool_folds
    from training.train import prepare_data
    from training.unit_folds import sensor_windows

    manifest = load_manifest(model_dir)
    config = model_config(model_dir, None, None)
    prepared = prepare_data(config)
    summary = prepared.summary
    kept = fold_epochs(None, 0, None, folds_dir, manifest=manifest)
    pool = [*summary.train_sensors, summary.validation_sensor]
    runs = train_pool_folds(config, pool, summary.train_sensors, kept, folds_dir)
    points = [entry.min_periods for entry in manifest.history_intervals or []]
    windows = sensor_windows(config, summary.train_sensors)
    calibrator = Calibrator.load(model_dir)
    units = [
        _unit_buckets(run.left_out, "train", fold_predictor(run), windows[run.left_out], points)
        for run in runs
    ]
    units.append(
        _unit_buckets(
            summary.validation_sensor, "validation", calibrator.calibrate, prepared.validation,
            points,
        )
    )  # fmt: skip
    test = _unit_buckets(summary.test_sensor, "test", calibrator.calibrate, prepared.test, points)
    return {bucket: [u[bucket] for u in units] for bucket in test}, test


def main(argv: Sequence[str] | None = None) -> int:
    from tesla_gateway.contract.manifest import load_manifest

    parser = argparse.ArgumentParser(prog="python -m training.interval_difficulty")
    parser.add_argument("--model", type=Path, action="append", required=True)
    parser.add_argument("--out-dir", type=Path, help="write difficulty-<name>.json here")
    args = parser.parse_args(argv)
    reports = []
    for model_dir in args.model:
        name = load_manifest(model_dir).name
        pool, test = gather(model_dir, Path("runs") / "interval-folds" / name)
        report = {
            "model": name,
            "candidates": {c.name: candidate_figures(pool, test, c) for c in CANDIDATES},
            "units": {u.sensor: unit_profile(u) for u in [*pool["whole"], test["whole"]]},
        }
        reports.append(report)
        if args.out_dir is not None:
            path = args.out_dir / f"difficulty-{name}.json"
            path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    decision = choose(reports)
    if args.out_dir is not None:
        path = args.out_dir / "difficulty-choice.json"
        path.write_text(json.dumps(decision, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(decision, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
