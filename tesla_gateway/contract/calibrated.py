"""What the ticker hands the publisher: one calibrated (or honestly uncalibrated) period."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

__all__ = ["PUBLISHED_DECIMALS", "CalibratedReading", "Interval", "Quality", "published_value"]

# Concentrations leave the gateway to a tenth of a µg/m³ (docs/mqtt.md, "Calibrated readings").
PUBLISHED_DECIMALS = 1


def published_value(value: float) -> float:
    """``value`` as the gateway publishes it: to 0.1 µg/m³, since a finer figure is noise (the
    sensors resolve 1 µg/m³, the models' errors are whole µg/m³) and ``33.393028259277344``
    claims otherwise; never ``-0.0``; a non-finite value as it is."""
    return round(float(value), PUBLISHED_DECIMALS) + 0.0 if math.isfinite(value) else value


class Quality(enum.StrEnum):
    """Why a published value is or is not a model calibration; subscribers filter on these."""

    OK = "ok"  # calibrated by the model from a valid window (maybe a young sensor's, padded)
    # fewer periods seen since the sensor's first than the model calibrates from (its manifest's
    # min_history_periods; N for a model not trained on short histories)
    WARMING_UP = "warming_up"
    GAP = "gap"  # the window holds a gap longer than the gap policy interpolates
    MISSING_CHANNEL = "missing_channel"  # the sensor does not supply an input the model needs
    NO_MODEL = "no_model"  # no valid model is loaded for this feature
    OUT_OF_DOMAIN = "out_of_domain"  # inputs far outside the training data's range
    # the model's output is no concentration: its whole interval below zero, or far beyond what
    # it was trained on (tesla_gateway/models/plausibility.py); published without a value
    IMPLAUSIBLE = "implausible"
    # the window's newest stuck_periods raw values of the first channel are one value exactly:
    # a frozen sensor (tesla_gateway/contract/stuck.py); published without a value
    STUCK = "stuck"


@dataclass(frozen=True, slots=True)
class Interval:
    """Where the true value lies with probability ``level`` (the manifest's conformal bins)."""

    low: float
    high: float
    level: float


@dataclass(frozen=True, slots=True)
class CalibratedReading:
    """One closed period of one sensor and feature.

    ``calibrated`` is None unless ``quality`` contains only ``Quality.OK`` (or the advisory
    ``OUT_OF_DOMAIN``): the gateway never publishes a made-up calibration, nor one the model
    computed but no concentration could be (``IMPLAUSIBLE``), nor the model's answer to a
    frozen sensor's constant window (``STUCK``). ``interval`` is None whenever ``calibrated``
    is.
    """

    sensor_id: str
    feature: str
    period_start: float  # Unix seconds, UTC, start of the grid period
    period_seconds: int
    raw: float  # mean of the period's raw readings, in ``unit``
    calibrated: float | None
    unit: str
    model_name: str | None
    model_version: int | None
    quality: tuple[Quality, ...]
    interval: Interval | None = None  # only with a calibrated value and a manifest that has them
    # periods of real history in the window (N: whole; fewer: a young sensor's window, its
    # older part edge-padded) and the model's N; None where no window was read
    history_periods: int | None = None
    window_length: int | None = None
