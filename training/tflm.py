"""Run FlatBuffers under the TFLite Micro interpreter and measure the arena they need.

TFLite Micro is the runtime on the Arduino node; running the exported file here proves the
device can execute it (same kernels, fixed shapes, no dynamic allocation). An allocation that is
too small can abort the interpreter, so the arena search runs in a child process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tflite_micro.python.tflite_micro import runtime

from training.errors import ExportVerificationError

__all__ = ["measure_arena", "run_tflm"]

_GENEROUS_ARENA = 256 * 1024  # the nRF52840's whole RAM: anything that fits runs here


def run_tflm(
    flatbuffer: bytes, inputs: npt.NDArray[np.generic], arena_size: int = _GENEROUS_ARENA
) -> npt.NDArray[np.generic]:
    """Invoke the batch-1 graph once per row of ``inputs`` (already in the input's dtype)."""
    try:
        interpreter = runtime.Interpreter.from_bytes(flatbuffer, arena_size=arena_size)
    except RuntimeError as exc:
        raise ExportVerificationError(f"TFLite Micro cannot load the model: {exc}") from exc
    outputs = []
    for row in inputs:
        interpreter.set_input(row[None, ...], 0)
        interpreter.invoke()
        outputs.append(np.array(interpreter.get_output(0)).reshape(-1))
    return np.stack(outputs)


def _arena_works(flatbuffer: bytes, sample: npt.NDArray[np.generic], size: int) -> bool:
    try:
        interpreter = runtime.Interpreter.from_bytes(flatbuffer, arena_size=size)
        interpreter.set_input(sample[None, ...], 0)
        interpreter.invoke()
    except RuntimeError:
        return False
    return True


def _search_arena(flatbuffer: bytes, sample: npt.NDArray[np.generic]) -> int:
    """Smallest arena (16-byte steps) with which the model allocates and invokes."""
    low, high = 1024, _GENEROUS_ARENA
    if not _arena_works(flatbuffer, sample, high):
        raise ExportVerificationError(f"the model does not run in TFLite Micro with {high} bytes")
    while high - low > 16:
        middle = (low + high) // 2 // 16 * 16
        if _arena_works(flatbuffer, sample, middle):
            high = middle
        else:
            low = middle
    return high


def measure_arena(flatbuffer_path: Path, sample: npt.NDArray[np.generic]) -> int:
    """Measure the minimal TFLite Micro arena in a child process (a failed probe may abort)."""
    with tempfile.TemporaryDirectory() as scratch:
        sample_path = Path(scratch) / "sample.npy"
        np.save(sample_path, sample)
        completed = subprocess.run(  # noqa: S603 - our own interpreter and module, no shell
            [sys.executable, "-m", "training.tflm", str(flatbuffer_path), str(sample_path)],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        raise ExportVerificationError(
            f"arena measurement failed (exit {completed.returncode}): {completed.stderr[-500:]}"
        )
    return int(json.loads(lines[-1])["arena_bytes"])


def _main(argv: list[str]) -> None:
    flatbuffer = Path(argv[0]).read_bytes()
    sample = np.load(argv[1])
    print(json.dumps({"arena_bytes": _search_arena(flatbuffer, sample)}))


if __name__ == "__main__":
    _main(sys.argv[1:])
