"""FLOPs per calibration, counted from the operators stored in a FlatBuffer.

Method: for the graph as stored (batch 1), each operator is charged the floating-point work a
straightforward kernel does: FULLY_CONNECTED 2·rows·in·out (+ rows·out for the bias); MUL, ADD,
SUB, ABS, RSQRT one per output element; SUM and MEAN one per input element; SOFTMAX three per
element (exponential, sum, divide). RESHAPE, TRANSPOSE, STRIDED_SLICE, QUANTIZE and DEQUANTIZE
move data and are charged nothing. The same rule counts the float and the integer graph.
"""

from __future__ import annotations

import math

from training.flatbuffer import Graph, GraphOp

__all__ = ["count_flops", "flops_by_op"]

_ELEMENTWISE = {"MUL", "ADD", "SUB", "ABS", "RSQRT", "SQUARED_DIFFERENCE", "DIV", "EXP"}
_REDUCTIONS = {"SUM", "MEAN"}


def _elements(shape: tuple[int, ...]) -> int:
    return math.prod(max(1, dim) for dim in shape)


def _op_flops(op: GraphOp) -> int:
    if op.name == "FULLY_CONNECTED":
        weights = op.input_shapes[1]  # [out, in]
        rows = _elements(op.input_shapes[0]) // weights[1]
        has_bias = len(op.input_shapes) > 2 and len(op.input_shapes[2]) > 0
        return 2 * rows * weights[0] * weights[1] + (rows * weights[0] if has_bias else 0)
    if op.name in _ELEMENTWISE:
        return _elements(op.output_shapes[0])
    if op.name in _REDUCTIONS:
        return _elements(op.input_shapes[0])
    if op.name == "SOFTMAX":
        return 3 * _elements(op.output_shapes[0])
    return 0


def flops_by_op(graph: Graph) -> dict[str, int]:
    totals: dict[str, int] = {}
    for op in graph.ops:
        totals[op.name] = totals.get(op.name, 0) + _op_flops(op)
    return totals


def count_flops(graph: Graph) -> int:
    """FLOPs for one calibration (the stored graph's batch of one)."""
    return sum(_op_flops(op) for op in graph.ops)
