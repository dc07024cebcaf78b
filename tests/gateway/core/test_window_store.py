"""Ring buffer semantics, and the proof that the gateway's windows equal training's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tesla_gateway.contract.calibrated import Quality
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import (
    GapPolicy,
    gap_fill,
    interpolate_short_gaps,
    period_index,
    sliding_windows,
    valid_window_ends,
)
from tesla_gateway.errors import SeriesError
from tesla_gateway.ingest.clock_sanity import ClockSanity
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.windows.outcome import AddOutcome
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.state import WindowStoreError
from tesla_gateway.windows.store import WindowStore

P = 60
T0 = 1_700_000_000 - 1_700_000_000 % P  # a period boundary


def geometry(n: int = 4, max_gap: int = 1, channels: tuple[str, ...] = ("pm10",)) -> WindowGeometry:
    return WindowGeometry(
        window_length=n,
        period_seconds=P,
        channels=channels,
        gap_policy=GapPolicy(max_interpolated_periods=max_gap),
    )


def reading(sensor: str, period: int, offset: float, **values: float) -> Reading:
    return Reading(sensor_id=sensor, timestamp=T0 + period * P + offset, values=values)


def feed(windows: ModelWindows, sensor: str, per_period: dict[int, list[float]]) -> None:
    for period, values in sorted(per_period.items()):
        for index, value in enumerate(values):
            assert windows.add(reading(sensor, period, index, pm10=value), 0.0) == (
                AddOutcome.ACCEPTED
            )


BASE = T0 // P


def test_readings_within_a_period_are_averaged_and_close_on_the_next_period() -> None:
    windows = ModelWindows(geometry(n=2))
    feed(windows, "a", {0: [10.0, 20.0, 30.0]})
    assert windows.pending_count == 0  # the period is still open
    windows.add(reading("a", 1, 0, pm10=5.0), 0.0)
    ready = windows.ready_windows()
    assert ready.sensor_ids == ("a",)
    assert ready.periods.tolist() == [BASE]
    assert ready.raw.tolist() == [20.0]
    assert ready.windows.dtype == np.float32
    assert ready.windows.shape == (1, 2)
    assert math.isnan(ready.windows[0, 0]) and ready.windows[0, 1] == 20.0
    assert ready.quality == ((Quality.WARMING_UP,),)
    assert windows.pending_count == 0


def test_out_of_order_readings_within_the_open_period_are_accepted() -> None:
    windows = ModelWindows(geometry(n=1))
    for offset, value in [(50, 1.0), (10, 2.0), (30, 6.0)]:
        assert windows.add(reading("a", 0, offset, pm10=value), 0.0) is AddOutcome.ACCEPTED
    ready = windows.ready_windows(closed_through_period=BASE)
    assert ready.raw.tolist() == [3.0]
    assert ready.quality == ((),)
    assert ready.windows.tolist() == [[3.0]]


def test_duplicates_are_idempotent() -> None:
    windows = ModelWindows(geometry(n=1))
    first = reading("a", 0, 5, pm10=4.0)
    assert windows.add(first, 0.0) is AddOutcome.ACCEPTED
    assert windows.add(first, 0.0) is AddOutcome.DUPLICATE
    assert windows.add(reading("a", 0, 5, pm10=100.0), 0.0) is AddOutcome.DUPLICATE
    assert windows.ready_windows(closed_through_period=BASE).raw.tolist() == [4.0]
    assert windows.counts[AddOutcome.DUPLICATE] == 2


def test_parts_of_one_reading_stamped_alike_fill_one_period() -> None:
    """PM in one message and rh/temp in another, same timestamp: one reading, not a duplicate;
    a redelivered part is still a duplicate, and an overlapping part adds only what is new."""
    windows = ModelWindows(geometry(n=1, channels=("pm10", "rh", "temp_c")))
    pm = reading("a", 0, 5, pm10=4.0)
    climate = reading("a", 0, 5, rh=60.0, temp_c=12.0)
    assert windows.add(pm, 0.0) is AddOutcome.ACCEPTED
    assert windows.add(climate, 0.0) is AddOutcome.ACCEPTED
    assert windows.add(climate, 0.0) is AddOutcome.DUPLICATE
    assert windows.add(pm, 0.0) is AddOutcome.DUPLICATE
    assert windows.add(reading("a", 0, 5, pm10=9.0, rh=99.0), 0.0) is AddOutcome.DUPLICATE
    assert windows.add(reading("a", 0, 1, rh=50.0), 0.0) is AddOutcome.ACCEPTED  # out of order
    assert windows.add(reading("a", 0, 1, pm10=2.0, rh=70.0), 0.0) is AddOutcome.ACCEPTED
    ready = windows.ready_windows(closed_through_period=BASE)
    assert ready.quality == ((),)
    assert ready.windows.tolist() == [[[3.0, 55.0, 12.0]]]  # rh 70 at t+1 was a duplicate


def test_a_sensor_sending_pm_and_covariates_apart_gets_a_covariate_window() -> None:
    """A covariate model beside a PM-only one admits a sensor once its readings together have
    brought every channel; a PM-only sensor is remembered nowhere."""
    windows = ModelWindows(geometry(n=2, channels=("pm10", "rh", "temp_c")))
    windows.admit_complete_only = True
    for period in range(3):
        windows.add(reading("plain", period, 5, pm10=1.0), 0.0)
    assert not windows.sensor_ids and windows._partial == {}
    outcomes = []
    for period in range(3):
        outcomes.append(windows.add(reading("split", period, 5, pm10=10.0 + period), 0.0))
        outcomes.append(windows.add(reading("split", period, 5, rh=60.0, temp_c=12.0), 0.0))
    # Period 0: the PM came before anything said this sensor has covariates; from period 1 on
    # both parts go in.
    assert outcomes == [AddOutcome.IRRELEVANT] * 2 + [AddOutcome.ACCEPTED] * 4
    assert windows.sensor_ids == ("split",) and windows._partial == {}
    ready = windows.ready_windows(closed_through_period=BASE + 2)
    assert ready.periods.tolist() == [BASE + 1, BASE + 2]
    assert ready.windows[-1].tolist() == [[11.0, 60.0, 12.0], [12.0, 60.0, 12.0]]
    assert ready.quality[-1] == ()
    windows.add(reading("half", 0, 5, pm10=1.0, rh=50.0), 0.0)  # never a temperature
    assert windows.sensor_ids == ("split",) and windows._partial == {"half": 0b011}
    assert windows.remove("half") is False and windows._partial == {}  # evicted: forgotten


def test_a_reading_for_a_closed_period_is_rejected_as_late() -> None:
    windows = ModelWindows(geometry(n=2))
    windows.add(reading("a", 0, 0, pm10=1.0), 0.0)
    windows.add(reading("a", 1, 0, pm10=1.0), 0.0)  # closes period 0
    assert windows.add(reading("a", 0, 30, pm10=9.0), 0.0) is AddOutcome.LATE
    windows.close_through(BASE + 1)  # forced close (wall-clock fallback)
    assert windows.add(reading("a", 1, 59, pm10=9.0), 0.0) is AddOutcome.LATE
    assert windows.counts[AddOutcome.LATE] == 2
    ready = windows.ready_windows()
    assert ready.raw.tolist() == [1.0, 1.0]


def test_readings_without_the_models_channel_are_ignored() -> None:
    windows = ModelWindows(geometry())
    assert windows.add(reading("a", 0, 0, pm2_5=3.0), 0.0) is AddOutcome.IRRELEVANT
    assert windows.sensor_ids == ()


def test_short_gap_is_interpolated_and_the_window_is_valid() -> None:
    windows = ModelWindows(geometry(n=4, max_gap=2))
    feed(windows, "a", {0: [10.0], 1: [20.0], 4: [50.0]})
    windows.ready_windows()
    ready = windows.ready_windows(closed_through_period=BASE + 4)
    assert ready.windows.tolist() == [[20.0, 30.0, 40.0, 50.0]]
    assert ready.quality == ((),)


def test_long_gap_invalidates_until_it_scrolls_out() -> None:
    windows = ModelWindows(geometry(n=3, max_gap=1))
    feed(windows, "a", {0: [1.0], 1: [1.0], 2: [1.0], 5: [4.0]})
    assert windows.ready_windows().quality[-1] == ()  # period 2 had a full window
    feed(windows, "a", {6: [5.0], 7: [6.0], 8: [7.0]})
    ready = windows.ready_windows(closed_through_period=BASE + 8)
    assert ready.periods.tolist() == [BASE + 5, BASE + 6, BASE + 7, BASE + 8]
    # periods 3 and 4 are a two-period gap, longer than the policy fills
    assert ready.quality == ((Quality.GAP,), (Quality.GAP,), (), ())
    assert np.isnan(ready.windows[0, :2]).all()
    assert ready.raw.tolist() == [4.0, 5.0, 6.0, 7.0]
    assert ready.windows[3].tolist() == [5.0, 6.0, 7.0]


def test_warm_up_is_flagged_until_n_periods_are_seen() -> None:
    windows = ModelWindows(geometry(n=3, max_gap=0))
    flags: list[tuple[Quality, ...]] = []
    for period in range(4):
        windows.add(reading("a", period, 0, pm10=float(period)), 0.0)
        flags.extend(windows.ready_windows(closed_through_period=BASE + period).quality)
    assert flags == [(Quality.WARMING_UP,), (Quality.WARMING_UP,), (), ()]


def test_wall_clock_fallback_closes_idle_periods() -> None:
    windows = ModelWindows(geometry(n=1))
    windows.add(reading("a", 0, 0, pm10=1.0), arrival=T0 + 1)
    end = T0 + P
    assert windows.close_idle(now=end + 4.9, grace_s=5.0) == 0
    assert windows.close_idle(now=end + 5.0, grace_s=5.0) == 1
    assert windows.ready_windows().raw.tolist() == [1.0]


def test_replayed_old_data_closes_only_after_grace_without_readings() -> None:
    windows = ModelWindows(geometry(n=1))
    windows.add(reading("a", 0, 0, pm10=1.0), arrival=T0 + 10_000)
    assert windows.close_idle(now=T0 + 10_004, grace_s=5.0) == 0
    assert windows.close_idle(now=T0 + 10_005, grace_s=5.0) == 1


def test_several_periods_closed_before_a_tick_are_all_returned() -> None:
    windows = ModelWindows(geometry(n=2, max_gap=0))
    feed(windows, "a", {0: [1.0], 1: [2.0], 2: [3.0], 3: [4.0]})
    ready = windows.ready_windows()
    assert ready.periods.tolist() == [BASE, BASE + 1, BASE + 2]
    assert ready.raw.tolist() == [1.0, 2.0, 3.0]
    assert ready.windows[1:].tolist() == [[1.0, 2.0], [2.0, 3.0]]


def test_many_sensors_grow_the_arrays() -> None:
    windows = ModelWindows(geometry(n=2), capacity=2)
    for index in range(50):
        feed(windows, f"s{index}", {0: [float(index)], 1: [float(index) + 1]})
    ready = windows.ready_windows(closed_through_period=BASE + 1)
    assert len(ready) == 100
    by_sensor = dict(zip(ready.sensor_ids, ready.windows.tolist(), strict=False))
    assert by_sensor["s49"] == [49.0, 50.0]


def test_missing_channel_is_flagged() -> None:
    windows = ModelWindows(geometry(n=1, channels=("pm10", "rh")))
    windows.add(reading("a", 0, 0, pm10=3.0), 0.0)
    windows.add(reading("b", 0, 0, pm10=3.0, rh=50.0), 0.0)
    ready = windows.ready_windows(closed_through_period=BASE)
    assert dict(zip(ready.sensor_ids, ready.quality, strict=True)) == {
        "a": (Quality.MISSING_CHANNEL,),
        "b": (),
    }
    assert ready.windows.shape == (2, 1, 2)  # [B, N, C]


def test_store_routes_readings_to_every_model_and_resets_on_new_geometry() -> None:
    store = WindowStore()
    assert store.ensure("pm10", geometry(channels=("pm10",)))
    assert store.ensure("pm2_5", geometry(channels=("pm2_5",)))
    outcomes = store.add(reading("a", 0, 0, pm10=1.0), 0.0)
    assert outcomes == {"pm10": AddOutcome.ACCEPTED, "pm2_5": AddOutcome.IRRELEVANT}
    assert not store.ensure("pm10", geometry(channels=("pm10",)))
    assert store["pm10"].sensor_ids == ("a",)
    assert store.ensure("pm10", geometry(n=7, channels=("pm10",)))
    assert len(store["pm10"].sensor_ids) == 0


# -- equivalence with training's rule --------------------------------------------------------


@st.composite
def streams(draw: st.DrawFn) -> tuple[int, int, list[tuple[int, float, float, bool]]]:
    """A sensor's stream: (period, offset within it, value, expected-late) in arrival order.

    An event with offset -1 stands for the wall-clock fallback closing the open period.
    """
    n = draw(st.integers(1, 8))
    max_gap = draw(st.integers(0, 3))
    periods = sorted(draw(st.sets(st.integers(0, 40), min_size=1, max_size=30)))
    events: list[tuple[int, float, float, bool]] = []
    for position, period in enumerate(periods):
        offsets = draw(st.lists(st.integers(0, 59), min_size=1, max_size=4))
        for offset in offsets:  # arbitrary order within the period, duplicates included
            value = draw(st.floats(0, 500, allow_nan=False, width=32))
            events.append((period, float(offset), value, False))
        if draw(st.booleans()):
            events.append((period, -1.0, 0.0, False))  # forced close before the next period
        if position > 0 and draw(st.booleans()):
            late = draw(st.integers(0, period - 1))
            events.append((late, 30.5, 999.0, True))
    return n, max_gap, events


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.booleans())
def test_gateway_windows_equal_training_windows(
    stream: tuple[int, int, list[tuple[int, float, float, bool]]], gather_each_time: bool
) -> None:
    n, max_gap, events = stream
    windows = ModelWindows(geometry(n=n, max_gap=max_gap), capacity=1)
    per_period: dict[int, dict[float, float]] = {}
    got: dict[int, tuple[np.ndarray, bool]] = {}

    def gather(closed_through: int | None = None) -> None:
        ready = windows.ready_windows(closed_through)
        for period, window, quality in zip(
            ready.periods.tolist(), ready.windows, ready.quality, strict=True
        ):
            assert period - BASE not in got
            got[period - BASE] = (window, quality == ())

    for period, offset, value, late in events:
        if offset < 0:
            assert windows.close_through(BASE + period) == 1
            continue
        outcome = windows.add(reading("s", period, offset, pm10=value), 0.0)
        if late:
            assert outcome is AddOutcome.LATE
            continue
        first = per_period.setdefault(period, {})
        assert outcome is (AddOutcome.DUPLICATE if offset in first else AddOutcome.ACCEPTED)
        first.setdefault(offset, value)
        if gather_each_time:
            gather()
    gather(closed_through=BASE + 1000)

    # Training's side: grid the series (NaN = missing), pad N-1 periods so every period has a
    # window, then apply the shared functions to the whole series at once.
    last = max(per_period)
    series = np.full(last + 1 + n - 1, np.nan)
    for period, values in per_period.items():
        series[period + n - 1] = float(np.mean(list(values.values())))
    observed = ~np.isnan(series)
    filled = interpolate_short_gaps(series, GapPolicy(max_interpolated_periods=max_gap))
    valid = valid_window_ends(filled, observed, n)
    all_windows = sliding_windows(filled, n)  # row k ends at padded index k + n - 1

    assert sorted(got) == sorted(per_period)
    for period, (window, is_valid) in got.items():
        expected = all_windows[period].astype(np.float32)
        np.testing.assert_allclose(window, expected, rtol=1e-6, equal_nan=True)
        assert is_valid == bool(valid[period + n - 1])


@pytest.mark.parametrize("n", [360])
def test_paper_sized_window_round_trip(n: int) -> None:
    windows = ModelWindows(geometry(n=n, max_gap=5))
    for period in range(n + 1):
        if period % 7 == 4:
            continue  # a one-period gap every week of minutes, always interpolated
        windows.add(reading("a", period, 0, pm10=float(period)), 0.0)
    ready = windows.ready_windows(closed_through_period=BASE + n)
    assert ready.quality[-1] == ()
    np.testing.assert_allclose(ready.windows[-1], np.arange(1, n + 1, dtype=np.float32))


def test_float32_ring_keeps_the_published_raw_mean_exact_also_after_a_restore() -> None:
    windows = ModelWindows(geometry(n=3))
    feed(windows, "a", {0: [10.1, 10.2], 1: [0.1, 0.2], 2: [7.0]})
    assert windows.export_state().ring.dtype == np.float32
    restored = ModelWindows.from_state(windows.export_state())  # period 1 pending, 2 still open
    ready = windows.ready_windows()
    # The float64 means, not their float32 roundings.
    assert ready.raw.tolist() == [(10.1 + 10.2) / 2, (0.1 + 0.2) / 2]
    assert ready.windows.dtype == np.float32
    assert ready.windows[1, -1] == np.float32((0.1 + 0.2) / 2)
    again = restored.ready_windows()  # a restore keeps every period waiting for a tick
    # The waiting period's exact mean travels with it; the pending one's is rebuilt from the
    # ring: the shortest decimal.
    assert again.raw.tolist() == [(10.1 + 10.2) / 2, 0.15]
    np.testing.assert_array_equal(again.windows, ready.windows)


def test_a_float64_snapshot_restores_into_the_float32_ring() -> None:
    windows = ModelWindows(geometry(n=3))
    feed(windows, "a", {0: [10.0], 1: [11.0], 2: [12.0], 3: [13.0]})
    state = windows.export_state()
    state.ring = state.ring.astype(np.float64)  # as the daemon saved it before
    restored = ModelWindows.from_state(state)
    np.testing.assert_array_equal(restored.ready_windows().windows, windows.ready_windows().windows)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=59), min_size=1, max_size=80))
def test_duplicates_are_found_in_any_arrival_order(offsets: list[int]) -> None:
    windows = ModelWindows(geometry(n=2))
    outcomes = [windows.add(reading("a", 0, offset, pm10=float(offset)), 0.0) for offset in offsets]
    assert outcomes.count(AddOutcome.ACCEPTED) == len(set(offsets))
    assert outcomes.count(AddOutcome.DUPLICATE) == len(offsets) - len(set(offsets))
    restored = ModelWindows.from_state(windows.export_state())  # the open period's timestamps
    assert [restored.add(reading("a", 0, o, pm10=1.0), 0.0) for o in offsets] == [
        AddOutcome.DUPLICATE
    ] * len(offsets)
    windows.add(reading("a", 1, 0, pm10=1.0), 0.0)
    ready = windows.ready_windows()
    assert ready.raw.tolist() == [pytest.approx(sum(set(offsets)) / len(set(offsets)))]


# -- removal, last_seen and the store's bookkeeping (survivors of make mutation) ---------------


def test_removing_a_sensor_moves_the_last_row_into_its_place() -> None:
    """Eviction swaps the last row into the hole: the moved sensor keeps its window, its pending
    period and its open period's duplicates; a newcomer gets a clean row."""
    windows = ModelWindows(geometry(n=2))
    feed(windows, "a", {0: [1.0], 1: [10.0]})
    feed(windows, "b", {0: [2.0]})
    feed(windows, "c", {0: [3.0], 1: [30.0]})
    feed(windows, "d", {0: [4.0], 1: [40.0, 41.0]})  # t and t + 1 s in its open period
    assert windows.pending_count == 3  # a, c and d closed period 0; b's is still open
    assert windows.remove("a") is True
    assert windows.pending_count == 2
    assert windows.sensor_ids == ("d", "b", "c")
    assert windows.remove("a") is False and windows.remove("nobody") is False
    assert windows.add(reading("d", 1, 1, pm10=99.0), 0.0) is AddOutcome.DUPLICATE
    assert windows.add(reading("e", 5, 0, pm10=7.0), 0.0) is AddOutcome.ACCEPTED  # the freed row
    ready = windows.ready_windows(closed_through_period=BASE + 5)
    by_sensor = {
        (sensor, int(period) - BASE): ([None if math.isnan(v) else v for v in window], raw)
        for sensor, period, window, raw in zip(
            ready.sensor_ids, ready.periods, ready.windows.tolist(), ready.raw.tolist(), strict=True
        )
    }
    assert by_sensor == {
        ("d", 0): ([None, 4.0], 4.0),
        ("c", 0): ([None, 3.0], 3.0),
        ("d", 1): ([4.0, 40.5], 40.5),
        ("b", 0): ([None, 2.0], 2.0),
        ("c", 1): ([3.0, 30.0], 30.0),
        ("e", 5): ([None, 7.0], 7.0),
    }
    assert windows.remove("e") is True and windows.sensor_ids == ("d", "b", "c")
    assert windows.pending_count == 0


