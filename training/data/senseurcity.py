"""Loader for the full SensEURCity 1-minute per-box release (``<City>_<box>.csv``, ~90 columns).

The files are large, so only the needed columns are read. Values flagged ``W`` (sensor warm-up)
are not measurements: a warmed-up raw value drops its row, a warmed-up target or covariate
becomes NaN, and both are counted in the frame's :class:`LoadCounts`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from tesla_gateway.contract.readings import Feature
from tesla_gateway.contract.sensor_kind import PMS5003_ATM
from training.data._files import csv_files, parse_timestamps, read_csv, require_columns
from training.data.frame import CoLocationData, LoadCounts, tidy_frame
from training.errors import DataError

__all__ = ["SENSEURCITY_ATTRIBUTION", "load_senseurcity"]

SENSEURCITY_ATTRIBUTION = (
    "SensEURCity: van Poppel et al., Scientific Data 10 (2023), Zenodo doi:10.5281/zenodo.7256405"
)
WARM_UP_FLAG = "W"
_PMS5003 = {"pm1": "5301CAT", "pm2_5": "5325CAT", "pm10": "5310CAT"}
_OPCN3 = {"pm1": "OPCN3PM1", "pm2_5": "OPCN3PM25", "pm10": "OPCN3PM10"}
_STATION = {"pm1": "Ref.PM1", "pm2_5": "Ref.PM2.5", "pm10": "Ref.PM10"}
_COVARIATES = {"rh": "SHT31HE", "temp_c": "SHT31TE"}


def load_senseurcity(
    paths: Path | Sequence[Path],
    *,
    feature: Feature = "pm2_5",
    target: Literal["station", "opcn3"] = "station",
    zone: str = "UTC",
) -> CoLocationData:
    """PMS5003 against the station reference or the box's own OPC-N3, one minute per row.

    ``zone``: the city's IANA zone (Antwerp ``Europe/Brussels``, Oslo ``Europe/Oslo``, Zagreb
    ``Europe/Zagreb``); the files do not say which city they are from, so the default UTC places
    a model's hour channels wrong by the city's offset.

    ``paths`` is a directory of per-box files or a list of them; the sensor id is the file name
    without ``.csv`` (e.g. ``Antwerp_402B00``). A file without the target column contributes
    its raw readings with a missing reference.
    """
    if feature not in _PMS5003:
        raise DataError(f"feature must be one of {sorted(_PMS5003)}, got {feature!r}")
    if target not in ("station", "opcn3"):
        raise DataError(f"target must be 'station' or 'opcn3', got {target!r}")
    files = _resolve(paths)
    raw_column = _PMS5003[feature]
    target_column = (_STATION if target == "station" else _OPCN3)[feature]
    flagged = [raw_column, *_COVARIATES.values()]
    if target == "opcn3":
        flagged.append(target_column)
    wanted = {"date", raw_column, target_column, *flagged, *(f"{c}_flag" for c in flagged)}
    flag_dtypes = {f"{column}_flag": "str" for column in flagged}

    parts: list[pd.DataFrame] = []
    rows_read = 0
    dropped: Counter[str] = Counter()
    nulled: Counter[str] = Counter()
    targets_found = 0
    for path in files:
        table = read_csv(path, usecols=lambda name: name in wanted, dtype=flag_dtypes)
        require_columns(path, table, ["date", raw_column])
        rows_read += len(table)
        warm_raw = _warm_up(table, raw_column)
        dropped["raw:warmup"] += int(warm_raw.sum())
        table = table.loc[~warm_raw]
        if target_column in table.columns:
            targets_found += 1
            reference = _numeric(path, table, target_column)
            warm_target = _warm_up(table, target_column) & ~np.isnan(reference)
            nulled["reference:warmup"] += int(warm_target.sum())
            reference[warm_target] = np.nan
        else:
            reference = np.full(len(table), np.nan)
        covariates: dict[str, np.ndarray] = {}
        for name, column in _COVARIATES.items():
            if column not in table.columns:
                continue
            values = _numeric(path, table, column)
            warm = _warm_up(table, column) & ~np.isnan(values)
            nulled[f"{name}:warmup"] += int(warm.sum())
            values[warm] = np.nan
            covariates[name] = values
        parts.append(
            tidy_frame(
                timestamp=parse_timestamps(path, table["date"], "date"),
                sensor_id=path.stem,
                raw=_numeric(path, table, raw_column),
                reference=reference,
                covariates=covariates,
            )
        )
    if targets_found == 0:
        raise DataError(
            f"none of the {len(files)} SensEURCity file(s) has the target column {target_column!r}"
        )
    frame = pd.concat(parts, ignore_index=True)
    return CoLocationData(
        frame=frame,
        feature=feature,
        period_seconds=60,
        source=f"senseurcity:{_describe(paths)}",
        target=target_column,
        attribution=SENSEURCITY_ATTRIBUTION,
        load_counts=LoadCounts(
            rows_read=rows_read,
            rows_dropped={key: count for key, count in dropped.items() if count},
            values_nulled={key: count for key, count in nulled.items() if count},
        ),
        sensor=PMS5003_ATM,  # the PMS5003's atmospheric (ATM) channel
        zone=zone,
    )


def _resolve(paths: Path | Sequence[Path]) -> list[Path]:
    if isinstance(paths, str | Path):
        path = Path(paths)
        return csv_files(path, "*.csv") if path.is_dir() else [path]
    files = [Path(item) for item in paths]
    if not files:
        raise DataError("no SensEURCity files given")
    return files


def _describe(paths: Path | Sequence[Path]) -> str:
    if isinstance(paths, str | Path):
        return str(paths)
    return ",".join(Path(item).name for item in paths)


def _warm_up(table: pd.DataFrame, column: str) -> np.ndarray:
    flags = table.get(f"{column}_flag")
    if flags is None:
        return np.zeros(len(table), dtype=bool)
    return (flags.astype("str").str.strip() == WARM_UP_FLAG).to_numpy(dtype=bool)


def _numeric(path: Path, table: pd.DataFrame, column: str) -> np.ndarray:
    values = pd.to_numeric(table[column], errors="coerce")
    bad = values.isna() & table[column].notna()
    if bad.any():
        position = int(bad.to_numpy().argmax())
        raise DataError(
            f"{path}: line {int(table.index[position]) + 2}, column {column!r}: "
            f"non-numeric value {table[column].iloc[position]!r}"
        )
    return values.to_numpy(dtype=np.float64, na_value=np.nan).copy()
