"""The ``train`` and ``export`` commands' ladder: what they print and the ``--init-from`` flow."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports TensorFlow only for the commands that need it
    from training.train import TrainConfig

__all__ = ["add_export_arguments", "add_train_arguments", "run_export", "run_train"]


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--init-from",
        type=Path,
        help="model directory of a TESLA default to fine-tune on these data (same feature, "
        "period and channels; N defaults to its own)",
    )
    parser.add_argument(
        "--init-run", type=Path, help="the run directory that produced --init-from (its weights)"
    )


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--candidate",
        help="export this calibration of the run's ladder instead of the winner (linear, "
        "multilinear, growth, tesla, tesla-fine-tuned)",
    )


def run_train(args: argparse.Namespace, config: TrainConfig) -> int:
    """Train TESLA (and fine-tune a default with --init-from), then fit and print the ladder."""
    from tesla_gateway.contract.manifest import TestMetrics
    from training.fine_tune import check_compatible, fine_tune_run, init_manifest, init_weights
    from training.harm import describe
    from training.ladder import fit_ladder
    from training.train import prepare_data, train

    runs: dict[str, Path] = {"tesla": args.run_dir}
    prepared = default = None
    if args.init_from is not None:  # every refusal before any training
        manifest = init_manifest(args.init_from)
        default = init_weights(args.init_from, args.init_run, manifest)
        if args.window is None:
            config = config.model_copy(update={"window_length": manifest.window_length})
        prepared = prepare_data(config)
        check_compatible(
            manifest,
            config,
            feature=prepared.data.feature,
            period_seconds=prepared.data.period_seconds,
        )
    result = train(config, args.run_dir)
    if args.init_from is not None and prepared is not None:
        tuned = fine_tune_run(config, prepared, args.init_from, args.run_dir,
                              init_run=args.init_run, model=default)  # fmt: skip
        runs["tesla-fine-tuned"] = tuned.run_dir
    ladder = fit_ladder(config, args.run_dir, runs)
    metrics = json.loads((args.run_dir / "metrics.json").read_text(encoding="utf-8"))
    baselines = TestMetrics.model_validate(metrics["validation_baselines"])
    print(
        json.dumps(
            {
                "run_dir": str(args.run_dir),
                "validation": baselines.model_dump(),
                "test": result.test.model_dump(),
                "ladder": {
                    "winner": ladder.winner,
                    "reason": ladder.reason,
                    "candidates": [c.model_dump(mode="json") for c in ladder.candidates],
                },
            },
            indent=2,
        )
    )
    print(f"validation sensor, TESLA: {describe(baselines)}", file=sys.stderr)
    print(ladder.table(), file=sys.stderr)
    return 0


def run_export(args: argparse.Namespace) -> int:
    """Export the ladder's winner (a run without a ladder: its TESLA model) and print it."""
    from training.ladder_export import export_choice

    exported = export_choice(
        args.run,
        args.out,
        name=args.name,
        version=args.version,
        targets=args.targets or "both-if-possible",
        force=args.force,
        candidate=args.candidate,
    )
    manifest = exported.manifest
    print(
        json.dumps(
            {
                "model_dir": str(exported.model_dir),
                "version": manifest.version,
                "architecture": manifest.architecture,
                "choice": manifest.choice,
                "files": {k: v.size_bytes for k, v in manifest.files.items()},
                "device_graph_absent": manifest.device_graph_absent,
                "validation": None
                if manifest.validation_baselines is None
                else manifest.validation_baselines.model_dump(),
                "verification": exported.verification.as_dict(),
            },
            indent=2,
        )
    )
    if manifest.device_graph_absent is not None:
        print(f"no device graph: {manifest.device_graph_absent}", file=sys.stderr)
    return 0
