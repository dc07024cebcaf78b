"""A seeded synthetic co-location campaign: a test aid and a demo for users without data.

Never a result: numbers measured on it say nothing about real sensors.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

from tesla_gateway.contract.readings import Feature
from training.data.frame import CoLocationData, LoadCounts, tidy_frame
from training.errors import DataError

__all__ = ["SYNTHETIC_ATTRIBUTION", "generate_synthetic", "growth_factor"]

SYNTHETIC_ATTRIBUTION = "synthetic data from training.data.synthetic (not a measurement)"
_START = pd.Timestamp("2021-01-04T00:00:00Z")
_DAY_S = 86_400.0
_MAX_WATER_ACTIVITY = 0.98  # the growth law diverges at saturation; fog is not modelled

FloatArray = npt.NDArray[np.float64]


def growth_factor(rh_percent: npt.ArrayLike, kappa: float) -> FloatArray:
    """Mass growth of hygroscopic particles with humidity (kappa-Köhler, flat-surface limit).

    With water activity ``aw = RH/100`` the wet/dry volume ratio is ``1 + kappa·aw/(1 - aw)``;
    an optical counter sizes the wet particle, so its mass reading grows by that factor.
    """
    water_activity = np.clip(np.asarray(rh_percent, dtype=np.float64) / 100.0, 0.0, None)
    water_activity = np.minimum(water_activity, _MAX_WATER_ACTIVITY)
    return 1.0 + kappa * water_activity / (1.0 - water_activity)


def generate_synthetic(
    n_sensors: int = 4,
    days: float = 3,
    period_seconds: int = 60,
    seed: int = 0,
    *,
    feature: Feature = "pm2_5",
    base_level: float = 15.0,
    kappa: float = 0.15,
    saturation: float = 1000.0,
    dropout_rate_per_day: float = 6.0,
) -> CoLocationData:
    """Simulate ``n_sensors`` low-cost units beside one reference instrument.

    The physics, in the order it is applied:

    * **True concentration** (µg/m³, shared by the co-located units): ``base_level`` times a
      diurnal cycle with morning (08 h) and evening (20 h) traffic peaks, times ``exp(z)`` where
      ``z`` is an AR(1) process with a 3-hour memory, which gives log-normal pollution episodes.
    * **Weather**: temperature follows a sine peaking at 15 h; relative humidity is
      anticorrelated (peaking before dawn), both with slow AR(1) weather noise; RH is kept
      within 5–99 %.
    * **Optical reading**: the true mass is multiplied by the hygroscopic growth factor
      :func:`growth_factor` (``1 + kappa·aw/(1-aw)``), so humid air reads high as on real
      PMS5003s; then a per-unit gain (log-normal around 1.3, the PMS's typical over-reading)
      and offset (normal, ±1.5 µg/m³), then a soft saturation ``s·tanh(x/s)`` at
      ``saturation``, then multiplicative (5 %) and additive (1 µg/m³) noise, clipped at 0.
    * **Dropouts**: per unit, about ``dropout_rate_per_day`` gaps a day, mostly a few
      minutes, some tens of minutes and about one in six between one and four hours; the rows
      are absent, as in a real log.
    * **Reference**: the true concentration plus small instrument noise (0.5 µg/m³ + 2 %),
      missing in about 1 % of rows.

    The same arguments always give the same data.
    """
    if n_sensors < 1:
        raise DataError(f"n_sensors must be at least 1, got {n_sensors}")
    if days <= 0 or period_seconds < 1:
        raise DataError("days must be positive and period_seconds at least 1")
    rng = np.random.default_rng(seed)
    count = int(days * _DAY_S // period_seconds)
    if count < 2:
        raise DataError(f"{days} day(s) at {period_seconds} s is fewer than two periods")
    seconds = _START.timestamp() + np.arange(count) * float(period_seconds)
    hour: FloatArray = np.asarray((seconds % _DAY_S) / 3600.0, dtype=np.float64)

    true_pm = _true_concentration(rng, hour, period_seconds, base_level)
    temperature = (
        5.0 + 4.0 * np.sin(2 * np.pi * (hour - 9.0) / 24.0) + _ar1(rng, count, period_seconds, 1.0)
    )
    rh_site = np.clip(
        72.0
        - 18.0 * np.sin(2 * np.pi * (hour - 9.0) / 24.0)
        + _ar1(rng, count, period_seconds, 6.0),
        5.0,
        99.0,
    )
    reference = true_pm + rng.normal(0.0, 0.5 + 0.02 * true_pm)
    reference = np.clip(reference, 0.0, None)
    reference[rng.random(count) < 0.01] = np.nan

    timestamps = pd.to_datetime(seconds, unit="s", utc=True)
    frames: list[pd.DataFrame] = []
    for unit in range(n_sensors):
        gain = 1.3 * float(np.exp(rng.normal(0.0, 0.12)))
        offset = float(rng.normal(0.0, 1.5))
        rh = np.clip(rh_site + rng.normal(0.0, 1.0, count), 5.0, 99.0)
        temp_c = temperature + rng.normal(0.0, 0.2, count)
        optical = true_pm * growth_factor(rh, kappa) * gain + offset
        optical = saturation * np.tanh(optical / saturation)
        raw = optical * (1.0 + rng.normal(0.0, 0.05, count)) + rng.normal(0.0, 1.0, count)
        raw = np.clip(raw, 0.0, None)
        kept = _dropout_mask(rng, count, period_seconds, days, dropout_rate_per_day)
        frames.append(
            tidy_frame(
                timestamp=timestamps[kept],
                sensor_id=f"SYN{unit:03d}",
                raw=raw[kept],
                reference=reference[kept],
                covariates={"rh": rh[kept], "temp_c": temp_c[kept]},
            )
        )
    frame = pd.concat(frames, ignore_index=True)
    return CoLocationData(
        frame=frame,
        feature=feature,
        period_seconds=period_seconds,
        source=f"synthetic:seed={seed}",
        target="synthetic-reference",
        attribution=SYNTHETIC_ATTRIBUTION,
        load_counts=LoadCounts(rows_read=len(frame)),
    )


def _true_concentration(
    rng: np.random.Generator, hour: FloatArray, period_seconds: int, base_level: float
) -> FloatArray:
    morning = np.exp(-0.5 * ((hour - 8.0) / 1.5) ** 2)
    evening = np.exp(-0.5 * ((hour - 20.0) / 2.5) ** 2)
    diurnal = 0.7 + 0.6 * morning + 0.5 * evening
    episodes = _ar1(rng, hour.size, period_seconds, 0.6)
    return base_level * diurnal * np.exp(episodes)


def _ar1(
    rng: np.random.Generator, count: int, period_seconds: int, stationary_sd: float
) -> FloatArray:
    """AR(1) with a 3-hour memory and the given stationary standard deviation."""
    phi = float(np.exp(-period_seconds / (3 * 3600.0)))
    innovations = rng.normal(0.0, stationary_sd * np.sqrt(1.0 - phi**2), count)
    values = np.empty(count)
    values[0] = rng.normal(0.0, stationary_sd)
    for index in range(1, count):
        values[index] = phi * values[index - 1] + innovations[index]
    return values


def _dropout_mask(
    rng: np.random.Generator, count: int, period_seconds: int, days: float, rate_per_day: float
) -> npt.NDArray[np.bool_]:
    kept = np.ones(count, dtype=np.bool_)
    for _ in range(int(rng.poisson(rate_per_day * days))):
        kind = rng.random()
        if kind < 0.6:
            length_s = rng.uniform(60, 600)
        elif kind < 0.83:
            length_s = rng.uniform(600, 3600)
        else:
            length_s = rng.uniform(3600, 4 * 3600)
        length = max(1, round(length_s / period_seconds))
        start = int(rng.integers(0, count))
        kept[start : start + length] = False
    return kept
