"""Read a TFLite FlatBuffer's graph (operators and tensor shapes) without running it.

Used to list the operators a model needs (the firmware registers exactly these) and to count
its FLOPs for the benchmarks. Parsing uses the schema bindings shipped with ``tflite-micro``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tflite_micro.python.tflite_micro import runtime

__all__ = ["Graph", "GraphOp", "read_graph"]

_SCHEMA = runtime.schema_fb
_OP_NAMES = {value: name for name, value in vars(_SCHEMA.BuiltinOperator).items() if name.isupper()}
_TENSOR_DTYPES = {
    _SCHEMA.TensorType.FLOAT32: np.float32,
    _SCHEMA.TensorType.INT8: np.int8,
    _SCHEMA.TensorType.INT16: np.int16,
    _SCHEMA.TensorType.INT32: np.int32,
    _SCHEMA.TensorType.UINT8: np.uint8,
}


@dataclass(frozen=True)
class GraphOp:
    """One operator with the static shapes of its tensors (batch dimension as stored)."""

    name: str
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    constant_inputs: tuple[bool, ...]
    # Non-zero entries of a constant weight tensor (second input), when it is one: a 0/1
    # selection matrix multiplies mostly by zero, which FLOP counting should not charge.
    weight_nonzero: int | None = None


@dataclass(frozen=True)
class Graph:
    ops: tuple[GraphOp, ...]
    input_shape_signature: tuple[int, ...]

    @property
    def op_names(self) -> list[str]:
        return sorted({op.name for op in self.ops})


def read_graph(flatbuffer: bytes) -> Graph:
    """Parse the first subgraph of a FlatBuffer."""
    model = _SCHEMA.ModelT.InitFromPackedBuf(bytearray(flatbuffer), 0)
    codes = [
        _OP_NAMES[max(code.builtinCode, code.deprecatedBuiltinCode)] for code in model.operatorCodes
    ]
    subgraph = model.subgraphs[0]
    tensors = subgraph.tensors

    def shape(index: int) -> tuple[int, ...]:
        stored = tensors[index].shape
        return () if stored is None else tuple(int(v) for v in np.asarray(stored).tolist())

    def constant(index: int) -> bool:
        buffer = model.buffers[tensors[index].buffer]
        return buffer.data is not None and len(buffer.data) > 0

    def weight_nonzero(inputs: list[int]) -> int | None:
        if len(inputs) < 2 or inputs[1] < 0 or not constant(inputs[1]):
            return None
        tensor = tensors[inputs[1]]
        dtype = _TENSOR_DTYPES.get(tensor.type)
        if dtype is None:
            return None
        data = np.frombuffer(bytes(model.buffers[tensor.buffer].data), dtype=dtype)
        return int(np.count_nonzero(data))

    ops = tuple(
        GraphOp(
            name=codes[op.opcodeIndex],
            input_shapes=tuple(shape(i) for i in op.inputs if i >= 0),
            output_shapes=tuple(shape(i) for i in op.outputs),
            constant_inputs=tuple(constant(i) for i in op.inputs if i >= 0),
            weight_nonzero=weight_nonzero(list(op.inputs)),
        )
        for op in subgraph.operators
    )
    first_input = tensors[subgraph.inputs[0]]
    signature = first_input.shapeSignature if first_input.shapeSignature is not None else None
    input_signature = tuple(
        int(v) for v in (signature if signature is not None else first_input.shape)
    )
    return Graph(ops=ops, input_shape_signature=input_signature)
