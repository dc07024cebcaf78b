"""Builds tests/vectors/window_gap_policy.json: the node's window against the gateway's contract.

Each scenario is a stream of readings per period and channel (PM first, then covariates such as
rh and temp_c); for every period in which PM was observed the file holds what the contract
(tesla_gateway/contract/series.py: per-channel means, :func:`interpolate_short_gaps` channel by
channel, a window valid only without missing values and with its newest PM observed) makes of
the window ending there: invalid, or its values ``[N, C]``, oldest period first. The firmware's
host test (firmware/test/test_main.cpp) feeds the same readings to ``tesla::Window`` and
compares; test_window_vectors.py checks the gateway's own ring buffers against the file.
Regenerate with ``.venv/bin/python -m tests.firmware.window_vectors`` and review the diff.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tesla_gateway.contract.series import GapPolicy, interpolate_short_gaps, valid_window_ends

VECTORS_PATH = Path(__file__).resolve().parents[1] / "vectors" / "window_gap_policy.json"
FIRST_PERIOD = 29_612_160  # a real minute index (2026), beyond 32 bits of seconds / 60 tricks

# One scenario's readings: {period offset: [[PM values], [rh values], ...]}; an absent period
# has no reading at all, an empty list is a channel without a reading in that period.
Readings = dict[int, list[list[float]]]


def _expected(readings: Readings, channels: int, length: int, max_gap: int) -> list[Any]:
    """Per period with readings: the contract's verdict on the window ending there."""
    last = max(readings)
    series = np.full((channels, last + 1), np.nan)
    for offset, per_channel in readings.items():
        for channel, values in enumerate(per_channel):
            if values:
                series[channel, offset] = np.mean(np.asarray(values, dtype=np.float64))
    policy = GapPolicy(max_interpolated_periods=max_gap)
    steps: list[Any] = []
    for period in sorted(readings):
        pm_observed = not np.isnan(series[0, period])
        if not pm_observed:
            steps.append(None)  # no window: the gateway calibrates PM periods only
            continue
        prefix = series[:, : period + 1]  # causal: only what has arrived by then
        filled = np.stack([interpolate_short_gaps(row, policy) for row in prefix])
        observed = ~np.isnan(prefix[0])
        valid = all(bool(valid_window_ends(row, observed, length)[period]) for row in filled)
        window = filled[:, period - length + 1 : period + 1].T if valid else None
        steps.append(None if window is None else [round(float(v), 6) for v in window.ravel()])
    return steps


def _scenario(
    name: str, channels: tuple[str, ...], length: int, max_gap: int, readings: Readings
) -> dict[str, Any]:
    expected = _expected(readings, len(channels), length, max_gap)
    periods = []
    for (offset, per_channel), window in zip(sorted(readings.items()), expected, strict=True):
        periods.append(
            {
                "period": FIRST_PERIOD + offset,
                "readings": per_channel,
                # absent: PM not observed (no window); null: invalid; else [N * C] values
                **({} if not per_channel[0] else {"window": window}),
            }
        )
    return {
        "name": name,
        "channels": list(channels),
        "window_length": length,
        "max_interpolated_periods": max_gap,
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
    return {
        "description": (
            "The gap rule of tesla_gateway/contract/series.py per channel: readings per period "
            "and channel; 'window' (present where PM was observed) is the [N * C] window ending "
            "at that period, oldest period first, a period's channels together, or null when "
            "invalid. Built by tests/firmware/window_vectors.py."
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
        ],
    }


def render() -> str:
    return json.dumps(build_vectors(), indent=1) + "\n"


if __name__ == "__main__":
    VECTORS_PATH.write_text(render(), encoding="utf-8")
    print(f"wrote {VECTORS_PATH}")
