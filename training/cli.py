"""``python -m training`` / ``tesla-train``: train, evaluate and export calibration models."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tesla_gateway.errors import GatewayError
from training import days_check, intervals_cli, ladder_cli
from training.bench import cli as bench_cli
from training.cli_types import model_name
from training.errors import TrainingError
from training.retrain import cli as retrain_cli

if TYPE_CHECKING:
    from tesla_gateway.contract.manifest import Manifest
    from training.train import TrainConfig

__all__ = ["build_parser", "main", "train_config"]


def _add_train(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("train", help="train a model on co-location data")
    parser.add_argument("--config", type=Path, help="JSON TrainConfig; flags override it")
    parser.add_argument("--dataset", help="ispra-1min, antwerp-hourly-pm2_5, csv, synthetic, …")
    parser.add_argument("--data", type=Path, help="data folder or file (default ../shared/data)")
    parser.add_argument("--window", type=int, help="N, readings per window (paper: 360)")
    parser.add_argument("--max-gap", type=int, help="longest gap (periods) to interpolate")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--learning-rate", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--max-train-windows", type=int)
    parser.add_argument(
        "--channels", help="input channels, raw first, comma-separated: raw or raw,rh,temp_c"
    )
    parser.add_argument("--feature", help="csv loader: feature of the raw column (pm2_5, pm10)")
    parser.add_argument(
        "--period", type=int, help="csv loader: grid period in seconds (default: median spacing)"
    )
    parser.add_argument("--run-dir", type=Path, required=True, help="where the run is written")
    ladder_cli.add_train_arguments(parser)


def _add_export(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("export", help="export a run to a verified model directory")
    parser.add_argument("--run", type=Path, required=True, help="run directory from `train`")
    parser.add_argument("--out", type=Path, required=True, help="model directory to write")
    parser.add_argument(
        "--name", required=True, type=model_name, help="model name, e.g. pm10-ispra-1min"
    )
    parser.add_argument("--version", type=int, help="release number (default: Unix time)")
    parser.add_argument(
        "--targets",
        choices=("gateway", "node", "both"),
        help="graphs required: gateway (float only), node or both (fail without the device "
        "graph); default: both if the device graph passes its bound, else the gateway graph "
        "alone with the reason in the manifest",
    )
    parser.add_argument(
        "--force", action="store_true", help="export even if worse than raw or linear"
    )
    ladder_cli.add_export_arguments(parser)
    intervals_cli.add_export_arguments(parser)


def _add_evaluate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "evaluate", help="score a model directory (the gateway's calibrator) on any data source"
    )
    parser.add_argument("--model", type=Path, required=True, help="model directory")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--csv", type=Path, help="plain CSV: timestamp,sensor_id,raw,reference")
    source.add_argument("--dataset", help="a registered dataset name, e.g. ispra-1min")
    parser.add_argument("--data", type=Path, help="folder for --dataset (default ../shared/data)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--predictions", type=Path, help="write every calibrated step as CSV")
    parser.add_argument(
        "--reference-uncertainty",
        type=float,
        default=0.0,
        help="u(x) of the reference in the GDE formula, µg/m³ (default 0: conservative)",
    )
    parser.add_argument(
        "--history-periods",
        type=int,
        metavar="K",
        help="score as if every sensor had only its last K periods (1..N; the older part of "
        "each window edge-padded, as the gateway pads a new sensor's window)",
    )


def _add_history_curve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "history-curve",
        help="a model's error by history length on its test sensor: JSON, table and plot",
    )
    parser.add_argument("--model", type=Path, required=True, help="model directory")
    parser.add_argument("--dataset", required=True, help="registered dataset, e.g. ispra-1min")
    parser.add_argument("--data", type=Path, help="folder for --dataset (default ../shared/data)")
    parser.add_argument("--out", type=Path, required=True, help="folder for <model>.json/.md/.png")
    parser.add_argument(
        "--baseline", type=Path, help="another model directory scored the same way (e.g. before)"
    )
    parser.add_argument(
        "--points", help="history lengths K, comma-separated (default: log-spaced 1..N)"
    )


def _add_defaults(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("default-models", help="retrain the committed default models")
    parser.add_argument("--data", type=Path, help="shared data folder (default ../shared/data)")
    parser.add_argument("--out", type=Path, default=Path("models"))
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--only", help="retrain just this default model")
    parser.add_argument(
        "--reuse-runs", action="store_true", help="keep finished runs instead of retraining them"
    )
    parser.add_argument(
        "--annotate-only",
        action="store_true",
        help="no training: recompute the committed models' intervals and validation comparison "
        "from their float graphs and rewrite their manifests",
    )


def _add_release_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keygen = sub.add_parser("keygen", help="create the Ed25519 key pair that signs releases")
    keygen.add_argument("--out", type=Path, required=True, help="directory for the key files")
    release = sub.add_parser("release", help="sign a model directory into a release")
    release.add_argument("--model", type=Path, required=True, help="model directory")
    release.add_argument("--target", choices=("gateway", "node"), required=True)
    release.add_argument("--key", type=Path, required=True, help="private key from keygen")
    release.add_argument("--out", type=Path, required=True, help="release directory to write")
    release.add_argument(
        "--gateway",
        dest="gateways",
        action="append",
        default=[],
        metavar="ID",
        help="staged rollout: only this gateway installs or relays it (repeatable)",
    )
    release.add_argument(
        "--group",
        dest="groups",
        action="append",
        default=[],
        metavar="NAME",
        help="staged rollout: only gateways in this [ota] group (repeatable), e.g. canary",
    )
    push = sub.add_parser("push", help="publish a release (retained) on MQTT")
    push.add_argument("--release", type=Path, required=True, help="release directory")
    push.add_argument("--broker", required=True, help="HOST:PORT of the MQTT broker")
    push.add_argument("--topic-prefix", default="tesla/releases")
    push.add_argument("--username")
    push.add_argument("--password-file", type=Path, help="file whose first line is the password")
    push.add_argument("--ca-file", type=Path, help="CA bundle: connect with TLS")
    push.add_argument(
        "--protocol",
        choices=["5", "3.1.1"],
        default="5",
        help="MQTT version: 3.1.1 for nats-server's MQTT listener (cluster mode)",
    )
    constants = sub.add_parser(
        "firmware-constants", help="generate firmware/src/model_constants.h from a manifest"
    )
    constants.add_argument("--model", type=Path, required=True, help="model directory")
    constants.add_argument("--out", type=Path, required=True, help="header to write")
    constants.add_argument(
        "--public-key", type=Path, help="release .pub file: also write release_key.h beside it"
    )
    constants.add_argument(
        "--model-data", type=Path, help="also write the default model as a C++ array here"
    )


def _keygen(args: argparse.Namespace) -> int:
    from training.release import keygen

    pair = keygen(args.out)
    print(json.dumps({"private": str(pair.private_path), "public": str(pair.public_path),
                      "key_id": pair.key_id}))  # fmt: skip
    return 0


def _release(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from tesla_gateway.ota.release import Rollout
    from training.release import ReleaseError, build_release

    rollout = None
    if args.gateways or args.groups:
        try:
            rollout = Rollout(gateways=args.gateways, groups=args.groups)
        except ValidationError as exc:
            raise ReleaseError(f"--gateway/--group: {exc.errors()[0]['msg']}") from exc
    out = build_release(args.model, args.target, args.key, args.out, rollout=rollout)
    print(json.dumps({"release": str(out)}))
    return 0


def _push(args: argparse.Namespace) -> int:
    from tesla_gateway.daemon.logging import configure_logging
    from training.release import broker_from_flags, push_release

    configure_logging(level="warning")  # the connection's log lines to stderr, stdout is JSON
    broker = broker_from_flags(
        args.broker,
        username=args.username,
        password_file=args.password_file,
        ca_file=args.ca_file,
        protocol=args.protocol,
    )
    topic = push_release(args.release, broker, topic_prefix=args.topic_prefix)
    print(json.dumps({"topic": topic}))
    return 0


def _firmware_constants(args: argparse.Namespace) -> int:
    from training.firmware_constants import write_model_constants

    path = write_model_constants(
        args.model, args.out, public_key=args.public_key, model_data=args.model_data
    )
    print(json.dumps({"header": str(path)}))
    return 0


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The run's TrainConfig: the ``--config`` file, then every flag given on top of it (the
    loader options ``--feature``/``--period`` merge into its ``dataset_options``)."""
    from training.train import TrainConfig

    base = json.loads(args.config.read_text(encoding="utf-8")) if args.config is not None else {}
    loader_options = {
        key: value
        for key, value in (("feature", args.feature), ("period_seconds", args.period))
        if value is not None
    }
    overrides = {
        "channels": None if args.channels is None else _channel_list(args.channels),
        "dataset_options": {**base.get("dataset_options", {}), **loader_options}
        if loader_options
        else None,
        "dataset": args.dataset,
        "data_path": args.data,
        "window_length": args.window,
        "max_interpolated_periods": args.max_gap,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "seed": args.seed,
        "max_train_windows": args.max_train_windows,
    }
    return TrainConfig.model_validate(
        {**base, **{k: v for k, v in overrides.items() if v is not None}}
    )


