"""Small but real model directories for the gateway's tests.

Until training's exporter lands, these build what it will ship: a tiny Keras model exported to a
float32 FlatBuffer with a dynamic batch dimension (input ``[batch, N]`` raw ug/m3 oldest first,
output ``[batch, 1]``) and a manifest written with
:func:`tesla_gateway.contract.manifest.write_manifest`, with
the real sha256 and size. Tests may import TensorFlow; the gateway never does.

The untrained network's output is made non-negative (``abs``) so that it stays a plausible
concentration (the gateway withholds the ones no concentration could be:
tesla_gateway/models/plausibility.py); ``affine=(slope, intercept)`` replaces it with
``slope * newest raw + intercept``, a graph whose output a test chooses exactly (e.g. one that
answers raw 20 with -10,000).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tesla_gateway.contract.manifest import (
    DataSummary,
    ErrorMetrics,
    InputChannel,
    InputRange,
    Manifest,
    ModelFile,
    TestMetrics,
    sha256_file,
    write_manifest,
)
from tesla_gateway.contract.series import GapPolicy

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__all__ = [
    "ModelFactory",
    "TestModel",
    "build_model_dir",
    "copy_model_dir",
    "corrupt_model_file",
    "model_factory",
]

MODEL_FILENAME = "model.tflite"


@dataclass
class TestModel:
    """A model directory and the Keras model it was exported from (the reference for parity)."""

    __test__ = False  # not a pytest test class

    path: Path
    keras_model: Any
    manifest: Manifest

    def keras_predict(self, windows: np.ndarray) -> np.ndarray:
        """Reference output [B] for float32 windows [B, N] (or [B, N, C])."""
        out = self.keras_model(np.asarray(windows, dtype=np.float32), training=False)
        return np.asarray(out, dtype=np.float32)[:, 0]


def _input_shape(window_length: int, channels: int) -> tuple[int, ...]:
    return (window_length,) if channels == 1 else (window_length, channels)


def _build_keras(
    window_length: int,
    channels: int,
    seed: int,
    nan_output: bool,
    affine: tuple[float, float] | None = None,
) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape=_input_shape(window_length, channels), dtype="float32")
    if affine is not None:
        return keras.Model(inputs, _affine_output(keras, inputs, window_length, channels, affine))
    scaled = keras.layers.Rescaling(1.0 / 300.0)(inputs)
    if channels > 1:
        scaled = keras.layers.Flatten()(scaled)
    hidden = keras.layers.Dense(6, activation="tanh")(scaled)
    out = keras.layers.Dense(1)(hidden)
    out = keras.layers.Rescaling(300.0)(out)
    out = keras.layers.Lambda(keras.ops.abs)(out)  # a concentration, if a made-up one
    if nan_output:
        out = keras.layers.Lambda(lambda x: keras.ops.log(-1.0 - keras.ops.abs(x)))(out)
    return keras.Model(inputs, out)


def _affine_output(
    keras: Any, inputs: Any, window_length: int, channels: int, affine: tuple[float, float]
) -> Any:
    """``slope * x[:, -1, 0] + intercept`` as one dense layer with fixed weights [N*C, 1]."""
    slope, intercept = affine
    flat = keras.layers.Flatten()(inputs) if channels > 1 else inputs
    dense = keras.layers.Dense(1)
    out = dense(flat)
    kernel = np.zeros((window_length * channels, 1), dtype=np.float32)
    kernel[(window_length - 1) * channels, 0] = slope  # the newest period's own channel
    dense.set_weights([kernel, np.asarray([intercept], dtype=np.float32)])
    return out


def _export_dynamic_batch(model: Any, window_length: int, channels: int) -> bytes:
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    @tf.function(
        input_signature=[tf.TensorSpec([None, *_input_shape(window_length, channels)], tf.float32)]
    )
    def serve(window: Any) -> Any:
        return model(window, training=False)

    # Freeze the Keras variables into constants, or the graph would need resource variables.
    frozen = convert_variables_to_constants_v2(serve.get_concrete_function())
    converter = tf.lite.TFLiteConverter.from_concrete_functions([frozen])
    return bytes(converter.convert())


def build_model_dir(
    path: Path,
    *,
    window_length: int = 8,
    period_seconds: int = 60,
    feature: str = "pm10",
    version: int = 1,
    seed: int = 0,
    max_interpolated_periods: int = 2,
    name: str = "test-tesla",
    nan_output: bool = False,
    median_input: float = 20.0,
    extra_channels: tuple[str, ...] = (),
    affine: tuple[float, float] | None = None,
) -> TestModel:
    """Export a tiny model with a valid manifest into ``path`` (created).

    ``extra_channels`` (e.g. ``("rh",)``) makes a multi-channel model taking ``[batch, N, C]``;
    ``affine=(slope, intercept)`` one that outputs ``slope * newest raw + intercept``.
    """
    channels = 1 + len(extra_channels)
    keras_model = _build_keras(window_length, channels, seed, nan_output, affine)
    path.mkdir(parents=True, exist_ok=True)
    model_file = path / MODEL_FILENAME
    model_file.write_bytes(_export_dynamic_batch(keras_model, window_length, channels))
    metrics = ErrorMetrics(rmse=1.0, mae=0.5, n=10)
    manifest = Manifest(
        name=name,
        version=version,
        architecture="test-mlp",
        feature=feature,  # type: ignore[arg-type]
        window_length=window_length,
        period_seconds=period_seconds,
        input_channels=[
            InputChannel(name=feature, unit="ug/m3"),
            *(InputChannel(name=name, unit="%") for name in extra_channels),
        ],
        input_scale=300.0,
        gap_policy=GapPolicy(max_interpolated_periods=max_interpolated_periods),
        files={
            "float32": ModelFile(
                path=MODEL_FILENAME,
                sha256=sha256_file(model_file),
                size_bytes=model_file.stat().st_size,
                precision="float32",
                batch="dynamic",
                ops=["FULLY_CONNECTED"] if affine else ["ABS", "FULLY_CONNECTED", "MUL", "TANH"],
            )
        },
        parameter_count=int(keras_model.count_params()),
        hyperparameters={"hidden": 6, "seed": seed},
        validation=metrics,
        test=TestMetrics(raw=metrics, linear=metrics, model=metrics),
        input_range=InputRange(min=0.0, p01=1.0, p50=median_input, p99=200.0, max=500.0),
        data=DataSummary(
            source="synthetic:tests.support.models",
            target="none",
            train_sensors=["t1"],
            validation_sensor="v1",
            test_sensor="x1",
            rows_read=0,
            rows_dropped={},
            windows={},
            attribution="generated for tests",
        ),
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    write_manifest(path, manifest)
    return TestModel(path=path, keras_model=keras_model, manifest=manifest)


def copy_model_dir(source: TestModel, target: Path) -> TestModel:
    """Copy a model directory file by file (manifest last, as a careful deployer would)."""
    target.mkdir(parents=True, exist_ok=True)
    (target / MODEL_FILENAME).write_bytes((source.path / MODEL_FILENAME).read_bytes())
    write_manifest(target, source.manifest)
    return TestModel(path=target, keras_model=source.keras_model, manifest=source.manifest)


def corrupt_model_file(model_dir: Path) -> None:
    """Flip bytes in the FlatBuffer without touching the manifest (sha256 no longer matches)."""
    model_file = model_dir / MODEL_FILENAME
    data = bytearray(model_file.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(8)
    model_file.write_bytes(bytes(data))


class ModelFactory:
    """Builds each distinct test model once per session and hands out private copies."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._built: dict[tuple[tuple[str, Any], ...], TestModel] = {}

    def get(self, **kwargs: Any) -> TestModel:
        """The shared (read-only) directory of the model built with ``build_model_dir`` kwargs."""
        key = tuple(sorted(kwargs.items()))
        if key not in self._built:
            path = self._root / f"model-{len(self._built)}"
            self._built[key] = build_model_dir(path, **kwargs)
        return self._built[key]

    def copy(self, target: Path, **kwargs: Any) -> TestModel:
        """A private copy at ``target`` (replacing it) that a test may corrupt or replace."""
        source = self.get(**kwargs)
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source.path, target)
        return TestModel(path=target, keras_model=source.keras_model, manifest=source.manifest)


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelFactory]:
    """Test model directories, exported once per session (about a second each)."""
    yield ModelFactory(tmp_path_factory.mktemp("models"))
