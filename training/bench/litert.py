"""One window through LiteRT, set up once for the benchmark's measurements (FLOPs, latency)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["OneWindow", "one_window"]


class OneWindow:
    """An interpreter allocated for a batch of one window, with that window as its input."""

    def __init__(self, interpreter: Any, data: npt.NDArray[np.generic]) -> None:
        self.interpreter = interpreter
        self.data = data
        self._input = int(interpreter.get_input_details()[0]["index"])
        self._output = int(interpreter.get_output_details()[0]["index"])

    def invoke(self) -> None:
        self.interpreter.set_tensor(self._input, self.data)
        self.interpreter.invoke()
        self.interpreter.get_tensor(self._output)


def one_window(flatbuffer: bytes, window: npt.NDArray[np.float32], **options: Any) -> OneWindow:
    """``window`` ([N] or [N, C], raw units) ready to run; ``options`` go to the Interpreter.

    Dynamic-batch graphs are resized to one window; integer graphs get the window quantised.
    """
    from ai_edge_litert.interpreter import Interpreter

    from training.export import graph_input

    interpreter = Interpreter(model_content=flatbuffer, **options)
    source = interpreter.get_input_details()[0]
    batch = np.asarray(window, dtype=np.float32)[None, ...]
    if list(source["shape"]) != list(batch.shape):
        interpreter.resize_tensor_input(source["index"], list(batch.shape))
    interpreter.allocate_tensors()
    return OneWindow(interpreter, graph_input(batch, source))
