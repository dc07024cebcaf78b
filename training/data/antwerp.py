"""Loader for the INERIS hourly means of the SensEURCity Antwerp boxes (``Antwerp_<box>.csv``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pandas as pd

from tesla_gateway.contract.sensor_kind import PMS5003_ATM
from training.data._files import csv_files, parse_timestamps, read_csv, require_columns
from training.data.frame import CoLocationData, LoadCounts, tidy_frame
from training.errors import DataError

__all__ = ["ANTWERP_ATTRIBUTION", "load_antwerp"]

ANTWERP_ATTRIBUTION = (
    "SensEURCity: van Poppel et al., Scientific Data 10 (2023), Zenodo doi:10.5281/zenodo.7256405; "
    "hourly means from LaurentSpi/SensEURCity_Ineris (INERIS)"
)
_COLUMNS = {
    "pm2_5": ("pms5003_pm25_atm", "ref_pm25"),
    "pm10": ("pms5003_pm10_atm", "ref_pm10"),
}


def load_antwerp(directory: Path, *, feature: Literal["pm2_5", "pm10"] = "pm2_5") -> CoLocationData:
    """PMS5003 against the Fidas 200 at Antwerp reference stations, one hour per row."""
    if feature not in _COLUMNS:
        raise DataError(f"feature must be 'pm2_5' or 'pm10', got {feature!r}")
    raw_column, reference_column = _COLUMNS[feature]
    wanted = ["time_utc", "sensor_id", raw_column, reference_column]
    parts: list[pd.DataFrame] = []
    rows_read = 0
    for path in csv_files(Path(directory), "Antwerp_*.csv"):
        table = read_csv(path, usecols=lambda name: name in wanted, dtype={"sensor_id": "str"})
        require_columns(path, table, wanted)
        rows_read += len(table)
        parts.append(
            tidy_frame(
                timestamp=parse_timestamps(path, table["time_utc"], "time_utc"),
                sensor_id=table["sensor_id"],
                raw=table[raw_column],
                reference=table[reference_column],
            )
        )
    frame = pd.concat(parts, ignore_index=True)
    return CoLocationData(
        frame=frame,
        feature=feature,
        period_seconds=3600,
        source=f"antwerp-hourly:{directory}",
        target=reference_column,
        attribution=ANTWERP_ATTRIBUTION,
        load_counts=LoadCounts(rows_read=rows_read),
        sensor=PMS5003_ATM,  # the PMS5003's atmospheric (ATM) channel
        zone="Europe/Brussels",
    )
