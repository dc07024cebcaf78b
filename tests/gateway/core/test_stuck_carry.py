"""A frozen sensor's run against the ways it could be lost or miscounted: a model swap there and
back, a snapshot before the sensor returns, a mean that differs in the last bit, a snapshot run
no gateway wrote, and a sibling model that admitted the sensor late. Real rings, real snapshot
files (the attacker's cases in tests form)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tesla_gateway.contract.calibrated import CalibratedReading, Quality
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.stuck import RUN_CAP, next_run, run_key, run_lengths, stuck_positions
from tesla_gateway.models.choice import choose_per_sensor
from tesla_gateway.monitor.health import HealthConfig, HealthFlag, SensorHealth
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.snapshots import StateStore
from tesla_gateway.windows.state import WindowStoreError
from tesla_gateway.windows.store import WindowStore
from tests.gateway.core.test_stuck_runs import BASE, T0, K, P, feed, flags, geometry, ring

STUCK = (Quality.STUCK,)


def frozen_store(n: int = 16) -> WindowStore:
    """A store whose sensor s1 has read 0.0 for K + 2 periods (stuck from period K - 1)."""
    store = WindowStore()
    store.ensure("pm10", geometry(n))
    set_rule(store["pm10"])
    assert flags(feed(store["pm10"], dict.fromkeys(range(K + 2), 0.0)))[K + 1] == STUCK
    return store


def set_rule(windows: ModelWindows) -> None:
    windows.stuck_periods, windows.min_history_periods = K, 1


def test_a_swap_there_and_back_before_the_sensor_returns_keeps_its_run() -> None:
    store = frozen_store()
    for n in (24, 16):
        store.ensure("pm10", geometry(n))
        set_rule(store["pm10"])
    after = flags(feed(store["pm10"], {K + 2: 0.0, K + 3: 0.0}))
    assert after == {K + 2: STUCK, K + 3: STUCK}


def test_a_snapshot_between_a_swap_and_the_sensors_return_keeps_its_run(tmp_path: Path) -> None:
    store = frozen_store()
    store.ensure("pm10", geometry(24))
    set_rule(store["pm10"])
    saver = StateStore(tmp_path)
    assert saver.save("pm10", store["pm10"])
    for restored in (
        ModelWindows.from_state(store["pm10"].export_state()),
        saver.restore("pm10", geometry(24)),
    ):
        assert restored is not None
        set_rule(restored)
        assert flags(feed(restored, {K + 2: 0.0, K + 3: 0.0})) == {K + 2: STUCK, K + 3: STUCK}


@pytest.mark.parametrize("value", [12.3, 0.1])
def test_a_frozen_decimal_averaged_over_2_or_3_readings_is_one_run(value: float) -> None:
    """sum/count of 2 and of 3 readings of 12.3 differ in the last bit; to 4 decimals they
    are one value, so the ring, health and training agree that the sensor is frozen."""
    means = [sum([value] * (2 if p % 2 else 3)) / (2 if p % 2 else 3) for p in range(40)]
    assert len(set(means)) == 2  # the case: not binary-exact
    windows = ring(16)
    for p in range(40):
        for k in range(2 if p % 2 else 3):
            windows.add(Reading("s1", T0 + p * P + 1 + k * 15, {"pm10": value}), 0.0)
    out = flags(windows.ready_windows(closed_through_period=BASE + 39))
    assert [p for p, q in out.items() if q == STUCK] == list(range(K - 1, 40))
    assert stuck_positions(means, K).all() and run_lengths(means).tolist() == list(range(1, 41))
    health = SensorHealth(HealthConfig(stuck_periods=K))
    for p, mean in enumerate(means):
        health.update(BASE + p, mean, (), None, float(T0 + p * P))
    report = health.report(None, float(T0 + 40 * P))
    assert report.stuck_periods == 40 and HealthFlag.STUCK in report.flags


def test_run_key_rounds_a_scalar_and_an_array_alike() -> None:
    values = np.array([12.3, 12.300000000000002, 0.10000000000000002, 1.23456, np.nan])
    assert [run_key(float(v)) for v in values[:4]] == run_key(values)[:4].tolist()
    assert np.isnan(run_key(values)[4]) and next_run(12.3, 5, 12.300000000000002) == 6
    assert next_run(1.0, RUN_CAP, 1.0) == RUN_CAP and next_run(12.3, 5, 12.3001) == 1


def test_run_key_is_numpys_rounding_for_a_scalar_and_an_array() -> None:
    """The ring's scalar path is plain Python (NumPy cost 10 µs per closed period): it must give
    what the array path and np.round give, halves included."""
    rng = np.random.default_rng(11)
    values = np.concatenate(
        [
            rng.normal(0.0, 100.0, 20_000),
            np.round(rng.normal(0.0, 100.0, 20_000), 5),  # many exact 5th-decimal halves
            rng.uniform(-1e6, 1e6, 5_000),
            [0.0, -0.0, 0.00005, 0.00015, 2.5e-5, 1.23455, 1e-320],
        ]
    )
    scalar = np.array([run_key(float(v)) for v in values])
    np.testing.assert_array_equal(scalar, run_key(values))
    np.testing.assert_array_equal(scalar, np.round(values, 4))


def saved_then_mutated(tmp_path: Path, name: str, value: np.ndarray) -> StateStore:
    windows = ring(8)
    feed(windows, dict.fromkeys(range(5), 0.0))
    saver = StateStore(tmp_path)
    assert saver.save("pm10", windows)
    path = saver.path_for("pm10")
    with np.load(path, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files}
    arrays[name] = value
    np.savez(path, **arrays)
    return saver


@pytest.mark.parametrize("run", [-1, -(10**6)])
def test_a_negative_snapshot_run_is_a_corrupt_snapshot(tmp_path: Path, run: int) -> None:
    saver = saved_then_mutated(tmp_path, "run_length", np.array([run]))
    assert saver.restore("pm10", geometry(8)) is None
    assert list(tmp_path.rglob("*corrupt*"))


def test_a_huge_snapshot_run_is_clipped_and_the_next_close_works(tmp_path: Path) -> None:
    saver = saved_then_mutated(tmp_path, "run_length", np.array([2**63 - 1]))
    restored = saver.restore("pm10", geometry(8))
    assert restored is not None
    set_rule(restored)
    assert flags(feed(restored, {5: 0.0, 6: 0.0})) == {5: STUCK, 6: STUCK}
    assert restored.export_state().run_length.tolist() == [RUN_CAP]


def reading(
    model: str, quality: tuple[Quality, ...], calibrated: float | None
) -> CalibratedReading:
    return CalibratedReading(
        sensor_id="s1",
        feature="pm10",
        period_start=float(T0),
        period_seconds=P,
        raw=0.0,
        calibrated=calibrated,
        unit="ug/m3",
        model_name=model,
        model_version=1,
        quality=quality,
    )


def test_a_stuck_verdict_of_any_model_wins_over_a_calibrated_one() -> None:
    """The covariate model admitted the sensor late (its run is shorter): the PM-only model's
    stuck verdict is published, in either order."""
    pm_only = ((1, -5.0), [reading("pm", STUCK, None)])
    covariate = ((3, -4.0), [reading("rh", (), 10.4)])
    for results in ([pm_only, covariate], [covariate, pm_only]):
        (chosen,) = choose_per_sensor(results)
        assert chosen.quality == STUCK and chosen.calibrated is None


def test_a_negative_waiting_or_carried_run_is_refused() -> None:
    windows = ring(8)
    for p in range(3):  # a backlog: periods 0 and 1 wait beside pending period 2
        windows.add(Reading("s1", T0 + p * P + 1, {"pm10": 0.0}), 0.0)
    windows.close_through(BASE + 2)
    state = windows.export_state()
    assert state.waiting
    state.waiting[0] = replace(state.waiting[0], run=-1)
    with pytest.raises(WindowStoreError, match="negative"):
        ModelWindows.from_state(state)
    state = windows.export_state()
    state.carried["s2"] = (0.0, -5)
    with pytest.raises(WindowStoreError, match="negative"):
        ModelWindows.from_state(state)


@pytest.mark.parametrize("run", [2**63, 10**30])
def test_a_carried_run_beyond_any_integer_type_is_clipped_at_load(tmp_path: Path, run: int) -> None:
    """JSON integers have no bound: a carried run of 2**63 raised OverflowError out of the
    restore (the daemon failed at every start) instead of being clipped like the others."""
    windows = ring(16)
    windows.add(Reading("s", T0 + 5, {"pm10": 1.0}, source="mqtt"), T0 + 5)
    state = windows.export_state()
    state.carried = {"t": (0.0, run)}
    store = StateStore(tmp_path)
    store.write("pm10", state)
    restored = store.restore("pm10", geometry(16))
    assert restored is not None
    assert restored.export_state().carried == {"t": (0.0, RUN_CAP)}


def test_huge_distinct_values_are_no_run() -> None:
    """Rounding scales by 10**4: above ~1e304 it overflowed to inf, and four distinct values
    became one frozen run."""
    huge = [1e305, 2e305, 3e305, 4e305]
    assert not stuck_positions(huge, 2).any()
    assert run_key(1e305) == 1e305 and next_run(1e305, 5, 2e305) == 1
    assert stuck_positions([1e305] * 3, 2).all()
