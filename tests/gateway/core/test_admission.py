"""Sensor admission: restored windows count, a flood never displaces a reporting sensor, idle
sensors are evicted from the windows (issue 12, finding 7). Real window stores, test clocks."""

from __future__ import annotations

import numpy as np
from structlog.testing import capture_logs

from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading, RejectReason
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.ingest.admission import SensorAdmission
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.ingest.sensor_policy import SensorPolicy
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.store import WindowStore

P = 60
T0 = 1_700_000_040  # a period boundary
GEOMETRY = WindowGeometry(4, P, ("pm10",), GapPolicy(max_interpolated_periods=1))


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def reading(sensor: str, period: int, value: float = 10.0, source: str = "mqtt") -> Reading:
    return Reading(sensor, T0 + period * P + 1, {"pm10": value}, source=source)


def store_with(sensors: list[str], periods: range) -> WindowStore:
    store = WindowStore()
    store.ensure("pm10", GEOMETRY)
    for period in periods:
        for sensor in sensors:
            store.add(reading(sensor, period), 0.0)
    return store


def make(
    store: WindowStore, wall: Clock, mono: Clock, **policy: float
) -> tuple[SensorAdmission, RejectCounter]:
    rejects = RejectCounter()
    admission = SensorAdmission(
        SensorPolicy.model_validate(policy), store, rejects, clock=wall, monotonic=mono
    )
    return admission, rejects


def test_restored_windows_fill_the_cap_and_keep_their_place_against_a_flood() -> None:
    restored = [f"real-{i}" for i in range(100)]
    store = store_with(restored, range(6))
    wall, mono = Clock(T0 + 6 * P), Clock(1_000.0)
    admission, rejects = make(store, wall, mono, max_sensors=100)
    with capture_logs():
        assert admission.adopt_windows() == 100
        flood = [admission.admit(reading(f"new-{i}", 6)) for i in range(1_000)]
        assert not any(flood)
        assert all(admission.admit(reading(sensor, 6)) for sensor in restored)
    assert rejects.count(RejectReason.UNKNOWN_SENSOR) == 1_000
    assert admission.snapshot()["rejected_full"] == 1_000
    assert len(store["pm10"].sensor_ids) == 100


def test_a_sensor_idle_for_the_age_is_evicted_from_the_windows() -> None:
    store = store_with(["idle", "busy", "old"], range(3))
    wall, mono = Clock(T0 + 3 * P), Clock(1_000.0)
    admission, _ = make(store, wall, mono, max_sensors=10, evict_idle_s=3_600)
    # "old" was last heard two hours before the snapshot: evicted when its window is restored.
    store.remove_sensors(["old"])
    store.add(reading("old", -120), 0.0)
    with capture_logs() as logs:
        admission.adopt_windows()
        assert sorted(store["pm10"].sensor_ids) == ["busy", "idle"]
        for minute in range(1, 70):  # "busy" reports every minute, "idle" never again
            mono.now = 1_000.0 + minute * 60
            assert admission.admit(reading("busy", 3 + minute))
            admission.evict_idle()
    assert store["pm10"].sensor_ids == ("busy",)
    assert admission.snapshot()["evicted"] == 2
    assert [entry["sensors"] for entry in logs if entry["event"] == "sensors_evicted"] == [
        ["old"],
        ["idle"],
    ]


def test_when_full_a_new_id_may_take_only_an_idle_sensors_place() -> None:
    store = store_with(["a", "b"], range(2))
    wall, mono = Clock(T0 + 2 * P), Clock(1_000.0)
    admission, _ = make(store, wall, mono, max_sensors=2, evict_idle_s=600)
    with capture_logs():
        admission.adopt_windows()
        mono.now += 500
        assert admission.admit(reading("a", 2))  # "a" reports, "b" does not
        assert not admission.admit(reading("c", 2))  # nobody idle long enough yet
        mono.now += 200  # "b" idle 700 s, "a" 200 s
        assert admission.admit(reading("c", 2))
    assert store["pm10"].sensor_ids == ("a",)  # "b" evicted; "c" gets windows when ingested
    assert admission.snapshot()["sensors"] == 2


def test_removing_a_sensor_leaves_the_others_windows_intact() -> None:
    sensors = ["s0", "s1", "s2", "s3"]
    windows = ModelWindows(GEOMETRY)
    kept = ModelWindows(GEOMETRY)
    rng = np.random.default_rng(5)
    for period in range(7):
        for sensor in sensors:
            value = float(rng.uniform(1, 50))
            windows.add(reading(sensor, period, value), 0.0)
            if sensor != "s1":
                kept.add(reading(sensor, period, value), 0.0)
        if period == 3:
            assert windows.remove("s1")
            sensors.remove("s1")
        a, b = windows.ready_windows(), kept.ready_windows()
        if period > 3:  # s1 gone: the others' windows are exactly those never shared with it
            order = np.argsort(a.sensor_ids)
            assert sorted(a.sensor_ids) == sorted(b.sensor_ids)
            np.testing.assert_array_equal(a.windows[order], b.windows[np.argsort(b.sensor_ids)])
    assert not windows.remove("s1")
    assert sorted(windows.sensor_ids) == ["s0", "s2", "s3"]
    assert windows.pending_count == kept.pending_count


