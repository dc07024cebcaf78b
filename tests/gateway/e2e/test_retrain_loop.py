"""The closed retraining loop on loopback: drift detected → pairs recorded → retrain → a better,
signed challenger pushed over MQTT → the gateway hot-reloads it → the rolling error falls.

Real: the training pipeline (a tiny TESLA trained on synthetic co-location data and exported with
its verified FlatBuffers), mosquitto, the daemon (``python -m tesla_gateway run`` with ``[ota]``, a
reference station and drift tracking), and ``python -m training retrain`` as an operator runs it.
The replayed sensor is another synthetic unit; from period ``DRIFT_AT`` on its gain is
multiplied by ``GAIN`` (the champion never saw that), while the reference keeps the truth.
Expected errors are computed by the test with LiteRT on the windows it sends.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from devkit.broker import Mosquitto
from tesla_gateway.contract.manifest import load_manifest
from tesla_gateway.ota.install import install_release
from tesla_gateway.ota.release import verify_release
from tests.gateway.e2e.harness import (
    PREFIX,
    Calibrated,
    Daemon,
    MqttNodes,
    iso,
    litert_expected,
    wait_for,
    write_config,
)
from training.data import generate_synthetic, read_pairs
from training.model_dir import export_run
from training.models import TeslaConfig
from training.release import build_release, keygen
from training.train import TrainConfig, train

pytestmark = pytest.mark.slow

P = 60  # seconds per period
N = 16  # window length of the champion
NAME = "pm10-loop"
CHAMPION_VERSION = 3
GAIN = 3.0  # the sensor's gain change, unseen in training
DRIFT_AT = N + 30  # first drifted period: the champion is judged on 31 good pairs first
PHASE_A = DRIFT_AT + 420  # periods replayed before retraining
TOTAL = PHASE_A + 60  # then 60 periods served by the challenger
OFFSET = 360  # the replay starts at 06:00 of the synthetic day: the pairs span the morning peak
SENSOR = "drifty"
REFERENCE = "ref-1"
WINDOW_PAIRS = 30
MIN_PAIRS = 15
CLEAR_FRACTION = 0.8


def train_champion(root: Path) -> tuple[Path, Path]:
    """A tiny TESLA through the real pipeline: (model directory v3, run directory)."""
    config = TrainConfig(
        dataset="synthetic",
        dataset_options={"n_sensors": 4, "days": 1, "period_seconds": P, "seed": 3,
                         "feature": "pm10"},
        window_length=N,
        max_interpolated_periods=2,
        # "pre" keeps a linear path from readings to output, which int8 export preserves.
        model=TeslaConfig(d_model=8, heads=2, norm_position="pre"),
        epochs=4,
        batch_size=64,
        learning_rate=3e-3,
    )  # fmt: skip
    train(config, root / "run", verbose=0)
    export_run(root / "run", root / "champion", name=NAME, version=CHAMPION_VERSION, force=True)
    return root / "champion", root / "run"


def replay_series() -> tuple[np.ndarray, np.ndarray]:
    """(raw as the sensor sends it, reference) per period: gain × GAIN from DRIFT_AT on."""
    data = generate_synthetic(
        n_sensors=1, days=2, period_seconds=P, seed=21, feature="pm10", dropout_rate_per_day=0
    )
    frame = data.frame.iloc[OFFSET : OFFSET + TOTAL]
    assert len(frame) == TOTAL
    raw = frame["raw"].to_numpy(dtype=np.float64)
    raw = np.where(np.arange(TOTAL) >= DRIFT_AT, raw * GAIN, raw).round(3)
    return raw, frame["reference"].to_numpy(dtype=np.float64).round(3)


def rmse(a: np.ndarray, b: np.ndarray) -> float:
    keep = np.isfinite(a) & np.isfinite(b)
    return float(np.sqrt(np.mean((a[keep] - b[keep]) ** 2)))


def loop_config(broker: Mosquitto, public_key: Path, threshold: float) -> str:
    return f"""
[ota]
public_key_file = "{public_key}"

[health]
publish_interval_s = 0.5

[drift]
window_pairs = {WINDOW_PAIRS}
min_pairs = {MIN_PAIRS}
rmse_abs = {threshold:.4f}
rmse_ratio = 0.0
clear_fraction = {CLEAR_FRACTION}

[pairs]
reference_grace_s = 0.5

