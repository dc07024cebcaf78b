"""Bin layouts that group the N window positions into z tokens.

Logarithmic bins follow the paper's Figure 2 (see ../shared/paper/NOTES.md, erratum to Eq. 3):
z = ceil(log2 N) bins; going back in time from the newest reading the bins hold 1, 2, 4, …
positions, and the oldest bin takes the remainder. In the paper's notation
alpha_j = max{1, N - 2^(z-j) + 2} for j >= 1 and bin j holds positions alpha_(j-1) … alpha_j - 1.
We fix alpha_0 = 1 explicitly: for N a power of two the printed formula would give alpha_0 = 2 and
leave the oldest reading in no bin. N = 12 gives alpha = (1, 6, 10, 12, 13); N = 360 gives sizes
105, 128, 64, 32, 16, 8, 4, 2, 1 (oldest to newest).

Uniform bins (the paper's ablation) split N into z nearly equal runs, larger runs first.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = ["BinKind", "bin_count", "bin_sizes", "log_bin_boundaries", "membership_matrix"]

BinKind = Literal["log", "uniform"]


def bin_count(window_length: int) -> int:
    """z = ceil(log2 N), at least one bin."""
    if window_length < 1:
        raise ValueError(f"window length must be at least 1, got {window_length}")
    return max(1, math.ceil(math.log2(window_length)))


def log_bin_boundaries(window_length: int) -> tuple[int, ...]:
    """The paper's alpha_0 … alpha_z (1-based positions, oldest first)."""
    z = bin_count(window_length)
    inner = [max(1, window_length - 2 ** (z - j) + 2) for j in range(1, z + 1)]
    return (1, *inner)


def bin_sizes(window_length: int, kind: BinKind = "log") -> tuple[int, ...]:
    """Positions per bin, oldest bin first; they always sum to N."""
    z = bin_count(window_length)
    if kind == "log":
        alphas = log_bin_boundaries(window_length)
        return tuple(b - a for a, b in itertools.pairwise(alphas))
    base, extra = divmod(window_length, z)
    return tuple(base + 1 if index < extra else base for index in range(z))


def membership_matrix(window_length: int, kind: BinKind = "log") -> npt.NDArray[np.float32]:
    """0/1 matrix [N, z]: entry (i, j) is 1 when window position i falls in bin j."""
    sizes = bin_sizes(window_length, kind)
    matrix = np.zeros((window_length, len(sizes)), dtype=np.float32)
    start = 0
    for column, size in enumerate(sizes):
        matrix[start : start + size, column] = 1.0
        start += size
    return matrix
