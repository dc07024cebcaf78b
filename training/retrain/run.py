"""Champion/challenger retraining from the pairs a gateway recorded beside a reference.

``retrain(config, out_dir)``:

1. reads the champion model directory (its manifest fixes N, period, channels, architecture and
   version) and the recorded pairs of its feature (``inputs``);
2. holds back the most recent part of the pairs (a duration or a share of the recorded periods);
   the periods before it train the challenger, their most recent share selects its epoch;
3. trains the challenger: fine-tuned from the champion's Keras model when its run directory is
   given, else built fresh with the champion's architecture, on the pairs (and the original
   training data, when given) (``challenger``);
4. scores champion and challenger on the held-back period through the evaluate path (their float
   FlatBuffers in the gateway's calibrator, as served) on the same windows (``compare``);
5. accepts the challenger only if its RMSE beats the champion's by the configured margin; then
   exports it with the champion's version + 1, signs a release (given a key) and pushes it
   (given a broker).

Every input, figure and decision goes to ``report.json`` and ``report.md`` in the output
directory, also when the challenger is rejected or the run fails. Each step is the code the
``train``, ``export`` and ``evaluate`` commands run (run directory, representative set, export
and verification, manifest fields, scoring through the gateway's calibrator); this module only
decides what to feed them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import keras

from tesla_gateway.contract.manifest import (
    Manifest,
    ModelFile,
    Precision,
    TestMetrics,
    load_manifest,
    sha256_file,
    verify_model_files,
    write_manifest,
)
from tesla_gateway.errors import GatewayError
from training.errors import ExportVerificationError, RetrainError, TrainingError
from training.export import FLOAT_FILENAME, INT8_FILENAME, export_flatbuffers, export_float_graph
from training.model_dir import check_windows, representative_windows
from training.retrain.challenger import (
    Challenger,
    challenger_manifest,
    describe_challenger,
    train_challenger,
    with_files,
)
from training.retrain.compare import decide, describe_margin, score
from training.retrain.config import RetrainConfig
from training.retrain.data import iso
from training.retrain.inputs import Inputs, prepare
from training.retrain.report import RetrainReport
from training.train import TrainConfig, write_run

__all__ = ["RetrainResult", "retrain"]


@dataclass(frozen=True)
class RetrainResult:
    decision: Literal["accepted", "rejected"]
    reason: str
    out_dir: Path
    report: RetrainReport
    model_dir: Path | None
    release_dir: Path | None
    topic: str | None

    @property
    def accepted(self) -> bool:
        return self.decision == "accepted"


def retrain(config: RetrainConfig, out_dir: Path, *, verbose: int | str = 0) -> RetrainResult:
    """Train, compare and (if better) release a challenger; the report is written in any case."""
    if out_dir.exists() and any(out_dir.iterdir()):
        raise RetrainError(f"{out_dir} is not empty; each retraining run needs its own directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    report = RetrainReport(
        created_at=iso(datetime.now(UTC).timestamp()), config=config.model_dump(mode="json")
    )
    try:
        return _retrain(config, out_dir, report, verbose)
    except (TrainingError, GatewayError) as exc:
        report.failed(exc)
        report.write(out_dir)
        raise


def _retrain(
    config: RetrainConfig, out_dir: Path, report: RetrainReport, verbose: int | str
) -> RetrainResult:
    """The stages in order; each returns its result and the report section it fills."""
    if config.key is not None:
        from training.release import load_private_key

        load_private_key(config.key)  # a bad key fails now, not after training
    inputs = prepare(config, report)
    challenger = train_challenger(config, inputs, verbose)
    report.challenger = describe_challenger(config, inputs, challenger)
    manifest = challenger_manifest(config, inputs, challenger)
    comparison = score(config, inputs, challenger, manifest, out_dir)
    report.figures = comparison.figures()

    champion_rmse = comparison.scores["champion"].rmse
    challenger_rmse = comparison.scores["challenger"].rmse
    accepted, reason = decide(champion_rmse, challenger_rmse, config.margin, config.min_improvement)
    report.margin = describe_margin(config, champion_rmse, challenger_rmse)
    report.decision = "accepted" if accepted else "rejected"
    report.reason = reason

    test = TestMetrics(
        raw=comparison.scores["raw"],
        linear=comparison.scores["linear"],
        model=comparison.scores["challenger"],
    )
    run_dir = out_dir / "run"
    _save_run(run_dir, inputs, challenger, manifest, test)
    report.challenger["run_dir"] = str(run_dir)
    model_dir: Path | None = None
    if accepted:
        model_dir = out_dir / "model"
        exported = _export(
            challenger.model,
            model_dir,
            manifest=manifest,
            inputs=inputs,
            test=test,
            target=config.target,
        )
        released_sha256 = sha256_file(model_dir / FLOAT_FILENAME)
        report.challenger.update(
            export=exported,
            model_dir=str(model_dir),
            float32_sha256=released_sha256,
            float32_is_the_evaluated_file=released_sha256 == comparison.evaluated_sha256,
        )
        report.release = _release(config, model_dir, out_dir / "release")
    report.write(out_dir)
    release = report.release
    return RetrainResult(
        decision="accepted" if accepted else "rejected",
        reason=reason,
        out_dir=out_dir,
        report=report,
        model_dir=model_dir,
        release_dir=Path(release["path"]) if release else None,
        topic=release["topic"] if release else None,
    )


def _save_run(
    run_dir: Path,
    inputs: Inputs,
    challenger: Challenger,
    manifest: Manifest,
    test: TestMetrics,
) -> None:
    """A run directory in ``train``'s layout, so the next retraining can fine-tune from it."""
    write_run(
        run_dir,
        config=TrainConfig(
            dataset="pairs",
            data_path=inputs.pairs.directory,
            window_length=inputs.window_length,
            max_interpolated_periods=inputs.champion.gap_policy.max_interpolated_periods,
            channels=inputs.channels,
            model=challenger.model_config,
            epochs=int(manifest.hyperparameters["epochs"]),
            batch_size=challenger.batch_size,
            learning_rate=challenger.learning_rate,
            seed=int(manifest.hyperparameters["seed"]),
            input_scale=inputs.champion.input_scale,
        ),
        model=challenger.model,
        history=challenger.history,
        validation=challenger.validation,
        test=test,
        linear=challenger.linear,
        input_scale=inputs.champion.input_scale,
        summary=manifest.data,
        input_range=manifest.input_range,
    )