[[references]]
name = "{REFERENCE}"
feature = "pm10"
colocated_with = ["{SENSOR}"]
[references.mqtt]
topics = ["reference/{REFERENCE}"]
[references.mqtt.broker]
port = {broker.port}
reconnect_initial_s = 0.05
reconnect_max_s = 0.5
"""


def send(nodes: MqttNodes, base: int, raw: np.ndarray, reference: np.ndarray, span: range) -> None:
    """The sensor's and the reference's readings of ``span``, as JSON batches."""
    for first in range(span.start, span.stop, 100):
        chunk = range(first, min(first + 100, span.stop))
        nodes.send_raw(
            f"sensors/{SENSOR}/raw",
            json.dumps([{"ts": base + p * P + 2, "pm10": raw[p]} for p in chunk]).encode(),
        )
        refs = [
            {"ts": base + p * P + 5, "pm10": reference[p]}
            for p in chunk
            if np.isfinite(reference[p])
        ]
        nodes.send_raw(f"reference/{REFERENCE}", json.dumps(refs).encode())


def drift_events(calibrated: Calibrated) -> list[dict[str, Any]]:
    return [
        json.loads(payload) for payload in calibrated.collector.on(f"{PREFIX}/{SENSOR}/pm10/drift")
    ]


def rolling_errors(calibrated: Calibrated, version: int) -> list[float]:
    """The rolling RMSE vs the reference in the sensor's health messages under ``version``."""
    found = []
    for payload in calibrated.collector.on(f"{PREFIX}/{SENSOR}/pm10/health"):
        health = json.loads(payload)
        rolling = health.get("reference") or {}
        if health.get("model_version") == version and rolling.get("rmse") is not None:
            found.append(float(rolling["rmse"]))
    return found


def pair_rows(pairs_dir: Path) -> list[list[str]]:
    rows: list[list[str]] = []
    for path in sorted(pairs_dir.glob("pairs-*.csv")):
        rows += [line.split(",") for line in path.read_text(encoding="ascii").splitlines()[1:]]
    return rows


