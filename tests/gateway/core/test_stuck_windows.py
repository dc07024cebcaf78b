"""A frozen sensor's windows are flagged ``stuck`` by the ring and published without a value.

The ring (tesla_gateway/windows/ring.py) on its own, then through the real ticker and a real
LiteRT model: the newest ``stuck_periods`` first-channel values all equal, over real history
only, on an otherwise valid window (tesla_gateway/contract/stuck.py).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tesla_gateway.contract.calibrated import CalibratedReading, Quality
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.contract.stuck import STUCK_PERIODS
from tesla_gateway.daemon.ticker import Ticker
from tesla_gateway.models.watch import ModelSet
from tesla_gateway.monitor.health import HealthConfig
from tesla_gateway.windows.ring import ModelWindows
from tests.support.models import ModelFactory

P = 60
T0 = 1_700_000_040  # a period boundary
BASE = T0 // P
N = 8
K = 4  # stuck_periods in these tests (the default, 30, exceeds N)


def ring(
    *,
    stuck: int | None = K,
    min_history: int = 1,
    max_gap: int = 1,
    channels: tuple[str, ...] = ("pm10",),
) -> ModelWindows:
    geometry = WindowGeometry(
        window_length=N,
        period_seconds=P,
        channels=channels,
        gap_policy=GapPolicy(max_interpolated_periods=max_gap),
    )
    windows = ModelWindows(geometry)
    windows.min_history_periods = min_history
    windows.stuck_periods = stuck
    return windows


def flags_by_period(
    windows: ModelWindows, series: dict[int, float], sensor: str = "s1", **more: dict[int, float]
) -> dict[int, tuple[Quality, ...]]:
    """Feed one reading per listed period (``more``: other channels) and read each period out
    as soon as it closes; the flags per period."""
    out: dict[int, tuple[Quality, ...]] = {}
    for period, value in sorted(series.items()):
        values = {"pm10": value, **{name: s[period] for name, s in more.items() if period in s}}
        windows.add(Reading(sensor, T0 + period * P + 1, values), 0.0)
        ready = windows.ready_windows(closed_through_period=BASE + period)
        for index, closed in enumerate(ready.periods.tolist()):
            out[closed - BASE] = ready.quality[index]
    return out


def test_stuck_after_exactly_stuck_periods_identical_periods_and_cleared_at_once() -> None:
    varied = {p: 10.0 + p for p in range(N)}  # a whole window of real history first
    same = dict.fromkeys(range(N, N + K + 2), 25.0)
    flags = flags_by_period(ring(), {**varied, **same, N + K + 2: 26.0})
    assert all(flags[p] == () for p in range(N + K - 1))  # K - 1 identical: still a sensor
    assert flags[N + K - 1] == (Quality.STUCK,)  # the K-th identical period
    assert flags[N + K] == flags[N + K + 1] == (Quality.STUCK,)
    assert flags[N + K + 2] == ()  # a new value clears it at once


def test_a_young_sensor_whose_padded_window_is_constant_is_not_stuck() -> None:
    # Its window is edge-padded with its first value (constant by construction) until it has
    # K periods of its own; then its own K identical values are stuck.
    flags = flags_by_period(ring(min_history=1), dict.fromkeys(range(K + 1), 7.0))
    assert [flags[p] for p in range(K - 1)] == [()] * (K - 1)
    assert flags[K - 1] == (Quality.STUCK,)
    assert flags[K] == (Quality.STUCK,)


def test_a_missing_period_neither_breaks_nor_lengthens_a_run() -> None:
    """Observed periods count (the contract, as training counts its rows): a period without a
    reading, interpolated in the window, is not one of the run's."""
    series = {p: 10.0 + p for p in range(N)}
    series |= {N: 25.0, N + 1: 25.0, N + 3: 25.0, N + 4: 25.0}  # N + 2 missing
    flags = flags_by_period(ring(max_gap=1), series)
    assert N + 2 not in flags  # no reading: no period of its own to publish
    assert flags[N + 3] == ()  # three observed
    assert flags[N + 4] == (Quality.STUCK,)  # N, N + 1, N + 3, N + 4


def test_withholding_off_leaves_a_constant_window_valid() -> None:
    flags = flags_by_period(ring(stuck=None), dict.fromkeys(range(N + K), 0.0))
    assert set(flags.values()) == {()}


def test_other_flags_take_precedence() -> None:
    # warming up: a model that needs N periods, a sensor constant for K + 1 < N of them
    warming = flags_by_period(ring(min_history=N), dict.fromkeys(range(K + 1), 0.0))
    assert warming[K] == (Quality.WARMING_UP,)
    # a gap longer than the policy fills, older than the newest K identical values
    series = {p: 0.0 for p in range(N + 4) if p not in (2, 3)}
    gapped = flags_by_period(ring(max_gap=1), series)
    assert gapped[N - 1] == (Quality.GAP,)
    assert gapped[N + 1] == (Quality.GAP,)  # periods 2..9
    assert gapped[N + 3] == (Quality.STUCK,)  # periods 4..11: the gap left the window
    # a missing channel
    rh = {p: 50.0 + p for p in range(N + K)}
    del rh[N + K - 1]
    channels = flags_by_period(
        ring(channels=("pm10", "rh")), dict.fromkeys(range(N + K), 3.0), rh=rh
    )
    assert channels[N + K - 2] == (Quality.STUCK,)
    assert channels[N + K - 1] == (Quality.MISSING_CHANNEL,)


