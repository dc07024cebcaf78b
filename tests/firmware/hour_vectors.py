"""Builds tests/vectors/window_hours.json: the node's model input with the hour of the day.

A model may read ``hour_sin`` and ``hour_cos`` (tesla_gateway/contract/time_of_day.py), which no
sensor measures: the node derives them from the wall time of the gateway's last ``T`` line
(docs/serial-protocol.md). Its periods are on its uptime, so period ``p`` starts at the wall
time ``p * period_seconds + unix_s - uptime_ms / 1000``, where the ``T`` line said ``unix_s``
when the uptime was ``uptime_ms``. THE window rule, as training and the gateway apply it: the
measured channels make the window as in window_vectors.py (gap rule per channel); each position
whose PM value is present (observed or gap-filled) holds the hour of its period's start
(:func:`hour_phase` in the ``T`` line's standard offset), UNKNOWN_HOUR before any ``T`` line;
then a young window is edge-padded, every channel alike (:func:`pad_history`), so its padded
positions repeat the oldest real period's hour as they repeat its PM.

The firmware's host test (firmware/test/test_hours.cpp) replays each scenario's steps through
``tesla::Window``, ``tesla::WallClock`` and ``tesla::build_model_input`` and compares.
Regenerate with ``.venv/bin/python -m tests.firmware.hour_vectors`` and review the diff.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tesla_gateway.contract.series import (
    GapPolicy,
    interpolate_short_gaps,
    pad_history,
    window_is_valid,
)
from tesla_gateway.contract.time_of_day import (
    HOUR_CHANNELS,
    UNKNOWN_HOUR,
    hour_phase,
    is_hour_channel,
)
from tests.firmware.window_vectors import Readings, _full, _random

VECTORS_PATH = Path(__file__).resolve().parents[1] / "vectors" / "window_hours.json"
NEW_YEAR_2026 = 1_767_225_600  # 2026-01-01 00:00 UTC


def _time(unix_s: int, utc_offset_s: int, uptime_ms: int) -> dict[str, int]:
    """A ``T`` line received at ``uptime_ms``."""
    return {"unix_s": unix_s, "utc_offset_s": utc_offset_s, "uptime_ms": uptime_ms}


@dataclass(frozen=True)
class Shape:
    """A model's window: input channels (measured and hour), N, period, gap rule, min history."""

    channels: tuple[str, ...]
    length: int
    period_seconds: int
    max_gap: int
    min_history: int


def _input(
    series: np.ndarray, newest: int, first: int, clock: dict[str, int] | None, shape: Shape
) -> tuple[int, list[float] | None]:
    """The model input [N * C] of the window ending at ``newest`` (or None) and its history."""
    length = shape.length
    policy = GapPolicy(max_interpolated_periods=shape.max_gap)
    prefix = series[:, : newest + 1]  # causal: only what has arrived by then
    filled = np.stack([interpolate_short_gaps(row, policy) for row in prefix])
    before = np.full((len(filled), max(length - newest - 1, 0)), np.nan)
    measured = np.concatenate([before, filled[:, max(newest - length + 1, 0) :]], axis=1)
    periods = newest - (length - 1) + np.arange(length)
    hours = np.full((2, length), np.nan)
    for j in np.flatnonzero(~np.isnan(measured[0])):  # PM present: observed or gap-filled
        if clock is None:
            hours[:, j] = UNKNOWN_HOUR
        else:
            start_s = int(periods[j]) * shape.period_seconds + clock["unix_s"]
            hours[:, j] = hour_phase(start_s - clock["uptime_ms"] / 1000.0, clock["utc_offset_s"])
    measured_rows = iter(measured)
    window = np.stack(
        [
            hours[HOUR_CHANNELS.index(name)] if is_hour_channel(name) else next(measured_rows)
            for name in shape.channels
        ]
    )  # [C, N]
    history = min(newest - first + 1, length)
    if history < length:
        if history < shape.min_history:
            return history, None
        window = pad_history(window[None], history)[0]  # after the hours: every channel alike
    if not window_is_valid(window, newest_observed=True):
        return history, None
    return history, [round(float(v), 9) for v in window.T.ravel()]


