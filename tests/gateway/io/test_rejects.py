"""RejectCounter: counts by reason and source; logs name the sensor, where and why, throttled per
(sensor, reason) with a count of what was suppressed, and bounded overall."""

from __future__ import annotations

from structlog.testing import capture_logs

from tesla_gateway.contract.readings import ReadingRejectedError, RejectReason
from tesla_gateway.ingest.rejects import RejectCounter


class ManualClock:
    """A clock the test advances by hand (monotonic seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_counts_by_reason_and_source() -> None:
    counter = RejectCounter(clock=ManualClock())
    with capture_logs():
        counter.reject(RejectReason.BAD_JSON, source="mqtt")
        counter.reject(RejectReason.BAD_JSON, source="mqtt")
        counter.reject_error(
            ReadingRejectedError(RejectReason.BAD_CHECKSUM, "x"), source="serial:tty0"
        )
    assert counter.count() == 3
    assert counter.count(RejectReason.BAD_JSON) == 2
    assert counter.count(source="serial:tty0") == 1
    snapshot = counter.snapshot()
    assert snapshot == {
        "total": 3,
        "by_reason": {"bad_checksum": 1, "bad_json": 2},
        "by_source": {"mqtt": {"bad_json": 2}, "serial:tty0": {"bad_checksum": 1}},
    }


def test_each_sensor_and_reason_is_logged_then_throttled_with_a_count() -> None:
    clock = ManualClock()
    counter = RejectCounter(summary_interval_s=60, clock=clock)
    with capture_logs() as logs:
        for _ in range(500):  # a flood from one sensor for one reason: one line
            counter.reject(
                RejectReason.NOT_FINITE,
                source="mqtt",
                sensor="s1",
                where="sensors/s1/raw",
                detail="pm10 is nan",
            )
            clock.now += 0.01
        # Another reason, another sensor, a reject whose sensor is not known: each has a line.
        counter.reject(RejectReason.NEGATIVE, source="mqtt", sensor="s1", where="sensors/s1/raw")
        counter.reject(RejectReason.NOT_FINITE, source="mqtt", sensor="s2", where="sensors/s2/raw")
        counter.reject(RejectReason.BAD_JSON, source="mqtt", where="sensors/x/raw")
        counter.reject(RejectReason.BAD_SENSOR_ID, source="mqtt", sensor="-bad", where="t")
        assert [(log["sensor"], log["reason"], log["where"]) for log in logs] == [
            ("s1", "not_finite", "sensors/s1/raw"),
            ("s1", "negative", "sensors/s1/raw"),
            ("s2", "not_finite", "sensors/s2/raw"),
            (None, "bad_json", "sensors/x/raw"),
            (None, "bad_sensor_id", "t"),  # an invalid id is not a sensor name (detail has it)
        ]
        assert logs[0]["detail"] == "pm10 is nan" and logs[0]["suppressed"] == 0
        clock.now += 60  # a minute later the flood goes on: one line with what was held back
        counter.reject(RejectReason.NOT_FINITE, source="mqtt", sensor="s1", where="sensors/s1/raw")
        assert logs[-1]["sensor"] == "s1" and logs[-1]["suppressed"] == 499
        counter.reject(RejectReason.NOT_FINITE, source="mqtt", sensor="s1", where="sensors/s1/raw")
        lines = len(logs)
        counter.flush()  # periodic: s1's interval has not passed yet, nothing to say
        assert len(logs) == lines
        clock.now += 60  # the flood stopped; the periodic flush tells what was held back
        counter.flush()
        assert logs[-1]["event"] == "readings_rejected_summary"
        assert logs[-1]["counts"] == {"s1:not_finite": 1}
        counter.reject(RejectReason.NEGATIVE, source="mqtt", sensor="s2")
        counter.reject(RejectReason.NEGATIVE, source="mqtt", sensor="s2")
        counter.flush(final=True)  # at shutdown: everything still held back
        assert logs[-1]["counts"] == {"s2:negative": 1}
    assert counter.count() == 508


def test_a_flood_of_distinct_sensors_is_bounded_per_interval() -> None:
    clock = ManualClock()
    counter = RejectCounter(summary_interval_s=60, max_lines_per_interval=10, clock=clock)
    with capture_logs() as logs:
        for n in range(1000):
            counter.reject(RejectReason.UNKNOWN_SENSOR, source="mqtt", sensor=f"stranger-{n}")
        assert len(logs) == 10
        clock.now += 60
        counter.reject(RejectReason.UNKNOWN_SENSOR, source="mqtt", sensor="late")
    assert logs[10]["event"] == "readings_rejected_over_budget"
    assert logs[10]["not_logged"] == 990 and logs[10]["by_reason"] == {"unknown_sensor": 990}
    assert logs[11]["sensor"] == "late"


def test_the_sensor_named_by_the_error_wins() -> None:
    counter = RejectCounter(clock=ManualClock())
    error = ReadingRejectedError(RejectReason.NEGATIVE, "pm10 is negative", sensor_id="in-body")
    with capture_logs() as logs:
        counter.reject_error(error, source="mqtt", sensor="from-topic", where="sensors/x/raw")
    assert logs[0]["sensor"] == "in-body"
