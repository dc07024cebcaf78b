"""The bin layout is the paper's Figure 2 (with NOTES.md's erratum) for every N."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from training.models.bins import bin_count, bin_sizes, log_bin_boundaries, membership_matrix


def test_figure_2_boundaries_for_n_12() -> None:
    assert log_bin_boundaries(12) == (1, 6, 10, 12, 13)
    assert bin_sizes(12) == (5, 4, 2, 1)


def test_paper_default_n_360() -> None:
    assert bin_count(360) == 9
    assert bin_sizes(360) == (105, 128, 64, 32, 16, 8, 4, 2, 1)


@pytest.mark.parametrize(
    ("n", "sizes"),
    [
        (1, (1,)),
        (2, (2,)),
        (3, (2, 1)),
        (4, (3, 1)),  # power of two: alpha_0 forced to 1 so the oldest reading is binned
        (8, (5, 2, 1)),
        (15, (8, 4, 2, 1)),
        (16, (9, 4, 2, 1)),
        (60, (29, 16, 8, 4, 2, 1)),
        (1440, (417, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1)),
    ],
)
def test_layouts_including_powers_of_two_and_tiny_windows(n: int, sizes: tuple[int, ...]) -> None:
    assert bin_sizes(n) == sizes


@given(st.integers(min_value=1, max_value=5000))
def test_log_bins_cover_every_position_once_newest_alone(n: int) -> None:
    sizes = bin_sizes(n)
    assert sum(sizes) == n
    assert len(sizes) == max(1, math.ceil(math.log2(n)))
    if len(sizes) >= 2:
        # Going back in time from the newest: 1, 2, 4, ... and the oldest takes the rest.
        assert sizes[::-1][:-1] == tuple(2**k for k in range(len(sizes) - 1))
    matrix = membership_matrix(n)
    assert np.array_equal(matrix.sum(axis=1), np.ones(n))


@given(st.integers(min_value=1, max_value=5000))
def test_uniform_bins_have_the_same_count_and_near_equal_sizes(n: int) -> None:
    sizes = bin_sizes(n, "uniform")
    assert len(sizes) == bin_count(n)
    assert sum(sizes) == n
    assert max(sizes) - min(sizes) <= 1


def test_invalid_window_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        bin_count(0)
