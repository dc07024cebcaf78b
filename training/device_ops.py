"""The builtin operators the Arduino TFLite Micro library can register.

Arduino_TensorFlowLite (tflite-micro-arduino-examples, last synced early 2023) exposes these
``MicroMutableOpResolver::Add*`` methods. Every int8 model is checked against this set at
export, and the firmware registers exactly the subset its model uses (from the manifest).
Notably absent: BATCH_MATMUL, which Keras MultiHeadAttention emits.
"""

from __future__ import annotations

__all__ = ["ARDUINO_TFLM_OPS", "unsupported_on_device"]

ARDUINO_TFLM_OPS = frozenset(
    {
        "ABS", "ADD", "ADD_N", "ARG_MAX", "ARG_MIN", "ASSIGN_VARIABLE", "AVERAGE_POOL_2D",
        "BATCH_TO_SPACE_ND", "BROADCAST_ARGS", "BROADCAST_TO", "CALL_ONCE", "CAST", "CEIL",
        "CONCATENATION", "CONV_2D", "COS", "CUMSUM", "DEPTH_TO_SPACE", "DEPTHWISE_CONV_2D",
        "DEQUANTIZE", "DIV", "ELU", "EQUAL", "EXP", "EXPAND_DIMS", "FILL", "FLOOR", "FLOOR_DIV",
        "FLOOR_MOD", "FULLY_CONNECTED", "GATHER", "GATHER_ND", "GREATER", "GREATER_EQUAL",
        "HARD_SWISH", "IF", "L2_NORMALIZATION", "L2_POOL_2D", "LEAKY_RELU", "LESS", "LESS_EQUAL",
        "LOG", "LOGICAL_AND", "LOGICAL_NOT", "LOGICAL_OR", "LOGISTIC", "LOG_SOFTMAX", "MAXIMUM",
        "MAX_POOL_2D", "MEAN", "MINIMUM", "MIRROR_PAD", "MUL", "NEG", "NOT_EQUAL", "PACK", "PAD",
        "PADV2", "PRELU", "QUANTIZE", "READ_VARIABLE", "REDUCE_MAX", "RELU", "RELU6", "RESHAPE",
        "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "ROUND", "RSQRT", "SELECT_V2", "SHAPE",
        "SIN", "SLICE", "SOFTMAX", "SPACE_TO_BATCH_ND", "SPACE_TO_DEPTH", "SPLIT", "SPLIT_V",
        "SQRT", "SQUARE", "SQUARED_DIFFERENCE", "SQUEEZE", "STRIDED_SLICE", "SUB", "SUM", "SVDF",
        "TANH", "TRANSPOSE", "TRANSPOSE_CONV", "UNIDIRECTIONAL_SEQUENCE_LSTM", "UNPACK",
        "VAR_HANDLE", "WHILE", "ZEROS_LIKE",
    }
)  # fmt: skip


def unsupported_on_device(ops: list[str]) -> list[str]:
    """The operators of a graph the Arduino library cannot run, sorted (empty: it runs)."""
    return sorted(set(ops) - ARDUINO_TFLM_OPS)