def test_last_seen_is_the_end_of_each_sensors_newest_period_over_every_model() -> None:
    store = WindowStore()
    store.ensure("pm10", geometry(n=2, channels=("pm10", "rh")))
    store.ensure("pm2_5", geometry(n=2, channels=("pm2_5",)))
    assert store.last_seen() == {}
    store.add(reading("a", 3, 0, pm10=1.0), 0.0)  # open period 3
    store.add(reading("b", 1, 0, pm10=1.0), 0.0)
    store.add(reading("b", 2, 0, rh=50.0), 0.0)  # closes 1; only rh in period 2
    store["pm10"].close_through(BASE + 2)  # b has no open period: its rh says period 2
    store.add(reading("c", 0, 0, pm2_5=1.0), 0.0)
    store.add(reading("a", 5, 0, pm2_5=1.0), 0.0)  # a's newest is in the second model
    store.add(reading("b", 0, 0, pm2_5=1.0), 0.0)  # b's newest is in the first
    assert store["pm10"].last_seen() == {"a": (BASE + 4) * P, "b": (BASE + 3) * P}
    assert store.last_seen() == {"a": (BASE + 6) * P, "b": (BASE + 3) * P, "c": (BASE + 1) * P}
    assert store.features() == ["pm10", "pm2_5"]
    assert "pm10" in store and "pm1" not in store


