"""RejectCounter: counts by reason and source, logs the first of a burst, summarises the rest."""

from __future__ import annotations

from structlog.testing import capture_logs

from gateway.readings import ReadingRejectedError, RejectReason
from gateway.rejects import RejectCounter


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


def test_logs_once_per_burst_then_summaries_at_most_every_interval() -> None:
    clock = ManualClock()
    counter = RejectCounter(summary_interval_s=60, clock=clock)
    with capture_logs() as logs:
        for _ in range(500):  # a burst inside one interval: one line logged
            counter.reject(RejectReason.NOT_FINITE, source="mqtt", detail="pm10 is nan")
            clock.now += 0.01
        assert [log["event"] for log in logs] == ["reading_rejected"]
        assert logs[0]["reason"] == "not_finite"
        clock.now += 60  # the burst goes on after the interval: a summary of what was held back
        counter.reject(RejectReason.NEGATIVE, source="mqtt")
        assert [log["event"] for log in logs] == ["reading_rejected", "readings_rejected_summary"]
        assert logs[1]["suppressed"] == 500
        assert logs[1]["counts"] == {"mqtt:not_finite": 499, "mqtt:negative": 1}
        clock.now += 120  # quiet for a while: the next reject opens a new burst and is logged
        counter.reject(RejectReason.BAD_JSON, source="mqtt")
        counter.reject(RejectReason.BAD_JSON, source="mqtt")
        counter.flush()
    events = [log["event"] for log in logs]
    assert events == [
        "reading_rejected",
        "readings_rejected_summary",
        "reading_rejected",
        "readings_rejected_summary",
    ]
    assert logs[3]["counts"] == {"mqtt:bad_json": 1}
    assert counter.count() == 503
