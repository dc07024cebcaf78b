"""Comparing what the gateway published with what a model or a sender computed.

Concentrations leave the gateway to a tenth of a µg/m³
(:func:`tesla_gateway.contract.calibrated.published_value`), so a published value lies within
half a tenth of the computed one, plus the runtimes' own small differences.
"""

from __future__ import annotations

import pytest

__all__ = ["HALF_A_TENTH", "as_published"]

HALF_A_TENTH = 0.05


def as_published(value: float | list[float], *, slack: float = 1e-3) -> object:
    """``pytest.approx`` for a computed value (or list) against its published form."""
    return pytest.approx(value, rel=1e-4, abs=HALF_A_TENTH + slack)
