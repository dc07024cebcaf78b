"""``python -m training bench``: arguments, budget flags and the handler.

A JSON config (:class:`BenchConfig`) may give the whole grid; flags override its fields.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from training.bench.grid import BenchConfig

__all__ = ["add_parser", "config_from_args", "run"]


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _integers(text: str) -> list[int]:
    try:
        return [int(part) for part in _names(text)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from exc


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "bench",
        help="reproduce the paper's comparison: models × datasets → report directory",
        description=(
            "Train, evaluate, export and measure every cell of a grid, then write report.md, "
            "CSVs, PNGs and results.json. Finished cells are reused on the next run."
        ),
    )
    parser.add_argument("--report-dir", type=Path, required=True, help="report directory")
    parser.add_argument("--work-dir", type=Path, help="runs and model dirs (default REPORT/work)")
    parser.add_argument("--config", type=Path, help="JSON BenchConfig; flags override it")
    grid = parser.add_argument_group("grid and budget")
    grid.add_argument("--dataset", action="append", help="dataset name (repeatable)")
    grid.add_argument("--data", type=Path, help="data folder or file for every --dataset")
    grid.add_argument("--max-gap", type=int, help="longest gap (periods) to interpolate")
    grid.add_argument("--feature", action="append", help="keep only this feature (repeatable)")
    grid.add_argument("--models", type=_names, help="learned models, comma-separated")
    grid.add_argument(
        "--defer-models",
        type=_names,
        default=[],
        help="compute these models' cells after all others (e.g. transformer,informer)",
    )
    grid.add_argument("--no-ablations", action="store_true", help="skip TESLA's ablations")
    grid.add_argument("--no-covariates", action="store_true", help="skip tesla+rh, tesla+rh+t")
    grid.add_argument("--no-epa", action="store_true", help="skip the EPA reference row")
    grid.add_argument("--window", type=int, help="main N (paper: 360)")
    grid.add_argument("--no-sweep", action="store_true", help="skip the window sweep")
    grid.add_argument("--sweep-windows", type=_integers, help="e.g. 15,60,360,720,1440")
    grid.add_argument("--sweep-models", type=_names, help="e.g. dlinear,transformer,tesla")
    grid.add_argument("--sweep-measure", choices=("float", "full"))
    grid.add_argument("--epochs", type=int)
    grid.add_argument("--batch-size", type=int)
    grid.add_argument("--learning-rate", type=float)
    grid.add_argument("--seeds", type=_integers, help="e.g. 0,1,2")
    grid.add_argument("--max-train-windows", type=int, help="cap on training windows per run")
    grid.add_argument("--case-study-models", type=_names)
    action = parser.add_argument_group("what to do")
    action.add_argument(
        "--validate-config", action="store_true", help="print the grid and exit without running"
    )
    action.add_argument(
        "--report-only", action="store_true", help="rewrite the report from stored cells"
    )
    action.add_argument("--no-progress", action="store_true", help="no progress bars")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The JSON config (if any) with the flags applied, validated."""
    from training.bench.grid import BenchConfigError, load_bench_config

    payload: dict[str, Any] = {}
    if args.config is not None:
        try:
            payload = json.loads(args.config.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise BenchConfigError(f"cannot read the bench config {args.config}: {exc}") from exc
    if args.dataset:
        payload["datasets"] = [
            {
                "dataset": name,
                **({"data_path": str(args.data)} if args.data else {}),
                **({"max_interpolated_periods": args.max_gap} if args.max_gap is not None else {}),
            }
            for name in args.dataset
        ]
    elif args.data is not None or args.max_gap is not None:
        raise BenchConfigError("--data and --max-gap need --dataset")
    flags = {
        "features": args.feature,
        "models": args.models,
        "window_length": args.window,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "seeds": args.seeds,
        "max_train_windows": args.max_train_windows,
        "case_study_models": args.case_study_models,
    }
    payload.update({key: value for key, value in flags.items() if value is not None})
    for flag, key in (("no_ablations", "ablations"), ("no_covariates", "covariates"),
                      ("no_epa", "epa")):  # fmt: skip
        if getattr(args, flag):
            payload[key] = False
    sweep = dict(payload.get("sweep", {}))
    if args.no_sweep:
        sweep["enabled"] = False
    if args.sweep_windows is not None:
        sweep["windows"] = args.sweep_windows
    if args.sweep_models is not None:
        sweep["models"] = args.sweep_models
    if args.sweep_measure is not None:
        sweep["measure"] = args.sweep_measure
    if sweep:
        payload["sweep"] = sweep
    return load_bench_config(payload)


def _command() -> str | None:
    if sys.argv[1:2] != ["bench"]:
        return None
    return "python -m training " + shlex.join(sys.argv[1:])


def _previous_command(report_dir: Path) -> str | None:
    """The command that computed the stored cells (a rewrite keeps it), else this one."""
    try:
        previous = json.loads((report_dir / "results.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return _command()
    command = previous.get("command") if isinstance(previous, dict) else None
    return command if isinstance(command, str) else _command()


def run(args: argparse.Namespace) -> int:
    from training.bench.report import write_report
    from training.bench.runner import run_bench

    config = config_from_args(args)
    if args.validate_config:
        print(json.dumps(_plan(config), indent=2))
        return 0
    if args.report_only:
        path = write_report(config, args.report_dir, command=_previous_command(args.report_dir))
        print(json.dumps({"report": str(path)}))
        return 0
    summary = run_bench(
        config,
        args.report_dir,
        work_dir=args.work_dir,
        progress=not args.no_progress,
        write=False,
        defer=args.defer_models,
    )
    path = write_report(config, args.report_dir, command=_command())
    print(
        json.dumps(
            {
                "report": str(path),
                "computed": len(summary.computed),
                "reused": len(summary.reused),
                "skipped": summary.skipped,
                "diverged": summary.diverged,
                "excluded_datasets": summary.excluded_datasets,
            },
            indent=2,
        )
    )
    return 0


def _plan(config: BenchConfig) -> dict[str, Any]:
    return {
        "config": config.model_dump(mode="json"),
        "cells": {
            spec.key: [cell.label for cell in (*config.reference_cells(spec), *config.cells(spec))]
            for spec in config.datasets
        },
    }