def test_the_store_forgets_held_readings_with_the_windows_they_were_held_for() -> None:
    rejects = RejectCounter()
    sanity = ClockSanity(rejects)
    store = WindowStore(clock_sanity=sanity)
    ahead = reading("a", 10, 0, pm10=1.0)  # far ahead of the gateway clock at T0
    restored = ModelWindows(geometry())
    for replace in (
        lambda: store.install("pm10", restored),
        lambda: store.ensure("pm10", geometry(n=5)),
        lambda: store.drop("pm10"),
    ):
        store.ensure("pm10", geometry())
        assert store.add(ahead, float(T0)) == {"pm10": AddOutcome.HELD}
        assert sanity.held == 1
        replace()
        assert sanity.held == 0
        assert (
            "pm10" not in store
            or store["pm10"] is restored
            or store["pm10"].geometry.window_length == 5
        )
    assert "pm10" not in store
    store.drop("pm10")  # dropping what is not there is harmless


def test_removing_sensors_from_the_store_counts_the_windows_that_went() -> None:
    store = WindowStore()
    store.ensure("pm10", geometry(channels=("pm10",)))
    store.ensure("pm2_5", geometry(channels=("pm2_5",)))
    store.add(reading("a", 0, 0, pm10=1.0, pm2_5=1.0), 0.0)
    store.add(reading("b", 0, 0, pm10=1.0), 0.0)
    assert store.remove_sensors(["a", "b", "c"]) == 3
    assert store["pm10"].sensor_ids == () and store["pm2_5"].sensor_ids == ()