def _scenario(
    name: str, shape: Shape, readings: Readings, times: dict[int, dict[str, int]]
) -> dict[str, Any]:
    """``readings`` of the measured channels by period; ``times[p]``: a ``T`` line before
    period ``p``'s readings."""
    measured = sum(1 for name in shape.channels if not is_hour_channel(name))
    series = np.full((measured, max(readings) + 1), np.nan)
    for period, per_channel in readings.items():
        for channel, values in enumerate(per_channel):
            if values:
                series[channel, period] = np.mean(np.asarray(values, dtype=np.float64))
    first = int(np.flatnonzero(~np.isnan(series[0]))[0])
    clock: dict[str, int] | None = None
    steps: list[dict[str, Any]] = []
    for period in sorted(set(readings) | set(times)):
        if period in times:
            clock = times[period]
            steps.append({"time": clock})
        if period not in readings:
            continue
        step: dict[str, Any] = {"period": period, "readings": readings[period]}
        if readings[period][0]:  # PM observed: the node calibrates (absent: no input asked)
            history, model_input = _input(series, period, first, clock, shape)
            step |= {"history": history, "input": model_input}
        steps.append(step)
    return {
        "name": name,
        "channels": list(shape.channels),
        "window_length": shape.length,
        "period_seconds": shape.period_seconds,
        "max_interpolated_periods": shape.max_gap,
        "min_history_periods": shape.min_history,
        "steps": steps,
    }


def build_vectors() -> dict[str, Any]:
    pm_hour = ("pm10", "hour_sin", "hour_cos")
    hourly = {p: v for p, v in _full(range(3, 14), 1).items() if p != 8}  # 8: gap filled
    young = {p: v for p, v in _full(range(2, 9), 1).items() if p != 5}
    steps_readings = _full(range(12), 2)
    steps_readings[6][1] = []  # rh interpolated
    return {
        "description": (
            "The node's model input with the hour of the day: steps are T lines ('time': "
            "unix_s, utc_offset_s, and the node's uptime_ms when it arrived) and periods of "
            "readings of the measured channels (the non-hour channels, in order), periods on "
            "the node's uptime; 'input' (where PM was observed) is the model's [N * C] input "
            "ending there, oldest period first, a period's channels together, or null when "
            "invalid; 'history' its real periods. Hour channels: hour_phase of each present "
            "position's period start, (0, 0) before any T line; young windows then padded. "
            "Built by tests/firmware/hour_vectors.py."
        ),
        "scenarios": [
            _scenario(
                "hourly periods east of UTC, a gap filled",
                Shape(pm_hour, 6, 3600, 2, 6),
                hourly,
                {0: _time(NEW_YEAR_2026 + 4321, 3600, 5_123_456)},
            ),
            _scenario(
                "young window repeats its oldest hour",
                Shape(pm_hour, 8, 1800, 2, 1),
                young,
                {0: _time(NEW_YEAR_2026 - 7 * 3600, -18000, 61_250)},
            ),
            _scenario(
                "no time, then a T line, then a clock step",
                Shape(("pm2_5", "hour_cos", "rh", "hour_sin"), 6, 900, 2, 2),
                steps_readings,
                {
                    4: _time(NEW_YEAR_2026 + 11 * 3600, -18000, 4 * 900_000 + 333),
                    9: _time(NEW_YEAR_2026 + 18 * 3600 + 7, 19800, 9 * 900_000 + 2000),
                },
            ),
            _scenario(
                "random dropouts across midnight",
                Shape(("pm10", "rh", "temp_c", "hour_sin", "hour_cos"), 8, 60, 4, 1),
                _random(10, 70, 3),
                {0: _time(NEW_YEAR_2026 - 1800, 0, 0)},
            ),
        ],
    }


def render() -> str:
    return json.dumps(build_vectors(), indent=1) + "\n"


if __name__ == "__main__":
    VECTORS_PATH.write_text(render(), encoding="utf-8")
    print(f"wrote {VECTORS_PATH}")
