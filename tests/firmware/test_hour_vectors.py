"""The shared hour-of-day vectors (tests/vectors/window_hours.json): current with the contract,
and holding what the node must get right. The firmware's host test (test_firmware_host.py) runs
the node's clock and input builder on the same file (firmware/test/test_hours.cpp)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from tesla_gateway.contract.series import pad_history
from tesla_gateway.contract.time_of_day import DAY_SECONDS, hour_phase, window_hours
from tests.firmware.hour_vectors import VECTORS_PATH, render

SCENARIOS: list[dict[str, Any]] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))["scenarios"]


def test_committed_vectors_are_current() -> None:
    assert VECTORS_PATH.read_text(encoding="utf-8") == render(), (
        "tests/vectors/window_hours.json is stale: run python -m tests.firmware.hour_vectors"
    )


def _inputs(scenario: dict[str, Any]) -> list[tuple[dict[str, Any] | None, dict[str, Any]]]:
    """(the clock then, step) of every valid input."""
    clock, out = None, []
    for step in scenario["steps"]:
        if "time" in step:
            clock = step["time"]
        elif step.get("input"):
            out.append((clock, step))
    return out


def _hours(scenario: dict[str, Any], step: dict[str, Any]) -> list[tuple[float, float]]:
    channels = scenario["channels"]
    c = len(channels)
    values = step["input"]
    sin, cos = channels.index("hour_sin"), channels.index("hour_cos")
    return [(values[i * c + sin], values[i * c + cos]) for i in range(scenario["window_length"])]


def test_before_any_time_line_the_hour_is_unknown_everywhere() -> None:
    unknown = [
        _hours(scenario, step)
        for scenario in SCENARIOS
        for clock, step in _inputs(scenario)
        if clock is None
    ]
    assert unknown and all(pair == (0.0, 0.0) for hours in unknown for pair in hours)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: str(s["name"]))
def test_padded_positions_repeat_the_oldest_real_hour(scenario: dict[str, Any]) -> None:
    """Young windows: the hour of position N - history (the oldest real period) fills the
    positions before it; the newest position holds its own period's hour."""
    n, period_s = scenario["window_length"], scenario["period_seconds"]
    young = 0
    for clock, step in _inputs(scenario):
        if clock is None:
            continue
        hours = _hours(scenario, step)
        start = step["period"] * period_s + clock["unix_s"] - clock["uptime_ms"] / 1000
        assert hours[-1] == pytest.approx(hour_phase(start, clock["utc_offset_s"]), abs=1e-8)
        oldest = n - step["history"]
        assert all(pair == hours[oldest] for pair in hours[:oldest])
        young += oldest > 0
    if scenario["min_history_periods"] < n:
        assert young > 0


def test_a_clock_step_moves_every_position_of_the_window() -> None:
    """After a second T line the same uptime periods get the new time's hours."""
    (scenario,) = [s for s in SCENARIOS if sum("time" in step for step in s["steps"]) > 1]
    clocks = {id(clock): clock for clock, _ in _inputs(scenario) if clock is not None}
    assert len(clocks) == 2


def test_the_vectors_hold_what_the_contracts_window_rule_gives() -> None:
    """The gateway's and training's implementation of the rule (``window_hours``, then
    ``pad_history``) gives the vectors' hour channels. Its periods start at multiples of the
    period; a node's start ``off`` seconds later, which for whole seconds is the same phase as
    the offset ``u + off`` folded into one day (the sub-second clocks are the generator's
    alone)."""
    compared = 0
    for scenario in SCENARIOS:
        n, period_s = scenario["window_length"], scenario["period_seconds"]
        for clock, step in _inputs(scenario):
            if clock is not None and clock["uptime_ms"] % 1000:
                continue
            offset = None
            if clock is not None:
                shift = clock["unix_s"] - clock["uptime_ms"] // 1000 + clock["utc_offset_s"]
                offset = (shift + DAY_SECONDS // 2) % DAY_SECONDS - DAY_SECONDS // 2
            pm = np.where(np.arange(n) >= n - step["history"], 1.0, np.nan)[None]
            sin, cos = window_hours(pm, [step["period"]], period_s, offset)
            padded = pad_history(np.stack([sin, cos], axis=1), step["history"])[0]
            got = np.asarray(_hours(scenario, step)).T
            np.testing.assert_allclose(got, padded, atol=1e-6)
            compared += 1
    assert compared >= 20