def test_accepted_readings_are_counted_and_each_closed_period_is_pending() -> None:
    windows = ModelWindows(geometry(n=2))
    for sensor in ("a", "b", "c"):
        feed(windows, sensor, {0: [1.0, 2.0], 1: [3.0]})
    assert windows.counts[AddOutcome.ACCEPTED] == 9
    assert windows.pending_count == 3
    ready = windows.ready_windows()
    assert ready.raw.dtype == np.float64 and ready.periods.dtype == np.int64


def test_a_period_without_the_first_channel_is_not_a_window() -> None:
    """Only periods that observed the model's PM channel are handed to the ticker."""
    windows = ModelWindows(geometry(n=2, channels=("pm10", "rh")))
    windows.add(reading("a", 0, 0, rh=50.0), 0.0)
    windows.add(reading("a", 1, 0, pm10=4.0, rh=51.0), 0.0)
    assert windows.pending_count == 0
    ready = windows.ready_windows(closed_through_period=BASE + 1)
    assert ready.periods.tolist() == [BASE + 1]


def test_a_sensor_sending_every_channel_at_once_is_admitted_at_once() -> None:
    windows = ModelWindows(geometry(n=2, channels=("pm10", "rh", "temp_c")))
    windows.admit_complete_only = True
    first = reading("a", 0, 0, pm10=1.0, rh=50.0, temp_c=10.0)
    assert windows.add(first, 0.0) is AddOutcome.ACCEPTED
    assert windows.sensor_ids == ("a",)


