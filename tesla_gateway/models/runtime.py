"""Which TFLite interpreter runs the models, behind one small typed protocol.

LiteRT (``ai_edge_litert``) is the default; ``tflite_runtime`` is the fallback for 32-bit boards
without LiteRT wheels; ``tensorflow.lite`` is accepted last, only when TensorFlow happens to be
installed (a development machine): the gateway itself never requires TensorFlow.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

import numpy as np
import numpy.typing as npt

from tesla_gateway.errors import ModelLoadError
from tesla_gateway.models.native_stderr import native_stderr_logged

__all__ = [
    "DEFAULT_RUNTIME_PREFERENCE",
    "BatchedInterpreter",
    "Interpreter",
    "Runtime",
    "RuntimeName",
    "RuntimeUnavailableError",
    "select_runtime",
]

RuntimeName = Literal["ai_edge_litert", "tflite_runtime", "tensorflow"]
DEFAULT_RUNTIME_PREFERENCE: tuple[RuntimeName, ...] = (
    "ai_edge_litert",
    "tflite_runtime",
    "tensorflow",
)
# Module to import and the attribute path to the Interpreter class in it (``tf.lite`` is an
# attribute of the ``tensorflow`` API module, not the ``tensorflow.lite`` package).
_MODULES: dict[RuntimeName, tuple[str, str]] = {
    "ai_edge_litert": ("ai_edge_litert.interpreter", "Interpreter"),
    "tflite_runtime": ("tflite_runtime.interpreter", "Interpreter"),
    "tensorflow": ("tensorflow", "lite.Interpreter"),
}
_TOP_LEVEL: dict[RuntimeName, str] = {
    "ai_edge_litert": "ai_edge_litert",
    "tflite_runtime": "tflite_runtime",
    "tensorflow": "tensorflow",
}

Float32Array = npt.NDArray[np.float32]


class RuntimeUnavailableError(ModelLoadError):
    """None of the preferred interpreters can be imported on this machine."""


class Interpreter(Protocol):
    """The part of the TFLite ``Interpreter`` API the gateway uses (same in all three)."""

    def get_input_details(self) -> list[dict[str, Any]]: ...

    def get_output_details(self) -> list[dict[str, Any]]: ...

    def resize_tensor_input(
        self, input_index: int, tensor_size: Sequence[int], strict: bool = False
    ) -> None: ...

    def allocate_tensors(self) -> None: ...

    def set_tensor(self, tensor_index: int, value: npt.NDArray[Any]) -> None: ...

    def invoke(self) -> None: ...

    def get_tensor(self, tensor_index: int) -> npt.NDArray[Any]: ...


InterpreterFactory = Callable[[bytes, int | None], Interpreter]


@dataclass(frozen=True, slots=True)
class Runtime:
    """A chosen interpreter implementation; ``name`` is what the start-up log reports."""

    name: RuntimeName
    version: str
    factory: InterpreterFactory

    def interpreter(self, model_content: bytes, num_threads: int | None = None) -> Interpreter:
        return self.factory(model_content, num_threads)


def _load(name: RuntimeName) -> Runtime:
    module_name, attribute_path = _MODULES[name]
    found: object = importlib.import_module(module_name)
    for attribute in attribute_path.split("."):
        found = getattr(found, attribute, None)
        if found is None:
            raise ImportError(f"{module_name} has no {attribute_path}")
    interpreter_class = cast("Callable[..., Interpreter]", found)
    top = importlib.import_module(_TOP_LEVEL[name])
    version = str(getattr(top, "__version__", "unknown"))

    def factory(model_content: bytes, num_threads: int | None) -> Interpreter:
        # The first allocation creates the XNNPACK delegate, which announces itself on fd 2.
        with native_stderr_logged(f"{name} interpreter"):
            interpreter = interpreter_class(model_content=model_content, num_threads=num_threads)
            interpreter.allocate_tensors()
        return interpreter

    return Runtime(name=name, version=version, factory=factory)


def select_runtime(preference: Sequence[RuntimeName] = DEFAULT_RUNTIME_PREFERENCE) -> Runtime:
    """The first importable runtime in ``preference``; the error lists why each was skipped."""
    skipped: list[str] = []
    for name in preference:
        if importlib.util.find_spec(_TOP_LEVEL[name]) is None:
            skipped.append(f"{name}: not installed")
            continue
        try:
            return _load(name)
        except ImportError as exc:
            skipped.append(f"{name}: {exc}")
    raise RuntimeUnavailableError(
        "no TFLite interpreter available ("
        + "; ".join(skipped or ["empty preference"])
        + "); install ai-edge-litert (or tflite-runtime on 32-bit boards)"
    )


DEFAULT_MAX_BATCH = 128


class BatchedInterpreter:
    """One model's interpreter, fed ``[B, ...]`` windows in one invoke.

    The input is resized only when the batch size changes (resizing reallocates every tensor);
    a lock makes it safe to call from the worker threads ``asyncio.to_thread`` uses. Batches
    larger than ``max_batch`` run as equal chunks of ``max_batch`` (the last one padded): the
    interpreter's intermediate tensors grow with the batch (attention holds B·z²·d values), so
    one 10,000-window invoke needed ~180 MB and ran slower per window than 1,024-window chunks.
    128-window chunks run fastest per window (the default model under LiteRT, one thread, four
    runs: 1.74-1.85 µs at 128, 1.80-1.94 µs at 256, 1.91-2.31 µs at 512, 2.41-3.02 µs at
    1,024) and the interpreter holds about 1 MiB for them instead of 9 MiB at 1,024.
    """

    def __init__(self, interpreter: Interpreter, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self._interpreter = interpreter
        self.max_batch = max_batch
        inputs = interpreter.get_input_details()
        outputs = interpreter.get_output_details()
        if len(inputs) != 1 or len(outputs) != 1:
            raise ModelLoadError(
                f"the model has {len(inputs)} inputs and {len(outputs)} outputs; "
                "the gateway runs graphs with exactly one of each"
            )
        self._input_index = int(inputs[0]["index"])
        self._output_index = int(outputs[0]["index"])
        self.input_signature = tuple(int(v) for v in inputs[0]["shape_signature"])
        self.output_signature = tuple(int(v) for v in outputs[0]["shape_signature"])
        self.input_dtype = np.dtype(inputs[0]["dtype"])
        self._batch = -1
        self._lock = threading.Lock()

    @property
    def dynamic_batch(self) -> bool:
        return len(self.input_signature) > 0 and self.input_signature[0] == -1

    def run(self, batch: Float32Array) -> Float32Array:
        """Outputs ``[B]`` for inputs ``[B, ...]`` (the model's single output column)."""
        size = int(batch.shape[0])
        if size <= self.max_batch:
            return self._invoke(batch)
        outputs = []
        for start in range(0, size, self.max_batch):
            chunk = batch[start : start + self.max_batch]
            if len(chunk) < self.max_batch:  # pad only the tail, with real windows (no NaN)
                filler = np.repeat(chunk[-1:], self.max_batch - len(chunk), axis=0)
                chunk = np.concatenate([chunk, filler])
            outputs.append(self._invoke(np.ascontiguousarray(chunk)))
        return np.concatenate(outputs)[:size]

    def _invoke(self, batch: Float32Array) -> Float32Array:
        size = int(batch.shape[0])
        with self._lock:
            if size != self._batch:
                self._interpreter.resize_tensor_input(self._input_index, list(batch.shape))
                self._interpreter.allocate_tensors()
                self._batch = size
            self._interpreter.set_tensor(self._input_index, batch)
            self._interpreter.invoke()
            out = self._interpreter.get_tensor(self._output_index)
        return np.asarray(out, dtype=np.float32).reshape(size, -1)[:, 0].copy()
