"""Run FlatBuffers under the TFLite Micro interpreter and measure the arena they need.

TFLite Micro is the runtime on the Arduino node; running the exported file here proves the
device can execute it (same kernels, fixed shapes, no dynamic allocation). An allocation that is
too small can abort the interpreter, so the arena search runs in a child process.
"""

from __future__ import annotations

import re
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
_ALIGNMENT = 16
_HEADROOM_STEPS = (1.0, 1.05, 1.1, 1.2, 1.3, 1.4, 1.6, 2.0)
_ARENA_TOTAL = re.compile(r"Arena allocation total (\d+) bytes")


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


def _child(mode: str, flatbuffer_path: Path, sample_path: Path, size: int) -> str:
    completed = subprocess.run(  # noqa: S603 - our own interpreter and module, no shell
        [sys.executable, "-m", "training.tflm", mode, str(flatbuffer_path), str(sample_path),
         str(size)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )  # fmt: skip
    if completed.returncode != 0:
        raise ExportVerificationError(
            f"TFLite Micro {mode} with a {size}-byte arena failed "
            f"(exit {completed.returncode}): {completed.stderr[-400:]}"
        )
    return completed.stdout + completed.stderr


def measure_arena(flatbuffer_path: Path, sample: npt.NDArray[np.generic]) -> int:
    """Smallest arena (in 5-10 % steps above the recording allocator's total) that invokes.

    The recorded total omits the interpreter's own bookkeeping, so the first size that really
    allocates and invokes is what the device must reserve. Each run is a child process: an
    interpreter given too little memory may abort.
    """
    with tempfile.TemporaryDirectory() as scratch:
        sample_path = Path(scratch) / "sample.npy"
        np.save(sample_path, sample)
        report = _child("record", flatbuffer_path, sample_path, _GENEROUS_ARENA)
        match = _ARENA_TOTAL.search(report)
        if match is None:
            raise ExportVerificationError(f"TFLite Micro reported no arena total: {report[-300:]}")
        recorded = int(match.group(1))
        for factor in _HEADROOM_STEPS:
            size = int(recorded * factor + _ALIGNMENT - 1) // _ALIGNMENT * _ALIGNMENT
            try:
                _child("invoke", flatbuffer_path, sample_path, size)
            except ExportVerificationError:
                continue
            return size
    raise ExportVerificationError(
        f"TFLite Micro recorded {recorded} bytes but no arena up to {_HEADROOM_STEPS[-1]}x works"
    )


def _main(argv: list[str]) -> None:
    mode, flatbuffer_path, sample_path, size = argv[0], argv[1], argv[2], int(argv[3])
    interpreter = runtime.Interpreter.from_bytes(
        Path(flatbuffer_path).read_bytes(), arena_size=size
    )
    interpreter.set_input(np.load(sample_path)[None, ...], 0)
    interpreter.invoke()
    if mode == "record":
        sys.stdout.flush()
        interpreter.print_allocations()


if __name__ == "__main__":
    _main(sys.argv[1:])
