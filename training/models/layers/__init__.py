"""Layers shared by TESLA and the baselines, written to export to small, portable FlatBuffers.

Every layer uses only operations that lower to TFLite builtins available in the Arduino TFLite
Micro library (FULLY_CONNECTED, MUL, ADD, SUB, SUM, MEAN, SOFTMAX, TRANSPOSE, RESHAPE, RSQRT):
in particular attention is expressed without BATCH_MATMUL, which Keras MultiHeadAttention emits
and the device library lacks. For TESLA's z <= 11 tokens the broadcast form costs the same
multiply-adds as a batched matmul.
"""