def test_periods_closed_before_a_tick_name_their_sensor() -> None:
    windows = ModelWindows(geometry(n=2, max_gap=0))
    feed(windows, "a", {0: [1.0], 1: [2.0], 2: [3.0]})
    feed(windows, "b", {0: [1.0], 1: [2.0]})
    ready = windows.ready_windows()
    assert sorted(zip(ready.sensor_ids, (ready.periods - BASE).tolist(), strict=True)) == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
    ]


def test_a_reading_without_the_models_channels_never_runs_ahead() -> None:
    windows = ModelWindows(geometry())
    assert not windows.would_run_ahead(reading("a", 10, 0, pm2_5=1.0), float(T0))
    assert windows.would_run_ahead(reading("a", 10, 0, pm10=1.0), float(T0))


def test_a_restore_keeps_what_gap_filling_and_the_ticker_need() -> None:
    """The last observed value interpolates a gap across the restart; pending periods count."""
    windows = ModelWindows(geometry(n=3, max_gap=1))
    feed(windows, "a", {0: [10.0], 1: [20.0]})
    feed(windows, "b", {0: [1.0], 1: [2.0]})
    windows.close_through(BASE + 1)
    restored = ModelWindows.from_state(windows.export_state())
    assert windows.pending_count == 4
    assert restored.pending_count == 4  # periods 0 and 1 of each: none lost by a restart
    restored.add(reading("a", 3, 0, pm10=40.0), 0.0)
    ready = restored.ready_windows(closed_through_period=BASE + 3)
    keys = zip(ready.sensor_ids, ready.periods.tolist(), strict=True)
    newest = dict(zip(keys, ready.windows.tolist(), strict=True))
    assert newest["a", BASE + 3] == [20.0, 30.0, 40.0]


