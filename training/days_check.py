"""Leave-days-out check: does a recipe's gain over linear carry to days no sensor was trained on?

The paper's split is by sensor only. Every sensor of a dataset is co-located over the same days,
so each moment the test sensor is scored on was a training target through the other sensors.
This check cuts time as well: the campaign is split into blocks of ``D`` whole UTC days; the
recipe (and the linear baseline) trains on the training sensors' windows whose newest period lies
in an even block and stops early on the validation sensor's even blocks. Validation and test
sensors are then scored on odd-block windows whose newest period is at least ``margin`` from any
even-block moment (untrained days) and, as a control, on even-block windows at the same distance
from the odd blocks (moments the training sensors taught; same hours of the day).

Only the scored *targets* must be untrained: a window's older inputs may reach into an even
block, as a sensor's history reaches into days a model was trained on in service.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pandas as pd

from training.data import WindowSet
from training.errors import DataError, DivergedTrainingError, TrainingError
from training.history import predict_truncated
from training.metrics import LinearCalibration, error_metrics

__all__ = [
    "DayBlocks",
    "WindowSubset",
    "add_parser",
    "check_points",
    "default_blocks",
    "main",
    "markdown_table",
    "refuse_diverged",
    "run",
    "run_check",
]

DAY_S = 86_400
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class DayBlocks:
    """Blocks of ``period_days`` whole UTC days counted from the Unix epoch: even blocks are
    trained on, odd blocks scored; ``margin_s`` keeps scored targets away from trained ones."""

    period_days: int
    margin_s: int

    def __post_init__(self) -> None:
        if self.period_days < 1 or self.margin_s < 0:
            raise DataError(
                f"need --period-days >= 1 and a margin >= 0, got {self.period_days} and "
                f"{self.margin_s} s"
            )
        if 2 * self.margin_s >= self.period_days * DAY_S:
            raise DataError(
                f"a margin of {self.margin_s / 3600:g} h on both sides leaves nothing of a "
                f"{self.period_days}-day block to score: lengthen --period-days or shorten "
                "--margin-hours"
            )

    @property
    def length_s(self) -> int:
        return self.period_days * DAY_S

    def trained(self, start_s: npt.ArrayLike) -> BoolArray:
        """Windows whose newest period starts in an even block (training targets)."""
        return (np.asarray(start_s, dtype=np.int64) // self.length_s) % 2 == 0

    def _inside(self, start_s: npt.ArrayLike, period_s: int) -> BoolArray:
        """Periods at least the margin from both ends of their block."""
        t = np.asarray(start_s, dtype=np.int64)
        offset = t % self.length_s
        return (offset >= self.margin_s) & (self.length_s - (offset + period_s) >= self.margin_s)

    def scored(self, start_s: npt.ArrayLike, period_s: int) -> BoolArray:
        """Odd-block windows whose newest period is at least the margin from every even-block
        period (the neighbouring blocks on both sides are even)."""
        return ~self.trained(start_s) & self._inside(start_s, period_s)

    def control(self, start_s: npt.ArrayLike, period_s: int) -> BoolArray:
        """Even-block windows placed as the scored ones are (same hours of the block): moments
        the training sensors taught."""
        return self.trained(start_s) & self._inside(start_s, period_s)


def default_blocks(period_s: int) -> DayBlocks:
    """Alternate days and a 6 h margin for minute data (N = 360 min is 6 h, PM's autocorrelation
    is hours); alternate weeks and a one-day margin for hourly data (N = 168 h: a week holds a
    whole window of targets and every weekday once, and a day clears hourly PM's persistence
    from the neighbouring trained block's edge)."""
    if period_s < 3600:
        return DayBlocks(period_days=1, margin_s=6 * 3600)
    return DayBlocks(period_days=7, margin_s=DAY_S)


def check_points(n: int, period_s: int) -> tuple[int, ...]:
    """History lengths scored: one period, an hour, three hours and a day where they fit, N."""
    spans = (3600, 3 * 3600, DAY_S)
    ks = {span // period_s for span in spans if span % period_s == 0}
    return tuple(sorted({1, n} | {k for k in ks if 1 <= k <= n}))


class WindowSubset:
    """Some windows of a WindowSet, with the reading methods scoring and fine-tuning use."""

    def __init__(self, windows: WindowSet, indices: IntArray) -> None:
        self.windows = windows
        self.indices = np.asarray(indices, dtype=np.int64)
        self.window_length = windows.window_length
        self.channels = windows.channels

    def __len__(self) -> int:
        return int(self.indices.size)

    def gather(self, indices: npt.ArrayLike) -> tuple[Any, Any]:
        return self.windows.gather(self.indices[np.asarray(indices, dtype=np.int64)])

    def targets(self) -> Any:
        return self.windows.targets()[self.indices]

    def current_raw(self) -> Any:
        return self.windows.current_raw()[self.indices]

    def current(self, channel: str) -> Any:
        return self.windows.current(channel)[self.indices]

    def meta(self) -> pd.DataFrame:
        return self.windows.meta().iloc[self.indices].reset_index(drop=True)

    def as_window_set(self) -> WindowSet:
        """For code typed on WindowSet that only reads windows (duck-typed)."""
        return cast("WindowSet", self)


def _starts(windows: WindowSet) -> IntArray:
    return windows.meta()["period_start_s"].to_numpy(dtype=np.int64)


def _days(starts: IntArray) -> int:
    return int(np.unique(starts // DAY_S).size)


def run_check(
    config: Any, blocks: DayBlocks | None = None, *, verbose: int | str = 2
) -> dict[str, Any]:
    """Train ``config``'s recipe on even blocks and score odd and even blocks: the JSON report."""
    import keras  # the CLI answers --help and refusals without loading TensorFlow

    from training.batches import WindowBatches
    from training.history_fit import fine_tune
    from training.models import build_model
    from training.train import covariate_scales, prepare_data

    keras.utils.set_random_seed(config.seed)
    prepared = prepare_data(config)
    period_s = prepared.data.period_seconds
    blocks = blocks or default_blocks(period_s)
    n = config.window_length

    train_starts = _starts(prepared.train)
    train_idx = np.flatnonzero(blocks.trained(train_starts)).astype(np.int64)
    if config.max_train_windows is not None and train_idx.size > config.max_train_windows:
        rng = np.random.default_rng(config.seed)
        train_idx = np.sort(rng.choice(train_idx, config.max_train_windows, replace=False))
    val_starts = _starts(prepared.validation)
    val_even = WindowSubset(prepared.validation, np.flatnonzero(blocks.trained(val_starts)))
    if train_idx.size == 0 or len(val_even) == 0:
        raise DataError("no training or validation windows end in an even block")
    train_even = WindowSubset(prepared.train, train_idx)

    raw = train_even.current_raw()
    input_scale = config.input_scale or max(1.0, float(np.percentile(raw, 99)))
    scales = covariate_scales(config, train_even.as_window_set(), input_scale)
    model = build_model(config.model, n, len(config.channels), input_scale, channel_scales=scales)
    model.compile(optimizer=keras.optimizers.Adam(config.learning_rate), loss="mse")
    two_phases = config.partial_history_fraction > 0 and config.partial_history_epochs > 0
    history = model.fit(
        WindowBatches(
            prepared.train, train_idx, config.batch_size, config.seed,
            0.0 if two_phases else config.partial_history_fraction,
            unknown_hour_fraction=config.unknown_hour_fraction,
        ),
        validation_data=val_even.gather(np.arange(len(val_even))),
        epochs=config.epochs,
        callbacks=[
            keras.callbacks.EarlyStopping(
                monitor="val_loss", patience=config.early_stopping_patience,
                restore_best_weights=True,
            ),
            keras.callbacks.TerminateOnNaN(),
        ],
        verbose=verbose,
    )  # fmt: skip
    refuse_diverged(history.history.get("loss", []), config)
    fine: dict[str, list[float]] = {}
    if two_phases:
        batches = WindowBatches(
            prepared.train, train_idx, config.batch_size, config.seed + 1,
            config.partial_history_fraction, unknown_hour_fraction=config.unknown_hour_fraction,
        )  # fmt: skip
        even_only = dataclasses.replace(prepared, validation=val_even.as_window_set())
        fine = fine_tune(model, config, even_only, batches, verbose=verbose).as_history()
    linear = LinearCalibration.fit(raw, train_even.targets())

    points = check_points(n, period_s)
    scores: dict[str, Any] = {}
    for sensor, windows in (("validation", prepared.validation), ("test", prepared.test)):
        starts = _starts(windows)
        for label, mask in (
            ("untrained", blocks.scored(starts, period_s)),
            ("trained", blocks.control(starts, period_s)),
        ):
            chosen = WindowSubset(windows, np.flatnonzero(mask))
            scores[f"{sensor}-{label}"] = _score(model, linear, chosen, points, starts[mask])
    return {
        "config": config.model_dump(mode="json"),
        "blocks": {"period_days": blocks.period_days, "margin_hours": blocks.margin_s / 3600},
        "period_seconds": period_s,
        "sensors": {
            "train": list(prepared.summary.train_sensors),
            "validation": prepared.summary.validation_sensor,
            "test": prepared.summary.test_sensor,
        },
        "training": {
            "windows": int(train_idx.size),
            "of_windows": len(prepared.train),
            "days": _days(train_starts[train_idx]),
            "epochs": len(history.history.get("loss", [])),
            **fine,
        },
        "linear": {"slope": linear.slope, "intercept": linear.intercept},
        "points": list(points),
        "scores": scores,
    }


def _score(
    model: Any,
    linear: LinearCalibration,
    windows: WindowSubset,
    points: tuple[int, ...],
    starts: IntArray,
) -> dict[str, Any]:
    reference = windows.targets()
    current = windows.current_raw()
    predicted = predict_truncated(
        lambda x: model.predict(x, verbose=0, batch_size=1024), windows.as_window_set(), points
    )
    if not all(np.isfinite(v).all() for v in predicted.values()):
        raise DivergedTrainingError("the model predicts NaN or inf: training diverged")
    lin = error_metrics(linear.predict(current), reference).rmse
    rmse = {str(k): error_metrics(v, reference).rmse for k, v in predicted.items()}
    # mean error: a model off on untaught days may be biased (a level it never saw) or noisy
    bias = {str(k): float(np.nanmean(v - reference)) for k, v in predicted.items()}
    whole = predicted[max(points)]
    fitted = linear.predict(current)
    per_day = {}  # where the error lies: one bad day, or every day
    for day in np.unique(starts // DAY_S):
        rows = starts // DAY_S == day
        per_day[str(np.datetime64(int(day), "D"))] = {
            "n": int(rows.sum()),
            "linear": error_metrics(fitted[rows], reference[rows]).rmse,
            "model": error_metrics(whole[rows], reference[rows]).rmse,
        }
    return {
        "n": len(windows),
        "days": _days(starts),
        "raw": error_metrics(current, reference).rmse,
        "linear": lin,
        "model": rmse,
        "model_bias": bias,
        "linear_bias": float(np.mean(linear.predict(current) - reference)),
        "ratio_to_linear": {k: v / lin if lin > 0 else None for k, v in rmse.items()},
        "per_day_whole_window": per_day,
    }


def refuse_diverged(losses: list[float], config: Any) -> None:
    """A diverged run scores over no window (RMSE 0 over n = 0): refuse it, as ``train`` does."""
    epoch = next((i + 1 for i, v in enumerate(losses) if not np.isfinite(v)), None)
    if epoch is not None:
        raise DivergedTrainingError(
            f"training diverged: the loss became NaN or inf in epoch {epoch} (seed "
            f"{config.seed}, learning rate {config.learning_rate}); try another seed"
        )


def markdown_table(report: dict[str, Any], name: str) -> str:
    """One row per sensor and kind of day: RMSE (µg/m³) and the model's change against linear."""
    points = report["points"]
    blocks = report["blocks"]
    head = ["sensor", "days", "n", "raw", "linear", *(f"K = {k}" for k in points)]
    lines = [
        f"**{name}**, seed {report['config']['seed']}: blocks of {blocks['period_days']} day(s), "
        f"margin {blocks['margin_hours']:g} h; trained on {report['training']['windows']} of "
        f"{report['training']['of_windows']} training windows ({report['training']['days']} days)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for key, score in report["scores"].items():
        sensor, label = key.split("-", 1)
        cells = [
            sensor,
            f"{label} ({score['days']})",
            str(score["n"]),
            f"{score['raw']:.2f}",
            f"{score['linear']:.2f}",
        ]
        for k in points:
            ratio = score["ratio_to_linear"][str(k)]
            change = "" if ratio is None else f" ({ratio - 1:+.0%})"
            cells.append(f"{score['model'][str(k)]:.2f}{change}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _config(source: str, data: Path | None, seed: int) -> tuple[str, Any]:
    from training.defaults import DEFAULT_MODELS
    from training.train import TrainConfig

    named = {default.name: default.config for default in DEFAULT_MODELS}
    if source in named:
        config, name = named[source], source
    else:
        path = Path(source)
        if not path.is_file():
            raise DataError(
                f"{source!r} is neither a default model ({', '.join(named)}) nor a config file"
            )
        config, name = TrainConfig.model_validate_json(path.read_text(encoding="utf-8")), path.stem
    update: dict[str, Any] = {"seed": seed}
    if data is not None:
        update["data_path"] = data
    return name, TrainConfig.model_validate(config.model_copy(update=update).model_dump())


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "days-check",
        help="leave-days-out check: train on even blocks of days, score untrained odd ones",
    )
    _arguments(parser)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a default model's name or a JSON TrainConfig file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, help="data folder (default ../shared/data)")
    parser.add_argument("--out", type=Path, required=True, help="JSON report to write")
    parser.add_argument("--table", type=Path, help="markdown table to write")
    parser.add_argument(
        "--period-days",
        type=int,
        help="days per block (default: 1 for minute data, 7 for hourly)",
    )
    parser.add_argument(
        "--margin-hours",
        type=float,
        help="least distance of a scored target from a trained one (default: 6 for minute "
        "data, 24 for hourly)",
    )
    parser.add_argument("--quiet", action="store_true", help="no Keras progress lines")


def run(args: argparse.Namespace) -> int:
    name, config = _config(args.model, args.data, args.seed)
    blocks = None
    if args.period_days is not None or args.margin_hours is not None:
        from training.data import load_dataset

        # the defaults depend on the period: read it only when one of the two is left out
        period_s = 0
        if args.period_days is None or args.margin_hours is None:
            options = config.dataset_options
            period_s = load_dataset(config.dataset, config.data_path, **options).period_seconds
        auto = default_blocks(period_s) if period_s else None
        blocks = DayBlocks(
            period_days=args.period_days or (auto.period_days if auto else 1),
            margin_s=int(
                args.margin_hours * 3600
                if args.margin_hours is not None
                else (auto.margin_s if auto else 0)
            ),
        )
    report = run_check(config, blocks, verbose=0 if args.quiet else 2)
    report["model"] = name
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    table = markdown_table(report, name)
    if args.table is not None:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(table, encoding="utf-8")
    print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.days_check", description=__doc__)
    _arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except TrainingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
