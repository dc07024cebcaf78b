"""Export a trained Keras model to the two FlatBuffers a model directory carries, and verify them.

* ``model.tflite``: float32 with a dynamic batch dimension, weights frozen as constants: the
  gateway resizes it to the number of ready sensors and calibrates them in one invoke (a graph
  exported with batch 1 cannot be resized; weights left as resource variables made a batched
  graph 16x slower here).
* ``model_int8.tflite``: full integer quantisation (int8 input and output) of a fixed batch-1
  graph, calibrated on a representative set of training windows: TFLite Micro needs fixed shapes.

Verification on held-out windows: LiteRT float vs Keras within 1e-4 of the output scale; int8 vs
Keras within a bound derived from the quantisation steps (see :func:`int8_error_bound`); the int8
file runs under the TFLite Micro interpreter and its arena is measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import numpy.typing as npt
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from gateway.manifest import ModelFile, sha256_file
from training.errors import ExportError, ExportVerificationError
from training.flatbuffer import read_graph
from training.tflm import measure_arena, run_tflm

__all__ = [
    "FLOAT_FILENAME",
    "INT8_FILENAME",
    "ExportVerification",
    "ExportedFiles",
    "convert_float",
    "convert_int8",
    "export_flatbuffers",
    "int8_error_bound",
    "litert_predict",
]

FLOAT_FILENAME = "model.tflite"
INT8_FILENAME = "model_int8.tflite"
FLOAT_TOLERANCE = 1e-4  # relative to the largest |output| on the check windows

Array = npt.NDArray[np.float32]


@dataclass(frozen=True)
class ExportVerification:
    """Measured agreement between Keras, LiteRT and TFLite Micro on held-out windows."""

    windows_checked: int
    float_max_abs_error: float
    float_relative_error: float
    int8_max_abs_error: float
    int8_rms_error: float
    int8_error_bound: float
    tflm_max_abs_diff_vs_litert: float
    tflm_arena_bytes: int
    litert_batched_max_abs_diff: float


@dataclass(frozen=True)
class ExportedFiles:
    files: dict[str, ModelFile]
    verification: ExportVerification


def _frozen(model: keras.Model, batch: int | None) -> tf.types.experimental.ConcreteFunction:
    spec = tf.TensorSpec((batch, *model.input_shape[1:]), tf.float32, name="window")

    @tf.function(input_signature=[spec])
    def serve(window: tf.Tensor) -> tf.Tensor:
        return model(window, training=False)

    return convert_variables_to_constants_v2(serve.get_concrete_function())


def convert_float(model: keras.Model) -> bytes:
    """float32 FlatBuffer with a dynamic batch dimension and constant weights."""
    converter = tf.lite.TFLiteConverter.from_concrete_functions([_frozen(model, None)])
    try:
        return bytes(converter.convert())
    except Exception as exc:  # the converter raises many unrelated types; re-raised typed
        raise ExportError(f"float32 conversion failed: {exc}") from exc


def convert_int8(model: keras.Model, representative: Array) -> bytes:
    """Fully int8 batch-1 FlatBuffer calibrated on ``representative`` windows [K, N(, C)]."""
    if len(representative) == 0:
        raise ExportError("int8 conversion needs at least one representative window")
    converter = tf.lite.TFLiteConverter.from_concrete_functions([_frozen(model, 1)])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = tf.int8
    converter.inference_output_type = tf.int8

    def windows() -> object:
        for row in representative:
            yield [row[None, ...].astype(np.float32)]

    converter.representative_dataset = windows
    try:
        return bytes(converter.convert())
    except Exception as exc:  # the converter raises many unrelated types; re-raised typed
        raise ExportError(f"int8 conversion failed: {exc}") from exc


def litert_predict(flatbuffer: bytes, windows: Array, *, batched: bool = True) -> Array:
    """Calibrate windows with LiteRT: one batched invoke, or one invoke per window."""
    interpreter = Interpreter(model_content=flatbuffer)
    source = interpreter.get_input_details()[0]
    target = interpreter.get_output_details()[0]
    quantised = source["dtype"] == np.int8
    in_scale, in_zero = source["quantization"]
    out_scale, out_zero = target["quantization"]

    def run(batch: Array) -> Array:
        data: npt.NDArray[np.generic] = batch
        if quantised:
            data = np.clip(np.round(batch / in_scale + in_zero), -128, 127).astype(np.int8)
        interpreter.set_tensor(source["index"], data)
        interpreter.invoke()
        result = interpreter.get_tensor(target["index"])
        if quantised:
            return ((result.astype(np.float32) - out_zero) * out_scale).reshape(-1)
        return result.reshape(-1).astype(np.float32)

    if batched and not quantised:
        interpreter.resize_tensor_input(source["index"], list(windows.shape))
        interpreter.allocate_tensors()
        return run(windows.astype(np.float32))
    interpreter.allocate_tensors()
    return np.concatenate([run(windows[i : i + 1].astype(np.float32)) for i in range(len(windows))])


def _quantisation(flatbuffer: bytes) -> tuple[float, int, float, int]:
    interpreter = Interpreter(model_content=flatbuffer)
    in_scale, in_zero = interpreter.get_input_details()[0]["quantization"]
    out_scale, out_zero = interpreter.get_output_details()[0]["quantization"]
    return float(in_scale), int(in_zero), float(out_scale), int(out_zero)


def int8_error_bound(reference: Array, output_scale: float) -> float:
    """Largest |int8 - float| we accept on a check window.

    The int8 graph rounds its input to the input step, every intermediate tensor to its own step,
    and its output to ``output_scale``. Eight output steps covers the rounding of the output
    (half a step) plus the propagated rounding of the ~40 int8 tensors between input and output
    (measured 2-5 steps on the default models); 5 % of the output range bounds the error from
    clipping outliers to the representative set's range. Exceeding it means the
    quantisation went wrong, not that it is imprecise.
    """
    spread = float(np.max(reference) - np.min(reference)) if reference.size else 0.0
    return max(8.0 * output_scale, 0.05 * spread)


def export_flatbuffers(
    model: keras.Model, out_dir: Path, representative: Array, check_windows: Array
) -> ExportedFiles:
    """Write both FlatBuffers into ``out_dir``, verify them, and describe them for the manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    float_bytes = convert_float(model)
    int8_bytes = convert_int8(model, representative)
    float_path = out_dir / FLOAT_FILENAME
    int8_path = out_dir / INT8_FILENAME
    float_path.write_bytes(float_bytes)
    int8_path.write_bytes(int8_bytes)

    reference = np.asarray(model.predict(check_windows, verbose=0, batch_size=256)).reshape(-1)
    output_scale_abs = max(float(np.max(np.abs(reference))), 1e-6)
    float_batched = litert_predict(float_bytes, check_windows, batched=True)
    float_single = litert_predict(float_bytes[:], check_windows[:32], batched=False)
    float_error = float(np.max(np.abs(float_batched - reference)))
    if float_error > FLOAT_TOLERANCE * output_scale_abs:
        raise ExportVerificationError(
            f"float32 FlatBuffer differs from Keras by {float_error:.3g} "
            f"(limit {FLOAT_TOLERANCE * output_scale_abs:.3g})"
        )
    batched_diff = float(np.max(np.abs(float_single - float_batched[:32])))

    in_scale, in_zero, out_scale, out_zero = _quantisation(int8_bytes)
    int8_litert = litert_predict(int8_bytes, check_windows)
    int8_diff = int8_litert - reference
    bound = int8_error_bound(reference, out_scale)
    if float(np.max(np.abs(int8_diff))) > bound:
        raise ExportVerificationError(
            f"int8 FlatBuffer differs from Keras by up to {np.max(np.abs(int8_diff)):.3g} "
            f"µg/m³ (bound {bound:.3g}): check the representative set"
        )
    quantised_inputs = np.clip(np.round(check_windows / in_scale + in_zero), -128, 127).astype(
        np.int8
    )
    micro_raw = run_tflm(int8_bytes, quantised_inputs).reshape(-1)
    micro = (micro_raw.astype(np.float32) - out_zero) * out_scale
    micro_diff = float(np.max(np.abs(micro - int8_litert)))
    if micro_diff > bound:
        raise ExportVerificationError(
            f"TFLite Micro and LiteRT disagree on the int8 model by {micro_diff:.3g} µg/m³"
        )
    arena = measure_arena(int8_path, quantised_inputs[0])

    files = {
        "float32": ModelFile(
            path=FLOAT_FILENAME,
            sha256=sha256_file(float_path),
            size_bytes=float_path.stat().st_size,
            precision="float32",
            batch="dynamic",
            ops=read_graph(float_bytes).op_names,
        ),
        "int8": ModelFile(
            path=INT8_FILENAME,
            sha256=sha256_file(int8_path),
            size_bytes=int8_path.stat().st_size,
            precision="int8",
            batch=1,
            ops=read_graph(int8_bytes).op_names,
            tflm_arena_bytes=arena,
            input_scale=in_scale,
            input_zero_point=in_zero,
            output_scale=out_scale,
            output_zero_point=out_zero,
        ),
    }
    verification = ExportVerification(
        windows_checked=len(check_windows),
        float_max_abs_error=float_error,
        float_relative_error=float_error / output_scale_abs,
        int8_max_abs_error=float(np.max(np.abs(int8_diff))),
        int8_rms_error=float(np.sqrt(np.mean(int8_diff**2))),
        int8_error_bound=bound,
        tflm_max_abs_diff_vs_litert=micro_diff,
        tflm_arena_bytes=arena,
        litert_batched_max_abs_diff=batched_diff,
    )
    return ExportedFiles(files=files, verification=verification)
