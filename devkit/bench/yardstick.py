"""The machine's yardstick: single-thread float32 GEMM throughput measured with NumPy."""

from __future__ import annotations

import numpy as np

from training.bench.timing import best_rate

__all__ = ["gemm_flops_per_second"]


def gemm_flops_per_second(size: int = 512) -> float:
    """FLOP/s of a square float32 matrix product (2·n³ FLOPs), BLAS limited to one thread."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    out = np.empty((size, size), dtype=np.float32)

    def multiply() -> None:
        np.matmul(a, b, out=out)

    return best_rate(multiply, 2 * size**3)
