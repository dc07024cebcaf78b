"""Reading source CSV files: listing a directory and turning pandas failures into DataError."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd

from training.errors import DataError

__all__ = ["csv_files", "parse_timestamps", "read_csv", "require_columns"]


def csv_files(directory: Path, pattern: str) -> list[Path]:
    """The matching CSV files of a source directory, sorted; an error if there are none."""
    if not directory.is_dir():
        raise DataError(f"data directory {directory} does not exist or is not a directory")
    files = sorted(directory.glob(pattern))
    if not files:
        raise DataError(f"no files matching {pattern!r} in {directory}")
    return files


def read_csv(
    path: Path,
    *,
    usecols: Sequence[str] | Callable[[str], bool] | None = None,
    dtype: Mapping[str, str] | str | None = None,
    nrows: int | None = None,
    sep: str = ",",
) -> pd.DataFrame:
    """``pandas.read_csv`` with errors that name the file; ``nrows`` reads only the first rows."""
    try:
        return pd.read_csv(path, usecols=usecols, dtype=dtype, nrows=nrows, sep=sep)  # type: ignore[arg-type]
    except FileNotFoundError as error:
        raise DataError(f"{path}: file not found") from error
    except ValueError as error:  # includes pandas' ParserError and bad usecols/dtype
        raise DataError(f"{path}: cannot read as CSV: {error}") from error


def require_columns(path: Path, frame: pd.DataFrame, columns: Sequence[str]) -> None:
    """Fail with the file's name and the missing column names."""
    missing = [name for name in columns if name not in frame.columns]
    if missing:
        raise DataError(
            f"{path}: line 1 (header): missing column(s) {missing}; found {list(frame.columns)}"
        )


def parse_timestamps(path: Path, values: pd.Series, column: str) -> pd.Series:
    """ISO-8601 (naive = UTC) or Unix epoch seconds to UTC datetimes; errors name line and column.

    Epoch seconds are used only when every cell is a number, so one file never mixes the two.
    """
    text = values.astype("str").str.strip()
    blank = values.isna() | (text == "")
    if blank.any():
        _fail(path, values, blank, column, "empty timestamp")
    numbers = pd.to_numeric(text, errors="coerce")
    if numbers.notna().all():
        return pd.Series(pd.to_datetime(numbers, unit="s", utc=True), index=values.index)
    parsed = pd.to_datetime(text, utc=True, format="ISO8601", errors="coerce")
    bad = parsed.isna()
    if bad.any():
        _fail(
            path, values, bad, column, "cannot parse timestamp (expected ISO-8601 or epoch seconds)"
        )
    return pd.Series(parsed, index=values.index)


def _fail(path: Path, values: pd.Series, bad: pd.Series, column: str, problem: str) -> None:
    position = int(bad.to_numpy().argmax())
    line = int(values.index[position]) + 2  # the index is the data row; line 1 is the header
    raise DataError(
        f"{path}: line {line}, column {column!r}: {problem}: {values.iloc[position]!r}"
        f" ({int(bad.sum())} such row(s) in the file)"
    )