def _train(args: argparse.Namespace) -> int:
    return ladder_cli.run_train(args, train_config(args))


def _channel_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _export(args: argparse.Namespace) -> int:
    code = ladder_cli.run_export(args)
    if code == 0:
        intervals_cli.after_export(args)
    return code


def _evaluate(args: argparse.Namespace) -> int:
    from tesla_gateway.contract.manifest import load_manifest
    from training.data import load_dataset, load_plain_csv
    from training.evaluate import evaluate_model_dir, evaluation_text

    manifest = load_manifest(args.model)
    if args.csv is not None:
        data = load_plain_csv(
            args.csv, feature=manifest.feature, period_seconds=manifest.period_seconds
        )
    else:
        data = load_dataset(args.dataset, args.data)
    evaluation = evaluate_model_dir(
        args.model,
        data,
        reference_uncertainty=args.reference_uncertainty,
        history_periods=args.history_periods,
    )
    if args.predictions is not None:
        evaluation.predictions.to_csv(args.predictions, index=False, float_format="%.4f")
    if args.json:
        print(json.dumps(evaluation.as_json()))
    else:
        print(evaluation_text(manifest, evaluation))
    return 0


def _default_models(args: argparse.Namespace) -> int:
    from training.defaults import DEFAULT_MODELS
    from training.model_dir import export_run
    from training.train import load_result, train

    for default in DEFAULT_MODELS:
        if args.only is not None and default.name != args.only:
            continue
        if args.annotate_only:
            from training.annotate import annotate_model_dir

            config = default.config.model_copy(update={"data_path": args.data})
            manifest = annotate_model_dir(args.out / default.name, config)
            print(json.dumps({"model": default.name, **_trust_fields(manifest)}, indent=2))
            # annotate refits split conformal intervals: across units again (folds reused)
            calibrated = intervals_cli.calibrate_default(
                args.out / default.name, args.data, args.runs
            )
            print(json.dumps(calibrated, indent=2))
            continue
        results = []
        for seed in default.seeds:
            config = default.config.model_copy(update={"data_path": args.data, "seed": seed})
            run_dir = args.runs / f"{default.name}-seed{seed}"
            finished = args.reuse_runs and (run_dir / "metrics.json").is_file()
            result = load_result(run_dir) if finished else train(config, run_dir)
            results.append(result)
            print(
                json.dumps(
                    {"model": default.name, "seed": seed, "validation": result.validation.rmse}
                )
            )
        best = min(results, key=lambda result: result.validation.rmse)
        exported = export_run(
            best.run_dir, args.out / default.name, name=default.name, targets=default.targets
        )
        calibrated = intervals_cli.calibrate_default(args.out / default.name, args.data, args.runs)
        print(json.dumps(calibrated, indent=2))
        print(
            json.dumps(
                {
                    "model": default.name,
                    "run": str(best.run_dir),
                    "validation": best.validation.model_dump(),
                    "test": best.test.model_dump(),
                    "parameters": exported.manifest.parameter_count,
                    "sizes": {k: v.size_bytes for k, v in exported.manifest.files.items()},
                    "verification": exported.verification.as_dict(),
                },
                indent=2,
            )
        )
    return 0


