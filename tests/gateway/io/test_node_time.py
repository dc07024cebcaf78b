"""When the gateway tells a serial node the time (tesla_gateway/sources/node_time.py): after a
hello, every hour, after its own clock stepped, and never from an unset clock. The clocks are
the test's (an hour cannot pass in a test); the pty test in test_serial_source.py shows the
line reaching the node."""

from __future__ import annotations

from tesla_gateway.sources.line_protocol import TIME_MIN_S, TimeSync, decode_line
from tesla_gateway.sources.node_time import TIME_RESEND_S, NodeTime

START = 1_767_225_600.0  # 2026-01-01 00:00 UTC


class Clocks:
    """A wall clock and a monotonic one that the test moves."""

    def __init__(self, wall: float) -> None:
        self.wall = wall
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def told(keeper: NodeTime) -> TimeSync | None:
    line = keeper.line_if_due()
    if line is None:
        return None
    decoded = decode_line(line)
    assert isinstance(decoded, TimeSync)
    return decoded


def test_told_after_a_hello_then_every_hour() -> None:
    clocks = Clocks(START)
    keeper = NodeTime("Europe/Rome", clock=lambda: clocks.wall, monotonic=lambda: clocks.mono)
    assert told(keeper) is None  # nothing asked yet
    keeper.hello_seen()
    assert keeper.next_check_s() == 0.0
    assert told(keeper) == TimeSync(int(START), 3600)
    assert told(keeper) is None
    clocks.advance(TIME_RESEND_S - 1)
    assert told(keeper) is None and 0 < keeper.next_check_s() <= 60
    clocks.advance(1)
    assert told(keeper) == TimeSync(int(START + TIME_RESEND_S), 3600)


def test_a_step_of_the_gateway_clock_is_told_at_once() -> None:
    clocks = Clocks(START)
    keeper = NodeTime("UTC", clock=lambda: clocks.wall, monotonic=lambda: clocks.mono)
    keeper.hello_seen()
    assert told(keeper) is not None
    clocks.advance(60)
    clocks.wall += 1.5  # NTP slewing: no step
    assert told(keeper) is None
    clocks.wall -= 600  # the clock stepped back ten minutes
    assert told(keeper) == TimeSync(int(clocks.wall), 0)
    assert told(keeper) is None


def test_an_unset_gateway_clock_teaches_nothing_until_it_is_set() -> None:
    clocks = Clocks(86_400.0)  # a Pi without a real-time clock, before NTP answered
    keeper = NodeTime(None, clock=lambda: clocks.wall, monotonic=lambda: clocks.mono)
    keeper.hello_seen()
    assert told(keeper) is None
    assert keeper.next_check_s() == 60.0  # not a busy loop while it waits
    clocks.advance(30)
    clocks.wall = START  # NTP answered
    assert clocks.wall >= TIME_MIN_S
    assert keeper.next_check_s() == 0.0
    sync = told(keeper)
    assert sync is not None and sync.unix_s == int(START)
