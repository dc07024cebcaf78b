"""Export a trained Keras model to the two FlatBuffers a model directory carries, and verify them.

* ``model.tflite``: float32 with a dynamic batch dimension and weights frozen as constants. The
  gateway resizes it to the number of ready sensors and calibrates them in one invoke. (A graph
  exported with batch 1 cannot be resized; weights left as resource variables made a batched
  graph 16x slower.)
* ``model_int8.tflite``: the device graph for TFLite Micro, a fixed batch-1 graph with full
  integer quantisation: 8-bit weights and 16-bit activations (TFLite's "16x8" scheme), calibrated
  on a representative set of training windows. We measured 8-bit activations first: on the Ispra
  PM10 model they raised test RMSE from 4.5 to 32.5 µg/m³, because attention multiplies two
  activations and 256 levels cannot hold both the range of concentrations and the precision a
  calibration needs. With 16-bit activations the same model stays within 0.9 µg/m³ RMS of float.

Verification on held-out windows: LiteRT float vs Keras within 1e-4 of the output scale; the
integer model vs Keras within :func:`integer_error_bound`; the integer file runs under the TFLite
Micro interpreter, agrees with LiteRT, and its arena is measured.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, cast

import keras
import numpy as np
import numpy.typing as npt
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from tesla_gateway.contract.manifest import ModelFile, sha256_file
from tesla_gateway.models.runtime import DEFAULT_MAX_BATCH, BatchedInterpreter, select_runtime
from training.bias_correction import convert_bias_corrected
from training.device_ops import unsupported_on_device
from training.errors import ExportError, ExportVerificationError
from training.flatbuffer import read_graph
from training.models.layers.attention import TokenSelfAttention
from training.models.layers.norm import FeatureAggregator, TokenLayerNorm
from training.tflm import measure_arena, run_tflm

__all__ = [
    "FLOAT_FILENAME",
    "INT8_FILENAME",
    "ExportTargets",
    "ExportVerification",
    "ExportedFiles",
    "convert_device",
    "convert_float",
    "export_flatbuffers",
    "export_float_graph",
    "float_model_file",
    "gateway_graph",
    "graph_input",
    "integer_error_bound",
    "litert_predict",
    "quantise",
]

FLOAT_FILENAME = "model.tflite"
INT8_FILENAME = "model_int8.tflite"
FLOAT_TOLERANCE = 1e-4  # relative to the largest |output| on the check windows
# The integer graph's last bias is corrected (training/bias_correction.py) when its mean output
# error on the representative windows is at least this share of the integer error bound.
BIAS_CORRECTION_SHARE = 0.1
INTEGER_RMS_SHARE = 0.25  # integer-vs-float RMS may be at most this share of the model's RMSE

Array = npt.NDArray[np.float32]
_INT_LIMITS = {np.dtype(np.int8): (-128, 127), np.dtype(np.int16): (-32768, 32767)}


@dataclass(frozen=True)
class ExportVerification:
    """Measured agreement between Keras, LiteRT and TFLite Micro on held-out windows."""

    windows_checked: int
    float_max_abs_error: float
    float_relative_error: float
    integer_max_abs_error: float | None
    integer_rms_error: float | None
    integer_rms_bound: float | None
    float_rmse_vs_reference: float | None
    integer_rmse_vs_reference: float | None
    tflm_max_abs_diff_vs_litert: float | None
    tflm_arena_bytes: int | None
    litert_batched_max_abs_diff: float
    device_graph_absent: str | None = None

    def as_dict(self) -> dict[str, float | int | str | None]:
        return asdict(self)


@dataclass(frozen=True)
class ExportedFiles:
    files: dict[Literal["float32", "int8"], ModelFile]
    verification: ExportVerification
    device_graph_absent: str | None = None


def _frozen(model: keras.Model, batch: int | None) -> tf.types.experimental.ConcreteFunction:
    spec = tf.TensorSpec((batch, *model.input_shape[1:]), tf.float32, name="window")

    @tf.function(input_signature=[spec])
    def serve(window: tf.Tensor) -> tf.Tensor:
        return model(window, training=False)

    return convert_variables_to_constants_v2(serve.get_concrete_function())


def _convert(converter: tf.lite.TFLiteConverter, label: str) -> bytes:
    try:
        return bytes(converter.convert())
    except Exception as exc:  # the converter raises many unrelated types; re-raised typed
        raise ExportError(f"{label} conversion failed: {exc}") from exc


@contextmanager
def gateway_graph(model: keras.Model) -> Iterator[None]:
    """Trace the gateway's form of attention, LayerNorm and aggregator (batch axis last).

    Same weights and maths as the portable form (tested to float tolerance), laid out for
    LiteRT at large batch: the default model runs 1.7-1.9 µs per window at 128 windows per invoke
    against 4.3 µs for the batched-matmul form it replaced (one thread, XNNPACK).
    """
    gateway_forms = (TokenSelfAttention, TokenLayerNorm, FeatureAggregator)
    layers = [layer for layer in model._flatten_layers() if isinstance(layer, gateway_forms)]
    for layer in layers:
        layer.portable = False
    try:
        yield
    finally:
        for layer in layers:
            layer.portable = True


def convert_float(model: keras.Model) -> bytes:
    """float32 FlatBuffer with a dynamic batch dimension and constant weights (gateway graph)."""
    with gateway_graph(model):
        function = _frozen(model, None)
    return _convert(tf.lite.TFLiteConverter.from_concrete_functions([function]), "float32")


def convert_device(model: keras.Model, representative: Array) -> bytes:
    """Batch-1 integer FlatBuffer (int8 weights, int16 activations) for TFLite Micro."""
    if len(representative) == 0:
        raise ExportError("integer conversion needs at least one representative window")
    converter = tf.lite.TFLiteConverter.from_concrete_functions([_frozen(model, 1)])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_ops = [
        tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
    ]
    converter.inference_input_type = tf.int16
    converter.inference_output_type = tf.int16

    def windows() -> object:
        for row in representative:
            yield [row[None, ...].astype(np.float32)]

    converter.representative_dataset = windows
    return _convert(converter, "integer")


def quantise(
    values: Array, scale: float, zero_point: int, dtype: np.dtype
) -> npt.NDArray[np.integer]:
    """Real values to the integer input of a quantised graph (round, shift, saturate)."""
    low, high = _INT_LIMITS[np.dtype(dtype)]
    return np.clip(np.round(values / scale + zero_point), low, high).astype(dtype)


def graph_input(values: Array, details: Mapping[str, Any]) -> npt.NDArray[np.generic]:
    """Real windows as a graph's input tensor (``get_input_details()[0]``) takes them:
    quantised with its scale and zero point when it takes integers, float32 otherwise."""
    dtype = np.dtype(details["dtype"])
    if dtype not in _INT_LIMITS:
        return np.asarray(values, dtype=np.float32)
    scale, zero_point = details["quantization"]
    return quantise(values, scale, zero_point, dtype)


def litert_predict(flatbuffer: bytes, windows: Array, *, batched: bool = True) -> Array:
    """Calibrate windows with the gateway's runtime: batched invokes, or one per window.

    A graph that is not a model directory yet (the exporter's own check) runs through the same
    interpreter and batching the gateway uses (``tesla_gateway.models.runtime``); integer graphs
    get their
    inputs quantised and their outputs dequantised, one window per invoke (batch 1).
    """
    interpreter = select_runtime(("ai_edge_litert",)).interpreter(flatbuffer)
    source = interpreter.get_input_details()[0]
    target = interpreter.get_output_details()[0]
    integer = np.dtype(source["dtype"]) in _INT_LIMITS
    one_at_a_time = integer or not batched
    runner = BatchedInterpreter(interpreter, max_batch=1 if one_at_a_time else DEFAULT_MAX_BATCH)
    # An integer graph takes int16: the runner hands arrays to the interpreter as they are.
    inputs = cast("Array", graph_input(np.asarray(windows, dtype=np.float32), source))
    outputs = runner.run(inputs)
    if integer:
        out_scale, out_zero = target["quantization"]
        return ((outputs - out_zero) * out_scale).astype(np.float32)
    return outputs


def integer_error_bound(float_output: Array, reference: Array | None) -> float:
    """Largest RMS difference between the integer and the float model we accept.

    The device model is there to calibrate, so its quantisation error is judged against the
    model's own error: an RMS deviation of at most 25 % of the float model's RMSE on the same
    windows adds at most 3 % to the RMSE (errors add in quadrature: sqrt(1 + 0.25²) = 1.03).
    Without a reference (parity checks on arbitrary windows) the yardstick is 5 % of the
    outputs' spread.
    """
    if reference is not None and np.isfinite(reference).any():
        keep = np.isfinite(reference)
        float_rmse = float(np.sqrt(np.mean((float_output[keep] - reference[keep]) ** 2)))
        return INTEGER_RMS_SHARE * float_rmse
    return 0.05 * float(np.std(float_output))


def _rmse(a: Array, b: Array | None) -> float | None:
    if b is None or not np.isfinite(b).any():
        return None
    keep = np.isfinite(b)
    return float(np.sqrt(np.mean((a[keep] - b[keep]) ** 2)))


def float_model_file(path: Path) -> ModelFile:
    """How the manifest describes the gateway graph written at ``path``."""
    return ModelFile(
        path=path.name,
        sha256=sha256_file(path),
        size_bytes=path.stat().st_size,
        precision="float32",
        activations="float32",
        batch="dynamic",
        ops=read_graph(path.read_bytes()).op_names,
    )


def _check_float(float_bytes: bytes, keras_out: Array, check_windows: Array) -> tuple[Array, float]:
    """LiteRT's batched float output on the check windows, and its error against Keras
    (raises past :data:`FLOAT_TOLERANCE` of the output scale)."""
    output_scale_abs = max(float(np.max(np.abs(keras_out))), 1e-6)
    float_batched = litert_predict(float_bytes, check_windows, batched=True)
    float_error = float(np.max(np.abs(float_batched - keras_out)))
    if float_error > FLOAT_TOLERANCE * output_scale_abs:
        raise ExportVerificationError(
            f"float32 FlatBuffer differs from Keras by {float_error:.3g} "
            f"(limit {FLOAT_TOLERANCE * output_scale_abs:.3g})"
        )
    return float_batched, float_error


def _keras_outputs(model: keras.Model, windows: Array) -> Array:
    return np.asarray(model.predict(windows, verbose=0, batch_size=256)).reshape(-1)


def export_float_graph(model: keras.Model, out_dir: Path, check_windows: Array) -> ModelFile:
    """The gateway graph alone, written to ``out_dir`` and checked against Keras."""
    out_dir.mkdir(parents=True, exist_ok=True)
    float_bytes = convert_float(model)
    _check_float(float_bytes, _keras_outputs(model, check_windows), check_windows)
    path = out_dir / FLOAT_FILENAME
    path.write_bytes(float_bytes)
    return float_model_file(path)


ExportTargets = Literal["gateway", "node", "both", "both-if-possible"]


def export_flatbuffers(
    model: keras.Model,
    out_dir: Path,
    representative: Array,
    check_windows: Array,
    check_reference: Array | None = None,
    *,
    targets: ExportTargets = "both",
) -> ExportedFiles:
    """Write the gateway graph and (unless ``targets`` is ``gateway``) the device graph into
    ``out_dir``, verify them, and describe them for the manifest.

    The gateway graph is always written: it is what gateways run and what the device graph is
    verified against. ``node``/``both`` raise when the device graph misses its bound;
    ``both-if-possible`` keeps the gateway graph and says why the device graph is absent.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    float_bytes = convert_float(model)
    float_path = out_dir / FLOAT_FILENAME
    keras_out = _keras_outputs(model, check_windows)
    output_scale_abs = max(float(np.max(np.abs(keras_out))), 1e-6)
    float_batched, float_error = _check_float(float_bytes, keras_out, check_windows)
    float_path.write_bytes(float_bytes)
    float_single = litert_predict(float_bytes, check_windows[:32], batched=False)
    files: dict[Literal["float32", "int8"], ModelFile] = {"float32": float_model_file(float_path)}
    device: _DeviceGraph | None = None
    absent: str | None = None
    if targets == "gateway":
        absent = "not requested: exported with --targets gateway"
    else:
        try:
            device = _export_device(
                model,
                out_dir,
                representative,
                check_windows,
                keras_out=keras_out,
                check_reference=check_reference,
            )
        except ExportError as exc:
            if targets != "both-if-possible":
                raise
            absent = str(exc)
    if device is not None:
        files["int8"] = device.file
    else:  # no stale device graph from an earlier export may sit beside the manifest
        (out_dir / INT8_FILENAME).unlink(missing_ok=True)
    verification = ExportVerification(
        windows_checked=len(check_windows),
        float_max_abs_error=float_error,
        float_relative_error=float_error / output_scale_abs,
        integer_max_abs_error=None if device is None else device.max_abs_error,
        integer_rms_error=None if device is None else device.rms_error,
        integer_rms_bound=None if device is None else device.bound,
        float_rmse_vs_reference=_rmse(keras_out, check_reference),
        integer_rmse_vs_reference=None if device is None else device.rmse_vs_reference,
        tflm_max_abs_diff_vs_litert=None if device is None else device.micro_diff,
        tflm_arena_bytes=None if device is None else device.file.tflm_arena_bytes,
        litert_batched_max_abs_diff=float(np.max(np.abs(float_single - float_batched[:32]))),
        device_graph_absent=absent,
    )
    return ExportedFiles(files=files, verification=verification, device_graph_absent=absent)


@dataclass(frozen=True)
class _DeviceGraph:
    file: ModelFile
    max_abs_error: float
    rms_error: float
    bound: float
    rmse_vs_reference: float | None
    micro_diff: float


def _export_device(
    model: keras.Model,
    out_dir: Path,
    representative: Array,
    check_windows: Array,
    *,
    keras_out: Array,
    check_reference: Array | None,
) -> _DeviceGraph:
    """Convert, write and verify the batch-1 integer graph (raises ExportError subclasses)."""
    bound = integer_error_bound(keras_out, check_reference)
    device_bytes, _ = convert_bias_corrected(
        model,
        representative,
        convert=convert_device,
        keras_predict=_keras_outputs,
        integer_predict=litert_predict,
        min_shift=BIAS_CORRECTION_SHARE * bound,
    )
    device_ops = read_graph(device_bytes).op_names
    missing_ops = unsupported_on_device(device_ops)
    if missing_ops:
        raise ExportVerificationError(
            f"the device model needs {missing_ops}, which the Arduino TFLite Micro library lacks"
        )
    interpreter = select_runtime(("ai_edge_litert",)).interpreter(device_bytes)
    source = interpreter.get_input_details()[0]
    target = interpreter.get_output_details()[0]
    in_scale, in_zero = source["quantization"]
    out_scale, out_zero = target["quantization"]
    integer_out = litert_predict(device_bytes, check_windows)
    integer_diff = integer_out - keras_out
    integer_rms = float(np.sqrt(np.mean(integer_diff**2)))
    if integer_rms > bound:
        raise ExportVerificationError(
            f"the integer FlatBuffer deviates from Keras by {integer_rms:.3g} µg/m³ RMS "
            f"(bound {bound:.3g}): check the representative set"
        )
    device_inputs = graph_input(check_windows, source)
    micro_raw = run_tflm(device_bytes, device_inputs).reshape(-1)
    micro = (micro_raw.astype(np.float32) - out_zero) * out_scale
    micro_rms = float(np.sqrt(np.mean((micro - integer_out) ** 2)))
    if micro_rms > bound:
        raise ExportVerificationError(
            f"TFLite Micro and LiteRT disagree on the device model by {micro_rms:.3g} µg/m³ RMS"
        )
    device_path = out_dir / INT8_FILENAME
    device_path.write_bytes(device_bytes)
    arena = measure_arena(device_path, device_inputs[0])
    return _DeviceGraph(
        file=ModelFile(
            path=INT8_FILENAME,
            sha256=sha256_file(device_path),
            size_bytes=device_path.stat().st_size,
            precision="int8",
            activations="int16",
            batch=1,
            ops=device_ops,
            tflm_arena_bytes=arena,
            input_scale=float(in_scale),
            input_zero_point=int(in_zero),
            output_scale=float(out_scale),
            output_zero_point=int(out_zero),
        ),
        max_abs_error=float(np.max(np.abs(integer_diff))),
        rms_error=integer_rms,
        bound=bound,
        rmse_vs_reference=_rmse(integer_out, check_reference),
        micro_diff=float(np.max(np.abs(micro - integer_out))),
    )
