"""A frozen sensor is judged by its run of equal period means, kept beside its window.

The ring (tesla_gateway/windows/ring.py) counts, per sensor, the observed first-channel means
equal to the newest one (tesla_gateway/contract/stuck.py). The count decides ``stuck`` whatever
the window holds, so it holds for a window shorter than the rule, survives a snapshot (file or
cluster partition) and a model swap that resets the window; a new value after a frozen run makes
the sensor young again, so the frozen values feed no window. Real rings, real snapshot files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tesla_gateway.cluster import window_parts
from tesla_gateway.contract.calibrated import Quality
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.monitor.health import HealthConfig, HealthFlag, SensorHealth
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.snapshots import StateStore
from tesla_gateway.windows.state import ReadyWindows
from tesla_gateway.windows.store import WindowStore

P = 60
T0 = 1_700_000_040  # a period boundary
BASE = T0 // P
K = 12  # stuck_periods in these tests


def geometry(n: int) -> WindowGeometry:
    return WindowGeometry(
        window_length=n,
        period_seconds=P,
        channels=("pm10",),
        gap_policy=GapPolicy(max_interpolated_periods=1),
    )


def ring(n: int, *, min_history: int = 1, stuck: int | None = K) -> ModelWindows:
    windows = ModelWindows(geometry(n))
    windows.min_history_periods = min_history
    windows.stuck_periods = stuck
    return windows


def feed(windows: ModelWindows, series: dict[int, float], sensor: str = "s1") -> ReadyWindows:
    """One reading per listed period; every closed period read out at the end (the set-aside
    copies included), as one tick would."""
    for period, value in sorted(series.items()):
        windows.add(Reading(sensor, T0 + period * P + 1, {"pm10": value}), 0.0)
    return windows.ready_windows(closed_through_period=BASE + max(series))


def flags(ready: ReadyWindows) -> dict[int, tuple[Quality, ...]]:
    return dict(zip((ready.periods - BASE).tolist(), ready.quality, strict=True))


def test_a_window_shorter_than_the_rule_still_withholds() -> None:
    """Break 3: N = 8 < stuck_periods = 12; the window alone could never show 12 equal values."""
    out = flags(feed(ring(8), {p: 10.0 + p for p in range(4)} | dict.fromkeys(range(4, 20), 0.0)))
    assert [out[p] for p in range(4, 4 + K - 1)] == [()] * (K - 1)
    assert [out[p] for p in range(4 + K - 1, 20)] == [(Quality.STUCK,)] * (20 - 4 - K + 1)


def test_a_model_swap_that_resets_the_windows_keeps_a_frozen_sensor_frozen() -> None:
    """Break 2 (a swap changing N): the new, empty window is young, the run is not."""
    store = WindowStore()
    store.ensure("pm10", geometry(16))
    store["pm10"].stuck_periods, store["pm10"].min_history_periods = K, 1
    before = feed(store["pm10"], dict.fromkeys(range(K + 2), 0.0))
    assert flags(before)[K + 1] == (Quality.STUCK,)
    assert store.ensure("pm10", geometry(24))  # the swap: new windows
    store["pm10"].stuck_periods, store["pm10"].min_history_periods = K, 1
    after = feed(store["pm10"], {K + 2: 0.0, K + 3: 0.0})
    assert after.history is not None and after.history.tolist() == [1, 2]  # a young window
    assert set(after.quality) == {(Quality.STUCK,)}
    # a sensor that was not frozen before the swap starts with no run
    fresh = feed(store["pm10"], dict.fromkeys(range(K + 4, K + 8), 0.0), sensor="s2")
    assert set(fresh.quality) == {()}


def test_recovery_makes_the_sensor_young_again() -> None:
    """Break 4: after a frozen run a new value starts a young window (edge-padded from it by
    the contract's rule), so the frozen zeros feed no calibration; before, they filled it."""
    n = 16
    live = {p: 10.0 + p for p in range(n)}
    frozen = dict.fromkeys(range(n, n + K + 3), 0.0)
    recovered = {n + K + 3 + k: 20.0 + k for k in range(4)}
    ready = feed(ring(n), live | frozen | recovered)
    start = n + K + 3
    out = flags(ready)
    assert out[start - 1] == (Quality.STUCK,)
    assert all(out[start + k] == () for k in range(4))
    assert ready.history is not None
    rows = ((ready.periods - BASE) >= start).nonzero()[0]
    assert ready.history[rows].tolist() == [1, 2, 3, 4]
    newest = ready.windows[rows[-1]]
    assert newest.tolist() == [20.0] * (n - 3) + [21.0, 22.0, 23.0]  # no zero left in it


def test_recovery_for_a_model_needing_whole_windows_warms_up_again() -> None:
    n = 16
    series = {p: 10.0 + p for p in range(n)} | dict.fromkeys(range(n, n + K), 0.0)
    series |= {n + K: 30.0, n + K + 1: 31.0}
    out = flags(feed(ring(n, min_history=n), series))
    assert out[n + K] == out[n + K + 1] == (Quality.WARMING_UP,)


def test_a_short_run_or_withholding_off_does_not_reset_the_window() -> None:
    n = 16
    series = {p: 10.0 + p for p in range(n)} | dict.fromkeys(range(n, n + K - 1), 0.0)
    series[n + K - 1] = 5.0  # K - 1 equal values: a live sensor's coincidence, not a run
    short = feed(ring(n), series)
    assert short.history is not None and short.history[-1] == n
    frozen = dict.fromkeys(range(n, n + K + 2), 0.0) | {n + K + 2: 5.0}
    off = feed(ring(n, stuck=None), series | frozen)
    assert off.history is not None and off.history[-1] == n
    assert set(off.quality) == {()}


def test_the_run_survives_a_snapshot_file_and_a_partition_snapshot(tmp_path: Path) -> None:
    """Break 2 (a restart): the restored run goes on; N = 8 < K, so the window cannot tell."""
    windows = ring(8)
    feed(windows, dict.fromkeys(range(K - 2), 0.0))
    windows.add(Reading("s1", T0 + (K - 2) * P + 1, {"pm10": 0.0}), 0.0)  # still open
    windows.close_through(BASE + K - 2)  # closed, waiting for a tick
    saver = StateStore(tmp_path)
    assert saver.save("pm10", windows)
    restored = saver.restore("pm10", geometry(8))
    assert restored is not None
    blob = window_parts.encode(window_parts.PartitionSnapshot(3, {"pm10": windows.export_state()}))
    state = window_parts.decode(blob, {"pm10": geometry(8)}, max_bytes=1 << 20).states["pm10"]
    taken = ModelWindows.from_state(state)
    for windows_now in (restored, taken):
        windows_now.stuck_periods, windows_now.min_history_periods = K, 1
        out = flags(feed(windows_now, {K - 1: 0.0, K: 0.0}))
        assert out == {K - 2: (), K - 1: (Quality.STUCK,), K: (Quality.STUCK,)}


def test_a_snapshot_of_the_older_format_loads_with_no_run(tmp_path: Path) -> None:
    """A snapshot written before the runs were kept (no run arrays, waiting periods without
    theirs) loads; every run starts at 0, so a frozen sensor is withheld K periods later."""
    windows = ring(8)
    feed(windows, dict.fromkeys(range(K + 2), 0.0))
    for period in (K + 2, K + 3):  # one set aside (waiting) and one pending
        windows.add(Reading("s1", T0 + period * P + 1, {"pm10": 0.0}), 0.0)
    windows.close_through(BASE + K + 3)
    saver = StateStore(tmp_path)
    assert saver.save("pm10", windows)
    path = saver.path_for("pm10")
    newer = {"run_value", "run_length", "waiting_run"}
    with np.load(path, allow_pickle=False) as data:
        assert newer <= set(data.files)
        arrays = {name: data[name] for name in data.files if name not in newer}
    meta = json.loads(str(arrays.pop("meta")))
    assert meta["waiting_sensor_ids"] == ["s1"]
    np.savez(path, meta=np.array(json.dumps(meta)), **arrays)
    restored = saver.restore("pm10", geometry(8))
    assert restored is not None and restored.pending_count == 2
    restored.stuck_periods = K
    state = restored.export_state()
    assert state.run_length.tolist() == [0] and state.waiting[0].run == 0
    out = flags(feed(restored, dict.fromkeys(range(K + 4, 2 * K + 4), 0.0)))
    assert out[K + 2] == out[K + 3] == ()
    assert out[2 * K + 2] == () and out[2 * K + 3] == (Quality.STUCK,)


def test_eviction_loses_the_run() -> None:
    """Documented: a sensor evicted and readmitted starts anew, its run with it."""
    windows = ring(8)
    feed(windows, dict.fromkeys(range(K), 0.0))
    assert windows.remove("s1")
    out = flags(feed(windows, dict.fromkeys(range(K, K + 3), 0.0)))
    assert set(out.values()) == {()}


def test_health_says_stuck_while_the_value_is_withheld_even_after_its_count_restarted() -> None:
    """Break 7: health's own count is in memory; the restored windows' run is not."""
    health = SensorHealth(HealthConfig(stuck_periods=K))
    health.update(BASE, 0.0, (Quality.STUCK,), None, float(T0))
    report = health.report(None, float(T0))
    assert HealthFlag.STUCK in report.flags and report.stuck_periods == 1
    health.update(BASE + 1, 4.0, (), None, float(T0 + P))
    assert HealthFlag.STUCK not in health.report(None, float(T0 + P)).flags