def _history_curve(args: argparse.Namespace) -> int:
    from tesla_gateway.contract.manifest import load_manifest
    from training.data import load_dataset
    from training.defaults import DEFAULT_MODELS
    from training.history_report import measure, table, write_report

    name = load_manifest(args.model).name
    targets = next((d.history_targets for d in DEFAULT_MODELS if d.name == name), ())
    points = None if args.points is None else tuple(int(k) for k in _channel_list(args.points))
    report = measure(
        args.model, load_dataset(args.dataset, args.data), points=points, baseline_dir=args.baseline
    )
    written = write_report(report, args.out, targets)
    print(table(report, targets))
    print(json.dumps({"written": [str(path) for path in written]}))
    return 0


def _trust_fields(manifest: Manifest) -> dict[str, object]:
    return {
        "validation": None
        if manifest.validation_baselines is None
        else manifest.validation_baselines.model_dump(),
        "intervals": None if manifest.intervals is None else manifest.intervals.model_dump(),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tesla-train", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train(sub)
    _add_export(sub)
    _add_evaluate(sub)
    _add_defaults(sub)
    _add_history_curve(sub)
    _add_release_commands(sub)
    bench_cli.add_parser(sub)
    intervals_cli.add_parser(sub)
    retrain_cli.add_parser(sub)
    days_check.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {
        "train": _train,
        "export": _export,
        "evaluate": _evaluate,
        "default-models": _default_models,
        "history-curve": _history_curve,
        "keygen": _keygen,
        "release": _release,
        "push": _push,
        "firmware-constants": _firmware_constants,
        "bench": bench_cli.run,
        "calibrate-intervals": intervals_cli.run,
        "retrain": retrain_cli.run,
        "days-check": days_check.run,
    }
    try:
        return handlers[args.command](args)
    except (TrainingError, GatewayError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
