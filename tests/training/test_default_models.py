"""The committed default models are real, intact, runnable, and beat raw and linear calibration."""

from __future__ import annotations

from pathlib import Path

import pytest

from tesla_gateway.contract.manifest import load_manifest, verify_model_files
from tesla_gateway.contract.sensor_kind import PMS5003_ATM
from training.data import default_data_dir, load_dataset
from training.device_ops import unsupported_on_device
from training.evaluate import evaluate_model_dir
from training.flatbuffer import read_graph

MODELS = Path(__file__).resolve().parents[2] / "models"
DEFAULTS = {
    "pm10-ispra-1min": ("ispra-1min", "ispra-1min"),
    "pm2_5-antwerp-1h": ("antwerp-hourly-pm2_5", "antwerp-hourly"),
    "pm10-ispra-1min-rh-temp": ("ispra-1min", "ispra-1min"),
}


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_committed_model_directory_is_intact(name: str) -> None:
    model_dir = MODELS / name
    manifest = load_manifest(model_dir)
    verify_model_files(model_dir, manifest)
    assert manifest.name == name
    float_graph = read_graph((model_dir / manifest.files["float32"].path).read_bytes())
    channels = len(manifest.input_channels)
    assert float_graph.input_shape_signature == (
        (-1, manifest.window_length) if channels == 1 else (-1, manifest.window_length, channels)
    )
    assert unsupported_on_device(manifest.files["int8"].ops) == []
    arena = manifest.files["int8"].tflm_arena_bytes
    assert arena is not None
    # nRF52840: 256 KB RAM shared with the sketch; the model must leave most of it free.
    assert arena + manifest.files["int8"].size_bytes < 128 * 1024
    assert manifest.test.model.rmse < manifest.test.linear.rmse < manifest.test.raw.rmse
    # SensEURCity's PMS5003 ATM channel (../shared/data/README.md): sources are checked against it.
    assert manifest.sensor == PMS5003_ATM


def test_the_covariate_model_serves_beside_the_pm_only_one_and_beats_it() -> None:
    """Same feature, sensors, split and grid: the gateway may switch between them per sensor."""
    plain = load_manifest(MODELS / "pm10-ispra-1min")
    covariate = load_manifest(MODELS / "pm10-ispra-1min-rh-temp")
    assert covariate.channel_names == ("pm10", "rh", "temp_c")
    assert (covariate.feature, covariate.period_seconds) == (plain.feature, plain.period_seconds)
    assert covariate.data.test_sensor == plain.data.test_sensor
    assert covariate.data.validation_sensor == plain.data.validation_sensor
    assert covariate.validation.rmse < plain.validation.rmse
    assert covariate.test.model.rmse < plain.test.model.rmse


@pytest.mark.realdata
@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_committed_model_scores_as_its_manifest_says_on_real_data(name: str) -> None:
    dataset, folder = DEFAULTS[name]
    if not (default_data_dir() / folder).is_dir():
        pytest.skip(f"{default_data_dir() / folder} is not present")
    model_dir = MODELS / name
    manifest = load_manifest(model_dir)
    data = load_dataset(dataset, default_data_dir() / folder)
    test_sensor = manifest.data.test_sensor
    only_test = data.with_frame(data.frame[data.frame["sensor_id"] == test_sensor])
    evaluation = evaluate_model_dir(model_dir, only_test)
    # LiteRT on the deployed FlatBuffer reproduces the Keras figures written at export.
    assert evaluation.n == manifest.test.model.n
    assert evaluation.model.rmse == pytest.approx(manifest.test.model.rmse, rel=1e-3)
    assert evaluation.raw.rmse == pytest.approx(manifest.test.raw.rmse, rel=1e-6)
    assert evaluation.model.rmse < manifest.test.linear.rmse
