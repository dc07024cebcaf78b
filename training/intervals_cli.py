"""``python -m training calibrate-intervals``: cross-unit intervals for a model directory.

The model's training config comes from ``--run`` (a run directory's ``config.json``) or, for a
committed default, from training/defaults.py with the seed its manifest records; the epochs the
folds train for from ``--fold-epochs``, else the manifest (``trained_epochs``, so a fresh clone
with no runs can recalibrate), else the run's history or the folds already trained. Prints the
per-unit report as JSON and writes it with ``--report``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from training.errors import DataError

if TYPE_CHECKING:  # training.train loads TensorFlow: not for every `python -m training` call
    from tesla_gateway.contract.manifest import Manifest
    from training.pool_folds import KeptEpochs
    from training.train import TrainConfig

__all__ = [
    "add_export_arguments",
    "add_parser",
    "after_export",
    "calibrate_default",
    "fold_epochs",
    "model_config",
    "run",
]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "calibrate-intervals",
        help="fit prediction intervals across units (folds of as many units and epochs as the "
        "model) into its manifest",
    )
    parser.add_argument("--model", type=Path, required=True, help="model directory to update")
    parser.add_argument(
        "--run", type=Path, help="the run it was exported from (default: a committed default's)"
    )
    parser.add_argument(
        "--data", type=Path, help="data folder for the run's dataset (default ../shared/data)"
    )
    parser.add_argument(
        "--folds-dir",
        type=Path,
        help="where fold runs are trained and reused (default runs/interval-folds/<name>)",
    )
    parser.add_argument(
        "--fold-epochs",
        type=int,
        help="epochs every fold trains for: the epoch the model's weights are from (its best "
        "validation epoch; default: the manifest's trained_epochs, else --run's history, else "
        "recorded by earlier folds)",
    )
    parser.add_argument(
        "--fold-fine-tune-epochs",
        type=int,
        default=0,
        help="with --fold-epochs: short-history fine-tuning epochs the model kept (0)",
    )
    parser.add_argument("--level", type=float, default=0.9, help="nominal coverage (0.9)")
    parser.add_argument("--report", type=Path, help="write the per-unit report (JSON) here")
    parser.add_argument("--table", type=Path, help="write the per-unit table (Markdown) here")


def model_config(model_dir: Path, run_dir: Path | None, data: Path | None) -> TrainConfig:
    """The config the model was trained with (the run's, or a committed default's with the
    seed its manifest records)."""
    from tesla_gateway.contract.manifest import load_manifest

    manifest = load_manifest(model_dir)  # a wrong --model is refused before TensorFlow loads
    from training.defaults import DEFAULT_MODELS
    from training.train import TrainConfig

    if run_dir is not None:
        config = TrainConfig.model_validate_json(
            (run_dir / "config.json").read_text(encoding="utf-8")
        )
    else:
        default = next((d for d in DEFAULT_MODELS if d.name == manifest.name), None)
        if default is None:
            raise DataError(
                f"{model_dir} ({manifest.name}) is not a committed default: pass --run, the run "
                "directory it was exported from"
            )
        seed = (
            manifest.trained_epochs.seed
            if manifest.trained_epochs is not None
            else int(manifest.hyperparameters.get("seed", default.config.seed))
        )
        config = default.config.model_copy(update={"seed": seed})
    return config if data is None else config.model_copy(update={"data_path": data})


def fold_epochs(
    epochs: int | None,
    fine_tune_epochs: int,
    run_dir: Path | None,
    folds_dir: Path,
    *,
    manifest: Manifest,
) -> KeptEpochs:
    """The epochs the folds train for: given, else those the manifest records (checked against
    the run's when both are there), else the run's kept epochs, else those the folds already
    under ``folds_dir`` were trained for."""
    from training.pool_folds import KeptEpochs, kept_epochs, manifest_epochs, recorded_epochs

    if epochs is not None:
        return KeptEpochs(epochs=epochs, fine_tune_epochs=fine_tune_epochs)
    recorded = manifest_epochs(manifest)
    has_history = run_dir is not None and (run_dir / "history.json").is_file()
    from_run = kept_epochs(run_dir) if run_dir is not None and has_history else None
    if recorded is not None and from_run is not None and from_run != recorded:
        raise DataError(
            f"{manifest.name}'s manifest says its weights are from epochs {recorded}, the run "
            f"{run_dir} kept {from_run}: was the model exported from that run? Pass the right "
            "--run, or --fold-epochs and --fold-fine-tune-epochs"
        )
    chosen = recorded if recorded is not None else from_run
    if chosen is not None:
        return chosen
    trained = recorded_epochs(folds_dir)
    if trained is None:
        raise DataError(
            "the folds train for the epochs the model's weights are from, and neither its "
            "manifest (exported before it recorded trained_epochs), a run's history nor folds "
            f"under {folds_dir} record them: pass --run RUN, or --fold-epochs E (its best "
            "validation epoch) and --fold-fine-tune-epochs F (the short-history fine-tuning "
            "epoch it kept, 0 for none)"
        )
    return trained


def run(args: argparse.Namespace) -> int:
    from tesla_gateway.contract.manifest import load_manifest

    config = model_config(args.model, args.run, args.data)
    manifest = load_manifest(args.model)
    folds_dir = args.folds_dir or Path("runs") / "interval-folds" / manifest.name
    kept = fold_epochs(
        args.fold_epochs, args.fold_fine_tune_epochs, args.run, folds_dir, manifest=manifest
    )
    from training.calibrate_intervals import calibrate_model_dir  # TensorFlow: to train the folds

    report = calibrate_model_dir(args.model, config, folds_dir, kept=kept, level=args.level)
    text = json.dumps(report.as_json(), indent=2)
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text + "\n", encoding="utf-8")
    if args.table is not None:
        from training.calibrate_intervals import report_table

        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(report_table(report.as_json()), encoding="utf-8")
    print(text)
    return 0


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """``export --intervals-across-units``: calibrate the exported model's intervals."""
    parser.add_argument(
        "--intervals-across-units",
        action="store_true",
        help="after export, fit the intervals across units: retrains the run's config once per "
        "training sensor, without it and with the validation sensor, for the run's kept epochs "
        "(TESLA runs; the folds go to RUN/interval-folds)",
    )


def after_export(args: argparse.Namespace) -> None:
    """The export's intervals recalibrated across units when asked (TESLA models only: the
    folds retrain the run's own model)."""
    from tesla_gateway.contract.manifest import load_manifest
    from training.calibrate_intervals import calibrate_model_dir

    if (
        not getattr(args, "intervals_across_units", False)
        or not (args.out / "manifest.json").is_file()
    ):
        return
    manifest = load_manifest(args.out)
    if manifest.architecture != "tesla":
        print("intervals across units: only for TESLA models, kept as exported", file=sys.stderr)
        return
    config = model_config(args.out, args.run, None)
    folds_dir = args.run / "interval-folds"
    kept = fold_epochs(None, 0, args.run, folds_dir, manifest=manifest)
    report = calibrate_model_dir(args.out, config, folds_dir, kept=kept)
    print(json.dumps(report.as_json(), indent=2))


def calibrate_default(model_dir: Path, data: Path | None, runs: Path) -> dict[str, object]:
    """A committed default's intervals across units (``default-models``), folds under
    ``runs/interval-folds/<name>``, reused when their config matches; the kept epochs from its
    manifest, else its run ``runs/<name>-seed<seed>``, else those its folds were trained for."""
    from tesla_gateway.contract.manifest import load_manifest
    from training.calibrate_intervals import calibrate_model_dir

    config = model_config(model_dir, None, data)
    manifest = load_manifest(model_dir)
    folds_dir = runs / "interval-folds" / manifest.name
    run_dir = runs / f"{manifest.name}-seed{config.seed}"
    kept = fold_epochs(None, 0, run_dir, folds_dir, manifest=manifest)
    report = calibrate_model_dir(model_dir, config, folds_dir, kept=kept)
    return report.as_json()
