"""Champion/challenger retraining on recorded pairs: a sensor whose gain changed after training.

The champion is a tiny TESLA trained on synthetic co-location data; the pairs come from another
synthetic unit whose readings are multiplied by ``DRIFT_GAIN`` (the gain change the champion never
saw). A challenger trained on those pairs must then beat the champion clearly on the held-back
period, while a margin it cannot meet must reject it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from devkit.broker import Mosquitto
from tesla_gateway.contract.manifest import load_manifest, verify_model_files
from tesla_gateway.mqtt.config import MqttBrokerConfig
from tesla_gateway.ota.release import verify_release
from tests.gateway.io.helpers import Collector
from training.data import generate_synthetic
from training.errors import FeatureMismatchError, HoldoutError, NoPairsError, RetrainError
from training.model_dir import export_run
from training.models import TeslaConfig
from training.release import ReleaseError, keygen
from training.retrain.compare import decide
from training.retrain.config import RetrainConfig
from training.retrain.data import HoldBack
from training.retrain.run import retrain
from training.train import TrainConfig, train

HEADER = "timestamp,sensor_id,raw,reference,calibrated,model_version,rh,temp_c"
DRIFT_GAIN = 2.0
CHAMPION_VERSION = 3
SYNTHETIC: dict[str, int | float | str] = {
    "n_sensors": 4,
    "days": 1,
    "period_seconds": 60,
    "seed": 3,
}


def train_champion(root: Path, **config: object) -> tuple[Path, Path]:
    """(model directory, run directory) of a tiny TESLA, exported as version 3."""
    train(
        TrainConfig.model_validate(
            {
                "dataset": "synthetic",
                "dataset_options": SYNTHETIC,
                "window_length": 32,
                "max_interpolated_periods": 5,
                "model": TeslaConfig(d_model=8, heads=2),
                "batch_size": 64,
                "learning_rate": 3e-3,
                **config,
            }
        ),
        root / "run",
        verbose=0,
    )
    export_run(
        root / "run", root / "model", name="pm2_5-test", version=CHAMPION_VERSION, force=True
    )
    return root / "model", root / "run"


@pytest.fixture(scope="module")
def champion(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return train_champion(tmp_path_factory.mktemp("champion"), epochs=4)


@pytest.fixture(scope="module")
def young_champion(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A champion trained for short histories too, whose manifest calibrates young sensors."""
    model_dir, run_dir = train_champion(
        tmp_path_factory.mktemp("young"),
        epochs=3,
        partial_history_fraction=0.5,
        partial_history_epochs=1,
    )
    # Too tiny to beat the line on a few periods, it would calibrate from a full window only: its
    # manifest is made to claim one period (the curve stays its own), as a default's does.
    path = model_dir / "manifest.json"
    document = json.loads(path.read_text())
    assert document["history_curve"]
    document["min_history_periods"] = 1
    path.write_text(json.dumps(document))
    return model_dir, run_dir


def write_pairs(
    directory: Path,
    *,
    gain: float = DRIFT_GAIN,
    seed: int = 9,
    rows_per_file: int = 500,
    torn_tail: bool = True,
) -> Path:
    """One synthetic unit's day as the gateway writes it: size-rotated files, a torn last line."""
    data = generate_synthetic(n_sensors=1, days=1, period_seconds=60, seed=seed)
    frame = data.frame.dropna(subset=["reference"]).reset_index(drop=True)
    stamps = frame["timestamp"].dt.strftime("%Y-%m-%dT%H:%M:%SZ").tolist()
    raw = (frame["raw"] * gain).tolist()
    reference = frame["reference"].tolist()
    rh = frame["rh"].tolist()
    lines = [
        f"{stamp},node-7,{r:.4f},{ref:.4f},{ref + 5:.4f},{CHAMPION_VERSION},{h:.2f},"
        for stamp, r, ref, h in zip(stamps, raw, reference, rh, strict=True)
    ]
    directory.mkdir(parents=True, exist_ok=True)
    day = stamps[0][:10].replace("-", "")
    for part, start in enumerate(range(0, len(lines), rows_per_file)):
        name = f"pairs-{day}.csv" if part == 0 else f"pairs-{day}-{part}.csv"
        chunk = lines[start : start + rows_per_file]
        (directory / name).write_text("\n".join([HEADER, *chunk]) + "\n", encoding="ascii")
    if torn_tail:
        with (directory / name).open("a", encoding="ascii") as handle:
            handle.write(lines[-1][:25])  # the writer died mid-row
    return directory


