"""SIGTERM at every point of a tick: no period taken from the windows is lost (issue 26 item 13).

A tick takes its closed periods out of the windows, calibrates them in a worker thread and hands
them to the publisher, whose outbox is durable. A SIGTERM used to cancel a tick between the take
and the hand-off: the periods were in neither the windows nor the outbox, and the shutdown's
checkpoint then told the ingest log that their readings were covered, so not even a restart
brought them back (one run of 15,000 periods lost 2,643).

The real service runs in this process (a real mosquitto, the committed PM10 model, real SIGTERMs
through the loop's signal handlers) and is restarted after each SIGTERM. The test wraps the
real ticker's take (``collect``) and calibration and the real publisher's ``submit`` to send
SIGTERM once per run, at one point of the first tick that takes periods: before or after the
take, inside the calibration (where the worker thread then waits a moment, widening the window
between take and hand-off), after it, or around the hand-off. Every (sensor, period) whose
readings the broker acknowledged must reach the collector at least once; duplicates are allowed
(at least once) and counted.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from devkit.broker import Mosquitto
from tesla_gateway.contract.calibrated import CalibratedReading
from tesla_gateway.daemon.config import load_config
from tesla_gateway.daemon.service import GatewayService
from tesla_gateway.daemon.ticker import TickBatch
from tesla_gateway.publish.publisher import Publisher
from tests.reliability.harness import (
    PERIOD_S,
    WAIT_S,
    Collector,
    Sensors,
    copy_default_model,
    delivery_figures,
    grid_base,
    iso,
    report,
    write_config,
)

pytestmark = pytest.mark.reliability

POINTS = (
    "before-take",
    "after-take",
    "in-calibration",
    "after-calibration",
    "before-hand-off",
    "after-hand-off",
)
WIDEN_S = 0.3  # the worker thread's wait after the SIGTERM: shutdown starts meanwhile
GATEWAY = "gw-t"
SENSORS = 4
PERIODS_PER_RUN = 2


class TickFailedError(RuntimeError):
    """What a trap raises to make a tick fail midway (a bug in a later step, say)."""


class TickTrap:
    """At ``point`` of the first tick that takes periods: SIGTERM to this process, or (``fail``)
    an error raised there."""

    def __init__(self, point: str | None, *, fail: bool = False) -> None:
        self.point = point
        self.fail = fail
        self.fired = threading.Event()

    def at(self, point: str) -> None:
        if point != self.point or self.fired.is_set():
            return
        self.fired.set()
        if self.fail:
            raise TickFailedError(f"test: the tick fails at {point}")
        os.kill(os.getpid(), signal.SIGTERM)
        if threading.current_thread() is not threading.main_thread():
            time.sleep(WIDEN_S)  # in the calibration's worker thread: the loop shuts down

    def install(self, service: GatewayService) -> None:
        """Wrap the real service's ticker (this instance only) around its take and its
        calibration; the hand-off is wrapped on the class (:meth:`Scenario.__init__`)."""
        ticker = service.ticker
        collect, calibrate = ticker.collect, ticker.calibrate

        def trapped_collect() -> list[TickBatch]:
            if ticker.has_closed_periods:
                self.at("before-take")
            batches = collect()
            if batches:
                self.at("after-take")
            return batches

        def trapped_calibrate(batches: list[TickBatch]) -> list[CalibratedReading]:
            self.at("in-calibration")
            readings = calibrate(batches)
            self.at("after-calibration")
            return readings

        ticker.collect = trapped_collect  # type: ignore[method-assign]
        ticker.calibrate = trapped_calibrate  # type: ignore[method-assign]


def ready(service: GatewayService) -> bool:
    connected = service.sources.stats()["mqtt_sources_connected"]
    return (
        service.reporter.phase == "running"
        and isinstance(connected, dict)
        and all(connected.values())
    )


class Scenario:
    """Sensors, a collector and the service's config; :meth:`run` is one run of the service."""

    def __init__(
        self, tmp_path: Path, broker: Mosquitto, monkeypatch: pytest.MonkeyPatch, periods: int
    ) -> None:
        model = copy_default_model(tmp_path / "model")
        self.config = write_config(
            tmp_path / "gw.toml", gateway_id=GATEWAY, model_dir=model, broker_port=broker.port
        )
        self.collector = Collector(broker.port)
        self.sensors = Sensors(broker.port)
        self.names = [f"node-{i:02d}" for i in range(SENSORS)]
        self.base = grid_base(periods + 10)
        self.expected: set[tuple[str, str, str]] = set()
        self._periods = itertools.count()
        self.trap = TickTrap(None)
        submit = Publisher.submit

        def trapped_submit(publisher: Publisher, readings: Sequence[CalibratedReading]) -> None:
            self.trap.at("before-hand-off")
            submit(publisher, readings)
            self.trap.at("after-hand-off")

        monkeypatch.setattr(Publisher, "submit", trapped_submit)

    def send(self) -> None:
        """The next PERIODS_PER_RUN periods of every sensor, each reading acknowledged."""
        for _ in range(PERIODS_PER_RUN):
            period = next(self._periods)
            for name in self.names:
                self.sensors.send(name, self.base + period * PERIOD_S + 30, 10.0 + period)
                self.expected.add((GATEWAY, name, iso(self.base + period * PERIOD_S)))

    def all_out(self) -> bool:
        return self.expected <= set(self.collector.snapshot())

    def run(self, trap: TickTrap) -> None:
        self.trap = trap
        asyncio.run(self._run(trap))

    async def _run(self, trap: TickTrap) -> None:
        """Start, send readings in a thread, and end at the trap (SIGTERM: exit code 0); a run
        without a trap point stops itself once every period is out (or after ``WAIT_S``)."""
        service = GatewayService(load_config(self.config))
        trap.install(service)
        run = asyncio.create_task(service.run())
        deadline = time.monotonic() + WAIT_S
        while not ready(service):
            assert not run.done(), "the service stopped before it was ready"
            assert time.monotonic() < deadline, "the service did not become ready"
            await asyncio.sleep(0.02)
        sending = asyncio.create_task(asyncio.to_thread(self.send))
        if trap.point is None:
            await sending
            while not self.all_out() and time.monotonic() < deadline + WAIT_S:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # (the collector's thread sets no asyncio event)
            service.request_stop("test")
        try:
            assert await asyncio.wait_for(run, WAIT_S) == 0
        except TimeoutError:
            service.request_stop("test: the trap never fired")
            await run
            raise
        finally:
            await sending

    def lost(self, name: str, **figures: int) -> list[tuple[str, str, str]]:
        """Close the clients, report the figures and return the periods never delivered."""
        self.sensors.close()
        time.sleep(0.5)  # stragglers
        received = self.collector.snapshot()
        self.collector.close()
        counts = delivery_figures(self.expected, received)
        report(name, counts | figures)
        assert counts["unexpected"] == 0
        return sorted(key for key in self.expected if received[key] == 0)


