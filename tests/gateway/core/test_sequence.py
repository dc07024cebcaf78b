"""Sequence numbers: readings_missing under loss, duplicates, reordering, wrap and restarts."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from tesla_gateway.ingest.sequence import (
    SEQ_MODULUS,
    SensorSequence,
    SequenceOutcome,
    SequenceTracker,
)

WINDOW = 64  # small, so the tests cross it; the default is 2048


def tracker(**overrides: object) -> SequenceTracker:
    return SequenceTracker(window=WINDOW, max_gap=10_000, clock=lambda: 0.0, **overrides)  # type: ignore[arg-type]


def feed(numbers: list[int], start: int = 0) -> SequenceTracker:
    counted = tracker()
    for n in numbers:
        counted.observe("s1", (start + n) % SEQ_MODULUS)
    return counted


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[int, list[int]]:
    """One run of a node, as the gateway receives it: (first number, relative numbers).

    Some readings lost, some delivered twice, and the stream reordered among blocks of up to
    32 consecutive numbers (within the window)."""
    start = draw(st.integers(0, SEQ_MODULUS - 1) | st.sampled_from([0, SEQ_MODULUS - 5]))
    length = draw(st.integers(1, 400))
    lost = draw(st.sampled_from([0.0, 0.1, 0.5, 0.9]))
    doubled = draw(st.sampled_from([0.0, 0.1, 0.5]))
    block = draw(st.integers(1, 32))
    rng = random.Random(draw(st.integers(0, 2**32)))
    sent = [n for n in range(length) if rng.random() >= lost] or [0]
    stream = [copy for n in sent for copy in [n] * (1 + (rng.random() < doubled))]
    shuffled: list[int] = []
    for group in range(0, length, block):  # reordered among numbers group .. group+block-1
        chunk = [n for n in stream if group <= n < group + block]
        rng.shuffle(chunk)
        shuffled += chunk
    return start, shuffled


@settings(max_examples=300, deadline=None)
@given(deliveries())
def test_missing_is_exactly_what_never_arrived(case: tuple[int, list[int]]) -> None:
    start, stream = case
    counted = tracker()
    for n in stream:
        counted.observe("s1", (start + n) % SEQ_MODULUS)
        assert counted.readings_missing >= 0
    distinct = set(stream)
    assert counted.readings_missing == max(distinct) - min(distinct) + 1 - len(distinct)
    assert counted.counts[SequenceOutcome.DUPLICATE] == len(stream) - len(distinct)
    assert counted.counts[SequenceOutcome.RESET] == 0
    assert counted.counts[SequenceOutcome.STALE] == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, SEQ_MODULUS - 1) | st.integers(0, 200), max_size=200))
def test_anything_at_all_never_counts_negative(numbers: list[int]) -> None:
    counted = tracker()
    for seq in numbers:
        counted.observe("s1", seq)
        assert counted.readings_missing >= 0
    assert counted.counts.total() == len(numbers)


@settings(max_examples=200, deadline=None)
@given(st.integers(WINDOW + 1, 5_000), st.integers(1, 500), st.integers(0, 2**31))
def test_a_restart_from_zero_is_a_reset_not_a_loss(before: int, after: int, start: int) -> None:
    """Numbered from 0 again after more than a window of readings. (A restart less than
    max_gap numbers before a wrap cannot be told from a loss: not generated.)"""
    counted = tracker()
    for n in range(before):
        counted.observe("s1", (start + n) % SEQ_MODULUS)
    for n in range(after):
        counted.observe("s1", n)
    assert counted.readings_missing == 0
    assert counted.counts[SequenceOutcome.RESET] == 1


def test_a_restart_just_after_a_wrap_is_a_reset() -> None:
    counted = tracker()
    for seq in [*range(SEQ_MODULUS - 100, SEQ_MODULUS), *range(100), *range(50)]:
        counted.observe("s1", seq)
    assert counted.readings_missing == 0
    assert counted.counts[SequenceOutcome.RESET] == 1


def test_a_restart_within_the_first_window_looks_like_redeliveries() -> None:
    counted = feed([*range(10), *range(20)])
    assert counted.readings_missing == 0
    assert counted.counts[SequenceOutcome.DUPLICATE] == 10


def test_wrap_around_is_continuous() -> None:
    counted = feed([0, 1, 2, 4, 5, 6], start=SEQ_MODULUS - 3)  # ..., 2**32-1, 0, (1 lost), 2
    assert counted.readings_missing == 1
    assert counted.counts[SequenceOutcome.RESET] == 0


def test_a_redelivered_burst_after_a_reconnect_is_duplicates() -> None:
    counted = feed([*range(100), *range(80, 100), 100])
    assert counted.readings_missing == 0
    assert counted.counts[SequenceOutcome.DUPLICATE] == 20


def test_a_late_reading_fills_its_gap() -> None:
    counted = feed([0, 1, 3, 4])
    assert counted.readings_missing == 1
    counted.observe("s1", 2)
    assert counted.readings_missing == 0
    assert counted.counts[SequenceOutcome.LATE] == 1


def test_beyond_the_window_a_late_reading_is_stale_and_stays_missing() -> None:
    counted = feed([0, *range(2, 200), 1], start=1_000)
    assert counted.readings_missing == 1
    assert counted.counts[SequenceOutcome.STALE] == 1


def test_a_huge_jump_ahead_is_a_restart() -> None:
    counted = feed([0, 1, 2, 5_000_000, 5_000_001])
    assert counted.readings_missing == 0
    assert counted.counts[SequenceOutcome.RESET] == 1


def test_sensors_are_counted_apart_and_the_top_shown() -> None:
    counted = tracker()
    for seq in (0, 5, 6):
        counted.observe("a", seq)
    for seq in (0, 2):
        counted.observe("b", seq)
    counted.observe("c", 9)
    stats = counted.stats()
    assert stats["readings_missing"] == 5
    assert stats["readings_missing_top"] == {"a": 4, "b": 1}
    assert counted.missing_for("c") == 0
    assert counted.missing_for("never") is None


def test_loss_is_logged_at_most_once_per_interval() -> None:
    now = [0.0]
    counted = SequenceTracker(window=WINDOW, log_interval_s=10.0, clock=lambda: now[0])
    with capture_logs() as logs:
        for seq in (0, 2, 4, 6):  # three gaps; the first is logged at once
            counted.observe("s1", seq)
        counted.log_pending()  # within the interval: nothing
        now[0] = 11.0
        counted.log_pending()
        counted.log_pending()  # nothing new
    lines = [entry for entry in logs if entry["event"] == "readings_missing"]
    assert [line["missing"] for line in lines] == [1, 2]
    assert lines[-1]["readings_missing_total"] == 3
    assert lines[-1]["sensors"] == {"s1": 2}


def test_the_number_of_sensors_tracked_is_bounded() -> None:
    counted = SequenceTracker(window=WINDOW, max_sensors=2, clock=lambda: 0.0)
    for sensor in ("a", "b", "c", "c"):
        counted.observe(sensor, 0)
    counted.observe("a", 2)
    assert counted.missing_for("c") is None
    assert counted.stats()["sequence"]["untracked"] == 2  # type: ignore[index]
    assert counted.readings_missing == 1


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="window"):
        SensorSequence(window=1)
    with pytest.raises(ValueError, match="max_gap"):
        SensorSequence(window=100, max_gap=10)


def test_the_smallest_window_and_a_max_gap_equal_to_it_are_accepted() -> None:
    SensorSequence(window=2, max_gap=2)
    with pytest.raises(ValueError, match="window"):
        SequenceTracker(window=1)  # the tracker checks its arguments at once, not per sensor
    with pytest.raises(ValueError, match="max_gap"):
        SequenceTracker(window=100, max_gap=10)


def test_a_restart_is_a_new_run_its_next_number_follows() -> None:
    counted = feed([0, 1, 2, 20_000, 20_001])  # max_gap 10,000: a jump ahead restarts
    assert counted.counts[SequenceOutcome.FIRST] == 1
    assert counted.counts[SequenceOutcome.RESET] == 1
    assert counted.counts[SequenceOutcome.NEXT] == 3 and counted.readings_missing == 0
    restarted = feed([*range(200), 3, 4])  # far behind and small: restarted from 0
    assert restarted.counts[SequenceOutcome.FIRST] == 1
    assert restarted.counts[SequenceOutcome.RESET] == 1 and restarted.readings_missing == 0


def test_the_jump_ahead_that_is_a_restart_is_more_than_max_gap_missing() -> None:
    loss = feed([0, 10_001])  # 10,000 missing: a loss of max_gap readings
    assert loss.readings_missing == 10_000 and loss.counts[SequenceOutcome.RESET] == 0
    restart = feed([0, 10_002])  # 10,001 missing would be more than max_gap: a restart
    assert restart.readings_missing == 0 and restart.counts[SequenceOutcome.RESET] == 1


def test_far_behind_is_a_restart_only_below_the_window_or_beyond_max_gap() -> None:
    stale = feed([*range(200), WINDOW])  # behind by 135, not small: delayed, stale
    assert stale.counts[SequenceOutcome.STALE] == 1 and stale.counts[SequenceOutcome.RESET] == 0
    at_gap = feed([0, 10_000, 20_000, 10_000])  # exactly max_gap behind: still stale
    assert at_gap.counts[SequenceOutcome.STALE] == 1
    assert at_gap.counts[SequenceOutcome.RESET] == 0
    beyond = feed([0, 10_000, 20_000, 9_999])  # one more behind than max_gap: a restart
    assert beyond.counts[SequenceOutcome.RESET] == 1


def test_half_the_number_space_ahead_counts_as_behind() -> None:
    sequence = SensorSequence(window=WINDOW, max_gap=2**32)
    sequence.observe(1_000)
    assert sequence.observe(1_000 + 2**31) == (SequenceOutcome.STALE, 0)


def test_a_late_reading_at_the_edge_of_the_window_fills_its_gap() -> None:
    counted = feed([0, 100])  # 99 missing; the window remembers the 63 numbers behind 100
    assert counted.readings_missing == 99
    counted.observe("s1", 100 - (WINDOW - 1))
    assert counted.readings_missing == 98 and counted.counts[SequenceOutcome.LATE] == 1


def test_resets_are_logged_per_sensor_and_the_log_shows_the_top_ten() -> None:
    now = [0.0]
    counted = SequenceTracker(window=WINDOW, max_gap=10_000, clock=lambda: now[0])
    with capture_logs() as logs:
        for sensor in [f"s{i:02}" for i in range(12)]:
            for seq in (0, 2 + int(sensor[1:])):  # s00 misses 1, s11 misses 12
                counted.observe(sensor, seq)
        for seq in (20_000, 40_000):  # two restarts of s00
            counted.observe("s00", seq)
        now[0] = 10.0  # exactly one interval after the first line
        counted.log_pending()
    first, second = [entry for entry in logs if entry["event"] == "readings_missing"]
    assert first["sensors"] == {"s00": 1} and first["resets"] == {}
    assert len(second["sensors"]) == 10 and "s01" not in second["sensors"]
    assert second["sensors"]["s11"] == 12
    assert second["resets"] == {"s00": 2}


def test_a_quiet_check_does_not_delay_the_next_line() -> None:
    now = [0.0]
    counted = SequenceTracker(window=WINDOW, log_interval_s=10.0, clock=lambda: now[0])
    with capture_logs() as logs:
        counted.observe("s1", 0)
        now[0] = 11.0
        counted.log_pending()  # nothing to log
        now[0] = 12.0
        counted.observe("s1", 2)  # the first loss: logged at once
    assert [entry["missing"] for entry in logs if entry["event"] == "readings_missing"] == [1]


def test_stats_name_the_sensors_missing_readings_and_the_top_ten() -> None:
    counted = tracker()
    counted.observe("clean", 0)
    counted.observe("clean", 1)
    for i in range(12):
        counted.observe(f"lossy{i:02}", 0)
        counted.observe(f"lossy{i:02}", 2 + i)
    stats = counted.stats()
    top: dict[str, int] = stats["readings_missing_top"]  # type: ignore[assignment]
    assert len(top) == 10 and "clean" not in top and top["lossy11"] == 12
    sequence: dict[str, int] = stats["sequence"]  # type: ignore[assignment]
    assert sequence["sensors"] == 13 and sequence["sensors_missing"] == 12


def test_a_forgotten_sensor_keeps_its_loss_in_the_total_and_starts_afresh() -> None:
    counted = feed([0, 5])
    counted.forget(["s1", "never-seen"])
    assert counted.readings_missing == 4 and counted.missing_for("s1") is None
    counted.observe("s1", 100)  # a new first number, not a jump
    assert counted.readings_missing == 4 and counted.stats()["readings_missing_top"] == {}


def test_a_forgotten_sensor_leaves_nothing_to_log() -> None:
    now = [0.0]
    counted = SequenceTracker(window=WINDOW, max_gap=10_000, clock=lambda: now[0])
    with capture_logs() as logs:
        for seq in (0, 2, 4, 50_000):  # one loss logged at once; one more and a restart wait
            counted.observe("s1", seq)
        counted.forget(["s1"])
        now[0] = 11.0
        counted.log_pending()
    assert len([entry for entry in logs if entry["event"] == "readings_missing"]) == 1
    assert counted.readings_missing == 2


def test_a_gap_filled_later_leaves_the_sensor_out_of_the_missing_figures() -> None:
    counted = tracker()
    for seq in (0, 2, 1):  # 1 late: the sensor's missing count goes back to 0
        counted.observe("s1", seq)
    stats = counted.stats()
    assert stats["readings_missing_top"] == {}
    assert stats["sequence"]["sensors_missing"] == 0  # type: ignore[index]


def test_the_log_names_at_most_ten_restarted_sensors() -> None:
    counted = tracker()
    with capture_logs() as logs:
        for i in range(12):
            counted.observe(f"s{i:02}", 0)
        for i in range(12):  # every one restarts; the clock stands still: one line at the end
            counted.observe(f"s{i:02}", 50_000)
        counted._next_log = 0.0
        counted.log_pending()
    *_, last = [entry for entry in logs if entry["event"] == "readings_missing"]
    assert len(last["resets"]) == 10