def test_only_the_first_channel_counts() -> None:
    pm = {p: 10.0 + p for p in range(N + K)}
    constant_rh = dict.fromkeys(range(N + K), 50.0)
    flags = flags_by_period(ring(channels=("pm10", "rh")), pm, rh=constant_rh)
    assert set(flags.values()) == {()}
    varying_rh = {p: 40.0 + p for p in range(N + K)}
    pm_frozen = dict.fromkeys(range(N + K), 12.0)
    frozen = flags_by_period(ring(channels=("pm10", "rh")), pm_frozen, rh=varying_rh)
    assert frozen[N + K - 1] == (Quality.STUCK,)


def test_periods_set_aside_before_a_tick_are_flagged_too() -> None:
    """Periods that closed while an earlier one waited for the tick leave as set-aside copies
    (the overflow path), and are flagged by the same rule."""
    windows = ring()
    for period in range(K + 2):
        windows.add(Reading("s1", T0 + period * P + 1, {"pm10": 4.0}), 0.0)
    ready = windows.ready_windows(closed_through_period=BASE + K + 1)
    flags = dict(zip((ready.periods - BASE).tolist(), ready.quality, strict=True))
    assert sorted(flags) == list(range(K + 2))
    assert [flags[p] for p in range(K + 2)] == [()] * (K - 1) + [(Quality.STUCK,)] * 3


def test_many_sensors_at_once() -> None:
    """The rule is vectorised over the batch: each row judged on its own values."""
    windows = ring()
    sensors = 50
    frozen = set(range(0, sensors, 3))
    for period in range(N + 1):
        for index in range(sensors):
            value = 5.0 if index in frozen else float(index + period)
            windows.add(Reading(f"s{index}", T0 + period * P + 1, {"pm10": value}), 0.0)
    ready = windows.ready_windows(closed_through_period=BASE + N)
    newest = ready.periods == BASE + N
    stuck = {
        int(sensor[1:])
        for sensor, flags, last in zip(ready.sensor_ids, ready.quality, newest, strict=True)
        if last and flags == (Quality.STUCK,)
    }
    assert stuck == frozen
    assert np.count_nonzero(newest) == sensors


# -- through the ticker ------------------------------------------------------------------------


def tick(ticker: Ticker, series: dict[str, list[float]], first: int = 0) -> list[CalibratedReading]:
    for offset in range(len(next(iter(series.values())))):
        for sensor, values in series.items():
            ticker.ingest(Reading(sensor, T0 + (first + offset) * P + 1, {"pm10": values[offset]}))
    return asyncio.run(ticker.tick())


def newest(readings: list[CalibratedReading], period: int) -> dict[str, CalibratedReading]:
    return {r.sensor_id: r for r in readings if r.period_start == T0 + period * P}


@pytest.fixture
def models(model_factory: ModelFactory) -> ModelSet:
    loaded = ModelSet({"pm10": model_factory.get(window_length=N).path})
    loaded.refresh()
    return loaded


def test_the_ticker_withholds_a_stuck_value_counts_it_and_calibrates_the_neighbour(
    models: ModelSet,
) -> None:
    ticker = Ticker(models, grace_s=5.0, clock=lambda: float(T0), stuck_periods=K)
    out = tick(ticker, {"dead": [0.0] * (N + 2), "live": [20.0 + p % 3 for p in range(N + 2)]})
    last = newest(out, N)
    dead, live = last["dead"], last["live"]
    assert dead.quality == (Quality.STUCK,) and dead.calibrated is None and dead.interval is None
    assert dead.raw == 0.0 and dead.model_name == "test-tesla"
    assert live.quality == (Quality.OK,) and live.calibrated is not None
    # Every period the dead sensor could be calibrated in (from the model's calibrates_from)
    # is withheld, and counted; the live one is calibrated in each of them.
    calibrates_from = models.primary("pm10").manifest.calibrates_from  # type: ignore[union-attr]
    whole = range(max(calibrates_from, K) - 1, N + 1)
    by_sensor = {(r.sensor_id, round((r.period_start - T0) / P)): r for r in out}
    assert all(by_sensor["dead", p].quality == (Quality.STUCK,) for p in whole)
    assert all(by_sensor["live", p].calibrated is not None for p in whole)
    assert ticker.counters.flagged["stuck"] == len(whole)
    assert ticker.counters.calibrated == sum(r.calibrated is not None for r in out) == len(whole)


def test_withhold_off_calibrates_a_constant_window_as_before(models: ModelSet) -> None:
    ticker = Ticker(models, grace_s=5.0, clock=lambda: float(T0), stuck_periods=None)
    out = tick(ticker, {"dead": [0.0] * (N + 2)})
    assert newest(out, N)["dead"].quality == (Quality.OK,)
    assert newest(out, N)["dead"].calibrated is not None
    assert "stuck" not in ticker.counters.flagged


def test_the_config_default_is_the_contract_rule() -> None:
    config = HealthConfig()
    assert config.stuck_periods == STUCK_PERIODS and config.withhold_stuck is True


def test_a_new_owner_flags_restored_windows_as_the_old_one_did(models: ModelSet) -> None:
    """A snapshot's windows installed in another ticker (a restart, a cluster takeover:
    Ticker.install) take that ticker's rule and flag the same periods."""
    values = [3.0] * (N + 3)
    first = Ticker(models, grace_s=5.0, clock=lambda: float(T0), stuck_periods=K)
    tick(first, {"dead": values[:N]})
    ((slot, state),) = first.snapshot()
    second = Ticker(models, grace_s=5.0, clock=lambda: float(T0), stuck_periods=K)
    second.install(slot, ModelWindows.from_state(state))
    taken_over = tick(second, {"dead": values[N:]}, first=N)
    stayed = tick(first, {"dead": values[N:]}, first=N)
    assert [(r.period_start, r.quality, r.calibrated) for r in taken_over] == [
        (r.period_start, r.quality, r.calibrated) for r in stayed
    ]
    assert {r.quality for r in taken_over} == {(Quality.STUCK,)}
