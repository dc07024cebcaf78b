"""The one timestamp format of our topics and files."""

from __future__ import annotations

import subprocess
import sys

from tesla_gateway.contract.timefmt import iso8601
from tesla_gateway.monitor import monitor
from tesla_gateway.publish import payloads


def test_utc_with_a_z_and_fractions_kept() -> None:
    assert iso8601(0.0) == "1970-01-01T00:00:00Z"
    assert iso8601(1_700_000_000.0) == "2023-11-14T22:13:20Z"
    assert iso8601(1_700_000_000.25) == "2023-11-14T22:13:20.250000Z"


def test_the_readings_and_the_monitor_documents_share_it() -> None:
    assert vars(payloads)["iso8601"] is iso8601
    assert vars(monitor)["iso8601"] is iso8601


def test_the_calibrator_stands_without_the_window_store() -> None:
    # WindowGeometry is part of the contract (tesla_gateway/contract/geometry.py): loading a model
    # must not pull in the windows (their ring buffers, store or state types).
    probe = (
        "import sys, tesla_gateway.models.calibrator; "
        "print(any(name.startswith('tesla_gateway.windows') for name in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