def test_drift_retrain_release_reload_closes_the_loop(
    tmp_path: Path, mosquitto: Mosquitto, daemons: list[Daemon]
) -> None:
    champion_dir, run_dir = train_champion(tmp_path / "training")
    keys = keygen(tmp_path / "keys")
    public = bytes.fromhex(keys.public_path.read_text(encoding="ascii"))
    # The daemon can write its model directory, so it trusts it through a signed release only:
    # the champion is installed as an operator would, from its own release.
    model_dir = tmp_path / "model"
    first_release = build_release(
        champion_dir, "gateway", keys.private_path, tmp_path / "release-v3"
    )
    install_release(verify_release(first_release, public, None), model_dir, "pm10")
    champion = model_dir / "current"  # the slot the gateway serves (tesla_gateway/models/slots.py)

    # What the champion makes of the replay, computed here with LiteRT on the windows sent.
    raw, reference = replay_series()
    ends = np.arange(N - 1, TOTAL)
    windows = np.stack([raw[end - N + 1 : end + 1] for end in ends]).astype(np.float32)
    champion_out = np.full(TOTAL, np.nan)
    champion_out[ends] = litert_expected(champion, windows)
    before = rmse(champion_out[N - 1 : DRIFT_AT], reference[N - 1 : DRIFT_AT])
    after = rmse(champion_out[DRIFT_AT + N : PHASE_A], reference[DRIFT_AT + N : PHASE_A])
    assert after > 2.5 * before, (before, after)  # precondition: the gain change matters
    threshold = float(np.sqrt(before * after))  # drift between the two regimes

    config = write_config(tmp_path, mosquitto, model_dir)
    with config.open("a", encoding="utf-8") as out:
        out.write(loop_config(mosquitto, keys.public_path, threshold))
    calibrated = Calibrated(mosquitto)
    nodes = MqttNodes(mosquitto)
    state = tmp_path / "state"
    pairs_dir = state / "pairs" / "pm10"
    try:
        daemons.append(Daemon(config, state))
        daemon = daemons[-1]
        wait_for(
            lambda: daemon.status().get("references_connected", {}).get(REFERENCE),
            "the reference subscription",
        )
        base = (int(time.time()) // P - TOTAL - 5) * P  # replayed, recent past

        # 1. The champion serves the sensor; its gain changes; the gateway raises a drift.
        send(nodes, base, raw, reference, range(PHASE_A))
        raised = wait_for(
            lambda: next((e for e in drift_events(calibrated) if e["drift"]), None),
            "the drift event",
        )
        assert raised["change"] == "raised"
        assert raised["model_version"] == CHAMPION_VERSION
        assert raised["rmse"] > threshold
        assert raised["period_start"] >= iso(base + DRIFT_AT * P)
        assert drift_events(calibrated)[0]["change"] == "confirmed_clear"  # fine before

        # 2. Every pair of phase A is recorded.
        expected_pairs = int(np.isfinite(reference[:PHASE_A]).sum())
        wait_for(
            lambda: pairs_dir.is_dir() and len(pair_rows(pairs_dir)) == expected_pairs,
            "the pairs of phase A",
        )

        # 3. Retrain on the pairs since the drift; release and push only if clearly better.
        out_dir = tmp_path / "retrain"
        completed = subprocess.run(
            [
                sys.executable, "-m", "training", "retrain",
                "--champion", str(champion), "--champion-run", str(run_dir),
                "--pairs", str(pairs_dir), "--since", raised["period_start"],
                "--holdout", "2h", "--margin", "0.3", "--epochs", "10",
                "--batch-size", "32", "--learning-rate", "0.003",
                "--key", str(keys.private_path),
                "--broker", f"{mosquitto.host}:{mosquitto.port}",
                "--out", str(out_dir),
            ],
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr[-3000:]
        summary = json.loads(completed.stdout[completed.stdout.index("{") :])
        assert summary["decision"] == "accepted", summary["reason"]
        assert summary["topic"] == f"tesla/releases/gateway/{NAME}"
        report = json.loads((out_dir / "report.json").read_text())
        figures = report["figures"]
        assert figures["challenger"]["rmse"] < 0.7 * figures["champion"]["rmse"]
        assert report["release"]["pushed"] is True
        assert report["data"]["pairs"]["sensors"] == [SENSOR]

        # 4. The gateway verifies, installs and hot-reloads the challenger.
        wait_for(
            lambda: any(
                (s := json.loads(payload))["status"] == "installed"
                and s["version"] == CHAMPION_VERSION + 1
                for payload in calibrated.collector.on(f"{PREFIX}/ota/gateway")
            ),
            "the release installed",
        )
        wait_for(
            lambda: (
                daemon.status().get("models", {}).get("pm10", {}).get("version")
                == CHAMPION_VERSION + 1
            ),
            "the hot reload",
        )
        assert load_manifest(model_dir / "current").version == CHAMPION_VERSION + 1

        # 5. The drifted sensor goes on; the challenger's rolling error clears the drift.
        send(nodes, base, raw, reference, range(PHASE_A, TOTAL))
        cleared = wait_for(
            lambda: next(
                (
                    e
                    for e in drift_events(calibrated)
                    if e["change"] == "cleared" and e["model_version"] == CHAMPION_VERSION + 1
                ),
                None,
            ),
            "the drift cleared under the challenger",
        )
        assert cleared["drift"] is False
        assert cleared["rmse"] < CLEAR_FRACTION * threshold
        # The rolling error the gateway publishes in its health: high under the drifted
        # champion, then low once the challenger's pairs fill the window.
        served_by_v3 = rolling_errors(calibrated, CHAMPION_VERSION)
        assert max(served_by_v3) > 2 * threshold
        served_by_v4 = wait_for(
            lambda: (
                (e := rolling_errors(calibrated, CHAMPION_VERSION + 1))
                and e[-1] < CLEAR_FRACTION * threshold
                and e
            ),
            "the rolling error under v4 in the health messages",
        )
        assert served_by_v4[-1] < 0.25 * max(served_by_v3)

        # The recorded pairs show the same: v4's calibrations are far closer to the reference.
        expected_all = int(np.isfinite(reference).sum())
        wait_for(lambda: len(pair_rows(pairs_dir)) == expected_all, "every pair")
        recorded = read_pairs(pairs_dir).recorded
        drifted_v3 = recorded[
            (recorded["model_version"] == CHAMPION_VERSION)
            & (recorded["timestamp"] >= pd.Timestamp(raised["period_start"]))
        ]
        served_v4 = recorded[recorded["model_version"] == CHAMPION_VERSION + 1]
        assert len(served_v4) >= MIN_PAIRS
        v3_error = rmse(drifted_v3["calibrated"].to_numpy(), drifted_v3["reference"].to_numpy())
        v4_error = rmse(served_v4["calibrated"].to_numpy(), served_v4["reference"].to_numpy())
        assert v4_error < 0.5 * v3_error, (v3_error, v4_error)
        assert daemon.stop() == 0
    finally:
        nodes.close()
        calibrated.close()
        shutil.rmtree(tmp_path / "training", ignore_errors=True)
