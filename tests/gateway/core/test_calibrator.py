"""Loading, verifying and running a model directory on the real LiteRT interpreter."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tesla_gateway.contract.manifest import write_manifest
from tesla_gateway.errors import ManifestError, ModelIntegrityError, ModelLoadError
from tesla_gateway.models.calibrator import CalibrationError, Calibrator
from tests.support.models import ModelFactory, corrupt_model_file


def test_batched_output_equals_single_invokes_and_keras(model_factory: ModelFactory) -> None:
    model = model_factory.get()
    calibrator = Calibrator.load(model.path)
    assert calibrator.runtime_name == "ai_edge_litert"
    assert (calibrator.feature, calibrator.version) == ("pm10", 1)
    windows = np.random.default_rng(0).uniform(0, 300, (17, 8)).astype(np.float32)
    batched = calibrator.calibrate(windows)
    assert batched.shape == (17,)
    singles = np.array([calibrator.calibrate(window[None])[0] for window in windows])
    np.testing.assert_allclose(batched, singles, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(batched, model.keras_predict(windows), rtol=1e-4, atol=1e-3)


def test_empty_batch_and_wrong_shape(model_factory: ModelFactory) -> None:
    calibrator = Calibrator.load(model_factory.get().path)
    assert calibrator.calibrate(np.empty((0, 8), dtype=np.float32)).shape == (0,)
    with pytest.raises(CalibrationError, match="takes"):
        calibrator.calibrate(np.zeros((2, 7), dtype=np.float32))


def test_sha256_mismatch_is_refused(model_factory: ModelFactory, tmp_path: Path) -> None:
    model = model_factory.copy(tmp_path / "m")
    corrupt_model_file(model.path)
    with pytest.raises(ModelIntegrityError, match="does not match the manifest"):
        Calibrator.load(model.path)


def test_missing_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"is .* a model directory"):
        Calibrator.load(tmp_path)


def test_invalid_manifest_names_the_field(model_factory: ModelFactory, tmp_path: Path) -> None:
    model = model_factory.copy(tmp_path / "m")
    manifest = json.loads((model.path / "manifest.json").read_text())
    manifest["window_length"] = 0
    (model.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="window_length"):
        Calibrator.load(model.path)


def test_garbage_flatbuffer_with_matching_hash_is_refused(
    model_factory: ModelFactory, tmp_path: Path
) -> None:
    model = model_factory.copy(tmp_path / "m")
    garbage = b"not a flatbuffer at all" * 10
    (model.path / "model.tflite").write_bytes(garbage)
    entry = model.manifest.files["float32"]
    import hashlib

    files = {
        "float32": entry.model_copy(
            update={"sha256": hashlib.sha256(garbage).hexdigest(), "size_bytes": len(garbage)}
        )
    }
    write_manifest(model.path, model.manifest.model_copy(update={"files": files}))
    with pytest.raises(ModelLoadError, match="cannot load"):
        Calibrator.load(model.path)


def test_model_giving_nan_fails_its_test_invoke(model_factory: ModelFactory) -> None:
    with pytest.raises(ModelLoadError, match="test invoke"):
        Calibrator.load(model_factory.get(nan_output=True).path)


def test_manifest_window_length_must_match_the_graph(
    model_factory: ModelFactory, tmp_path: Path
) -> None:
    model = model_factory.copy(tmp_path / "m")
    write_manifest(model.path, model.manifest.model_copy(update={"window_length": 9}))
    with pytest.raises(ModelLoadError, match="input shape"):
        Calibrator.load(model.path)


def test_several_models_side_by_side(model_factory: ModelFactory) -> None:
    pm10 = Calibrator.load(model_factory.get().path)
    model25 = model_factory.get(feature="pm2_5", window_length=5, seed=3)
    pm25 = Calibrator.load(model25.path)
    w10 = np.full((3, 8), 10.0, dtype=np.float32)
    w25 = np.full((2, 5), 10.0, dtype=np.float32)
    np.testing.assert_allclose(pm25.calibrate(w25), model25.keras_predict(w25), atol=1e-3)
    assert pm10.calibrate(w10).shape == (3,)
