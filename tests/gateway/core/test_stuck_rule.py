"""The contract's frozen-sensor rule: runs of identical period means, online and in hindsight."""

from __future__ import annotations

import numpy as np
import pytest

from tesla_gateway.contract.stuck import (
    STUCK_PERIODS,
    run_lengths,
    stuck_positions,
    stuck_windows,
)

NAN = float("nan")


def test_run_lengths_restart_on_change_and_stop_at_missing() -> None:
    series = [1.0, 1.0, 2.0, 2.0, 2.0, NAN, 2.0, 2.0, 0.0]
    assert run_lengths(series).tolist() == [1, 2, 1, 2, 3, 0, 1, 2, 1]
    assert run_lengths([]).tolist() == []


def test_whole_run_is_marked_in_hindsight_only_when_long_enough() -> None:
    series = np.r_[np.arange(5.0), np.zeros(4), [7.0, 8.0], np.full(3, 5.0), [9.0]]
    mask = stuck_positions(series, stuck_periods=4)
    # the four zeros (its first three included) are one frozen run; three fives are not
    assert np.flatnonzero(mask).tolist() == [5, 6, 7, 8]
    assert not stuck_positions(series, stuck_periods=5).any()


def test_run_at_the_end_of_the_series_is_marked() -> None:
    series = np.r_[[3.0, 4.0], np.full(STUCK_PERIODS, 0.0)]
    assert np.flatnonzero(stuck_positions(series)).tolist() == list(range(2, 2 + STUCK_PERIODS))


def test_missing_value_splits_a_run() -> None:
    half = STUCK_PERIODS // 2 + 1
    series = np.r_[np.full(half, 1.0), [NAN], np.full(half, 1.0)]
    assert not stuck_positions(series).any()


def test_windows_need_the_newest_periods_equal_and_enough_real_history() -> None:
    n, s = 12, 4
    live = np.arange(n, dtype=np.float32)
    frozen_tail = np.r_[np.arange(n - s, dtype=np.float32), np.full(s, 2.5, np.float32)]
    almost = np.r_[np.arange(n - s + 1, dtype=np.float32), np.full(s - 1, 2.5, np.float32)]
    young = np.full(n, 7.0, np.float32)  # one period of history, edge-padded: equal by padding
    windows = np.stack([live, frozen_tail, almost, young, young])
    history = np.array([n, n, n, 1, s])
    assert stuck_windows(windows, history, s).tolist() == [False, True, False, False, True]


def test_rule_longer_than_the_window_never_fires() -> None:
    windows = np.zeros((2, 10), np.float32)
    assert not stuck_windows(windows, np.array([10, 10]), 30).any()


@pytest.mark.parametrize("bad", [0, 1])
def test_a_run_of_one_is_no_rule(bad: int) -> None:
    with pytest.raises(ValueError, match="at least 2"):
        stuck_positions([1.0, 1.0], bad)
    with pytest.raises(ValueError, match="at least 2"):
        stuck_windows(np.zeros((1, 4)), [4], bad)


def test_offline_and_online_agree_on_when_a_run_is_frozen() -> None:
    """Training's hindsight marks a run that the gateway's window flags at its S-th period."""
    rng = np.random.default_rng(3)
    s, n = 6, 16
    series = np.round(rng.gamma(2.0, 3.0, 400), 1)
    series[100:110] = 0.0  # frozen for 10 periods
    series[200:205] = 4.0  # 5 equal periods: not frozen
    windows = np.lib.stride_tricks.sliding_window_view(series, n)
    online = stuck_windows(windows, np.full(len(windows), n), s)
    ends = np.flatnonzero(online) + n - 1
    assert ends.tolist() == list(range(100 + s - 1, 110))
    assert np.flatnonzero(stuck_positions(series, s)).tolist() == list(range(100, 110))