def test_an_id_outside_the_known_list_is_refused_and_counted_with_its_sensor() -> None:
    rejects = RejectCounter()
    admission = SensorAdmission(
        SensorPolicy(allow_unknown=False, known=["a"]), store_with([], range(0)), rejects
    )
    with capture_logs() as logs:
        assert admission.admit(reading("a", 0))
        assert not admission.admit(reading("b", 0))
    assert rejects.count(RejectReason.UNKNOWN_SENSOR, source="mqtt") == 1
    (logged,) = [entry for entry in logs if entry["event"] == "reading_rejected"]
    assert logged["sensor"] == "b" and logged["detail"] == "sensor b is not in sensors.known"
    assert admission.sensors == 1 and admission.snapshot()["admitted"] == 1


def test_the_snapshot_counts_every_way_a_sensor_came_and_went() -> None:
    store = store_with(["r1", "r2"], range(2))
    mono = Clock(1_000.0)
    evicted: list[list[str]] = []
    admission = SensorAdmission(
        SensorPolicy(max_sensors=5, evict_idle_s=600),
        store,
        RejectCounter(),
        clock=Clock(T0 + 2 * P),
        monotonic=mono,
        on_evicted=evicted.append,
    )
    with capture_logs() as logs:
        assert admission.adopt_windows() == 2
        store.add(reading("r3", 1), 0.0)
        assert admission.adopt_windows() == 1  # one more restored, the two known kept
        assert all(admission.admit(reading(s, 2)) for s in ("n1", "n2"))
        assert admission.admit(reading("n1", 2))  # known by now: not admitted twice
        mono.now += 601
        assert sorted(admission.evict_idle()) == ["n1", "n2", "r1", "r2", "r3"]
    assert admission.snapshot() == {
        "sensors": 0,
        "max_sensors": 5,
        "evict_idle_s": 600,
        "restored": 3,
        "admitted": 2,
        "rejected_full": 0,
        "evicted": 5,
        "conflicts": 0,
    }
    assert [sorted(ids) for ids in evicted] == [["n1", "n2", "r1", "r2", "r3"]]
    (line,) = [entry for entry in logs if entry["event"] == "sensors_evicted"]
    assert (line["count"], line["windows"], line["idle_for_s"], line["remaining"]) == (5, 3, 600, 0)


def test_idle_time_counts_from_the_newest_restored_period_or_the_last_reading() -> None:
    store = store_with(["r"], range(3))  # its newest period ends at T0 + 3 P: now
    wall, mono = Clock(T0 + 3 * P), Clock(1_000.0)
    admission, _ = make(store, wall, mono, evict_idle_s=600)
    with capture_logs():
        admission.adopt_windows()
        assert admission.idle_seconds() == {"r": 0.0}
        mono.now += 30
        assert admission.admit(reading("n", 3))
        mono.now += 10
        assert admission.idle_seconds() == {"r": 40.0, "n": 10.0}
        mono.now += 600 - 40
        assert admission.evict_idle() == []  # idle exactly evict_idle_s: not yet
        mono.now += 0.5
        assert admission.evict_idle() == ["r"]


def test_when_full_the_idle_sweep_runs_at_most_every_quarter_of_the_idle_age() -> None:
    store = store_with(["a", "b"], range(2))
    wall, mono = Clock(T0 + 2 * P), Clock(1_000.0)
    admission, _ = make(store, wall, mono, max_sensors=2, evict_idle_s=100)  # sweep every 25 s
    with capture_logs():
        admission.adopt_windows()  # a sweep at 1,000
        mono.now = 1_090.0
        assert admission.admit(reading("a", 2))  # "b" stays silent
        assert not admission.admit(reading("c", 2))  # full: a sweep at 1,090, nobody idle
        mono.now = 1_110.0  # "b" idle 110 s, but the last sweep was 20 s ago
        assert not admission.admit(reading("d", 2))
        mono.now = 1_115.0  # 25 s after the last sweep: another one makes room
        assert admission.admit(reading("d", 2))
    assert admission.snapshot()["rejected_full"] == 2


def test_when_full_before_any_sweep_the_first_new_id_sweeps() -> None:
    mono = Clock(1_000.0)
    admission = SensorAdmission(
        SensorPolicy(max_sensors=1, evict_idle_s=100),
        store_with([], range(0)),
        RejectCounter(),
        monotonic=mono,
    )
    with capture_logs():
        assert admission.admit(reading("a", 0))
        mono.now = 1_200.0
        assert admission.admit(reading("b", 0))  # "a" idle 200 s: evicted by the first sweep
    assert admission.snapshot()["evicted"] == 1


# -- a sensor id belongs to one source (issue 26 item 7) ---------------------------------------