@pytest.fixture(scope="module")
def pairs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pairs(tmp_path_factory.mktemp("state") / "pairs" / "pm2_5")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory):
    return keygen(tmp_path_factory.mktemp("keys"))


@pytest.mark.slow
def test_accepts_a_better_challenger_signs_and_pushes_it(
    champion: tuple[Path, Path], pairs_dir: Path, keys, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    model_dir, run_dir = champion
    collector = Collector(mosquitto, ["tesla/releases/#"])
    try:
        result = retrain(
            RetrainConfig(
                champion=model_dir,
                pairs=pairs_dir,
                champion_run=run_dir,
                holdout=HoldBack.model_validate("6h"),
                margin=0.2,
                key=keys.private_path,
                push=MqttBrokerConfig(host=mosquitto.host, port=mosquitto.port),
                epochs=8,
                batch_size=64,
                learning_rate=3e-3,
            ),
            tmp_path / "out",
        )
        assert result.accepted, result.reason
        topic = "tesla/releases/gateway/pm2_5-test"
        assert result.topic == topic
        collector.wait_for(lambda messages: any(m.topic == topic for m in messages))
    finally:
        collector.close()

    # The challenger: version + 1, verified files, test figures on the held-back period.
    assert result.model_dir is not None
    manifest = load_manifest(result.model_dir)
    verify_model_files(result.model_dir, manifest)
    assert manifest.version == CHAMPION_VERSION + 1
    assert manifest.name == "pm2_5-test"
    assert manifest.window_length == 32
    assert manifest.hyperparameters["retrain_mode"] == "finetune"
    assert manifest.hyperparameters["retrained_from"] == CHAMPION_VERSION
    assert set(manifest.files) == {"float32", "int8"}
    # The challenger's own comparison and intervals, on its validation period.
    assert manifest.validation_baselines is not None and manifest.intervals is not None
    assert manifest.target_range is not None  # its training pairs' reference values
    assert manifest.target_range.min <= manifest.target_range.p50 <= manifest.target_range.max
    assert manifest.validation_baselines.model.rmse == pytest.approx(manifest.validation.rmse)
    assert manifest.device_graph_absent is None

    # The release verifies against the public key as a gateway running the champion would.
    assert result.release_dir is not None
    public = bytes.fromhex(keys.public_path.read_text(encoding="ascii"))
    verified = verify_release(
        result.release_dir, public, running_version=CHAMPION_VERSION, target="gateway"
    )
    assert verified.manifest.version == CHAMPION_VERSION + 1

    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["decision"] == "accepted"
    assert report["champion"]["version"] == CHAMPION_VERSION
    assert report["challenger"]["version"] == CHAMPION_VERSION + 1
    assert report["challenger"]["mode"] == "finetune"
    assert report["challenger"]["float32_is_the_evaluated_file"] is True
    pairs = report["data"]["pairs"]
    assert pairs["files"] == ["pairs-20210104.csv", "pairs-20210104-1.csv", "pairs-20210104-2.csv"]
    assert pairs["truncated_lines_skipped"] == 1
    assert pairs["sensors"] == ["node-7"]
    assert report["data"]["periods"]["held_back"].endswith("2021-01-04T23:59:00Z")
    assert report["data"]["periods"]["held_back"].startswith("2021-01-04T18:00:00Z")
    figures = report["figures"]
    # The same windows for both models; the drifted champion is far off, the challenger is not.
    assert figures["champion"]["n"] == figures["challenger"]["n"] == figures["raw"]["n"] > 100
    assert figures["challenger"]["rmse"] <= 0.8 * figures["champion"]["rmse"]
    assert figures["raw"]["rmse"] > figures["champion"]["rmse"]
    assert figures["recorded_by_gateway"]["all"]["rmse"] == pytest.approx(5.0, abs=1e-3)
    assert set(figures["recorded_by_gateway"]["by_model_version"]) == {str(CHAMPION_VERSION)}
    assert report["margin"]["relative"] == 0.2
    assert report["margin"]["required_rmse"] == pytest.approx(0.8 * figures["champion"]["rmse"])
    assert report["release"]["topic"] == topic
    assert report["release"]["pushed"] is True
    assert report["release"]["key_id"] == keys.key_id
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "ACCEPTED" in markdown
    assert topic in markdown
    predictions = pd.read_csv(tmp_path / "out" / "holdout_predictions.csv")
    assert len(predictions) == figures["n"]
    rmse = float(np.sqrt(np.mean((predictions["challenger"] - predictions["reference"]) ** 2)))
    assert rmse == pytest.approx(figures["challenger"]["rmse"], rel=1e-3)
    # The run directory can seed the next round of fine-tuning.
    assert (tmp_path / "out" / "run" / "model.keras").is_file()
    assert json.loads((tmp_path / "out" / "run" / "config.json").read_text())["dataset"] == "pairs"


@pytest.mark.slow
def test_rejects_a_challenger_short_of_the_margin_through_the_cli(
    champion: tuple[Path, Path], pairs_dir: Path, keys, tmp_path: Path
) -> None:
    """Fresh challenger on pairs + the original data; a 95 % margin cannot be met."""
    model_dir, _ = champion
    config = tmp_path / "retrain.json"
    config.write_text(json.dumps({"dataset_options": SYNTHETIC, "max_original_windows": 500}))
    completed = subprocess.run(
        [
            sys.executable, "-m", "training", "retrain",
            "--champion", str(model_dir), "--pairs", str(pairs_dir), "--out", str(tmp_path / "out"),
            "--config", str(config), "--dataset", "synthetic", "--mode", "fresh",
            "--holdout", "25%", "--margin", "0.95", "--since", "2021-01-04T02:00:00Z",
            "--epochs", "3", "--batch-size", "64", "--learning-rate", "0.003",
            "--key", str(keys.private_path),
        ],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    summary = json.loads(completed.stdout[completed.stdout.index("{") :])
    assert summary["decision"] == "rejected"
    assert summary["model_dir"] is None and summary["release"] is None
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["decision"] == "rejected"
    assert "required" in report["reason"]
    assert report["challenger"]["mode"] == "fresh"
    assert report["challenger"]["architecture"] == "tesla"
    assert report["data"]["original"]["dataset"] == "synthetic"
    assert report["data"]["since"] == "2021-01-04T02:00:00+00:00"
    assert report["data"]["pairs"]["first"] == "2021-01-04T02:00:00Z"
    assert report["data"]["pairs"]["cleaning"]["rows_dropped"]["pairs:before_since"] > 100
    assert report["data"]["windows"]["train_original"] == 500
    assert report["figures"]["challenger"]["rmse"] > 0.05 * report["figures"]["champion"]["rmse"]
    assert report["release"] is None
    assert not (tmp_path / "out" / "model").exists()
    assert not (tmp_path / "out" / "release").exists()
    assert "REJECTED" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("share", [None, 0.0])
def test_a_challenger_claims_only_the_short_histories_it_was_measured_on(
    young_champion: tuple[Path, Path], pairs_dir: Path, share: float | None, tmp_path: Path
) -> None:
    """The champion calibrates from a few periods. Its challenger is trained for short histories
    too (by default) and its manifest carries its own curve, measured on its validation pairs;
    trained on whole windows only, it claims nothing and a gateway waits for a full window.
    Never the champion's figures, which describe another model."""
    model_dir, run_dir = young_champion
    champion = load_manifest(model_dir)
    assert champion.min_history_periods is not None and champion.min_history_periods < 32
    assert champion.history_curve is not None
    result = retrain(
        RetrainConfig(
            champion=model_dir,
            pairs=pairs_dir,
            champion_run=run_dir,
            holdout=HoldBack.model_validate("6h"),
            margin=0.0,
            epochs=3,
            batch_size=64,
            learning_rate=3e-3,
            partial_history_fraction=share,
        ),
        tmp_path / "out",
    )
    assert result.accepted, result.reason
    assert result.model_dir is not None
    manifest = load_manifest(result.model_dir)
    # the champion's epochs and seed describe its training: a recalibration must not use them
    assert champion.trained_epochs is not None and manifest.trained_epochs is None
    if share == 0.0:
        assert manifest.min_history_periods is None
        assert manifest.history_curve is None and manifest.history_intervals is None
        assert manifest.calibrates_from == 32
        return
    assert manifest.history_curve is not None and manifest.history_intervals is not None
    assert manifest.min_history_periods is not None
    assert manifest.history_curve != champion.history_curve  # measured on the challenger
    whole = manifest.history_curve[-1]
    assert whole.periods == 32
    assert whole.model.rmse == pytest.approx(manifest.validation.rmse, rel=1e-3)


# Errors found before any training: cheap, specific, written to the report.


def _config(champion: tuple[Path, Path], pairs: Path, **extra: object) -> RetrainConfig:
    return RetrainConfig.model_validate({"champion": champion[0], "pairs": pairs, **extra})


@pytest.mark.slow
def test_missing_and_empty_pairs(champion: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(NoPairsError, match="does not exist"):
        retrain(_config(champion, tmp_path / "nowhere" / "pm2_5"), tmp_path / "a")
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["decision"] == "error"
    assert report["reason"].startswith("NoPairsError")
    (tmp_path / "state" / "pm2_5").mkdir(parents=True)
    with pytest.raises(NoPairsError, match="no pairs-YYYYMMDD"):
        retrain(_config(champion, tmp_path / "state" / "pm2_5"), tmp_path / "b")


@pytest.mark.slow
def test_pairs_of_another_feature(champion: tuple[Path, Path], tmp_path: Path) -> None:
    pm10 = write_pairs(tmp_path / "pairs" / "pm10", rows_per_file=2000)
    with pytest.raises(FeatureMismatchError, match=r"calibrates pm2_5: .* holds pm10 pairs"):
        retrain(_config(champion, pm10), tmp_path / "out")


@pytest.mark.slow
def test_pairs_off_the_champions_grid(champion: tuple[Path, Path], tmp_path: Path) -> None:
    directory = tmp_path / "pm2_5"
    directory.mkdir()
    rows = [f"2021-01-04T00:{minute:02d}:30Z,a,10,8,,,," for minute in range(40)]
    (directory / "pairs-20210104.csv").write_text("\n".join([HEADER, *rows]) + "\n")
    with pytest.raises(FeatureMismatchError, match="do not start a 60 s period"):
        retrain(_config(champion, directory), tmp_path / "out")


@pytest.mark.slow
def test_too_few_pairs_for_the_held_back_period(
    champion: tuple[Path, Path], pairs_dir: Path, tmp_path: Path
) -> None:
    # 20 minutes held back cannot give 30 windows.
    with pytest.raises(HoldoutError, match=r"only \d+ window\(s\) of N=32 .* held-back period"):
        retrain(_config(champion, pairs_dir, holdout="20m"), tmp_path / "a")
    # Holding back (almost) everything leaves nothing to train on.
    with pytest.raises(HoldoutError, match="training window"):
        retrain(_config(champion, pairs_dir, holdout="0.99", min_holdout_windows=1), tmp_path / "b")
    assert json.loads((tmp_path / "b" / "report.json").read_text())["decision"] == "error"
    with pytest.raises(HoldoutError, match=r"no pair .* starts at or after 2021-01-05T00:00:00Z"):
        retrain(_config(champion, pairs_dir, since="2021-01-05T00:00:00"), tmp_path / "c")


@pytest.mark.slow
def test_bad_key_and_used_output_directory(
    champion: tuple[Path, Path], pairs_dir: Path, tmp_path: Path
) -> None:
    key = tmp_path / "key"
    key.write_text("not a key")
    key.chmod(0o600)
    with pytest.raises(ReleaseError, match="not a hex private key"):
        retrain(_config(champion, pairs_dir, key=key), tmp_path / "a")
    with pytest.raises(RetrainError, match="not empty"):
        retrain(_config(champion, pairs_dir), tmp_path / "a")


def test_configuration_checks(tmp_path: Path) -> None:
    base = {"champion": tmp_path, "pairs": tmp_path}
    with pytest.raises(ValidationError, match="pushing needs a signed release"):
        RetrainConfig.model_validate({**base, "push": {"host": "h", "port": 1883}})
    with pytest.raises(ValidationError, match="needs the champion's run directory"):
        RetrainConfig.model_validate({**base, "mode": "finetune"})
    with pytest.raises(ValidationError, match="held-back period 'soon'"):
        RetrainConfig.model_validate({**base, "holdout": "soon"})
    with pytest.raises(ValidationError, match=r"must lie in \(0, 1\)"):
        RetrainConfig.model_validate({**base, "holdout": "1.5"})


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("12h", "duration", 43_200),
        ("7d", "duration", 604_800),
        ("90m", "duration", 5_400),
        ("3600s", "duration", 3_600),
        ("0.2", "fraction", 0.2),
        ("20%", "fraction", 0.2),
        (0.25, "fraction", 0.25),
    ],
)
def test_held_back_period_notation(text: str | float, kind: str, value: float) -> None:
    holdout = HoldBack.model_validate(text)
    assert holdout.kind == kind
    assert holdout.value == pytest.approx(value)


def test_decision_rule() -> None:
    assert decide(10.0, 8.9, margin=0.1, min_improvement=0.0)[0]
    assert not decide(10.0, 9.1, margin=0.1, min_improvement=0.0)[0]
    assert not decide(10.0, 8.9, margin=0.1, min_improvement=1.5)[0]  # both must hold
    assert decide(10.0, 8.5, margin=0.1, min_improvement=1.5)[0]
    assert not decide(10.0, 10.0, margin=0.0, min_improvement=0.0)[0]  # a tie keeps the champion
    accepted, reason = decide(10.0, 5.0, margin=0.2, min_improvement=0.0)
    assert accepted and "5.000 <= 8.000 required" in reason


@pytest.mark.slow
def test_a_gateway_release_keeps_the_float_graph_when_the_device_graph_fails(
    champion: tuple[Path, Path], pairs_dir: Path, keys, tmp_path: Path, monkeypatch
) -> None:
    """The device graph's bound is a share of the model's own error; the gateway never runs it."""
    import training.retrain.run as retrain_module
    from training.errors import ExportVerificationError

    def failing_export(*_args: object, **_kwargs: object) -> None:
        raise ExportVerificationError("the integer FlatBuffer deviates (test)")

    monkeypatch.setattr(retrain_module, "export_flatbuffers", failing_export)
    model_dir, run_dir = champion
    base = {
        "champion": model_dir,
        "pairs": pairs_dir,
        "champion_run": run_dir,
        "margin": 0.2,
        "epochs": 4,
        "batch_size": 64,
        "learning_rate": 3e-3,
        "key": keys.private_path,
    }
    result = retrain(RetrainConfig.model_validate(base), tmp_path / "gateway")
    assert result.accepted and result.model_dir is not None
    manifest = load_manifest(result.model_dir)
    assert set(manifest.files) == {"float32"}
    assert not (result.model_dir / "model_int8.tflite").exists()
    assert manifest.device_graph_absent == (
        "left out (gateway release): the integer FlatBuffer deviates (test)"
    )
    verify_model_files(result.model_dir, manifest)
    assert result.report.as_json()["challenger"]["export"]["device_graph"].startswith("left out")
    assert "device graph: left out" in (tmp_path / "gateway" / "report.md").read_text()

    # A node runs nothing but the device graph: there the failure stands, and is reported.
    with pytest.raises(ExportVerificationError):
        retrain(RetrainConfig.model_validate({**base, "target": "node"}), tmp_path / "node")
    report = json.loads((tmp_path / "node" / "report.json").read_text())
    assert report["decision"] == "error"
    assert report["comparison"]["decision"] == "accepted"


def test_push_takes_the_gateways_broker_config(tmp_path: Path) -> None:
    """The broker is described as the gateway describes it (protocol, TLS, password file)."""
    key = tmp_path / "key"
    config = RetrainConfig.model_validate(
        {
            "champion": tmp_path,
            "pairs": tmp_path,
            "key": key,
            "push": {
                "host": "broker.local",
                "port": 8883,
                "protocol": "3.1.1",
                "username": "ci",
                "password_file": tmp_path / "secret",
                "tls": {"ca_file": tmp_path / "ca.pem"},
            },
        }
    )
    assert isinstance(config.push, MqttBrokerConfig)
    assert config.push.tls is not None and config.push.tls.ca_file == tmp_path / "ca.pem"
    (tmp_path / "secret").write_text("s3cret\nignored\n")
    password = config.push.resolve_password()
    assert password is not None and password.get_secret_value() == "s3cret"
    with pytest.raises(ValidationError, match="a password needs a username"):
        RetrainConfig.model_validate(
            {
                "champion": tmp_path,
                "pairs": tmp_path,
                "key": key,
                "push": {"host": "h", "port": 1883, "password_file": tmp_path / "secret"},
            }
        )


def test_a_failed_run_reports_how_far_it_got(tmp_path: Path) -> None:
    """The report is typed: sections stay out until their stage ran; a later failure keeps the
    decision it overturned."""
    from training.retrain.report import RetrainReport

    report = RetrainReport(created_at="2021-01-04T00:00:00Z", config={"margin": 0.05})
    report.champion = {"name": "pm2_5", "version": 3}
    report.failed(HoldoutError("too few windows"))
    document = report.as_json()
    assert document["decision"] == "error"
    assert document["reason"] == "HoldoutError: too few windows"
    assert "release" not in document and "figures" not in document
    assert "comparison" not in document

    report = RetrainReport(created_at="2021-01-04T00:00:00Z", config={})
    report.decision, report.reason = "accepted", "challenger RMSE 1.0 <= 2.0 required"
    assert report.as_json()["release"] is None  # decided, nothing released (no key)
    report.failed(RetrainError("push refused"))
    report.write(tmp_path)
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["comparison"] == {
        "decision": "accepted",
        "reason": "challenger RMSE 1.0 <= 2.0 required",
    }
    assert "ERROR" in (tmp_path / "report.md").read_text()
