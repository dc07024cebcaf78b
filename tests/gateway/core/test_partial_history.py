"""A young sensor (fewer than N periods since its first) is calibrated from its first closed
period when the model's manifest says it calibrates from there: its window is edge-padded by the
contract's rule, the message says how much history it had and the interval is that history's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from tesla_gateway.contract.calibrated import CalibratedReading, Interval, Quality
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.manifest import (
    ErrorMetrics,
    HistoryIntervals,
    HistoryPoint,
    Manifest,
    PredictionIntervals,
    write_manifest,
)
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import GapPolicy, pad_history
from tesla_gateway.daemon.ticker import Ticker
from tesla_gateway.errors import SeriesError
from tesla_gateway.models.watch import ModelSet
from tesla_gateway.publish.payloads import reading_message, reading_payload
from tesla_gateway.windows.readout import history_periods
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.state import NO_PERIOD
from tests.support.models import ModelFactory

P = 60
T0 = 1_700_000_040  # a period boundary
BASE = T0 // P


def _intervals(width: float) -> PredictionIntervals:
    return PredictionIntervals(
        level=0.9, edges=[], half_widths=[width], counts=[100], calibration_sensor="v"
    )


def test_pad_history_repeats_the_oldest_real_period_per_channel_and_row() -> None:
    windows = np.arange(2 * 2 * 5, dtype=np.float32).reshape(2, 2, 5)  # [B, C, N]
    padded = pad_history(windows, [2, 5])
    assert padded.dtype == np.float32
    assert padded[0].tolist() == [[3, 3, 3, 3, 4], [8, 8, 8, 8, 9]]
    assert padded[1].tolist() == windows[1].tolist()  # a whole window is left as it is
    assert windows[0, 0, 0] == 0  # a copy
    # training's layout: [B, N, C] with time on axis 1; K beyond 1..N is clipped
    by_time = np.moveaxis(windows, 1, 2)
    np.testing.assert_array_equal(pad_history(by_time, [2, 5], axis=1), np.moveaxis(padded, 1, 2))
    assert pad_history(windows, 0)[0, 0].tolist() == [4] * 5
    with pytest.raises(SeriesError):
        pad_history(np.zeros(5), 1)
    # one channel: [B, N]; the history may come as any numbers (a float array of counts)
    single = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert pad_history(single, np.array([1.0, 2.0])).tolist() == [[3, 3, 3], [5, 5, 6]]


def _windows(n: int = 4, min_history: int | None = None) -> ModelWindows:
    windows = ModelWindows(
        WindowGeometry(
            window_length=n,
            period_seconds=P,
            channels=("pm10",),
            gap_policy=GapPolicy(max_interpolated_periods=1),
        )
    )
    if min_history is not None:
        windows.min_history_periods = min_history
    return windows


def _feed(windows: ModelWindows, sensor: str, periods: dict[int, float]) -> None:
    for period, value in periods.items():
        windows.add(Reading(sensor, T0 + period * P + 1, {"pm10": value}), 0.0)


def test_a_model_that_calibrates_from_one_period_gets_padded_windows_from_the_first() -> None:
    windows = _windows(n=4, min_history=1)
    _feed(windows, "a", {0: 10.0, 1: 12.0, 2: 14.0})  # periods 0 and 1 close
    ready = windows.ready_windows()
    assert ready.quality == ((), ())
    assert ready.history is not None and ready.history.tolist() == [1, 2]
    assert ready.windows.tolist() == [[10.0] * 4, [10.0, 10.0, 10.0, 12.0]]


def test_by_default_a_young_window_is_warming_up_as_before() -> None:
    windows = _windows(n=4)
    _feed(windows, "a", {0: 10.0, 1: 12.0, 2: 14.0, 3: 16.0, 4: 18.0})
    ready = windows.ready_windows()
    assert ready.quality[:3] == ((Quality.WARMING_UP,),) * 3
    assert ready.quality[3] == ()
    assert ready.history is not None and ready.history.tolist() == [1, 2, 3, 4]
    assert np.isnan(ready.windows[0, :3]).all()  # nothing made up


def test_a_gap_inside_the_real_history_is_still_a_gap() -> None:
    windows = _windows(n=6, min_history=1)
    _feed(windows, "a", {0: 10.0, 3: 13.0, 4: 14.0})  # two missing periods: over the policy
    ready = windows.ready_windows()
    assert ready.quality == ((), (Quality.GAP,))
    assert ready.history is not None and ready.history.tolist() == [1, 4]


def test_warm_up_progress_counts_the_sensors_short_of_a_whole_window() -> None:
    windows = _windows(n=4, min_history=2)
    _feed(windows, "a", {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0})  # 5 closed: whole
    _feed(windows, "b", {4: 1.0, 5: 1.0})  # one closed period
    progress = windows.warm_up()
    assert (progress.need, progress.calibrates_from) == (4, 2)
    assert (progress.sensors_short, progress.fewest_periods) == (1, 1)
    # b's period BASE + 4 is its first; BASE + 7 its fourth, whole at that period's end
    assert progress.all_ready_at == (BASE + 8) * P
    assert _windows().warm_up().as_dict()["sensors_short"] == 0


def test_intervals_follow_the_history_bucket() -> None:
    manifest = Manifest.model_construct(
        intervals=_intervals(1.0),
        history_intervals=[
            HistoryIntervals(min_periods=1, intervals=_intervals(5.0)),
            HistoryIntervals(min_periods=3, intervals=_intervals(3.0)),
        ],
        window_length=8,
    )
    widths = [manifest.intervals_for(k).half_widths[0] for k in (1, 2, 3, 7, 8)]  # type: ignore[union-attr]
    assert widths == [5.0, 5.0, 3.0, 3.0, 1.0]


def test_a_manifest_refuses_a_minimum_history_beyond_its_window(
    model_factory: ModelFactory,
) -> None:
    manifest = model_factory.get().manifest
    fields = manifest.model_dump()
    assert Manifest.model_validate(fields).calibrates_from == manifest.window_length
    with pytest.raises(ValueError, match="min_history_periods"):
        Manifest.model_validate({**fields, "min_history_periods": manifest.window_length + 1})
    with pytest.raises(ValueError, match="ascend"):
        Manifest.model_validate(
            {
                **fields,
                "history_intervals": [
                    {"min_periods": 3, "intervals": _intervals(1.0).model_dump()},
                    {"min_periods": 2, "intervals": _intervals(1.0).model_dump()},
                ],
            }
        )


def _ticker(model_dir: Path) -> Ticker:
    models = ModelSet({"pm10": model_dir})
    models.refresh()
    return Ticker(models, grace_s=5.0, clock=lambda: float(T0))


def test_the_ticker_calibrates_a_young_sensor_with_the_history_it_has(
    model_factory: ModelFactory, tmp_path: Path
) -> None:
    model = model_factory.copy(tmp_path / "model")  # N = 8
    curve = [
        HistoryPoint(periods=k, model=ErrorMetrics(rmse=9.0 - k, mae=1.0, n=10)) for k in (1, 8)
    ]
    write_manifest(
        model.path,
        model.manifest.model_copy(
            update={
                "min_history_periods": 1,
                "history_curve": curve,
                "intervals": _intervals(1.0),
                "history_intervals": [HistoryIntervals(min_periods=1, intervals=_intervals(4.0))],
            }
        ),
    )
    ticker = _ticker(model.path)
    series = np.random.default_rng(5).uniform(5, 80, 10)
    published: list[CalibratedReading] = []
    for period in range(10):
        ticker.ingest(Reading("a", T0 + period * P + 1, {"pm10": float(series[period])}))
        published.extend(asyncio.run(ticker.tick()))
    assert [r.quality for r in published] == [(Quality.OK,)] * 9
    assert [r.history_periods for r in published] == [1, 2, 3, 4, 5, 6, 7, 8, 8]
    for period, reading in enumerate(published):
        have = min(period + 1, 8)
        window = np.full(8, series[0], dtype=np.float32)
        window[8 - have :] = series[max(0, period + 1 - 8) : period + 1]
        expected = model.keras_predict(window[None])[0]
        assert reading.calibrated is not None
        np.testing.assert_allclose(reading.calibrated, expected, rtol=1e-4, atol=1e-3)
        width = 4.0 if have < 8 else 1.0
        assert reading.interval is not None
        assert reading.interval.high == pytest.approx(reading.calibrated + width)
    warm = ticker.stats()["windows"]["pm10"]["warm_up"]  # type: ignore[index]
    assert warm["sensors_short"] == 0 and warm["calibrates_from"] == 1


def test_the_calibrated_document_carries_history_and_warm_up_progress() -> None:
    reading = CalibratedReading(
        sensor_id="s1",
        feature="pm10",
        period_start=float(T0),
        period_seconds=P,
        raw=12.5,
        calibrated=10.25,
        unit="ug/m3",
        model_name="m",
        model_version=3,
        quality=(Quality.OK,),
        interval=Interval(8.0, 12.5, 0.9),
        history_periods=5,
        window_length=360,
    )
    document = json.loads(reading_message(reading))
    assert document == reading_payload(reading)
    assert document["history_periods"] == 5
    # period 22:14-22:15 is its fifth: the 360th ends 355 periods later
    assert document["warm_up"] == {"have": 5, "need": 360, "ready_at": "2023-11-15T04:10:00Z"}
    whole = json.loads(
        reading_message(
            CalibratedReading(**{**_fields(reading), "history_periods": 360})  # type: ignore[arg-type]
        )
    )
    assert whole["history_periods"] == 360 and "warm_up" not in whole


def _fields(reading: CalibratedReading) -> dict[str, object]:
    return {name: getattr(reading, name) for name in CalibratedReading.__slots__}


def test_status_prints_the_warm_up_of_each_model() -> None:
    from tesla_gateway.daemon.cli import _summary

    status: dict[str, object] = {
        "updated_at": 0,
        "windows": {
            "pm10": {
                "sensors": 3,
                "outcomes": {},
                "warm_up": {
                    "need": 360,
                    "calibrates_from": 1,
                    "sensors_short": 2,
                    "fewest_periods": 12,
                    "all_ready_at": float(T0),
                },
            },
            "pm2_5": {"sensors": 1, "outcomes": {}, "warm_up": {"sensors_short": 0}},
        },
    }
    text = _summary(status, running=None)
    assert (
        "    warm-up: 2 sensor(s) below 360 periods (fewest 12; calibrated from 1), all whole by "
        "2023-11-14T22:14:00Z"
    ) in text
    assert text.count("warm-up") == 1


def test_history_is_n_when_the_first_period_is_unknown_and_an_int64() -> None:
    history = history_periods(np.array([5, 9, 9]), np.array([NO_PERIOD, 8, 0]), 4)
    assert history.dtype == np.int64 and history.tolist() == [4, 2, 4]
    windows = _windows(n=4, min_history=1)
    _feed(windows, "a", {0: 10.0, 1: 12.0})
    ready = windows.ready_windows()
    assert ready.history is not None and ready.history.dtype == np.int64


def test_warm_up_counts_only_sensors_with_a_first_reading_and_clips_at_n() -> None:
    windows = ModelWindows(
        WindowGeometry(
            window_length=4,
            period_seconds=P,
            channels=("pm10", "rh"),
            gap_policy=GapPolicy(max_interpolated_periods=1),
        )
    )
    for period in range(3):  # closed periods without the first channel: no first reading
        windows.add(Reading("rh-only", T0 + period * P + 1, {"rh": 50.0}), 0.0)
    assert windows.warm_up().fewest_periods is None  # no sensor with a first reading
    for period in range(7):  # six closed periods: whole, and more than N
        windows.add(Reading("whole", T0 + period * P + 1, {"pm10": 1.0, "rh": 50.0}), 0.0)
    windows.add(Reading("open", T0 + 1, {"pm10": 1.0}), 0.0)  # no period closed yet
    assert windows.warm_up().as_dict() == {
        "need": 4,
        "calibrates_from": 4,
        "sensors_short": 0,
        "fewest_periods": 4,
        "all_ready_at": None,
    }