def test_a_second_source_claiming_a_sensor_id_is_refused_counted_and_told_the_fix() -> None:
    store = store_with([], range(0))
    admission, rejects = make(store, Clock(T0), Clock(1_000.0))
    with capture_logs() as logs:
        assert admission.admit(reading("shared", 0, 10.0, source="tasmota"))
        assert not admission.admit(reading("shared", 0, 90.0, source="mqtt"))
        assert not admission.admit(reading("shared", 1, 90.0, source="mqtt"))
        assert admission.admit(reading("shared", 1, 11.0, source="tasmota"))  # the owner goes on
        # Every serial port is one kind: a node moved to another port keeps its id.
        assert admission.admit(reading("node", 0, source="serial:ttyACM0"))
        assert admission.admit(reading("node", 1, source="serial:ttyACM1"))
        assert not admission.admit(reading("node", 1, source="mqtt"))
    assert rejects.count(RejectReason.SENSOR_ID_CONFLICT, source="mqtt") == 3
    assert admission.snapshot()["conflicts"] == 3
    lines = [e for e in logs if e["event"] == "reading_rejected"]
    assert [(e["sensor"], e["source"]) for e in lines] == [("shared", "mqtt"), ("node", "mqtt")]
    assert lines[0]["reason"] == "sensor_id_conflict"
    assert lines[0]["detail"] == (
        "sensor shared reports through tasmota; a reading of the same id from mqtt is refused "
        "(a sensor id belongs to one source): set sensor_id_prefix on the tasmota source"
    )
    assert lines[1]["detail"].endswith("rename one of the two devices")


def test_a_claim_ends_with_the_eviction_and_a_restored_window_is_claimed_by_its_first_reading() -> (
    None
):
    store = store_with(["restored"], range(2))
    mono = Clock(1_000.0)
    admission, rejects = make(store, Clock(T0 + 2 * P), mono, evict_idle_s=600)
    with capture_logs():
        admission.adopt_windows()
        assert admission.admit(reading("restored", 2, source="esphome"))  # claims it
        assert not admission.admit(reading("restored", 2, source="mqtt"))
        assert admission.admit(reading("moved", 2, source="mqtt"))
        mono.now += 601
        assert sorted(admission.evict_idle()) == ["moved", "restored"]
        # Evicted: the id is free again, for whichever source reports it first.
        assert admission.admit(reading("moved", 20, source="tasmota"))
        assert not admission.admit(reading("moved", 20, source="mqtt"))
    assert rejects.count(RejectReason.SENSOR_ID_CONFLICT) == 2


def test_a_forgotten_sensor_is_no_longer_admitted_nor_evicted_and_its_id_is_free() -> None:
    """Cluster mode hands sensors to another gateway: forget drops them here (an id never
    admitted here is no error), they are not evicted later, and their claim ends."""
    store = store_with([], range(0))
    mono = Clock(1_000.0)
    admission, rejects = make(store, Clock(T0), mono, evict_idle_s=600)
    with capture_logs():
        assert admission.admit(reading("moved", 0, source="tasmota"))
        assert admission.admit(reading("stays", 0, source="mqtt"))
        admission.forget(["moved", "never-seen"])
        assert admission.sensors == 1 and set(admission.idle_seconds()) == {"stays"}
        mono.now += 601
        assert admission.evict_idle() == ["stays"]
        assert admission.admit(reading("moved", 20, source="mqtt"))  # no claim left
    assert rejects.count(RejectReason.SENSOR_ID_CONFLICT) == 0


def test_a_refusal_for_a_full_gateway_names_the_sensor_and_the_limits() -> None:
    store = store_with(["a"], range(1))
    admission, rejects = make(store, Clock(T0 + P), Clock(1_000.0), max_sensors=1)
    with capture_logs() as logs:
        admission.adopt_windows()
        assert not admission.admit(reading("b", 1))
    assert rejects.count(RejectReason.UNKNOWN_SENSOR, source="mqtt") == 1
    (logged,) = [entry for entry in logs if entry["event"] == "reading_rejected"]
    assert logged["sensor"] == "b"
    assert logged["detail"].startswith("new sensor b: sensors.max_sensors=1 reached")


def test_last_reading_times_give_the_true_age_across_a_clock_step() -> None:
    """For staleness alerts (time() minus it): the Unix time of each sensor's last reading,
    whose distance from the wall clock is the time since the reading, also after a step."""
    store = store_with(["r"], range(3))  # its newest period ends at T0 + 3 P
    wall, mono = Clock(T0 + 3 * P + 100), Clock(1_000.0)
    admission, _ = make(store, wall, mono, evict_idle_s=600)
    with capture_logs():
        admission.adopt_windows()
        mono.now += 20
        wall.now += 20
        assert admission.admit(reading("n", 3))
        mono.now += 5
        wall.now += 5
        assert admission.last_reading_times() == {"r": T0 + 3 * P, "n": T0 + 3 * P + 120}
        wall.now += 3600  # the wall clock steps an hour on (corrected); no reading since
        assert admission.last_reading_times() == {"r": T0 + 3 * P + 3600, "n": T0 + 3 * P + 3720}
        mono.now += 600
        wall.now += 600
        admission.evict_idle()
        assert admission.last_reading_times() == {}  # evicted: no series left behind