def test_a_state_naming_a_sensor_twice_is_refused() -> None:
    windows = ModelWindows(geometry(n=2))
    feed(windows, "a", {0: [1.0]})
    feed(windows, "b", {0: [1.0]})
    state = windows.export_state()
    state.sensor_ids = ["a", "a"]
    with pytest.raises(WindowStoreError):
        ModelWindows.from_state(state)


def test_a_hole_in_a_covariate_at_the_first_period_is_a_gap_while_warming_up() -> None:
    windows = ModelWindows(geometry(n=4, channels=("pm10", "rh")))
    windows.add(reading("a", 0, 0, pm10=1.0), 0.0)  # no rh in the first period
    windows.add(reading("a", 1, 0, pm10=1.0, rh=50.0), 0.0)
    windows.add(reading("a", 2, 0, pm10=1.0, rh=50.0), 0.0)
    ready = windows.ready_windows(closed_through_period=BASE + 2)
    assert ready.quality[-1] == (Quality.WARMING_UP, Quality.GAP)


def test_more_than_eight_channels_share_the_last_duplicate_bit() -> None:
    """Channels from the eighth on are told apart by one shared bit (seen.py): a part of a
    reading bringing only later channels is new once, then a duplicate."""
    names = tuple(f"c{index}" for index in range(10))
    windows = ModelWindows(geometry(n=1, channels=("pm10", *names[1:])))
    assert windows.add(reading("a", 0, 5, pm10=1.0), 0.0) is AddOutcome.ACCEPTED
    assert windows.add(reading("a", 0, 5, c7=1.0), 0.0) is AddOutcome.ACCEPTED
    assert windows.add(reading("a", 0, 5, c8=1.0, c9=2.0), 0.0) is AddOutcome.DUPLICATE
    assert windows.add(reading("a", 0, 9, c9=2.0), 0.0) is AddOutcome.ACCEPTED
    assert windows.add(reading("a", 0, 9, c8=3.0), 0.0) is AddOutcome.DUPLICATE
    assert windows.add(reading("a", 0, 20, c8=3.0), 0.0) is AddOutcome.ACCEPTED


