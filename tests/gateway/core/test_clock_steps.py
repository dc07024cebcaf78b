"""A step of the gateway's wall clock re-anchors the windows (issue 26 item 11).

The field report: the wall clock stepped a day forward for 15 s (a bad NTP answer) and back;
afterwards every reading of a sensor without a time of its own was ``late`` for 24 hours, its
open period a day ahead. Here the real ticker, windows and clock sanity run on injected clocks
(a wall clock and the steady one :class:`ClockSteps` compares it with): one sensor whose readings
the gateway stamps, one with its own true clock, a reading every 5 s. With the excursion, what
is published is exactly what is published without it; a lasting step back (a clock an hour
ahead, corrected) makes no reading late and leaves the windows valid.
"""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from structlog.testing import capture_logs

from tesla_gateway.contract.calibrated import CalibratedReading, Quality
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading, RejectReason, validate_reading
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.daemon.clock_steps import ClockSteps
from tesla_gateway.daemon.ticker import Ticker
from tesla_gateway.ingest.clock_sanity import ClockSanity
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.models.watch import ModelSet
from tesla_gateway.sources import payloads, payloads_fast
from tesla_gateway.sources.payload_rules import PayloadRules
from tesla_gateway.windows.outcome import AddOutcome
from tesla_gateway.windows.store import WindowStore
from tests.support.models import ModelFactory

P = 60
T0 = 1_700_000_040  # a period boundary
DAY = 86_400.0
EVERY_S = 5.0


@dataclass
class Clocks:
    """True time (what the steady clock and the sensor with its own clock follow) and the
    wall clock's error, both under the test's control."""

    true: float = T0
    error: float = 0.0
    steps: list[float] = field(default_factory=list)

    def wall(self) -> float:
        return self.true + self.error

    def steady(self) -> float:
        return self.true - T0 + 1_000.0  # any origin: only its progress counts


def run(
    model_factory: ModelFactory, error_at: Sequence[tuple[float, float]], periods: int = 14
) -> tuple[list[CalibratedReading], Ticker, RejectCounter, list[MutableMapping[str, Any]]]:
    """Readings of ``ours`` (stamped by the gateway) and ``own`` (its own true clock) every
    5 s for ``periods`` periods, a tick after each; ``error_at``: (true time, wall clock error
    from then on). Returns what was published, the ticker, the rejects and the logs."""
    clocks = Clocks()
    rejects = RejectCounter()
    models = ModelSet({"pm10": model_factory.get().path})  # N = 8, 60 s periods
    models.refresh()
    ticker = Ticker(
        models,
        grace_s=5.0,
        clock_sanity=ClockSanity(rejects),
        clock=clocks.wall,
        clock_steps=ClockSteps(steady=clocks.steady),
    )
    changes = sorted(error_at)
    published: list[CalibratedReading] = []
    with capture_logs() as logs:
        while clocks.true < T0 + periods * P:
            while changes and changes[0][0] <= clocks.true:
                clocks.error = changes.pop(0)[1]
            value = 10.0 + (clocks.true - T0) / 30.0  # rising: a mix-up of periods shows
            ticker.ingest(Reading("ours", clocks.wall(), {"pm10": value}, stamped_at_gateway=True))
            ticker.ingest(Reading("own", clocks.true, {"pm10": value + 1.0}))
            published.extend(asyncio.run(ticker.tick()))
            clocks.true += EVERY_S
        clocks.true += P + 5.0  # the wall-clock fallback closes the last periods
        published.extend(asyncio.run(ticker.tick()))
    return published, ticker, rejects, logs


def outputs(readings: list[CalibratedReading]) -> list[tuple[object, ...]]:
    return [(r.sensor_id, r.period_start, r.raw, r.calibrated, r.quality) for r in readings]


def test_a_day_forward_for_15_s_and_back_changes_nothing_published(
    model_factory: ModelFactory,
) -> None:
    excursion = [(T0 + 9 * P + 20, DAY), (T0 + 9 * P + 35, 0.0)]  # inside period 9
    stepped, ticker, rejects, logs = run(model_factory, excursion)
    reference, *_ = run(model_factory, [])
    assert outputs(stepped) == outputs(reference)
    assert len(stepped) == 2 * 14 and stepped[-1].quality == (Quality.OK,)
    counts = ticker.store["pm10"].counts
    assert counts[AddOutcome.LATE] == 0 and rejects.count(RejectReason.LATE) == 0
    assert counts[AddOutcome.ACCEPTED] == 2 * 14 * P / EVERY_S
    steps = [entry for entry in logs if entry["event"] == "clock_step"]
    assert [entry["step_s"] for entry in steps] == [DAY, -DAY]  # each logged once, with its size
    assert all(entry["windows_re_anchored"] == 1 for entry in steps)  # ours, not own
    assert ticker.counters.clock_steps == 2
    assert ticker.stats()["ticker"]["clock_steps"] == 2  # type: ignore[index]


