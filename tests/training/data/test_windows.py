"""WindowSet against a naive per-window implementation, and proof it does not copy windows."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tesla_gateway.contract.series import GapPolicy, interpolate_short_gaps, window_is_valid
from training.data import GriddedSensor, WindowSet
from training.errors import DataError

NAN = float("nan")


def _sensor(
    sensor_id: str,
    raw: list[float],
    reference: list[float],
    rh: list[float] | None = None,
    first_period: int = 1000,
) -> GriddedSensor:
    raw_array = np.asarray(raw, dtype=np.float64)
    covariates = {} if rh is None else {"rh": np.asarray(rh, dtype=np.float64)}
    return GriddedSensor(
        sensor_id=sensor_id,
        first_period=first_period,
        period_seconds=60,
        raw=raw_array,
        reference=np.asarray(reference, dtype=np.float64),
        observed=~np.isnan(raw_array),
        covariates=covariates,
    )


def _naive(
    sensors: list[GriddedSensor],
    N: int,
    policy: GapPolicy,
    channels: tuple[str, ...],
    require_target: bool,
) -> list[tuple[str, int, np.ndarray, float, float]]:
    """Every window checked one by one with the gateway's single-window rule."""
    out = []
    for sensor in sensors:
        filled = {name: interpolate_short_gaps(sensor.channel(name), policy) for name in channels}
        for end in range(N - 1, len(sensor)):
            windows = [filled[name][end - N + 1 : end + 1] for name in channels]
            newest = [not np.isnan(sensor.channel(name)[end]) for name in channels]
            if not all(window_is_valid(w, o) for w, o in zip(windows, newest, strict=True)):
                continue
            if require_target and np.isnan(sensor.reference[end]):
                continue
            x = np.stack(windows, axis=-1) if len(channels) > 1 else windows[0]
            timestamp = (sensor.first_period + end) * sensor.period_seconds
            out.append((sensor.sensor_id, timestamp, x, sensor.reference[end], sensor.raw[end]))
    return out


_values = st.one_of(st.just(NAN), st.floats(min_value=0, max_value=500, width=32))


@st.composite
def _sensors(draw: st.DrawFn) -> list[GriddedSensor]:
    count = draw(st.integers(min_value=1, max_value=3))
    sensors = []
    for index in range(count):
        length = draw(st.integers(min_value=0, max_value=60))
        column = st.lists(_values, min_size=length, max_size=length)
        sensors.append(
            _sensor(
                f"s{index}",
                draw(column),
                draw(column),
                draw(column),
                first_period=draw(st.integers(0, 10**6)),
            )
        )
    return sensors


