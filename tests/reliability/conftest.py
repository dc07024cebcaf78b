"""The reliability suite: short form in ``make test``, long form with ``--reliability-long``."""

from __future__ import annotations

import pytest


@pytest.fixture
def long_form(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--reliability-long"))