@pytest.mark.parametrize("step", [-3_600.0, 3_600.0, -DAY])
def test_a_lasting_step_makes_no_reading_late_and_keeps_the_windows_valid(
    model_factory: ModelFactory, step: float
) -> None:
    # The wall clock was wrong by -step and is corrected at period 10 (a lasting step).
    published, ticker, rejects, _ = run(model_factory, [(T0, -step), (T0 + 10 * P + 20, 0.0)])
    assert ticker.store["pm10"].counts[AddOutcome.LATE] == 0
    assert rejects.count() == 0
    ours = [r for r in published if r.sensor_id == "ours"]
    # Warmed up before the step, calibrated through it: no gap, no new warm-up.
    assert [r.quality for r in ours[7:]] == [(Quality.OK,)] * (len(ours) - 7)
    assert len(ours) == 14
    assert ours[-1].period_start == T0 + 13 * P  # on the true clock from the step on
    assert ticker.counters.clock_steps == 1


def test_small_differences_are_not_steps() -> None:
    clocks = Clocks()
    steps = ClockSteps(steady=clocks.steady)
    assert steps.observe(clocks.wall()) == 0.0  # the first observation sets the reference
    for error in (0.5, 30.0, -20.0, 30.0):  # a slew, and jumps within the 60 s threshold
        clocks.true += 1.0
        clocks.error = error
        assert steps.observe(clocks.wall()) == 0.0
    clocks.true += 1.0
    clocks.error = 30.0 + 61.0
    assert steps.observe(clocks.wall()) == pytest.approx(61.0)
    clocks.true += 1.0
    assert steps.observe(clocks.wall()) == 0.0  # the step is reported once


def test_a_held_readings_arrival_moves_with_the_step() -> None:
    # Clock sanity judges "ahead of the gateway clock" by a held reading's arrival: after a
    # step it is measured on the new clock (and becomes the window's arrival if added).
    rejects = RejectCounter()
    store = WindowStore(clock_sanity=ClockSanity(rejects))
    store.ensure("pm10", WindowGeometry(8, P, ("pm10",), GapPolicy(max_interpolated_periods=2)))
    now = T0 + 10.0
    assert store.add(Reading("s", now, {"pm10": 1.0}), now) == {"pm10": AddOutcome.ACCEPTED}
    assert store.add(Reading("s", now + 200, {"pm10": 99.0}), now) == {"pm10": AddOutcome.HELD}
    assert store.clock_stepped(100.0) == 0  # the gateway clock was 100 s behind
    with capture_logs() as logs:
        outcome = store.add(Reading("s", now + 5, {"pm10": 2.0}), now + 105)
    assert outcome == {"pm10": AddOutcome.ACCEPTED}
    assert rejects.count(RejectReason.CLOCK_OUTLIER) == 1
    [logged] = [entry for entry in logs if entry["event"] == "reading_rejected"]
    assert "100 s ahead of the gateway clock" in str(logged["detail"])


@pytest.mark.parametrize("fast", [True, False])
def test_a_reading_without_a_time_of_its_own_is_marked_stamped_at_gateway(fast: bool) -> None:
    decode = payloads_fast.decode_plain_payload if fast else payloads.decode_payload_fully
    now = T0 + 0.25
    for payload, stamped in ((b'{"pm10": 5}', True), (b'{"pm10": 5, "ts": 1700000001}', False)):
        decoded = decode(
            payload, topic_sensor_id="s", received_at=now, source="mqtt", rules=PayloadRules()
        )
        assert decoded is not None
        readings = decoded if isinstance(decoded, tuple) else decoded.readings
        assert [r.stamped_at_gateway for r in readings] == [stamped]
    assert validate_reading("s", now, {"pm10": 1.0}, now=now, source="serial").stamped_at_gateway
