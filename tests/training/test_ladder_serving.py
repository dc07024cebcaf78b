"""A ladder-exported linear calibration served end to end by the real daemon.

``train``'s ladder fits a straight line on synthetic co-location data (PM10 on the harness's
10-second grid, N = 8); ``export --candidate linear`` writes its model directory. The real
daemon (``python -m tesla_gateway run``, real mosquitto, LiteRT) loads it like any TESLA model;
a node publishes readings and every period, from the first (the line reads only the newest
period), must come out as ``weight·raw + intercept`` with the coefficients the manifest
records, computed here, and with its conformal interval. The node's interpreter (TFLite
Micro) runs the directory's int8 graph to the same line.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest

from devkit.broker import Mosquitto
from tesla_gateway.contract.manifest import load_manifest
from tests.gateway.e2e.harness import (
    MAX_GAP,
    Calibrated,
    Daemon,
    MqttNodes,
    N,
    P,
    daemons,  # noqa: F401 (fixture)
    grid_base,
    iso,
    wait_for,
    write_config,
)
from tests.support.published import as_published
from training.export import graph_input
from training.firmware_constants import write_model_constants
from training.ladder import fit_ladder
from training.ladder_export import export_choice
from training.tflm import run_tflm
from training.train import TrainConfig

pytestmark = pytest.mark.slow

PERIODS = N + 6
SYNTHETIC: dict[str, int | float | str] = {
    "n_sensors": 3, "days": 0.2, "period_seconds": P, "seed": 8, "feature": "pm10"
}  # fmt: skip


@pytest.fixture(scope="module")
def linear_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("ladder-serving")
    config = TrainConfig(
        dataset="synthetic",
        dataset_options=SYNTHETIC,
        window_length=N,
        max_interpolated_periods=MAX_GAP,
    )
    run_dir = work / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(config.model_dump_json())
    ladder = fit_ladder(config, run_dir, {})
    assert ladder.winner is not None  # every fit beats raw on these data
    out = work / "pm10-linear"
    export_choice(run_dir, out, name="pm10-linear", version=3, candidate="linear", targets="both")
    return out


def _line(model_dir: Path, raw: np.ndarray) -> np.ndarray:
    parameters = load_manifest(model_dir).hyperparameters
    return float(parameters["weight_raw"]) * raw + float(parameters["intercept"])


def test_the_daemon_serves_a_ladder_linear_model(
    tmp_path: Path,
    mosquitto: Mosquitto,
    linear_model: Path,
    daemons: list[Daemon],  # noqa: F811
) -> None:
    manifest = load_manifest(linear_model)
    assert manifest.architecture == "classical-linear"
    assert manifest.choice is not None and "linear" in manifest.choice  # chosen or requested
    assert manifest.intervals is not None
    values = np.random.default_rng(4).uniform(10, 80, PERIODS).round(2)
    base = grid_base(PERIODS + 5)
    calibrated = Calibrated(mosquitto)
    nodes = MqttNodes(mosquitto)
    try:
        daemons.append(Daemon(write_config(tmp_path, mosquitto, linear_model), tmp_path / "state"))
        for period, value in enumerate(values):
            nodes.send("node-1", base + period * P + 1, float(value))
        wait_for(partial(calibrated.has, "node-1", PERIODS - 1), "the node's periods")
        got = calibrated.by_period("node-1")
        expected = _line(linear_model, values)
        for period in range(PERIODS - 1):  # the last period may still be open
            message = got[iso(base + period * P)]
            assert message["model"] == "pm10-linear"
            assert message["calibrated"] == as_published(float(expected[period])), period
            low, high = manifest.intervals.interval(float(expected[period]))
            assert message["interval"]["low"] == as_published(low)
            assert message["interval"]["high"] == as_published(high)
    finally:
        nodes.close()
        calibrated.close()


def test_the_node_interpreter_runs_the_int8_line(linear_model: Path, tmp_path: Path) -> None:
    manifest = load_manifest(linear_model)
    entry = manifest.files["int8"]
    assert entry.ops == ["FULLY_CONNECTED", "STRIDED_SLICE"]  # a tiny graph the library has
    windows = np.random.default_rng(5).uniform(0, 900, (32, N)).astype(np.float32)
    details = {"dtype": np.int16, "quantization": (entry.input_scale, entry.input_zero_point)}
    device = (linear_model / "model_int8.tflite").read_bytes()
    micro = run_tflm(device, graph_input(windows, details)).reshape(-1).astype(np.float64)
    out = (micro - (entry.output_zero_point or 0)) * (entry.output_scale or 1.0)
    np.testing.assert_allclose(out, _line(linear_model, windows[:, -1]), atol=0.1)
    # and the node's build takes it like TESLA: constants from the manifest, ops registered
    header = write_model_constants(linear_model, tmp_path / "model_constants.h").read_text()
    assert "X(FULLY_CONNECTED, FullyConnected)" in header and "kWindowLength = 8u" in header
