"""Builds tests/vectors/window_gap_policy.json: the node's window against the gateway's contract.

Each scenario is a stream of readings per period and channel (PM first, then covariates such as
rh and temp_c); for every period in which PM was observed the file holds what the contract
(tesla_gateway/contract/series.py: per-channel means, :func:`interpolate_short_gaps` channel by
channel, a window valid only without missing values and with its newest PM observed) makes of
the window ending there: invalid, or its values ``[N, C]``, oldest period first, and its periods of
real history (since the first PM reading, at most N). A window with fewer than N is edge-padded
by :func:`pad_history` when it has at least the scenario's ``min_history_periods`` (a young
sensor, calibrated as the gateway calibrates it), else invalid. The firmware's
host test (firmware/test/test_main.cpp) feeds the same readings to ``tesla::Window`` and
compares; test_window_vectors.py checks the gateway's own ring buffers against the file.
Regenerate with ``.venv/bin/python -m tests.firmware.window_vectors`` and review the diff.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tesla_gateway.contract.series import (
    GapPolicy,
    interpolate_short_gaps,
    pad_history,
    window_is_valid,
)

VECTORS_PATH = Path(__file__).resolve().parents[1] / "vectors" / "window_gap_policy.json"
FIRST_PERIOD = 29_612_160  # a real minute index (2026), beyond 32 bits of seconds / 60 tricks

# One scenario's readings: {period offset: [[PM values], [rh values], ...]}; an absent period
# has no reading at all, an empty list is a channel without a reading in that period.
Readings = dict[int, list[list[float]]]


def _expected(
    readings: Readings, channels: int, length: int, max_gap: int, min_history: int
) -> list[tuple[int, Any]]:
    """Per period with readings: the window's history and the contract's verdict on it."""
    last = max(readings)
    series = np.full((channels, last + 1), np.nan)
    for offset, per_channel in readings.items():
        for channel, values in enumerate(per_channel):
            if values:
                series[channel, offset] = np.mean(np.asarray(values, dtype=np.float64))
    policy = GapPolicy(max_interpolated_periods=max_gap)
    first = int(np.flatnonzero(~np.isnan(series[0]))[0]) if (~np.isnan(series[0])).any() else 0
    steps: list[tuple[int, Any]] = []
    for period in sorted(readings):
        if np.isnan(series[0, period]):
            steps.append((0, None))  # no window: the gateway calibrates PM periods only
            continue
        prefix = series[:, : period + 1]  # causal: only what has arrived by then
        filled = np.stack([interpolate_short_gaps(row, policy) for row in prefix])
        history = min(period - first + 1, length)
        before = np.full((channels, max(length - period - 1, 0)), np.nan)  # before the series
        window = np.concatenate([before, filled[:, max(period - length + 1, 0) :]], axis=1)
        if history < length:
            window = pad_history(window[None], history)[0] if history >= min_history else window
        valid = window_is_valid(window, newest_observed=True)  # PM observed: holes invalidate
        steps.append((history, [round(float(v), 6) for v in window.T.ravel()] if valid else None))
    return steps


def _scenario(
    name: str,
    channels: tuple[str, ...],
    length: int,
    max_gap: int,
    readings: Readings,
    *,
    min_history: int | None = None,
) -> dict[str, Any]:
    """``min_history`` None: whole windows only (the node before it calibrated young windows)."""
    calibrates_from = length if min_history is None else min_history
    expected = _expected(readings, len(channels), length, max_gap, calibrates_from)
    periods = []
    for (offset, per_channel), (history, window) in zip(
        sorted(readings.items()), expected, strict=True
    ):
        periods.append(
            {
                "period": FIRST_PERIOD + offset,
                "readings": per_channel,
                # absent: PM not observed (no window); null: invalid; else [N * C] values
                **({} if not per_channel[0] else {"history": history, "window": window}),
            }
        )
    return {
        "name": name,
        "channels": list(channels),
        "window_length": length,
        "max_interpolated_periods": max_gap,
        "min_history_periods": calibrates_from,
        "periods": periods,
    }


def _full(offsets: range, channels: int, base: float = 10.0) -> Readings:
    return {
        p: [[base + p + 0.25 * c] if c == 0 else [40.0 + c + 0.5 * p] for c in range(channels)]
        for p in offsets
    }


def _random(seed: int, periods: int, channels: int) -> Readings:
    """Readings that come and go channel by channel: gaps of every length, 1-3 per period."""
    rng = np.random.default_rng(seed)
    readings: Readings = {}
    down = np.zeros(channels, dtype=int)  # periods each channel stays silent
    for p in range(periods):
        per_channel: list[list[float]] = []
        for c in range(channels):
            if down[c] == 0 and rng.random() < 0.08:
                down[c] = int(rng.integers(1, 8))
            if down[c] > 0:
                down[c] -= 1
                per_channel.append([])
                continue
            count = int(rng.integers(1, 4))
            scale = 60.0 if c == 0 else 30.0
            per_channel.append([round(float(v), 3) for v in rng.uniform(0, scale, count)])
        if any(per_channel):
            readings[p] = per_channel
    return readings


def build_vectors() -> dict[str, Any]:
    covariates = ("pm10", "rh", "temp_c")
    rh_missing = _full(range(10), 3)
    rh_missing[6][1] = []  # one rh missing: period 6 invalid, 7 on valid (rh interpolated)
    temp_long = _full(range(14), 3)
    for p in (5, 6, 7):
        temp_long[p][2] = []  # three missing with max 2: invalid until they scroll out
    pm_gap = {p: v for p, v in _full(range(12), 3).items() if p not in (7, 8)}
    averaged = _full(range(6), 3)
    averaged[5] = [[1.0, 2.0, 6.0], [50.0, 52.0], [20.5, 21.5, 22.5, 23.5]]
    covariates_alone = _full(range(9), 3)
    covariates_alone[8][0] = []  # rh and temp without PM: no window for that period
    covariates_alone[9] = [[30.0], [41.0], [42.0]]
    wide_gap = _full(range(4), 3)
    wide_gap.update({p + 9: v for p, v in _full(range(4), 3, base=50.0).items()})
    long_fill = {0: [[1.0], [2.0]], 6: [[8.0], [14.0]]}  # 5 missing, max 6 >= N = 4: filled
    # Young sensors: padded from min_history periods on.
    young_pm = {p: v for p, v in _full(range(9), 1).items() if p != 2}
    rh_late = _full(range(9), 3)
    rh_late[0][1] = []  # no rh in the first PM period: nothing to pad with until it scrolls out
    covariates_first = _full(range(1, 8), 3)
    covariates_first[0] = [[], [39.0], [18.0]]  # rh and temp before the first PM: padded over
    rh_bridged = _full(range(1, 8), 3)
    rh_bridged[0] = [[], [30.0], [18.0]]
    rh_bridged[1][1] = []  # rh interpolated into the first PM period from the one before it
    return {
        "description": (
            "The gap rule of tesla_gateway/contract/series.py per channel: readings per period "
            "and channel; 'window' (present where PM was observed) is the [N * C] window ending "
            "at that period, oldest period first, a period's channels together, or null when "
            "invalid; 'history' its periods since the first PM reading (at most N): a window "
            "with fewer is padded with its oldest real period from min_history_periods on. "
            "Built by tests/firmware/window_vectors.py."
        ),
        "scenarios": [
            _scenario(
                "pm only, short gap filled",
                ("pm10",),
                5,
                2,
                {p: v for p, v in _full(range(9), 1).items() if p != 6},
            ),
            _scenario("three channels fill up", covariates, 6, 2, _full(range(8), 3)),
            _scenario("one rh missing, interpolated", covariates, 6, 2, rh_missing),
            _scenario("temperature gap too long", covariates, 6, 2, temp_long),
            _scenario("pm gap of two filled", covariates, 6, 2, pm_gap),
            _scenario("readings averaged per period", covariates, 6, 2, averaged),
            _scenario("covariates without pm", covariates, 6, 2, covariates_alone),
            _scenario("gap longer than the window", covariates, 3, 2, wide_gap),
            _scenario("gap allowed beyond N", ("pm10", "rh"), 4, 6, long_fill),
            _scenario("random dropouts, 3 channels", covariates, 8, 3, _random(1, 120, 3)),
            _scenario("random dropouts, 2 channels", ("pm2_5", "rh"), 12, 5, _random(2, 160, 2)),
            _scenario("young pm only, from one period", ("pm10",), 5, 2, young_pm, min_history=1),
            _scenario(
                "young, three channels from three",
                covariates,
                6,
                2,
                _full(range(8), 3),
                min_history=3,
            ),
            _scenario("young, no rh in the first period", covariates, 5, 2, rh_late, min_history=1),
            _scenario(
                "young, covariates before pm", covariates, 6, 2, covariates_first, min_history=1
            ),
            _scenario(
                "young, rh bridged into the first", covariates, 6, 2, rh_bridged, min_history=2
            ),
            _scenario(
                "young random dropouts", covariates, 10, 3, _random(23, 40, 3), min_history=1
            ),
        ],
    }


def render() -> str:
    return json.dumps(build_vectors(), indent=1) + "\n"


if __name__ == "__main__":
    VECTORS_PATH.write_text(render(), encoding="utf-8")
    print(f"wrote {VECTORS_PATH}")
