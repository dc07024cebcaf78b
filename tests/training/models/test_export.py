"""Exported FlatBuffers run where they must and agree with Keras (real LiteRT and TFLite Micro)."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest

from training import export, tflm
from training.device_ops import ARDUINO_TFLM_OPS
from training.errors import ExportVerificationError
from training.export import export_flatbuffers, litert_predict
from training.flatbuffer import read_graph
from training.models import TeslaConfig, build_model

N = 32


def _windows(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    level = rng.gamma(2.0, 12.0, size=(count, 1))
    return (level * rng.lognormal(0.0, 0.2, size=(count, N))).astype("float32")


@pytest.fixture(scope="module")
def trained_tesla() -> keras.Model:
    keras.utils.set_random_seed(3)
    model = build_model(TeslaConfig(d_model=8, heads=2), N, 1, input_scale=60.0)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="mse")
    x = _windows(2048, 0)
    y = 0.6 * x[:, -1] + 0.2 * x.mean(axis=1) + 2.0
    history = model.fit(x, y, batch_size=64, epochs=4, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    return model


@pytest.fixture(scope="module")
def exported(trained_tesla: keras.Model, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("model")
    return out, export_flatbuffers(trained_tesla, out, _windows(200, 1), _windows(128, 2))


def test_both_files_are_written_and_described(exported) -> None:
    out, result = exported
    assert (out / "model.tflite").stat().st_size == result.files["float32"].size_bytes
    assert (out / "model_int8.tflite").stat().st_size == result.files["int8"].size_bytes
    assert result.files["float32"].batch == "dynamic"
    assert result.files["int8"].batch == 1
    assert result.files["int8"].input_scale is not None
    assert result.files["int8"].activations == "int16"


def test_float_graph_has_dynamic_batch_and_constant_weights(exported) -> None:
    out, _ = exported
    graph = read_graph((out / "model.tflite").read_bytes())
    assert graph.input_shape_signature == (-1, N)
    # Resource variables left in the graph made batched inference 16x slower.
    assert not {"VAR_HANDLE", "READ_VARIABLE"} & set(graph.op_names)
    # The gateway's graph takes the large-batch attention form: no BATCH_MATMUL over tiny
    # per-head matrices and no SOFTMAX over rows of 9 (both slow in LiteRT) ...
    assert not {"BATCH_MATMUL", "SOFTMAX"} & set(graph.op_names)
    assert {"REDUCE_MAX", "EXP", "SUM"} <= set(graph.op_names)


def test_device_graph_uses_only_arduino_ops(exported) -> None:
    # ... while the device graph keeps the portable form the Arduino library can run.
    _, result = exported
    ops = result.files["int8"].ops
    assert set(ops) <= ARDUINO_TFLM_OPS
    assert "BATCH_MATMUL" not in ops


def test_verification_figures_are_within_bounds(exported) -> None:
    _, result = exported
    check = result.verification
    assert check.float_relative_error <= 1e-4
    assert check.integer_rms_error <= check.integer_rms_bound
    assert check.tflm_max_abs_diff_vs_litert < 1.0
    assert 1024 < check.tflm_arena_bytes < 64 * 1024  # fits the nRF52840's 256 KB with room


def test_batched_invoke_equals_one_invoke_per_window(exported, trained_tesla) -> None:
    out, _ = exported
    windows = _windows(300, 9)
    flatbuffer = (out / "model.tflite").read_bytes()
    batched = litert_predict(flatbuffer, windows, batched=True)
    single = litert_predict(flatbuffer, windows, batched=False)
    keras_out = np.asarray(trained_tesla.predict(windows, verbose=0)).reshape(-1)
    np.testing.assert_allclose(batched, single, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(batched, keras_out, rtol=1e-4, atol=1e-3)


def test_a_device_graph_tflite_micro_runs_differently_is_refused(
    trained_tesla: keras.Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node runs TFLite Micro, not LiteRT: a device graph whose Micro outputs disagree with
    LiteRT's is not exported. No real TFLite Micro disagrees on this graph, so its real outputs
    are handed back for the windows in reverse order (a kernel that mixed up its inputs)."""
    real_run = tflm.run_tflm

    def reversed_run(flatbuffer: bytes, inputs: np.ndarray) -> np.ndarray:
        return real_run(flatbuffer, inputs)[::-1]

    monkeypatch.setattr(export, "run_tflm", reversed_run)
    with pytest.raises(ExportVerificationError, match="TFLite Micro and LiteRT disagree"):
        export_flatbuffers(trained_tesla, tmp_path, _windows(200, 1), _windows(128, 2))
    assert not (tmp_path / "model_int8.tflite").exists()


def test_keras_multi_head_attention_is_refused_for_the_device(tmp_path: Path) -> None:
    inputs = keras.Input(shape=(N,))
    tokens = keras.layers.Reshape((4, N // 4))(inputs)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(tokens, tokens)
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(attended)))
    with pytest.raises(ExportVerificationError, match="BATCH_MATMUL"):
        export_flatbuffers(model, tmp_path, _windows(50, 1), _windows(16, 2))
