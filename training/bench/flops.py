"""FLOPs per calibration, counted from the operators of an exported FlatBuffer.

Method (the one place the project counts FLOPs; ``make bench`` re-exports it):

* **Shapes.** The graph is run once under LiteRT at batch 1 (reference kernels, no delegate,
  every tensor kept), and each operator is charged for the shapes its tensors really had.
  The shapes *stored* in the gateway's float FlatBuffer cannot be used: it has a dynamic batch
  dimension, so the converter stores placeholders for tensors behind a reshape (a Transformer's
  Q projection over 360 tokens is stored as [1, 8]). :func:`resolve_graph` does this;
  :func:`count_flops` also accepts the stored :class:`training.flatbuffer.Graph`, which is
  exact for fixed-shape graphs such as the batch-1 device graph.
* **Charges.** FULLY_CONNECTED 2·rows·(non-zero weights) (+ rows·out for a bias): a
  multiplication by a constant zero is not work the model needs (the gateway's attention sums
  each head's products with a 0/1 matrix, three quarters zeros at 4 heads), so a graph cannot
  look efficient by multiplying by zeros; for dense weights this is 2·rows·in·out. BATCH_MATMUL
  2·(output elements)·K; CONV_2D 2·(output elements)·kh·kw·in (+ output elements for a bias),
  DEPTHWISE_CONV_2D 2·(output elements)·kh·kw (+ bias); elementwise arithmetic, comparisons and
  activations (MUL, ADD, SUB, DIV, ABS, RSQRT, SQRT, EXP, LOGISTIC, TANH, RELU, MINIMUM,
  MAXIMUM, GREATER, LESS, …) one per output element; reductions (SUM, MEAN, REDUCE_MAX, …) and
  pooling one per input element; SOFTMAX three per element (exponential, sum, divide).
  Operators that only move or reinterpret data (RESHAPE, TRANSPOSE, STRIDED_SLICE, PACK,
  CONCATENATION, CAST, QUANTIZE, DEQUANTIZE, …) cost nothing. Any other operator is listed by
  :func:`uncounted_ops` rather than silently charged.
* The same rule counts the float and the integer graph; the two differ slightly because the
  device graph writes attention as MUL + SUM instead of BATCH_MATMUL (the same multiply-adds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from training.bench.litert import one_window
from training.flatbuffer import Graph, GraphOp

__all__ = [
    "FREE_OPS",
    "ResolvedGraph",
    "ResolvedOp",
    "count_flops",
    "flops_by_op",
    "resolve_graph",
    "uncounted_ops",
]

_ELEMENTWISE = frozenset(
    {
        "ABS", "ADD", "SUB", "MUL", "DIV", "RSQRT", "SQRT", "SQUARE", "SQUARED_DIFFERENCE",
        "EXP", "LOG", "LOGISTIC", "TANH", "RELU", "RELU6", "RELU_N1_TO_1", "LEAKY_RELU", "ELU",
        "GELU", "HARD_SWISH", "PRELU", "MINIMUM", "MAXIMUM", "GREATER", "GREATER_EQUAL", "LESS",
        "LESS_EQUAL", "EQUAL", "NOT_EQUAL", "NEG", "POW", "FLOOR", "CEIL", "ROUND", "SIN", "COS",
        "SELECT", "SELECT_V2", "LOGICAL_AND", "LOGICAL_OR", "LOGICAL_NOT",
    }
)  # fmt: skip
_REDUCTIONS = frozenset(
    {"SUM", "MEAN", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "MAX_POOL_2D", "AVERAGE_POOL_2D"}
)
FREE_OPS = frozenset(
    {
        "RESHAPE", "TRANSPOSE", "STRIDED_SLICE", "SLICE", "PACK", "UNPACK", "SHAPE",
        "CONCATENATION", "EXPAND_DIMS", "SQUEEZE", "CAST", "QUANTIZE", "DEQUANTIZE", "GATHER",
        "PAD", "PADV2", "SPLIT", "SPLIT_V", "TILE", "BROADCAST_TO", "FILL", "ZEROS_LIKE",
    }
)  # fmt: skip
_COUNTED = frozenset(
    {"FULLY_CONNECTED", "BATCH_MATMUL", "CONV_2D", "DEPTHWISE_CONV_2D", "SOFTMAX"}
) | _ELEMENTWISE | _REDUCTIONS  # fmt: skip


@dataclass(frozen=True)
class ResolvedOp:
    """One operator with the tensor indices it reads and writes (graph order)."""

    name: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass(frozen=True)
class ResolvedGraph:
    """Operators with the tensor shapes of one batch-1 invoke, and which tensors are weights."""

    ops: tuple[ResolvedOp, ...]
    shapes: dict[int, tuple[int, ...]]
    itemsizes: dict[int, int]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    constants: frozenset[int]
    nonzero: dict[int, int] = field(default_factory=dict)  # constant tensor -> non-zero entries

    def tensor_bytes(self, index: int) -> int:
        return math.prod(self.shapes.get(index, ())) * self.itemsizes.get(index, 0)

    def as_graph(self) -> Graph:
        """The same operators as a :class:`training.flatbuffer.Graph` (for :func:`count_flops`)."""

        def shapes(indices: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
            return tuple(self.shapes.get(i, ()) for i in indices)

        ops = tuple(
            GraphOp(
                name=op.name,
                input_shapes=shapes(op.inputs),
                output_shapes=shapes(op.outputs),
                constant_inputs=tuple(i in self.constants for i in op.inputs),
                weight_nonzero=self.nonzero.get(op.inputs[1]) if len(op.inputs) > 1 else None,
            )
            for op in self.ops
        )
        return Graph(ops=ops, input_shape_signature=self.shapes.get(self.inputs[0], ()))


def resolve_graph(flatbuffer: bytes, window: npt.NDArray[np.float32]) -> ResolvedGraph:
    """Invoke the graph once on ``window`` ([N] or [N, C], raw units) at batch 1 and record
    the shape of every tensor each operator touched."""
    from ai_edge_litert.interpreter import OpResolverType

    run = one_window(
        flatbuffer,
        window,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        experimental_preserve_all_tensors=True,
        num_threads=1,
    )
    run.invoke()
    interpreter = run.interpreter

    details = {d["index"]: d for d in interpreter.get_tensor_details()}
    ops = tuple(
        ResolvedOp(
            name=str(op["op_name"]),
            inputs=tuple(int(i) for i in op["inputs"] if i >= 0),
            outputs=tuple(int(i) for i in op["outputs"] if i >= 0),
        )
        for op in interpreter._get_ops_details()  # LiteRT's (experimental) op table
    )
    produced = {i for op in ops for i in op.outputs}
    graph_inputs = tuple(int(d["index"]) for d in interpreter.get_input_details())
    graph_outputs = tuple(int(d["index"]) for d in interpreter.get_output_details())
    read = {i for op in ops for i in op.inputs}
    constants = frozenset(read - produced - set(graph_inputs))
    nonzero = {i: int(np.count_nonzero(interpreter.get_tensor(i))) for i in constants}
    return ResolvedGraph(
        ops=ops,
        shapes={i: tuple(int(v) for v in d["shape"]) for i, d in details.items()},
        itemsizes={i: int(np.dtype(d["dtype"]).itemsize) for i, d in details.items()},
        inputs=graph_inputs,
        outputs=graph_outputs,
        constants=constants,
        nonzero=nonzero,
    )


def _elements(shape: tuple[int, ...]) -> int:
    return math.prod(max(1, dim) for dim in shape)


def _has_bias(op: GraphOp) -> bool:
    return len(op.input_shapes) > 2 and len(op.input_shapes[2]) > 0


def _op_flops(op: GraphOp) -> int:  # noqa: PLR0911 - one return per operator family
    name = op.name
    if name == "FULLY_CONNECTED":
        weights = op.input_shapes[1]  # [out, in]
        rows = _elements(op.input_shapes[0]) // max(1, weights[1])
        nonzero = weights[0] * weights[1] if op.weight_nonzero is None else op.weight_nonzero
        return 2 * rows * nonzero + (rows * weights[0] if _has_bias(op) else 0)
    if name == "BATCH_MATMUL":
        output = op.output_shapes[0]  # [..., M, P]
        rows = _elements(output) // max(1, output[-1])  # batch · M
        inner = _elements(op.input_shapes[0]) // max(1, rows)  # K (whatever the adjoint flags)
        return 2 * _elements(output) * inner
    if name == "CONV_2D":
        kernel = op.input_shapes[1]  # [out, kh, kw, in]
        out = _elements(op.output_shapes[0])
        return 2 * out * kernel[1] * kernel[2] * kernel[3] + (out if _has_bias(op) else 0)
    if name == "DEPTHWISE_CONV_2D":
        kernel = op.input_shapes[1]  # [1, kh, kw, out]
        out = _elements(op.output_shapes[0])
        return 2 * out * kernel[1] * kernel[2] + (out if _has_bias(op) else 0)
    if name in _ELEMENTWISE:
        return _elements(op.output_shapes[0])
    if name in _REDUCTIONS:
        return _elements(op.input_shapes[0])
    if name == "SOFTMAX":
        return 3 * _elements(op.output_shapes[0])
    return 0


def flops_by_op(graph: Graph | ResolvedGraph) -> dict[str, int]:
    """FLOPs per operator type for one calibration."""
    stored = graph.as_graph() if isinstance(graph, ResolvedGraph) else graph
    totals: dict[str, int] = {}
    for op in stored.ops:
        totals[op.name] = totals.get(op.name, 0) + _op_flops(op)
    return totals


def count_flops(graph: Graph | ResolvedGraph) -> int:
    """FLOPs for one calibration (batch of one)."""
    return sum(flops_by_op(graph).values())


def uncounted_ops(graph: Graph | ResolvedGraph) -> list[str]:
    """Operators this method has no charge for (neither counted nor known to be free)."""
    stored = graph.as_graph() if isinstance(graph, ResolvedGraph) else graph
    return sorted({op.name for op in stored.ops} - _COUNTED - FREE_OPS)
