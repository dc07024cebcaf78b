"""Loader for the JRC Ispra 1-minute SensEURCity co-location extract (``Ispra_<box>.csv``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pandas as pd

from tesla_gateway.contract.sensor_kind import PMS5003_ATM
from training.data._files import csv_files, parse_timestamps, read_csv, require_columns
from training.data.frame import CoLocationData, LoadCounts, tidy_frame
from training.errors import DataError

__all__ = ["ISPRA_ATTRIBUTION", "load_ispra"]

ISPRA_ATTRIBUTION = (
    "SensEURCity: van Poppel et al., Scientific Data 10 (2023), Zenodo doi:10.5281/zenodo.7256405; "
    "Ispra extract from ec-jrc/airsenseur-calibration (JRC)"
)
_TARGET_COLUMNS = {"station": "ref_pm10", "opcn3": "opcn3_pm10"}
_RAW_COLUMN = "pms5003_pm10_atm"


def load_ispra(
    directory: Path, *, target: Literal["station", "opcn3"] = "station"
) -> CoLocationData:
    """PMS5003 PM10 against the station (or the OPC-N3) at Ispra, one minute per row."""
    if target not in _TARGET_COLUMNS:
        raise DataError(f"target must be 'station' or 'opcn3', got {target!r}")
    target_column = _TARGET_COLUMNS[target]
    wanted = ["time_utc", "sensor_id", _RAW_COLUMN, target_column, "ref_rh", "ref_temp_c"]
    parts: list[pd.DataFrame] = []
    rows_read = 0
    for path in csv_files(Path(directory), "Ispra_*.csv"):
        # sensor_id as text: an id like 4065E0 would otherwise parse as the number 4065.
        table = read_csv(path, usecols=lambda name: name in wanted, dtype={"sensor_id": "str"})
        require_columns(path, table, wanted)
        rows_read += len(table)
        parts.append(
            tidy_frame(
                timestamp=parse_timestamps(path, table["time_utc"], "time_utc"),
                sensor_id=table["sensor_id"],
                raw=table[_RAW_COLUMN],
                reference=table[target_column],
                covariates={"rh": table["ref_rh"], "temp_c": table["ref_temp_c"]},
            )
        )
    frame = pd.concat(parts, ignore_index=True)
    return CoLocationData(
        frame=frame,
        feature="pm10",
        period_seconds=60,
        source=f"ispra-1min:{directory}",
        target=target_column,
        attribution=ISPRA_ATTRIBUTION,
        load_counts=LoadCounts(rows_read=rows_read),
        sensor=PMS5003_ATM,  # the PMS5003's atmospheric (ATM) channel
        zone="Europe/Rome",
    )
