"""``python -m training retrain``: its flags and its handler (training.cli registers both)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from training.cli_types import model_name
from training.errors import RetrainError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "retrain",
        help="train a challenger on a gateway's recorded pairs; release it only if it is better",
    )
    parser.add_argument("--champion", type=Path, required=True, help="model directory in service")
    parser.add_argument(
        "--pairs", type=Path, required=True, help="recorded pairs: <state_dir>/pairs/<feature>"
    )
    parser.add_argument("--out", type=Path, required=True, help="new directory for the run")
    parser.add_argument("--config", type=Path, help="JSON RetrainConfig; flags override it")
    parser.add_argument("--champion-run", type=Path, help="the champion's run dir: fine-tune it")
    parser.add_argument("--mode", choices=("auto", "finetune", "fresh"))
    parser.add_argument("--since", help="use only pairs from this ISO-8601 time on")
    parser.add_argument("--dataset", help="original training data as `train` takes it")
    parser.add_argument("--data", type=Path, help="folder or file for --dataset")
    parser.add_argument(
        "--holdout", help="most recent pairs held back: 12h, 7d, 90m, 3600s, or 0.2 / 20%%"
    )
    parser.add_argument("--validation-fraction", type=float)
    parser.add_argument(
        "--margin", type=float, help="required relative RMSE improvement (default 0.05)"
    )
    parser.add_argument("--min-improvement", type=float, help="required RMSE drop, µg/m³")
    parser.add_argument("--min-holdout-windows", type=int)
    parser.add_argument("--min-train-windows", type=int)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--learning-rate", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--pairs-weight", type=int, help="repeat each pairs window per epoch")
    parser.add_argument("--max-original-windows", type=int)
    parser.add_argument("--name", type=model_name, help="model name (default: the champion's)")
    parser.add_argument("--key", type=Path, help="private key: sign an accepted challenger")
    parser.add_argument("--target", choices=("gateway", "node"))
    parser.add_argument("--broker", help="HOST:PORT: push the signed release there")
    parser.add_argument("--topic-prefix")
    parser.add_argument("--username")
    parser.add_argument("--password-file", type=Path, help="file whose first line is the password")
    parser.add_argument("--ca-file", type=Path, help="CA bundle: connect with TLS")


def run(args: argparse.Namespace) -> int:
    """Run it; print the decision as JSON. Exit 0 whether accepted or rejected."""
    from pydantic import ValidationError

    from tesla_gateway.daemon.logging import configure_logging
    from training.release import broker_from_flags
    from training.retrain.config import RetrainConfig
    from training.retrain.report import REPORT_JSON
    from training.retrain.run import retrain

    base: dict[str, Any] = (
        json.loads(args.config.read_text(encoding="utf-8")) if args.config is not None else {}
    )
    overrides = {
        "champion": args.champion,
        "pairs": args.pairs,
        "champion_run": args.champion_run,
        "mode": args.mode,
        "since": args.since,
        "dataset": args.dataset,
        "data_path": args.data,
        "holdout": args.holdout,
        "validation_fraction": args.validation_fraction,
        "margin": args.margin,
        "min_improvement": args.min_improvement,
        "min_holdout_windows": args.min_holdout_windows,
        "min_train_windows": args.min_train_windows,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "seed": args.seed,
        "pairs_weight": args.pairs_weight,
        "max_original_windows": args.max_original_windows,
        "name": args.name,
        "key": args.key,
        "target": args.target,
        "topic_prefix": args.topic_prefix,
    }
    document = {**base, **{k: v for k, v in overrides.items() if v is not None}}
    if args.broker is not None:
        configure_logging(level="warning")  # the connection's log lines to stderr
        document["push"] = broker_from_flags(
            args.broker,
            username=args.username,
            password_file=args.password_file,
            ca_file=args.ca_file,
        )
    try:
        config = RetrainConfig.model_validate(document)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'options'}: {error['msg']}"
            for error in exc.errors()
        )
        raise RetrainError(f"invalid retraining options: {problems}") from exc
    result = retrain(config, args.out)
    print(
        json.dumps(
            {
                "decision": result.decision,
                "reason": result.reason,
                "report": str(result.out_dir / REPORT_JSON),
                "model_dir": str(result.model_dir) if result.model_dir else None,
                "release": str(result.release_dir) if result.release_dir else None,
                "topic": result.topic,
            },
            indent=2,
        )
    )
    return 0
