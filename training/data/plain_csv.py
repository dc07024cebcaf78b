"""Loader for users' own co-location data in one plain CSV.

Header ``timestamp,sensor_id,raw,reference`` plus optional ``rh`` and ``temp_c``, in any order
(names compared without surrounding spaces or case). Timestamps are ISO-8601 (a naive one is
UTC) or Unix epoch seconds. Besides commas, the file may be separated by semicolons or tabs, as
spreadsheets write CSV in locales whose decimal mark is a comma: the separator is the one the
header line uses, and with ``;`` or a tab a decimal comma (``12,5``) is read as ``12.5``.
Problems are reported with the file, line and column so a user can fix the file instead of
guessing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd

from tesla_gateway.contract.readings import COVARIATES, SENSOR_ID_PATTERN, Feature
from training.data._files import parse_timestamps, read_csv
from training.data.frame import (
    REQUIRED_COLUMNS,
    CoLocationData,
    LoadCounts,
    tidy_frame,
    unix_seconds,
)
from training.errors import DataError

__all__ = [
    "PLAIN_CSV_ATTRIBUTION",
    "infer_period_seconds",
    "load_plain_csv",
    "numeric_column",
    "tidy_plain_table",
]

PLAIN_CSV_ATTRIBUTION = "user-supplied co-location data"


def load_plain_csv(
    path: Path,
    *,
    feature: Feature = "pm2_5",
    period_seconds: int | None = None,
    zone: str = "UTC",
) -> CoLocationData:
    """Read a plain co-location CSV; the period is the median spacing unless given.

    ``zone``: the site's IANA zone (e.g. ``Europe/Rome``). A CSV does not say where it was
    recorded; the default UTC places a model's hour channels wrong by the site's offset.
    """
    path = Path(path)
    separator = header_separator(path)
    table = read_csv(path, dtype="str", sep=separator)  # every cell as text: ids keep "007"
    table.columns = [str(name).strip().lower() for name in table.columns]
    frame = tidy_plain_table(path, table, decimal_comma=separator != ",")
    if frame.empty:
        raise DataError(f"{path}: no data rows after the header")
    period = period_seconds if period_seconds is not None else infer_period_seconds(frame, path)
    return CoLocationData(
        frame=frame,
        feature=feature,
        period_seconds=period,
        source=f"csv:{path}",
        target="reference",
        attribution=PLAIN_CSV_ATTRIBUTION,
        load_counts=LoadCounts(rows_read=len(table)),
        zone=zone,
    )


def header_separator(path: Path) -> str:
    """``,``, ``;`` or a tab: whichever the header line holds most of (``,`` if none)."""
    try:
        with path.open(encoding="utf-8-sig", errors="replace") as handle:
            header = handle.readline()
    except FileNotFoundError as error:
        raise DataError(f"{path}: file not found") from error
    except OSError as error:
        raise DataError(f"{path}: cannot read: {error}") from error
    counts = {separator: header.count(separator) for separator in (",", ";", "\t")}
    best = max(counts, key=lambda separator: counts[separator])
    return best if counts[best] > 0 else ","


def tidy_plain_table(
    path: Path, table: pd.DataFrame, *, decimal_comma: bool = False
) -> pd.DataFrame:
    """The tidy frame of a table read as text with the plain CSV columns (``path`` names errors).

    Row ``k`` of ``table`` is reported as line ``k + 2`` of ``path`` (line 1 is the header).
    """
    _check_header(path, list(table.columns))
    covariates: dict[str, npt.NDArray[np.float64]] = {
        name: numeric_column(path, table, name, decimal_comma=decimal_comma)
        for name in COVARIATES
        if name in table.columns
    }
    sensor_ids = table["sensor_id"].astype("str").str.strip()
    bad_ids = ~sensor_ids.str.fullmatch(SENSOR_ID_PATTERN.pattern).fillna(value=False)
    if bad_ids.any():
        position = int(bad_ids.to_numpy().argmax())
        raise DataError(
            f"{path}: line {position + 2}, column 'sensor_id': "
            f"{table['sensor_id'].iloc[position]!r} is not a valid sensor id"
            f" (must match {SENSOR_ID_PATTERN.pattern})"
        )
    return tidy_frame(
        timestamp=parse_timestamps(path, table["timestamp"], "timestamp"),
        sensor_id=sensor_ids,
        raw=numeric_column(path, table, "raw", decimal_comma=decimal_comma),
        reference=numeric_column(path, table, "reference", decimal_comma=decimal_comma),
        covariates=covariates,
    )


def infer_period_seconds(frame: pd.DataFrame, path: Path | str = "<frame>") -> int:
    """Median spacing between a sensor's consecutive distinct timestamps, in whole seconds."""
    spacings: list[np.ndarray] = []
    for _, group in frame.groupby("sensor_id", sort=False):
        seconds = np.unique(unix_seconds(group["timestamp"]))
        spacings.append(np.diff(seconds))
    steps = np.concatenate(spacings) if spacings else np.empty(0)
    if steps.size == 0:
        raise DataError(
            f"{path}: cannot infer the period from fewer than two timestamps per sensor; "
            "pass period_seconds"
        )
    period = round(float(np.median(steps)))
    if period < 1:
        raise DataError(f"{path}: median spacing is below one second; pass period_seconds")
    return period


def _check_header(path: Path, columns: list[str]) -> None:
    allowed = (*REQUIRED_COLUMNS, *COVARIATES)
    expected = ",".join(REQUIRED_COLUMNS) + "[,rh][,temp_c]"
    duplicated = sorted({name for name in columns if columns.count(name) > 1})
    # pandas renames a repeated "raw" to "raw.1"; catch that too.
    renamed = [
        name for name in columns if name.rsplit(".", 1)[0] in allowed and name not in allowed
    ]
    if duplicated or renamed:
        raise DataError(f"{path}: line 1 (header): repeated column(s) {duplicated or renamed}")
    unknown = [name for name in columns if name not in allowed]
    if unknown:
        raise DataError(
            f"{path}: line 1 (header): unknown column(s) {unknown}; expected {expected}"
        )
    missing = [name for name in REQUIRED_COLUMNS if name not in columns]
    if missing:
        raise DataError(
            f"{path}: line 1 (header): missing column(s) {missing}; expected {expected}"
        )


def numeric_column(
    path: Path, table: pd.DataFrame, column: str, *, decimal_comma: bool = False
) -> npt.NDArray[np.float64]:
    text = table[column].astype("str").str.strip()
    if decimal_comma:
        text = text.str.replace(",", ".", regex=False)
    blank = table[column].isna() | (text == "")
    values = pd.to_numeric(text.where(~blank), errors="coerce")
    bad = values.isna() & ~blank
    if bad.any():
        position = int(bad.to_numpy().argmax())
        raise DataError(
            f"{path}: line {position + 2}, column {column!r}: not a number: "
            f"{table[column].iloc[position]!r}"
        )
    return np.asarray(values.to_numpy(dtype=np.float64, na_value=np.nan), dtype=np.float64)
