"""Cost of one calibration: parameters, FLOPs, peak memory, file sizes, latency, TFLite Micro.

Methods (also written into every report):

* **Parameters**: the Keras model's weight count.
* **FLOPs**: counted from the exported float FlatBuffer, operator by operator, with the shapes of
  one batch-1 invoke (:mod:`training.bench.flops`). ``int8_flops`` applies the same rule to the
  device graph.
* **Peak activation memory** (float graph, batch 1): run the operators in their stored order;
  each non-constant tensor lives from the operator that writes it (graph inputs: from the start)
  to the last operator that reads it (graph outputs: to the end); the peak is the largest total
  of bytes alive at once. Weights are excluded (``weight_bytes``: they stay in the FlatBuffer).
  This is what an ideal memory planner needs for that order; LiteRT's arena is at least this.
  On the device, the measured TFLite Micro arena (integer graph, 16-bit activations, including
  the interpreter's bookkeeping) is the figure that matters.
* **Sizes**: bytes of ``model.tflite`` (float32) and ``model_int8.tflite`` (int8 weights,
  int16 activations).
* **Latency**: LiteRT as the gateway runs it (default resolver, one thread), one window per
  invoke, best of three rounds of at least 0.1 s: microseconds per calibration on this machine.
* **TFLite Micro**: the device graph runs under the TFLite Micro interpreter with the smallest
  working arena (:func:`training.tflm.measure_arena`), or the reason it does not: no integer
  graph (conversion failed), or the arena it would need (recorded with a 64 MiB arena) exceeds
  the nRF52840's 256 KiB of RAM.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import numpy.typing as npt

from training.bench.cells import Efficiency, TflmStatus
from training.bench.flops import (
    ResolvedGraph,
    count_flops,
    flops_by_op,
    resolve_graph,
    uncounted_ops,
)
from training.bench.litert import one_window
from training.bench.timing import best_rate
from training.errors import ExportVerificationError

__all__ = [
    "DEVICE_RAM_BYTES",
    "METHODS",
    "ExportOutcome",
    "litert_latency_us",
    "measure_efficiency",
    "peak_activation_bytes",
    "tflm_status",
]

DEVICE_RAM_BYTES = 256 * 1024  # Arduino Nano 33 BLE Sense (nRF52840)
_LARGE_ARENA = 64 * 2**20
_ARENA_TOTAL = re.compile(r"Arena allocation total (\d+) bytes")
METHODS = {
    "parameters": "weights of the Keras model",
    "flops": (
        "counted per operator of the float FlatBuffer with the tensor shapes of one batch-1 "
        "invoke: FULLY_CONNECTED 2·rows·in·out (+bias), BATCH_MATMUL 2·out·K, CONV_2D "
        "2·out·kh·kw·in (+bias), elementwise ops 1 per output element, reductions and pooling "
        "1 per input element, SOFTMAX 3 per element, data movement 0"
    ),
    "peak_activation_bytes": (
        "largest total of non-constant tensor bytes alive at once, float graph, batch 1, "
        "operators in stored order (weights excluded)"
    ),
    "sizes": "bytes of model.tflite (float32) and model_int8.tflite (int8 weights, int16 act.)",
    "latency": "LiteRT, default resolver, 1 thread, batch 1, best of 3 rounds of >= 0.1 s",
    "tflm": (
        "TFLite Micro interpreter on the device graph, smallest working arena; the device has "
        "256 KiB of RAM"
    ),
}


@dataclass(frozen=True)
class ExportOutcome:
    """What the export step produced for one cell."""

    float_bytes: bytes
    int8_path: Path | None
    verified: bool
    reason: str | None
    arena_bytes: int | None  # measured by the verified export
    float_rmse_vs_reference: float | None = None
    integer_rmse_vs_reference: float | None = None


def peak_activation_bytes(graph: ResolvedGraph) -> int:
    """Peak bytes of live non-constant tensors over the operators in stored order."""
    last = len(graph.ops)
    start: dict[int, int] = dict.fromkeys(graph.inputs, 0)
    end: dict[int, int] = {}
    for position, op in enumerate(graph.ops):
        for index in op.outputs:
            start.setdefault(index, position)
            end[index] = max(end.get(index, position), position)
        for index in op.inputs:
            if index not in graph.constants:
                end[index] = max(end.get(index, position), position)
    for index in graph.outputs:
        end[index] = last
    live = np.zeros(last + 1, dtype=np.int64)
    for index, first in start.items():
        live[first : end.get(index, first) + 1] += graph.tensor_bytes(index)
    return int(live.max()) if live.size else 0


def litert_latency_us(
    flatbuffer: bytes, window: npt.NDArray[np.float32], *, rounds: int = 3, min_seconds: float = 0.1
) -> float:
    """Microseconds per batch-1 calibration under LiteRT (as the gateway runs it, 1 thread)."""
    run = one_window(flatbuffer, window, num_threads=1)
    return 1e6 / best_rate(run.invoke, 1, rounds=rounds, min_seconds=min_seconds)


def _device_sample(int8_bytes: bytes, window: npt.NDArray[np.float32]) -> npt.NDArray[np.generic]:
    return one_window(int8_bytes, window).data[0]


def _recorded_arena(int8_path: Path, sample: npt.NDArray[np.generic]) -> int | None:
    """Arena the TFLite Micro recording allocator reports with a very large arena (child)."""
    with tempfile.TemporaryDirectory() as scratch:
        sample_path = Path(scratch) / "sample.npy"
        np.save(sample_path, sample)
        completed = subprocess.run(  # noqa: S603 - our own interpreter and module, no shell
            [sys.executable, "-m", "training.tflm", "record", str(int8_path), str(sample_path),
             str(_LARGE_ARENA)],
            capture_output=True, text=True, check=False, timeout=1200,
        )  # fmt: skip
    match = _ARENA_TOTAL.search(completed.stdout + completed.stderr)
    return int(match.group(1)) if completed.returncode == 0 and match else None


def tflm_status(
    int8_path: Path | None, window: npt.NDArray[np.float32], reason: str | None
) -> TflmStatus:
    """Run the device graph under TFLite Micro and measure its arena, or say why it cannot run."""
    from training.tflm import measure_arena

    if int8_path is None:
        return TflmStatus(runs=False, reason=f"no device graph: {reason}")
    sample = _device_sample(int8_path.read_bytes(), window)
    try:
        return TflmStatus(runs=True, arena_bytes=measure_arena(int8_path, sample))
    except ExportVerificationError as exc:
        needed = _recorded_arena(int8_path, sample)
        if needed is not None and needed > DEVICE_RAM_BYTES:
            return TflmStatus(
                runs=False,
                arena_bytes=needed,
                reason=f"needs a {needed:,} B arena; the nRF52840 has {DEVICE_RAM_BYTES:,} B RAM",
            )
        return TflmStatus(runs=False, arena_bytes=needed, reason=str(exc))


def measure_efficiency(
    model: keras.Model,
    outcome: ExportOutcome,
    window: npt.NDArray[np.float32],
    *,
    device: bool,
) -> Efficiency:
    """Measure one exported model; ``device``: also the integer graph and TFLite Micro."""
    graph = resolve_graph(outcome.float_bytes, window)
    int8_bytes = outcome.int8_path.read_bytes() if device and outcome.int8_path else None
    if not device:
        tflm = TflmStatus(runs=False, reason="not measured (sweep cell, float export only)")
    elif outcome.verified and outcome.arena_bytes is not None:
        tflm = TflmStatus(runs=True, arena_bytes=outcome.arena_bytes)
    else:
        tflm = tflm_status(outcome.int8_path, window, outcome.reason)
    return Efficiency(
        parameters=int(model.count_params()),
        flops=count_flops(graph),
        flops_by_op={k: v for k, v in sorted(flops_by_op(graph).items()) if v},
        uncounted_ops=uncounted_ops(graph),
        peak_activation_bytes=peak_activation_bytes(graph),
        weight_bytes=sum(graph.tensor_bytes(i) for i in graph.constants),
        float_bytes=len(outcome.float_bytes),
        int8_bytes=len(int8_bytes) if int8_bytes is not None else None,
        int8_flops=count_flops(resolve_graph(int8_bytes, window)) if int8_bytes else None,
        litert_us_float=litert_latency_us(outcome.float_bytes, window),
        litert_us_int8=litert_latency_us(int8_bytes, window) if int8_bytes else None,
        tflm=tflm,
        export_verified=outcome.verified,
        export_reason=outcome.reason,
        integer_rmse_vs_reference=outcome.integer_rmse_vs_reference,
        float_rmse_vs_reference=outcome.float_rmse_vs_reference,
    )
