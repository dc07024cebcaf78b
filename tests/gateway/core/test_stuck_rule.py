"""The contract's frozen-sensor rule: runs of identical period means, online and in hindsight."""

from __future__ import annotations

import numpy as np
import pytest

from tesla_gateway.contract.stuck import (
    STUCK_PERIODS,
    ends_frozen_run,
    next_run,
    run_lengths,
    stuck_positions,
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


def online_runs(series: np.ndarray) -> list[int]:
    """The gateway's counter folded over a series: the run at each position."""
    runs, value, run = [], float("nan"), 0
    for observed in series.tolist():
        run, value = next_run(value, run, observed), observed
        runs.append(run)
    return runs


def test_the_online_counter_is_run_lengths() -> None:
    series = np.array([1.0, 1.0, 2.0, 2.0, 2.0, NAN, 2.0, 2.0, 0.0, 0.0])
    assert online_runs(series) == run_lengths(series).tolist()


def test_a_run_ends_frozen_only_after_stuck_periods_and_with_a_rule() -> None:
    assert ends_frozen_run(previous_run=4, run=1, stuck_periods=4)
    assert not ends_frozen_run(previous_run=3, run=1, stuck_periods=4)  # never was frozen
    assert not ends_frozen_run(previous_run=4, run=5, stuck_periods=4)  # still frozen
    assert not ends_frozen_run(previous_run=40, run=1, stuck_periods=None)  # withholding off


@pytest.mark.parametrize("bad", [0, 1])
def test_a_run_of_one_is_no_rule(bad: int) -> None:
    with pytest.raises(ValueError, match="at least 2"):
        stuck_positions([1.0, 1.0], bad)


def test_offline_and_online_agree_on_when_a_run_is_frozen() -> None:
    """Training's hindsight marks a run that the gateway's counter flags from its S-th period."""
    rng = np.random.default_rng(3)
    s = 6
    series = np.round(rng.gamma(2.0, 3.0, 400), 1)
    series[100:110] = 0.0  # frozen for 10 periods
    series[200:205] = 4.0  # 5 equal periods: not frozen
    online = np.array(online_runs(series)) >= s
    assert np.flatnonzero(online).tolist() == list(range(100 + s - 1, 110))
    assert np.flatnonzero(stuck_positions(series, s)).tolist() == list(range(100, 110))


def test_series_laid_end_to_end_never_share_a_run() -> None:
    tail_of_one = np.zeros(3)
    head_of_next = np.zeros(3)
    series = np.r_[[1.0], tail_of_one, head_of_next, [2.0]]
    starts = np.zeros(series.size, dtype=np.bool_)
    starts[4] = True  # the second sensor's first value
    assert np.flatnonzero(stuck_positions(series, 4)).tolist() == [1, 2, 3, 4, 5, 6]
    assert not stuck_positions(series, 4, starts=starts).any()


def test_stuck_positions_agree_with_run_lengths_on_random_series() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        series = rng.integers(0, 3, rng.integers(0, 60)).astype(np.float64)
        series[rng.random(series.size) < 0.05] = NAN
        lengths = run_lengths(series)
        expected = np.zeros(series.size, dtype=np.bool_)
        for end in range(series.size):
            if lengths[end] >= 4 and (end + 1 == series.size or lengths[end + 1] <= lengths[end]):
                expected[end - lengths[end] + 1 : end + 1] = True
        assert stuck_positions(series, 4).tolist() == expected.tolist()
