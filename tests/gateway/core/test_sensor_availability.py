"""Per-sensor availability: online at the first reading, offline once quiet (monotonic time)."""

from __future__ import annotations

from tesla_gateway.publish.availability import SensorAvailability


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_a_sensor_goes_online_once_and_offline_after_the_quiet_time() -> None:
    clock = Clock()
    availability = SensorAvailability(60.0, monotonic=clock)
    assert availability.seen("a") is True
    assert availability.seen("b") is True
    clock.now += 30
    assert availability.seen("a") is False  # already online: nothing to publish
    clock.now += 31  # b quiet for 61 s, a for 31 s
    assert availability.expire() == ["b"]
    assert availability.expire() == []
    assert len(availability) == 1
    assert availability.seen("b") is True  # back online
    clock.now += 60
    assert sorted(availability.expire()) == ["a", "b"]


def test_only_the_quiet_ones_are_looked_at_and_order_follows_the_last_reading() -> None:
    clock = Clock()
    availability = SensorAvailability(10.0, monotonic=clock)
    for index in range(5):
        availability.seen(f"s{index}")
        clock.now += 1
    availability.seen("s0")  # s0 is now the most recent
    clock.now += 7.5  # s1..s2 are more than 10 s old, s3, s4 and s0 are not
    assert availability.expire() == ["s1", "s2"]


def test_forgotten_sensors_are_no_longer_tracked() -> None:
    clock = Clock()
    availability = SensorAvailability(5.0, monotonic=clock)
    availability.seen("a")
    availability.forget(["a", "never-seen"])
    clock.now += 10
    assert availability.expire() == []
    assert availability.seen("a") is True


def test_sensors_restored_at_start_get_their_true_state() -> None:
    clock = Clock()
    availability = SensorAvailability(60.0, monotonic=clock)
    online, offline = availability.adopt({"recent": 10.0, "older": 50.0, "gone": 3_600.0})
    assert (online, offline) == (["older", "recent"], ["gone"])
    assert availability.seen("recent") is False  # already online: nothing new to publish
    assert availability.seen("gone") is True  # back: online again
    clock.now += 15  # "older" has now been quiet for 65 s
    assert availability.expire() == ["older"]
