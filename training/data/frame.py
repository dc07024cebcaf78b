"""The tidy co-location frame every loader produces, and the metadata that travels with it.

One shape for all sources (``timestamp, sensor_id, raw, reference[, rh, temp_c]``) lets cleaning,
gridding and windowing ignore where the data came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, get_args

import numpy as np
import numpy.typing as npt
import pandas as pd

from tesla_gateway.contract.readings import COVARIATES, Covariate, Feature
from tesla_gateway.contract.sensor_kind import SensorKind
from tesla_gateway.contract.time_of_day import zone_problem
from training.errors import DataError

__all__ = [
    "FEATURES",
    "REQUIRED_COLUMNS",
    "CoLocationData",
    "LoadCounts",
    "tidy_frame",
    "unix_seconds",
]

FEATURES: tuple[Feature, ...] = get_args(Feature)
REQUIRED_COLUMNS: tuple[str, ...] = ("timestamp", "sensor_id", "raw", "reference")
TIMESTAMP_DTYPE: Final = "datetime64[ns, UTC]"


@dataclass(frozen=True)
class LoadCounts:
    """What a loader removed before the frame existed (e.g. SensEURCity warm-up rows).

    Keys are ``"<column>:<reason>"``; ``rows_dropped`` counts whole rows, ``values_nulled``
    counts single values set to NaN. Cleaning adds these to its own report.
    """

    rows_read: int
    rows_dropped: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    values_nulled: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, eq=False)
class CoLocationData:
    """A tidy co-location frame plus what it measures and where it came from.

    ``eq=False``: frames compare element-wise, so identity is the only meaningful equality.
    """

    frame: pd.DataFrame
    feature: Feature
    period_seconds: int
    source: str
    target: str
    attribution: str
    load_counts: LoadCounts | None = None
    # The low-cost sensor and value set of ``raw`` (the manifest's ``sensor``); None: not known.
    sensor: SensorKind | None = None
    # The site's IANA time zone: the hour channels are its local standard time
    # (tesla_gateway/contract/time_of_day.py). "UTC" when a source does not say where it was.
    zone: str = "UTC"

    def __post_init__(self) -> None:
        _check_zone(self.zone)
        if self.feature not in FEATURES:
            raise DataError(f"feature must be one of {FEATURES}, got {self.feature!r}")
        if self.period_seconds < 1:
            raise DataError(f"period_seconds must be at least 1, got {self.period_seconds}")
        _check_frame(self.frame)

    @property
    def sensor_ids(self) -> tuple[str, ...]:
        """Sorted ids of the sensors present in the frame."""
        return tuple(sorted(str(value) for value in self.frame["sensor_id"].unique()))

    @property
    def covariates(self) -> tuple[Covariate, ...]:
        """Covariate columns present in the frame."""
        return tuple(name for name in COVARIATES if name in self.frame.columns)

    def with_frame(self, frame: pd.DataFrame) -> CoLocationData:
        """Same metadata over a new frame (cleaning and slicing use this)."""
        return dataclasses.replace(self, frame=frame)


def tidy_frame(
    timestamp: pd.Series | pd.DatetimeIndex,
    sensor_id: pd.Series | str,
    raw: pd.Series | npt.ArrayLike,
    reference: pd.Series | npt.ArrayLike,
    covariates: Mapping[str, pd.Series | npt.ArrayLike] | None = None,
) -> pd.DataFrame:
    """Build the tidy frame with the canonical dtypes, sorted by sensor and time."""
    stamps = pd.Series(pd.to_datetime(timestamp, utc=True)).reset_index(drop=True)
    columns: dict[str, object] = {
        "timestamp": stamps.astype(TIMESTAMP_DTYPE),
        "sensor_id": _as_str(sensor_id, len(stamps)),
        "raw": _as_float(raw),
        "reference": _as_float(reference),
    }
    for name, values in (covariates or {}).items():
        if name not in COVARIATES:
            raise DataError(f"unknown covariate {name!r}; expected one of {COVARIATES}")
        columns[name] = _as_float(values)
    frame = pd.DataFrame(columns)
    frame = frame.sort_values(["sensor_id", "timestamp"], kind="stable").reset_index(drop=True)
    _check_frame(frame)
    return frame


def unix_seconds(timestamps: pd.Series) -> npt.NDArray[np.float64]:
    """Unix seconds (float) of a UTC timestamp column, whatever its stored resolution."""
    nanoseconds = np.asarray(timestamps.dt.as_unit("ns").astype("int64"), dtype=np.int64)
    return nanoseconds.astype(np.float64) / 1e9


def _as_float(values: pd.Series | npt.ArrayLike) -> npt.NDArray[np.float64]:
    if isinstance(values, pd.Series):
        return np.asarray(values.to_numpy(dtype=np.float64, na_value=np.nan), dtype=np.float64)
    return np.asarray(values, dtype=np.float64)


def _as_str(values: pd.Series | str, length: int) -> pd.Series:
    if isinstance(values, str):
        return pd.Series([values] * length, dtype="str")
    return values.reset_index(drop=True).astype(str)


def _check_zone(zone: str) -> None:
    problem = zone_problem(zone)
    if problem is not None:
        raise DataError(f"the data's site zone: {problem}")


def _check_frame(frame: pd.DataFrame) -> None:
    missing = [name for name in REQUIRED_COLUMNS if name not in frame.columns]
    if missing:
        raise DataError(f"co-location frame lacks columns {missing}")
    unknown = [name for name in frame.columns if name not in (*REQUIRED_COLUMNS, *COVARIATES)]
    if unknown:
        raise DataError(f"co-location frame has unexpected columns {unknown}")
    if str(frame["timestamp"].dtype) != TIMESTAMP_DTYPE:
        raise DataError(f"timestamp must be {TIMESTAMP_DTYPE}, got {frame['timestamp'].dtype}")
    if not pd.api.types.is_string_dtype(frame["sensor_id"]):
        raise DataError(f"sensor_id must hold strings, got {frame['sensor_id'].dtype}")
    for name in ("raw", "reference", *COVARIATES):
        if name in frame.columns and frame[name].dtype != np.float64:
            raise DataError(f"{name} must be float64, got {frame[name].dtype}")
