"""The calibrations practitioners use today, as reference rows beside the learned models.

* **OLS on the current reading** (:class:`training.metrics.LinearCalibration`): fitted on the
  training sensors' newest raw reading against the reference.
* **US EPA PurpleAir correction for PM2.5** (needs relative humidity). Barkjohn, Gantt and
  Clements, "Development and application of a United States-wide correction for PM2.5 data
  collected with the PurpleAir sensor", Atmos. Meas. Tech. 14, 4617–4637 (2021),
  doi:10.5194/amt-14-4617-2021: PM2.5 = 0.524·PA − 0.0862·RH + 5.75. Its October 2021
  extension for high concentrations (US EPA / AirNow, "Fire and Smoke Map questions and
  answers", https://document.airnow.gov/airnow-fire-and-smoke-map-questions-and-answers.pdf)
  is piecewise in PA (µg/m³, PurpleAir's cf_1 channel):

  ======================  ==========================================================
  PA < 30                 0.524·PA − 0.0862·RH + 5.75
  30 ≤ PA < 50            [0.786·s + 0.524·(1 − s)]·PA − 0.0862·RH + 5.75, s = PA/20 − 3/2
  50 ≤ PA < 210           0.786·PA − 0.0862·RH + 5.75
  210 ≤ PA < 260          [0.69·s + 0.786·(1 − s)]·PA − 0.0862·RH·(1 − s)
                          + 2.966·s + 5.75·(1 − s) + 8.84e-4·PA²·s,  s = PA/50 − 21/5
  PA ≥ 260                2.966 + 0.69·PA + 8.84e-4·PA²
  ======================  ==========================================================

  The blends s run from 0 to 1 across each transition so the curve is continuous. The
  correction was fitted to PurpleAir (two PMS5003) cf_1 data against US regulatory monitors;
  applied to another sensor's readings it is a practitioner's reference, not a fitted model.
  RH is in percent. It applies to PM2.5 only and only where the data carry RH.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.manifest import ErrorMetrics
from tesla_gateway.contract.readings import Feature
from training.data import WindowSet
from training.errors import DataError
from training.metrics import LinearCalibration, error_metrics

__all__ = [
    "EPA_FEATURE",
    "barkjohn_2021",
    "current_channel",
    "epa_purpleair_pm25",
    "fit_ols",
    "reference_rows",
]

EPA_FEATURE: Feature = "pm2_5"
_CHUNK = 4096

FloatArray = npt.NDArray[np.float64]


def barkjohn_2021(pm: npt.ArrayLike, rh: npt.ArrayLike) -> FloatArray:
    """The original US-wide correction: 0.524·PA − 0.0862·RH + 5.75 (µg/m³, RH in %)."""
    pa = np.asarray(pm, dtype=np.float64)
    humidity = np.asarray(rh, dtype=np.float64)
    return 0.524 * pa - 0.0862 * humidity + 5.75


def epa_purpleair_pm25(pm: npt.ArrayLike, rh: npt.ArrayLike) -> FloatArray:
    """The EPA correction with its October 2021 piecewise extension (table in the module doc)."""
    pa, humidity = np.broadcast_arrays(
        np.asarray(pm, dtype=np.float64), np.asarray(rh, dtype=np.float64)
    )
    low = barkjohn_2021(pa, humidity)
    low_blend = np.clip(pa / 20.0 - 1.5, 0.0, 1.0)
    rising = (0.786 * low_blend + 0.524 * (1.0 - low_blend)) * pa - 0.0862 * humidity + 5.75
    middle = 0.786 * pa - 0.0862 * humidity + 5.75
    high_blend = np.clip(pa / 50.0 - 4.2, 0.0, 1.0)
    bending = (
        (0.69 * high_blend + 0.786 * (1.0 - high_blend)) * pa
        - 0.0862 * humidity * (1.0 - high_blend)
        + 2.966 * high_blend
        + 5.75 * (1.0 - high_blend)
        + 8.84e-4 * pa**2 * high_blend
    )
    high = 2.966 + 0.69 * pa + 8.84e-4 * pa**2
    return np.select(
        [pa < 30.0, pa < 50.0, pa < 210.0, pa < 260.0],
        [low, rising, middle, bending],
        default=high,
    )


def current_channel(windows: WindowSet, name: str) -> FloatArray:
    """The newest value of input channel ``name`` in every window [len]."""
    if name not in windows.channels:
        raise DataError(
            f"channel {name!r} is not among the windows' channels {windows.channels}: "
            "train with it in TrainConfig.channels"
        )
    if name == windows.channels[0]:
        return windows.current_raw().astype(np.float64)
    column = windows.channels.index(name)
    values = []
    for start in range(0, len(windows), _CHUNK):
        x, _ = windows.gather(np.arange(start, min(start + _CHUNK, len(windows))))
        values.append(x[:, -1, column])  # [B]
    return np.concatenate(values).astype(np.float64) if values else np.empty(0)


def fit_ols(train: WindowSet) -> LinearCalibration:
    """OLS of the reference on the newest raw reading over the training windows."""
    return LinearCalibration.fit(train.current_raw(), train.targets())


def reference_rows(train: WindowSet, test: WindowSet, feature: Feature) -> dict[str, ErrorMetrics]:
    """Test errors of the reference calibrations: 'raw', 'ols' and, where it applies, 'epa'.

    'epa' is present only for PM2.5 with an 'rh' input channel.
    """
    target = test.targets()
    current = test.current_raw()
    rows = {
        "raw": error_metrics(current, target),
        "ols": error_metrics(fit_ols(train).predict(current), target),
    }
    if feature == EPA_FEATURE and "rh" in test.channels:
        rows["epa"] = error_metrics(
            epa_purpleair_pm25(current, current_channel(test, "rh")), target
        )
    return rows