def test_more_sensors_than_one_gather_chunk_all_get_their_window() -> None:
    windows = ModelWindows(geometry(n=2))
    for index in range(2100):  # over two of readout's 1024-row chunks, at one ring position
        windows.add(reading(f"s{index}", 0, 0, pm10=float(index)), 0.0)
    ready = windows.ready_windows(closed_through_period=BASE)
    assert len(ready) == 2100
    assert dict(zip(ready.sensor_ids, ready.windows[:, 1].tolist(), strict=True)) == {
        f"s{index}": float(index) for index in range(2100)
    }


# -- the shared series functions' edges (survivors of make mutation) --------------------------


def test_series_functions_at_their_edges() -> None:
    assert gap_fill(1.0, 2.0, 0).size == 0  # no missing period: nothing to fill
    with pytest.raises(SeriesError):
        gap_fill(1.0, 2.0, -1)
    assert period_index(5.5, 1) == 5
    for bad in (0, -60):
        with pytest.raises(SeriesError, match="must be positive"):
            period_index(5.0, bad)
    short = sliding_windows(np.array([1.0, 2.0], dtype=np.float32), 3)
    assert short.shape == (0, 3) and short.dtype == np.float32
    with pytest.raises(SeriesError, match="same length"):
        valid_window_ends(np.zeros(3), np.ones(4, dtype=bool), 2)


def test_interpolation_is_computed_in_float64_whatever_the_input() -> None:
    series = np.array([1.0, np.nan, np.nan, 2.0], dtype=np.float32)
    policy = GapPolicy(max_interpolated_periods=2)
    filled = interpolate_short_gaps(series, policy)  # type: ignore[arg-type]  # float32 on purpose
    assert filled.dtype == np.float64
    assert filled.tolist() == [1.0, 1.0 + 1.0 / 3.0, 1.0 + 2.0 / 3.0, 2.0]


# -- a step of the gateway clock, on the ring itself (survivors of make mutation) --------------


def stamped(sensor: str, period: int, offset: float, **values: float) -> Reading:
    """A reading without a time of its own: the gateway stamped it on arrival."""
    return Reading(
        sensor_id=sensor,
        timestamp=T0 + period * P + offset,
        values=values,
        stamped_at_gateway=True,
    )


def test_a_clock_step_moves_the_stamped_sensors_timeline_in_whole_periods() -> None:
    windows = ModelWindows(geometry(n=4, channels=("pm10", "rh")))
    for period, value in ((0, 10.0), (1, 20.0)):  # period 0 closes (pending), 1 stays open
        windows.add(stamped("a", period, 1, pm10=value, rh=value + 1), float(T0 + period * P + 1))
        windows.add(reading("b", period, 1, pm10=value, rh=value + 1), float(T0 + period * P + 1))
    assert windows.clock_stepped(10.0) == 0  # less than half a period: nothing moves
    assert windows.clock_stepped(3 * P - 10.0) == 1  # three periods on: only a moves
    assert windows.pending_count == 2  # a's closed period waits with its own time
    # a's open period is now period 4, holding its reading at +1 s: the same one again is a
    # duplicate, a new one goes in
    assert windows.add(stamped("a", 4, 1, pm10=99.0, rh=99.0), 0.0) is AddOutcome.DUPLICATE
    assert windows.add(stamped("a", 4, 2, pm10=22.0, rh=23.0), 0.0) is AddOutcome.ACCEPTED
    assert windows.add(reading("b", 1, 2, pm10=22.0, rh=23.0), 0.0) is AddOutcome.ACCEPTED
    ready = windows.ready_windows(closed_through_period=BASE + 4)
    got = {
        (sensor, int(period) - BASE): [
            [None if math.isnan(v) else v for v in step] for step in window.tolist()
        ]
        for sensor, period, window in zip(
            ready.sensor_ids, ready.periods, ready.windows, strict=True
        )
    }
    empty = [None, None]
    assert got == {
        ("a", 0): [empty, empty, empty, [10.0, 11.0]],  # kept its time
        ("b", 0): [empty, empty, empty, [10.0, 11.0]],
        ("a", 4): [empty, empty, [10.0, 11.0], [21.0, 22.0]],  # period 0 is period 3 now
        ("b", 1): [empty, empty, [10.0, 11.0], [21.0, 22.0]],
    }