def test_sigterm_at_every_point_of_a_tick_loses_no_period(
    tmp_path: Path, mosquitto: Mosquitto, long_form: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = [point for _ in range(4 if long_form else 2) for point in POINTS]
    scenario = Scenario(tmp_path, mosquitto, monkeypatch, PERIODS_PER_RUN * (len(runs) + 1))
    fired = 0
    for point in runs:
        trap = TickTrap(point)
        scenario.run(trap)
        fired += trap.fired.is_set()
    scenario.run(TickTrap(None))  # a last clean run: its last periods close by the grace fallback
    lost = scenario.lost("sigterm_mid_tick", sigterms=fired, runs=len(runs) + 1)
    assert fired == len(runs), "a trap did not fire: that run had no tick taking periods"
    assert not lost, f"{len(lost)} of {len(scenario.expected)} periods lost: {lost[:20]}"


def test_a_tick_failing_between_take_and_hand_off_saves_no_checkpoint_over_its_periods(
    tmp_path: Path, mosquitto: Mosquitto, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tick's error stops the daemon; its periods are out of the windows and not in the
    # outbox. The shutdown must not save windows nor a checkpoint that claims their readings:
    # the restart replays them from the ingest log and publishes the periods.
    scenario = Scenario(tmp_path, mosquitto, monkeypatch, PERIODS_PER_RUN * 2)
    trap = TickTrap("after-calibration", fail=True)
    with capture_logs() as logs, pytest.raises(ExceptionGroup) as failure:
        scenario.run(trap)
    assert failure.group_contains(TickFailedError)
    scenario.run(TickTrap(None))
    lost = scenario.lost("tick_failed_mid_hand_off")
    assert not lost, f"{len(lost)} of {len(scenario.expected)} periods lost: {lost[:20]}"
    assert any(entry["event"] == "windows_not_saved" for entry in logs)
