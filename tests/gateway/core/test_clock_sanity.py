"""A reading from a fast clock cannot move a window into the future (issue 12, finding 8).

The tester's scenario on the daemon's window store: a sensor reports every 15 s with a true
clock; one reading is stamped 300 s ahead (inside ``max_future_s``); then 20 true readings.
None of them may be late, and the window must hold the true readings only, no ramp towards the
outlier. A sensor whose clock is consistently ahead (or a gateway whose clock is behind) still
gets every reading in, each confirmed by the next.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading, RejectReason
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.ingest.clock_sanity import ClockSanity
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.windows.outcome import AddOutcome
from tesla_gateway.windows.store import WindowStore

P = 60
T0 = 1_700_000_040  # a period boundary
GEOMETRY = WindowGeometry(12, P, ("pm10",), GapPolicy(max_interpolated_periods=10))


def daemon_store() -> tuple[WindowStore, RejectCounter]:
    rejects = RejectCounter()
    store = WindowStore(clock_sanity=ClockSanity(rejects))
    store.ensure("pm10", GEOMETRY)
    return store, rejects


def true_value(t: float) -> float:
    return 20.0 + (t - T0) / 60.0  # slowly rising, so any ramp or mix-up shows


def windows_after(store: WindowStore, now: float) -> dict[int, np.ndarray]:
    store.close_idle(now, grace_s=0.0)
    ready = store["pm10"].ready_windows()
    return {int(p): ready.windows[i] for i, p in enumerate(ready.periods)}


def test_one_reading_300_s_fast_makes_no_true_reading_late_and_leaves_no_ramp() -> None:
    store, rejects = daemon_store()
    reference = WindowStore()  # the same true readings, without the outlier
    reference.ensure("pm10", GEOMETRY)
    now = T0 + 7.0
    outcomes: list[AddOutcome] = []
    with capture_logs() as logs:
        for _ in range(12):  # three minutes of true readings
            true = Reading("s", now, {"pm10": true_value(now)}, source="mqtt")
            store.add(true, now)
            reference.add(true, now)
            now += 15
        fast = Reading("s", now + 300, {"pm10": 99.0}, source="mqtt")
        assert store.add(fast, now) == {"pm10": AddOutcome.HELD}
        for _ in range(20):
            true = Reading("s", now, {"pm10": true_value(now)}, source="mqtt")
            outcomes.append(store.add(true, now)["pm10"])
            reference.add(true, now)
            now += 15
        got, expected = windows_after(store, now + P), windows_after(reference, now + P)
    assert AddOutcome.LATE not in outcomes
    assert outcomes == [AddOutcome.ACCEPTED] * 20
    counts = store["pm10"].counts
    assert counts[AddOutcome.LATE] == 0 and counts[AddOutcome.CLOCK_OUTLIER] == 1
    assert rejects.count(RejectReason.CLOCK_OUTLIER) == 1 and rejects.count() == 1
    logged = [e for e in logs if e["event"] == "reading_rejected"]
    assert logged and "sensor s" in logged[0]["detail"] and logged[0]["reason"] == "clock_outlier"
    # The window holds what the true readings alone give: no ramp, no trace of 99.
    assert got.keys() == expected.keys()
    for period, window in got.items():
        np.testing.assert_array_equal(window, expected[period])
        assert np.nanmax(window) < 99.0


def test_a_refuted_reading_held_by_two_models_is_one_reject() -> None:
    # A feature with a PM-only and a covariate model (tesla_gateway.models.choice): the fast reading
    # is held in both windows, refuted in both, and rejected once, naming both windows.
    rejects = RejectCounter()
    store = WindowStore(clock_sanity=ClockSanity(rejects))
    store.ensure("pm10", GEOMETRY)
    store.ensure(
        "pm10-rh", WindowGeometry(12, P, ("pm10", "rh"), GapPolicy(max_interpolated_periods=10))
    )
    now = T0 + 7.0
    store.add(Reading("s", now, {"pm10": 20.0, "rh": 50.0}, source="mqtt"), now)
    fast = Reading("s", now + 300, {"pm10": 99.0, "rh": 50.0}, source="mqtt")
    assert store.add(fast, now) == {"pm10": AddOutcome.HELD, "pm10-rh": AddOutcome.HELD}
    with capture_logs() as logs:
        store.add(Reading("s", now + 15, {"pm10": 21.0, "rh": 50.0}, source="mqtt"), now + 15)
    assert store["pm10"].counts[AddOutcome.CLOCK_OUTLIER] == 1
    assert store["pm10-rh"].counts[AddOutcome.CLOCK_OUTLIER] == 1
    assert rejects.count(RejectReason.CLOCK_OUTLIER) == 1 and rejects.count() == 1
    (logged,) = [e for e in logs if e["event"] == "reading_rejected"]
    assert logged["detail"].endswith("dropped from its pm10, pm10-rh windows")


def test_late_readings_are_counted_as_rejects_with_the_sensor() -> None:
    store, rejects = daemon_store()
    now = T0 + 3 * P + 5
    with capture_logs() as logs:
        store.add(Reading("s", T0 + 2 * P + 1, {"pm10": 1.0}, source="mqtt"), now)
        store.add(Reading("s", T0 + 3 * P + 1, {"pm10": 2.0}, source="mqtt"), now)  # closes 2
        outcome = store.add(Reading("s", T0 + 2 * P + 30, {"pm10": 3.0}, source="mqtt"), now)
    assert outcome == {"pm10": AddOutcome.LATE}
    assert rejects.count(RejectReason.LATE, source="mqtt") == 1
    assert "sensor s" in next(e for e in logs if e["event"] == "reading_rejected")["detail"]


def test_a_clock_consistently_ahead_still_gets_every_reading_in() -> None:
    store, rejects = daemon_store()
    gateway_now = T0 + 30.0  # the gateway clock is 10 minutes behind the sensor's
    for minute in range(6):
        sensor_time = T0 + 600 + minute * P + 1
        outcome = store.add(Reading("s", sensor_time, {"pm10": float(minute)}), gateway_now)
        assert outcome == {"pm10": AddOutcome.HELD}  # each waits for the next one
        gateway_now += P
    ready = store["pm10"].ready_windows()
    assert ready.periods.tolist() == [T0 // P + 10 + m for m in range(4)]  # 0..4 in, 4 open
    assert rejects.count() == 0
    # When the gateway clock reaches its period, the last held reading goes in too.
    store.close_idle(T0 + 600 + 6 * P + 1, grace_s=0.0)
    assert store["pm10"].ready_windows().periods.tolist() == [T0 // P + 10 + 4, T0 // P + 15]


def test_two_readings_of_one_period_ahead_of_the_clock_confirm_each_other() -> None:
    """A sensor 10 minutes ahead reporting every 15 s: the first reading of each period is held
    and the next one, of the same period, confirms it (it does not contradict it) and goes in
    with it, so no reading is an outlier and the windows equal those of a true clock."""
    store, rejects = daemon_store()
    reference = WindowStore()
    reference.ensure("pm10", GEOMETRY)
    gateway_now = T0 + 3.0
    for step in range(24):  # six periods, four readings each
        sensor_time = T0 + 600 + step * 15 + 1
        reading = Reading("s", sensor_time, {"pm10": true_value(sensor_time)})
        expected_outcome = AddOutcome.HELD if step % 4 == 0 else AddOutcome.ACCEPTED
        assert store.add(reading, gateway_now) == {"pm10": expected_outcome}
        reference.add(reading, sensor_time)
        gateway_now += 15
    assert store["pm10"].counts[AddOutcome.CLOCK_OUTLIER] == 0
    assert rejects.count() == 0
    end = T0 + 600 + 7 * P
    got, expected = windows_after(store, end), windows_after(reference, end)
    assert got.keys() == expected.keys() and len(got) == 6
    for period, window in got.items():
        np.testing.assert_array_equal(window, expected[period])


def test_a_boundary_reading_a_moment_early_is_not_lost() -> None:
    store, rejects = daemon_store()
    store.add(Reading("s", T0 + 30, {"pm10": 1.0}), T0 + 30)
    early = Reading("s", T0 + P + 0.5, {"pm10": 2.0})  # the sensor's clock is 1 s fast
    assert store.add(early, T0 + P - 0.5) == {"pm10": AddOutcome.HELD}
    store.close_idle(T0 + P + 0.1, grace_s=5.0)  # the gateway clock reaches its period
    store.add(Reading("s", T0 + 2 * P + 1, {"pm10": 3.0}), T0 + 2 * P + 1)
    ready = store["pm10"].ready_windows()
    assert ready.raw.tolist() == [1.0, 2.0] and rejects.count() == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gaps=st.lists(st.integers(5, 50), min_size=30, max_size=80),
    outliers=st.dictionaries(st.integers(1, 78), st.integers(1, 300), max_size=6),
)
def test_isolated_fast_readings_never_change_what_true_readings_give(
    gaps: list[int], outliers: dict[int, int]
) -> None:
    """True readings every 5-50 s; after some of them one reading stamped ahead of the clock by
    more than the next gap plus a period (up to 300 s more). No true reading is late and every
    window equals the one the true readings alone give."""
    store, rejects = daemon_store()
    reference = WindowStore()
    reference.ensure("pm10", GEOMETRY)
    now = float(T0 + 3)
    dropped = 0
    for index, gap in enumerate(gaps):
        true = Reading("s", now, {"pm10": true_value(now)})
        assert store.add(true, now)["pm10"] is not AddOutcome.LATE
        reference.add(true, now)
        ahead = outliers.get(index)
        if ahead is not None and index + 1 < len(gaps):
            fast = Reading("s", now + gap + P + ahead, {"pm10": 999.0})
            assert store.add(fast, now)["pm10"] is AddOutcome.HELD
            dropped += 1
        now += gap
    got, expected = windows_after(store, now + P), windows_after(reference, now + P)
    assert got.keys() == expected.keys()
    for period, window in got.items():
        np.testing.assert_array_equal(window, expected[period])
    assert rejects.count(RejectReason.CLOCK_OUTLIER) == dropped == rejects.count()


def test_an_outlier_reject_names_its_source_its_sensor_and_how_far_ahead_it_was() -> None:
    store, rejects = daemon_store()
    now = T0 + 7.0
    store.add(Reading("s", now, {"pm10": 20.0}, source="serial"), now)
    store.add(Reading("s", now + 300, {"pm10": 99.0}, source="serial"), now)
    with capture_logs() as logs:
        store.add(Reading("s", now + 15, {"pm10": 21.0}, source="serial"), now + 15)
    assert rejects.count(RejectReason.CLOCK_OUTLIER, source="serial") == 1
    (logged,) = [e for e in logs if e["event"] == "reading_rejected"]
    assert logged["sensor"] == "s"
    assert "was 300 s ahead of the gateway clock" in logged["detail"]
    assert logged["detail"].endswith("dropped from its pm10 window")  # one window: singular


def test_a_late_reading_names_its_sensor_and_only_the_windows_that_closed_its_period() -> None:
    rejects = RejectCounter()
    store = WindowStore(clock_sanity=ClockSanity(rejects))
    for feature in ("pm10", "pm10-b", "pm10-hourly"):
        period = 3600 if feature == "pm10-hourly" else P
        store.ensure(
            feature,
            WindowGeometry(12, period, ("pm10",), GapPolicy(max_interpolated_periods=10)),
        )
    now = T0 + 3 * P + 5
    store.add(Reading("s", T0 + 2 * P + 1, {"pm10": 1.0}, source="mqtt"), now)
    store.add(Reading("s", T0 + 3 * P + 1, {"pm10": 2.0}, source="mqtt"), now)
    with capture_logs() as logs:
        outcome = store.add(Reading("s", T0 + 2 * P + 30, {"pm10": 3.0}, source="mqtt"), now)
    assert outcome["pm10"] is AddOutcome.LATE and outcome["pm10-b"] is AddOutcome.LATE
    assert outcome["pm10-hourly"] is not AddOutcome.LATE  # its hour is still open
    assert rejects.count(RejectReason.LATE, source="mqtt") == 1
    (logged,) = [e for e in logs if e["event"] == "reading_rejected"]
    assert logged["sensor"] == "s"
    assert logged["detail"].endswith("period already closed in its pm10, pm10-b window")


def test_held_readings_go_with_their_window_or_their_sensor_and_no_other() -> None:
    rejects = RejectCounter()
    store = WindowStore(clock_sanity=ClockSanity(rejects))
    store.ensure("pm10", GEOMETRY)
    store.ensure("pm10-b", GEOMETRY)
    now = T0 + 7.0
    for sensor in ("a", "b"):
        store.add(Reading(sensor, now + 300, {"pm10": 1.0}), now)
    sanity = store._sanity
    assert isinstance(sanity, ClockSanity) and sanity.held == 4
    store.drop("pm10-b")
    assert sanity.held == 2  # pm10's two remain
    store.remove_sensors(["a"])
    assert sanity.held == 1  # b's pm10 reading remains
    # When the gateway clock reaches its period, b's reading goes in and only it.
    assert sanity.release_due(store._models, now + 300) == 1
    assert store["pm10"].sensor_ids == ("b",)


def test_release_due_counts_what_it_adds_and_waits_for_the_held_period() -> None:
    sanity = ClockSanity(RejectCounter())
    store = WindowStore(clock_sanity=sanity)
    store.ensure("pm10", GEOMETRY)
    store.ensure("pm10-b", GEOMETRY)
    assert sanity.release_due(store._models, T0) == 0  # nothing held
    ahead = T0 + 5 * P + 1  # in period T0/P + 5
    for sensor in ("a", "b"):  # held as (pm10, a), (pm10-b, a), (pm10, b), (pm10-b, b)
        store.add(Reading(sensor, ahead, {"pm10": 1.0}), T0 + 1.0)
    assert sanity.held == 4
    assert sanity.release_due(store._models, T0 + 5 * P - 0.5) == 0  # a moment before
    # Its period has begun; pm10-b's windows are gone meanwhile: theirs are forgotten, and
    # pm10's after them still go in.
    assert sanity.release_due({"pm10": store["pm10"]}, T0 + 5 * P) == 2
    assert sanity.held == 0
    assert set(store["pm10"].sensor_ids) == {"a", "b"}


def test_a_held_reading_confirmed_by_a_held_one_closes_by_its_own_arrival() -> None:
    """A clock minutes ahead: the first reading is held, the next (further ahead) confirms it
    and is held in turn. The confirmed one goes in with the time it arrived, so its period
    closes by the wall-clock fallback once it is over and the grace has passed since then."""
    store, rejects = daemon_store()
    first = Reading("s", T0 + 2 * P + 1, {"pm10": 1.0})
    assert store.add(first, T0 + 1.0) == {"pm10": AddOutcome.HELD}
    second = Reading("s", T0 + 10 * P + 1, {"pm10": 2.0})
    assert store.add(second, T0 + 2.0) == {"pm10": AddOutcome.HELD}
    assert store.close_idle(T0 + 3 * P + 4.0, grace_s=5.0) == 0  # its period ended 4 s ago
    assert store.close_idle(T0 + 3 * P + 5.0, grace_s=5.0) == 1
    assert store["pm10"].ready_windows().raw.tolist() == [1.0]
    assert rejects.count() == 0


def test_a_redelivered_reading_of_a_closed_period_does_not_refute_a_held_one() -> None:
    """After a reconnect or a cluster takeover a broker redelivers readings the window already
    holds: refused (late, duplicate), they say nothing of a reading held ahead of the clock,
    which goes in when the sensor's next reading confirms it. It was dropped as a clock outlier,
    and its period then closed only by the wall-clock grace (the cluster's leader-kill stall)."""
    store, rejects = daemon_store()
    now = T0 + 7.0
    first = Reading("s", now, {"pm10": 20.0}, source="mqtt")
    second = Reading("s", now + P, {"pm10": 21.0}, source="mqtt")
    assert store.add(first, now) == {"pm10": AddOutcome.ACCEPTED}
    now += P
    assert store.add(second, now) == {"pm10": AddOutcome.ACCEPTED}  # closes the first period
    ahead = Reading("s", now + 2 * P, {"pm10": 23.0}, source="mqtt")
    assert store.add(ahead, now) == {"pm10": AddOutcome.HELD}
    assert store.add(first, now + 1) == {"pm10": AddOutcome.LATE}  # redelivered
    assert store.add(second, now + 2) == {"pm10": AddOutcome.DUPLICATE}  # redelivered
    assert rejects.count(RejectReason.CLOCK_OUTLIER) == 0
    confirming = Reading("s", now + 2 * P + 5, {"pm10": 23.0}, source="mqtt")
    assert store.add(confirming, now + 2 * P) == {"pm10": AddOutcome.ACCEPTED}
    assert store["pm10"].counts[AddOutcome.CLOCK_OUTLIER] == 0
    windows = windows_after(store, now + 4 * P)
    assert sorted(windows) == [(T0 + 7) // P + k for k in (0, 1, 3)]
    newest = windows[(T0 + 7) // P + 3]
    assert newest[-1] == 23.0  # the held reading went in: its period closed with it


def test_one_fast_reading_held_by_two_models_is_one_outlier() -> None:
    """PM in one message and rh in the next refute a reading held by both a PM and an rh model
    one model at a time: it was counted as two clock outliers."""
    rejects = RejectCounter()
    store = WindowStore(clock_sanity=ClockSanity(rejects))
    store.ensure("pm10", GEOMETRY)
    store.ensure("rh", WindowGeometry(12, P, ("rh",), GapPolicy(max_interpolated_periods=10)))
    now = T0 + 5.0
    store.add(Reading("s", now, {"pm10": 10.0, "rh": 50.0}, source="mqtt"), now)
    fast = Reading("s", now + 310, {"pm10": 99.0, "rh": 99.0}, source="mqtt")
    assert store.add(fast, now + 10) == {"pm10": AddOutcome.HELD, "rh": AddOutcome.HELD}
    assert store.add(Reading("s", now + 20, {"rh": 51.0}, source="mqtt"), now + 20)["rh"] is (
        AddOutcome.ACCEPTED
    )
    assert store.add(Reading("s", now + 30, {"pm10": 11.0}, source="mqtt"), now + 30)["pm10"] is (
        AddOutcome.ACCEPTED
    )
    assert rejects.count(RejectReason.CLOCK_OUTLIER) == 1
    assert store["pm10"].counts[AddOutcome.CLOCK_OUTLIER] == 1
    assert store["rh"].counts[AddOutcome.CLOCK_OUTLIER] == 1


def test_a_reading_barely_ahead_is_early_not_wrong() -> None:
    """A true reading 0.5 s ahead of the gateway clock across a period boundary is held; an
    earlier reading redelivered out of order (never seen by this window) then arrives. Both are
    true: the held one goes in when the clock reaches its period (it was dropped as an outlier)."""
    store, rejects = daemon_store()
    assert store.add(Reading("s", T0 + 30, {"pm10": 10.0}, source="mqtt"), T0 + 30)
    early = Reading("s", T0 + P + 0.2, {"pm10": 12.0}, source="mqtt")
    assert store.add(early, T0 + P - 0.3) == {"pm10": AddOutcome.HELD}
    late_delivery = Reading("s", T0 + 45, {"pm10": 11.0}, source="mqtt")
    assert store.add(late_delivery, T0 + P - 0.1) == {"pm10": AddOutcome.ACCEPTED}
    assert rejects.count(RejectReason.CLOCK_OUTLIER) == 0
    windows = windows_after(store, T0 + 3 * P)
    assert windows[T0 // P][-1] == 10.5  # both readings of the first period
    assert windows[T0 // P + 1][-1] == 12.0  # the early one, in its own period