def test_a_clock_step_counts_a_moved_pending_period_once() -> None:
    windows = ModelWindows(geometry(n=4))
    windows.add(stamped("a", 0, 1, pm10=10.0), float(T0 + 1))
    windows.add(stamped("a", 1, 1, pm10=20.0), float(T0 + P + 1))  # period 0 closes: pending
    assert windows.clock_stepped(2 * P) == 1
    assert windows.pending_count == 1  # the one closed period, waiting with its own time
    assert [int(period) - BASE for period in windows.ready_windows().periods] == [0]
    assert windows.pending_count == 0


def test_a_short_gap_after_a_clock_step_is_still_interpolated() -> None:
    """The last observation moves with the step, so the gap after it is the gap the sensor
    left (one period here: filled), not one stretched by the step."""
    windows = ModelWindows(geometry(n=4, max_gap=1))
    windows.add(stamped("a", 0, 1, pm10=10.0), float(T0 + 1))
    windows.ready_windows(closed_through_period=BASE)  # period 0 closed and read
    assert windows.clock_stepped(2 * P) == 1  # period 0 is period 2 now
    windows.add(stamped("a", 4, 1, pm10=30.0), 0.0)  # period 3 missed
    ready = windows.ready_windows(closed_through_period=BASE + 4)
    assert [int(period) - BASE for period in ready.periods] == [4]
    (window,) = ready.windows.reshape(1, -1).tolist()  # one channel, N values
    assert math.isnan(window[0]) and window[1:] == [10.0, 20.0, 30.0]


def test_a_clock_step_moves_every_arrival_and_so_the_idle_deadlines() -> None:
    windows = ModelWindows(geometry(n=2))
    windows.add(reading("a", 0, 0, pm10=1.0), arrival=float(T0 + 100))
    windows.clock_stepped(1000.0)
    assert windows.close_idle(now=T0 + 1100 + 4.9, grace_s=5.0) == 0
    assert windows.close_idle(now=T0 + 1100 + 5.0, grace_s=5.0) == 1


def test_a_period_without_the_first_channel_closing_after_a_pending_one_keeps_it_once() -> None:
    """A backlog (a replay, a node catching up) where a sensor's next period lacks the PM
    channel: the pending period is copied out before the ring moves on and is handed to the
    ticker once, with the window it closed with (it was handed twice, the second time with the
    newer period's column in the place of its oldest)."""
    windows = ModelWindows(geometry(n=4, channels=("pm10", "rh")))
    windows.add(reading("a", 0, 0, pm10=10.0, rh=50.0), 0.0)
    windows.add(reading("a", 1, 0, rh=51.0), 0.0)  # closes period 0: pending
    windows.add(reading("a", 2, 0, pm10=12.0, rh=52.0), 0.0)  # closes 1: no PM, no window
    assert windows.pending_count == 1
    ready = windows.ready_windows()
    assert ready.sensor_ids == ("a",)
    assert (ready.periods - BASE).tolist() == [0]
    np.testing.assert_array_equal(ready.windows[0], [[math.nan, math.nan]] * 3 + [[10.0, 50.0]])
    assert windows.pending_count == 0


def test_removing_a_sensor_drops_its_periods_waiting_for_a_tick() -> None:
    """A removed sensor (evicted, or handed to another gateway with its waiting periods) has
    nothing left here: none of its periods reaches a tick, and the state saved afterwards
    restores (a waiting period of a sensor without a window is refused as corrupt)."""
    windows = ModelWindows(geometry(n=2, max_gap=0))
    feed(windows, "a", {0: [1.0], 1: [2.0], 2: [3.0], 3: [4.0]})  # 0 and 1 wait, 2 pends
    feed(windows, "b", {0: [5.0], 1: [6.0], 2: [7.0]})  # 0 waits, 1 pends
    assert windows.pending_count == 5
    assert windows.remove("a") is True
    assert windows.pending_count == 2
    restored = ModelWindows.from_state(windows.export_state())
    for each in (windows, restored):
        ready = each.ready_windows()
        assert ready.sensor_ids == ("b", "b")
        assert (ready.periods - BASE).tolist() == [0, 1]
