"""FLOPs per calibration: the counting lives in :mod:`training.bench.flops` (one implementation).

See that module for the method. ``count_flops`` takes the stored graph
(:func:`training.flatbuffer.read_graph`) or, exact for dynamic-batch graphs, the shapes of one
invoke (:func:`training.bench.flops.resolve_graph`).
"""

from __future__ import annotations

from training.bench.flops import count_flops, flops_by_op, resolve_graph

__all__ = ["count_flops", "flops_by_op", "resolve_graph"]
