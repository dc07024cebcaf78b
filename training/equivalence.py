"""The field's own yardstick: expanded relative uncertainty at the limit value (EU GDE).

Computed as in the *Guide to the Demonstration of Equivalence of Ambient Air Monitoring Methods*
(EC Working Group, January 2010, §9.5.3), between **daily means** (UTC days with at least 75 %
of their periods present, the aggregation rule of Directive 2008/50/EC Annex VII for a daily
value) of the calibrated values ``y`` and the reference ``x``:

* orthogonal regression ``y = a + b·x`` (Deming regression with equal error variances):
  ``b = (s_yy − s_xx + sqrt((s_yy − s_xx)² + 4·s_xy²)) / (2·s_xy)``, ``a = ȳ − b·x̄``;
* combined uncertainty at the limit value ``LV``:
  ``u_c²(LV) = RSS/(n − 2) − u²(x) + (a + (b − 1)·LV)²`` with ``RSS = Σ (y_i − a − b·x_i)²``;
* expanded relative uncertainty ``W = 2·u_c(LV) / LV`` (coverage factor k = 2, ~95 %).

``u(x)`` is the reference method's random uncertainty (the GDE's between-sampler ``u_bs,RM``).
We do not know it for a user's reference, so the default is 0: nothing is subtracted, which
can only overstate ``W`` (a conservative assumption; pass the figure when it is known).

Limit values: PM10 50 µg/m³ (the daily limit value of 2008/50/EC Annex XI). PM2.5 has only an
annual limit value (25 µg/m³) in the Directive; the GDE evaluates PM2.5 equivalence at 30 µg/m³
on daily values, and we use that. The Directive's data quality objective (Annex I) for
**indicative** PM measurements is W ≤ 50 % (fixed measurements: 25 %).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

__all__ = [
    "INDICATIVE_DQO",
    "LIMIT_VALUES",
    "Equivalence",
    "daily_means",
    "equivalence",
    "expanded_relative_uncertainty",
    "orthogonal_regression",
]

LIMIT_VALUES = {"pm10": 50.0, "pm2_5": 30.0}
INDICATIVE_DQO = 0.5
DAILY_COVERAGE = 0.75
SECONDS_PER_DAY = 86_400
Array = npt.NDArray[np.floating]


@dataclass(frozen=True)
class Equivalence:
    """The GDE figures for one candidate-versus-reference comparison."""

    averaging: str
    days: int
    limit_value: float
    reference_uncertainty: float
    slope: float
    intercept: float
    r2: float
    expanded_relative_uncertainty: float
    dqo_indicative: float
    meets_indicative_dqo: bool

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def orthogonal_regression(x: Array, y: Array) -> tuple[float, float]:
    """``(slope, intercept)`` of the orthogonal (total least squares) fit of y on x."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    sxx = float(np.sum((x - x.mean()) ** 2))
    syy = float(np.sum((y - y.mean()) ** 2))
    sxy = float(np.sum((x - x.mean()) * (y - y.mean())))
    if sxy == 0:
        raise ValueError("x and y are uncorrelated: the orthogonal slope is undefined")
    slope = (syy - sxx + math.sqrt((syy - sxx) ** 2 + 4 * sxy**2)) / (2 * sxy)
    return slope, float(y.mean()) - slope * float(x.mean())


def expanded_relative_uncertainty(
    x: Array, y: Array, limit_value: float, reference_uncertainty: float = 0.0
) -> tuple[float, float, float]:
    """``(W, slope, intercept)``: W = 2·u_c(LV)/LV from the GDE formula (module docstring)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) < 3:
        raise ValueError(f"{len(x)} pairs: the GDE formula needs at least 3")
    slope, intercept = orthogonal_regression(x, y)
    rss = float(np.sum((y - intercept - slope * x) ** 2))
    variance = (
        rss / (len(x) - 2) - reference_uncertainty**2 + (intercept + (slope - 1) * limit_value) ** 2
    )
    return 2 * math.sqrt(max(variance, 0.0)) / limit_value, slope, intercept


def daily_means(predictions: pd.DataFrame, period_seconds: int) -> pd.DataFrame:
    """Per sensor and UTC day, the mean calibrated value and reference over the periods where
    both exist; days with less than 75 % of their periods are dropped."""
    frame = predictions[
        np.isfinite(predictions["reference"]) & np.isfinite(predictions["calibrated"])
    ].copy()
    frame["day"] = pd.to_datetime(frame["timestamp"], utc=True).dt.floor("D")
    grouped = frame.groupby(["sensor_id", "day"])
    days = grouped[["calibrated", "reference"]].mean()
    days["periods"] = grouped.size()
    needed = DAILY_COVERAGE * SECONDS_PER_DAY / period_seconds
    return days[days["periods"] >= needed].reset_index()


def equivalence(
    predictions: pd.DataFrame,
    *,
    feature: str,
    period_seconds: int,
    reference_uncertainty: float = 0.0,
) -> Equivalence | None:
    """GDE figures on daily means of ``predictions`` (timestamp, sensor_id, reference,
    calibrated); None when fewer than 3 complete days exist."""
    days = daily_means(predictions, period_seconds)
    if len(days) < 3 or feature not in LIMIT_VALUES:
        return None
    x = days["reference"].to_numpy()
    y = days["calibrated"].to_numpy()
    limit = LIMIT_VALUES[feature]
    try:
        w, slope, intercept = expanded_relative_uncertainty(x, y, limit, reference_uncertainty)
    except ValueError:
        return None
    r = float(np.corrcoef(x, y)[0, 1])
    return Equivalence(
        averaging="daily (UTC days with >= 75 % of periods)",
        days=len(days),
        limit_value=limit,
        reference_uncertainty=reference_uncertainty,
        slope=slope,
        intercept=intercept,
        r2=r * r,
        expanded_relative_uncertainty=w,
        dqo_indicative=INDICATIVE_DQO,
        meets_indicative_dqo=w <= INDICATIVE_DQO,
    )
