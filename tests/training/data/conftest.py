"""Fixtures for the data-layer tests: small files in the real source layouts, and the real data."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.data import default_data_dir


@pytest.fixture
def shared_data() -> Path:
    """The real co-location data folder; tests using it are marked ``realdata`` and skip here."""
    directory = default_data_dir()
    if not (directory / "ispra-1min").is_dir() or not (directory / "antwerp-hourly").is_dir():
        pytest.skip(f"real data not present at {directory}")
    return directory