def _export(
    model: keras.Model,
    model_dir: Path,
    *,
    manifest: Manifest,
    inputs: Inputs,
    test: TestMetrics,
    target: Literal["gateway", "node"],
) -> dict[str, Any]:
    """Both FlatBuffers, verified, and the manifest last (as ``export_run`` does).

    A gateway runs only the float graph: when the device graph fails its verification (its
    bound is a share of the model's own error, tight for an accurate challenger), a gateway
    release ships the verified float graph alone and the report says why. A node release needs
    the device graph, so there the failure stands.
    """
    # The integer graph's ranges also see the highest held-back readings: a drifting sensor
    # reads beyond the training range (inputs only, no reference, so nothing about the score
    # leaks into the model).
    representative = representative_windows(inputs.sets.train, inputs.holdout)
    check, check_reference = check_windows(inputs.holdout)
    described: dict[str, Any] = {"device_graph": "verified"}
    absent: str | None = None
    try:
        exported = export_flatbuffers(model, model_dir, representative, check, check_reference)
        files: dict[Precision, ModelFile] = dict(exported.files)
        described["verification"] = exported.verification.as_dict()
    except ExportVerificationError as exc:
        if target == "node":
            raise
        (model_dir / INT8_FILENAME).unlink(missing_ok=True)
        files = {"float32": export_float_graph(model, model_dir, check)}
        described["device_graph"] = absent = f"left out (gateway release): {exc}"
    write_manifest(model_dir, with_files(manifest, files, test, device_graph_absent=absent))
    verify_model_files(model_dir, load_manifest(model_dir))
    described["files"] = sorted(files)
    return described


def _release(config: RetrainConfig, model_dir: Path, release_dir: Path) -> dict[str, Any] | None:
    if config.key is None:
        return None
    from tesla_gateway.ota.release import key_id
    from training.release import build_release, load_private_key, push_release

    build_release(model_dir, config.target, config.key, release_dir)
    public = bytes(load_private_key(config.key).verify_key)
    described: dict[str, Any] = {
        "path": str(release_dir),
        "target": config.target,
        "key_id": key_id(public),
        "signed": True,
        "topic": None,
        "pushed": False,
    }
    if config.push is not None:
        described["topic"] = push_release(
            release_dir, config.push, topic_prefix=config.topic_prefix
        )
        described["pushed"] = True
        described["broker"] = f"{config.push.host}:{config.push.port}"
    return described
