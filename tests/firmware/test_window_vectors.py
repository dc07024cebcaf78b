"""The shared window vectors (tests/vectors/window_gap_policy.json): current with the contract,
and the gateway's ring buffers make the same windows (young ones padded) and report the same
history of the same readings as the file says.
The firmware's host test (test_firmware_host.py) runs the node's window on the same file."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.windows.ring import ModelWindows
from tests.firmware.window_vectors import VECTORS_PATH, render

SCENARIOS: list[dict[str, Any]] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))["scenarios"]
PERIOD_SECONDS = 60


def test_committed_vectors_are_current() -> None:
    assert VECTORS_PATH.read_text(encoding="utf-8") == render(), (
        "tests/vectors/window_gap_policy.json is stale: run python -m tests.firmware.window_vectors"
    )


def test_vectors_hold_valid_invalid_and_absent_windows_of_several_channels() -> None:
    kinds = {
        "valid" if period.get("window") else "invalid" if "window" in period else "absent"
        for scenario in SCENARIOS
        for period in scenario["periods"]
    }
    assert kinds == {"valid", "invalid", "absent"}
    assert {len(scenario["channels"]) for scenario in SCENARIOS} >= {1, 2, 3}


def test_vectors_hold_young_windows_padded_and_too_young() -> None:
    """Young sensors: padded windows from min_history_periods on, and ones still too young."""
    young = [
        (period["history"], period["window"] is not None)
        for scenario in SCENARIOS
        for period in scenario["periods"]
        if "window" in period and period["history"] < scenario["window_length"]
    ]
    assert any(valid and history == 1 for history, valid in young)
    assert any(valid and history > 1 for history, valid in young)
    assert any(not valid for _, valid in young)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: str(s["name"]))
def test_the_gateway_ring_makes_the_vector_windows(scenario: dict[str, Any]) -> None:
    channels = tuple(scenario["channels"])
    n = scenario["window_length"]
    windows = ModelWindows(
        WindowGeometry(
            window_length=n,
            period_seconds=PERIOD_SECONDS,
            channels=channels,
            gap_policy=GapPolicy(max_interpolated_periods=scenario["max_interpolated_periods"]),
        )
    )
    windows.min_history_periods = scenario["min_history_periods"]
    for step in scenario["periods"]:
        start = step["period"] * PERIOD_SECONDS
        second = 0
        for channel, values in zip(channels, step["readings"], strict=True):
            for value in values:
                second += 1  # distinct times: the ring drops a repeated (time, channel)
                reading = Reading("node", float(start + second), {channel: value})
                windows.add(reading, arrival=float(start + second))
        ready = windows.ready_windows(closed_through_period=step["period"])
        if "window" not in step:
            assert len(ready.sensor_ids) == 0
            continue
        assert list(ready.periods) == [step["period"]]
        assert ready.history is not None and int(ready.history[0]) == step["history"]
        window = np.asarray(ready.windows[0], dtype=np.float64).reshape(n, len(channels))
        if step["window"] is None:
            assert ready.quality[0] != (), step["period"]
        else:
            assert ready.quality[0] == ()
            expected = np.asarray(step["window"]).reshape(n, len(channels))
            np.testing.assert_allclose(window, expected, rtol=1e-5, atol=1e-4)