@settings(max_examples=150, deadline=None)
@given(
    sensors=_sensors(),
    N=st.integers(min_value=1, max_value=12),
    max_gap=st.integers(min_value=0, max_value=6),
    channels=st.sampled_from([("raw",), ("raw", "rh"), ("rh", "raw")]),
    require_target=st.booleans(),
)
def test_matches_naive_windows(
    sensors: list[GriddedSensor],
    N: int,
    max_gap: int,
    channels: tuple[str, ...],
    require_target: bool,
) -> None:
    policy = GapPolicy(max_interpolated_periods=max_gap)
    windows = WindowSet.build(sensors, N, policy, channels=channels, require_target=require_target)
    expected = _naive(sensors, N, policy, channels, require_target)
    assert len(windows) == len(expected)
    x, y = windows.gather(np.arange(len(windows)))
    assert x.dtype == np.float32 and y.dtype == np.float32
    assert x.shape == (
        (len(expected), N) if len(channels) == 1 else (len(expected), N, len(channels))
    )
    if expected:
        np.testing.assert_array_equal(x, np.stack([e[2] for e in expected]).astype(np.float32))
    np.testing.assert_array_equal(y, np.asarray([e[3] for e in expected], dtype=np.float32))
    np.testing.assert_array_equal(windows.targets(), y)
    np.testing.assert_array_equal(
        windows.current_raw(), np.asarray([e[4] for e in expected], dtype=np.float32)
    )
    meta = windows.meta()
    assert meta["sensor_id"].tolist() == [e[0] for e in expected]
    assert meta["period_start_s"].tolist() == [e[1] for e in expected]
    assert [int(t.timestamp()) for t in meta["timestamp"]] == [e[1] for e in expected]
    # A random gather returns the same rows as the full one.
    if expected:
        picks = np.asarray([len(expected) - 1, 0, len(expected) // 2, 0])
        x_some, y_some = windows.gather(picks)
        np.testing.assert_array_equal(x_some, x[picks])
        np.testing.assert_array_equal(y_some, y[picks])


def test_a_gap_longer_than_the_policy_blocks_windows_until_it_scrolls_out() -> None:
    raw = [1.0, 2.0, NAN, NAN, NAN, 6.0, 7.0, 8.0, 9.0]
    sensor = _sensor("a", raw, [10.0] * len(raw))
    filled = WindowSet.build([sensor], 3, GapPolicy(max_interpolated_periods=3))
    # The 3-period gap is filled; interpolated periods are never a window's newest value.
    assert filled.meta()["period_start_s"].tolist() == [(1000 + k) * 60 for k in (5, 6, 7, 8)]
    x, y = filled.gather([0, 1])
    np.testing.assert_array_equal(x, [[4.0, 5.0, 6.0], [5.0, 6.0, 7.0]])
    np.testing.assert_array_equal(y, [10.0, 10.0])
    strict = WindowSet.build([sensor], 3, GapPolicy(max_interpolated_periods=2))
    assert strict.meta()["period_start_s"].tolist() == [(1000 + k) * 60 for k in (7, 8)]


def test_iter_batches_cover_every_window_once_reproducibly() -> None:
    rng = np.random.default_rng(1)
    raw = rng.uniform(0, 100, 500)
    sensors = [_sensor("a", list(raw), list(raw + 1)), _sensor("b", list(raw * 2), list(raw))]
    windows = WindowSet.build(sensors, 20, GapPolicy(max_interpolated_periods=0))
    all_y = windows.targets()
    batches = list(windows.iter_batches(64, shuffle=True, seed=7))
    assert [len(b[1]) for b in batches[:-1]] == [64] * (len(batches) - 1)
    seen = np.concatenate([b[1] for b in batches])
    np.testing.assert_array_equal(np.sort(seen), np.sort(all_y))
    again = np.concatenate([b[1] for b in windows.iter_batches(64, shuffle=True, seed=7)])
    other = np.concatenate([b[1] for b in windows.iter_batches(64, shuffle=True, seed=8)])
    np.testing.assert_array_equal(seen, again)
    assert not np.array_equal(seen, other)
    ordered = np.concatenate([b[1] for b in windows.iter_batches(100, shuffle=False, seed=0)])
    np.testing.assert_array_equal(ordered, all_y)


def test_memory_scales_with_the_series_not_the_windows() -> None:
    T, N = 100_000, 360
    rng = np.random.default_rng(0)
    raw = rng.uniform(0, 100, T)
    raw[rng.integers(0, T, 500)] = np.nan
    sensor = GriddedSensor(
        "long", 0, 60, raw, raw * 0.6, ~np.isnan(raw), {"rh": rng.uniform(0, 100, T)}
    )
    materialised = T * N * 4 * 2  # float32 windows of two channels, as a naive loader keeps them
    tracemalloc.start()
    try:
        windows = WindowSet.build(
            [sensor], N, GapPolicy(max_interpolated_periods=10), channels=("raw", "rh")
        )
        _, build_peak = tracemalloc.get_traced_memory()
        picks = np.arange(0, len(windows), len(windows) // 64)[:64]
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        x, _ = windows.gather(picks)
        _, gather_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(windows) > 0.9 * (T - N)
    assert x.shape == (64, N, 2)
    assert windows.nbytes < 60 * T  # two float64 series plus ~20 bytes of index per window
    assert build_peak < materialised / 20
    assert gather_peak - before < 4 * x.nbytes  # only the gathered windows are copied


def test_build_rejects_bad_requests() -> None:
    sensor = _sensor("a", [1.0, 2.0], [1.0, 2.0])
    policy = GapPolicy(max_interpolated_periods=1)
    with pytest.raises(DataError, match="target"):
        WindowSet.build([sensor], 1, policy, channels=("raw", "reference"))
    with pytest.raises(DataError, match="no channel 'rh'"):
        WindowSet.build([sensor], 1, policy, channels=("raw", "rh"))
    with pytest.raises(DataError, match="once"):
        WindowSet.build([sensor, sensor], 1, policy)
    with pytest.raises(DataError, match="window_length"):
        WindowSet.build([sensor], 0, policy)
    windows = WindowSet.build([sensor], 2, policy)
    assert len(windows) == 1
    with pytest.raises(IndexError):
        windows.gather([1])
    empty = WindowSet.build([], 5, policy)
    assert len(empty) == 0
    assert empty.gather([])[0].shape == (0, 5)
