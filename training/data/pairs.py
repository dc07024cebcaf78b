"""Loader for the raw/reference pairs a gateway records beside a reference station.

Layout (written by ``tesla_gateway.monitor.pairs``)::

    <state_dir>/pairs/<feature>/pairs-YYYYMMDD.csv       first file of a UTC day
    <state_dir>/pairs/<feature>/pairs-YYYYMMDD-<n>.csv   further files of that day (size rotation)

Header ``timestamp,sensor_id,raw,reference,calibrated,model_version,rh,temp_c,quality``; one row
per (sensor, period): the period start (ISO-8601 UTC), the period means of the raw readings and
the reference, the calibration the gateway published (empty when the window was not valid) with
the version of the model that made it, the covariates (empty when the sensor sent none) and the
published quality values joined by ``;``. Files written before ``quality`` existed lack it.

A row the gateway published as ``stuck`` (a frozen sensor) is dropped here, and so is the rest of
its run: the same sensor's adjacent rows, in time order, of the same raw value (above all the
run's first periods, published before the gateway could know). The reference's cadence decides
how many rows a run leaves (one per reference reading), so training's own run rule alone
(``raw:stuck`` in cleaning, which still applies) can miss a run the gateway saw. Counted as
``raw:stuck`` too.

The plain CSV loader parses and validates the shared columns; this module only finds the files,
skips a torn last line a crashed writer may leave (counted, never fatal) and keeps the recorded
calibrations beside the tidy frame so a retraining report can quote what the gateway published.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import numpy.typing as npt
import pandas as pd

from tesla_gateway.contract.calibrated import Quality
from tesla_gateway.contract.readings import COVARIATES, Feature
from tesla_gateway.contract.stuck import run_ids
from tesla_gateway.monitor.pairs import QUALITY_SEPARATOR, pairs_file_part
from training.data._files import parse_timestamps, read_csv
from training.data.frame import (
    FEATURES,
    REQUIRED_COLUMNS,
    TIMESTAMP_DTYPE,
    CoLocationData,
    LoadCounts,
    tidy_frame,
)
from training.data.plain_csv import infer_period_seconds, numeric_column, tidy_plain_table
from training.errors import DataError, FeatureMismatchError, NoPairsError

__all__ = [
    "PAIRS_ATTRIBUTION",
    "PAIRS_COLUMNS",
    "STUCK_FLAGGED",
    "TRUNCATED_LINE",
    "RecordedPairs",
    "load_pairs",
    "pairs_files",
    "read_pairs",
]

PAIRS_ATTRIBUTION = "raw/reference pairs recorded by a tesla-gateway"
PAIRS_COLUMNS: tuple[str, ...] = (
    *REQUIRED_COLUMNS,
    "calibrated",
    "model_version",
    *COVARIATES,
    "quality",
)
RECORDED_COLUMNS: tuple[str, ...] = ("calibrated", "model_version")
NOT_DATA_COLUMNS: tuple[str, ...] = (*RECORDED_COLUMNS, "quality")
TRUNCATED_LINE = "pairs:truncated_line"
# The key cleaning's own run rule counts under, so the report shows one figure per reason.
STUCK_FLAGGED = "raw:stuck"
_FEATURE_BY_NAME: Mapping[str, Feature] = MappingProxyType({name: name for name in FEATURES})


@dataclass(frozen=True, eq=False)
class RecordedPairs:
    """The pairs as co-location data, plus what the gateway published for each row.

    ``recorded`` has one row per data row: ``timestamp`` (UTC), ``sensor_id``, ``reference``,
    ``calibrated`` and ``model_version`` (NaN where empty), in file order.
    """

    data: CoLocationData
    directory: Path
    files: tuple[Path, ...]
    truncated_lines: Mapping[str, int]  # file name -> torn last lines skipped (0 or 1)
    recorded: pd.DataFrame

    @property
    def rows(self) -> int:
        return len(self.data.frame)

    def summary(self) -> dict[str, object]:
        """What was read, for reports (JSON-serialisable)."""
        frame = self.data.frame
        versions = self.recorded["model_version"].dropna().astype(np.int64)
        return {
            "directory": str(self.directory),
            "feature": self.data.feature,
            "period_seconds": self.data.period_seconds,
            "files": [path.name for path in self.files],
            "rows": self.rows,
            "truncated_lines_skipped": int(sum(self.truncated_lines.values())),
            "sensors": list(self.data.sensor_ids),
            "first": _iso(frame["timestamp"].min()) if self.rows else None,
            "last": _iso(frame["timestamp"].max()) if self.rows else None,
            "model_versions": {
                str(version): int(count)
                for version, count in versions.value_counts().sort_index().items()
            },
        }


def pairs_files(directory: Path) -> list[Path]:
    """The directory's pairs files in write order: by day, then by rotation part."""
    found: list[tuple[str, int, Path]] = []
    for path in directory.iterdir():
        day_part = pairs_file_part(path.name)
        if day_part is not None and path.is_file():
            found.append((*day_part, path))
    return [path for _, _, path in sorted(found)]


def read_pairs(
    path: Path, *, feature: Feature | None = None, period_seconds: int | None = None
) -> RecordedPairs:
    """Read a feature's pairs directory (or the ``pairs`` directory above it, given ``feature``).

    The feature is the directory's name unless given; a given feature that differs from the
    directory's name is a :class:`FeatureMismatchError`. The period is the median spacing of a
    sensor's rows unless given.
    """
    directory = _feature_directory(Path(path), feature)
    named = _FEATURE_BY_NAME.get(directory.name)
    if feature is not None and named is not None and feature != named:
        raise FeatureMismatchError(
            f"{directory} holds {named} pairs, not {feature}: pass the {feature} directory"
        )
    resolved = feature or named
    if resolved is None:
        raise DataError(
            f"cannot tell the feature of {directory} from its name; pass feature= one of "
            f"{', '.join(FEATURES)}"
        )
    files = pairs_files(directory)
    if not files:
        raise NoPairsError(
            f"no pairs-YYYYMMDD.csv files in {directory}: has the gateway a reference stream "
            "configured, and has it recorded any period yet?"
        )
    frames: list[pd.DataFrame] = []
    recorded: list[pd.DataFrame] = []
    flagged: list[pd.DataFrame] = []
    truncated: dict[str, int] = {}
    rows_read = 0
    for file in files:
        complete_rows, torn = _complete_rows(file)
        truncated[file.name] = torn
        rows_read += torn
        if complete_rows is not None and complete_rows < 0:
            continue  # not even a complete header: the writer died creating the file
        table = read_csv(file, dtype=dict.fromkeys(PAIRS_COLUMNS, "str"), nrows=complete_rows)
        _check_header(file, list(table.columns))
        rows_read += len(table)
        if table.empty:
            continue
        frames.append(
            tidy_plain_table(
                file, table.drop(columns=[c for c in NOT_DATA_COLUMNS if c in table.columns])
            )
        )
        if "quality" in table.columns:
            flagged.append(_stuck_keys(file, table))
        recorded.append(
            pd.DataFrame(
                {
                    "timestamp": parse_timestamps(file, table["timestamp"], "timestamp"),
                    "sensor_id": table["sensor_id"].astype("str").str.strip(),
                    "reference": numeric_column(file, table, "reference"),
                    "calibrated": numeric_column(file, table, "calibrated"),
                    "model_version": numeric_column(file, table, "model_version"),
                }
            )
        )
    if not frames:
        raise NoPairsError(
            f"the pairs files in {directory} hold no complete row yet "
            f"({len(files)} file(s), {sum(truncated.values())} torn line(s) skipped)"
        )
    combined = pd.concat(frames, ignore_index=True)
    # Re-tidy the concatenation: one sort by sensor and time over every file.
    frame = tidy_frame(
        timestamp=combined["timestamp"],
        sensor_id=combined["sensor_id"],
        raw=combined["raw"],
        reference=combined["reference"],
        # A covariate no sensor ever sent is absent, not a column of NaN.
        covariates={
            name: combined[name]
            for name in COVARIATES
            if name in combined.columns and combined[name].notna().any()
        },
    )
    period = (
        period_seconds if period_seconds is not None else infer_period_seconds(frame, directory)
    )
    frozen = _flagged_runs(frame, pd.concat(flagged, ignore_index=True) if flagged else None)
    frame = frame.loc[~frozen].reset_index(drop=True)
    torn_total = sum(truncated.values())
    dropped = {TRUNCATED_LINE: torn_total, STUCK_FLAGGED: int(frozen.sum())}
    data = CoLocationData(
        frame=frame,
        feature=resolved,
        period_seconds=period,
        source=f"pairs:{directory}",
        target="reference",
        attribution=PAIRS_ATTRIBUTION,
        load_counts=LoadCounts(
            rows_read=rows_read,
            rows_dropped=MappingProxyType({k: n for k, n in dropped.items() if n}),
        ),
    )
    return RecordedPairs(
        data=data,
        directory=directory,
        files=tuple(files),
        truncated_lines=MappingProxyType(truncated),
        recorded=pd.concat(recorded, ignore_index=True),
    )


def load_pairs(
    path: Path,
    *,
    feature: Feature | None = None,
    period_seconds: int | None = None,
    zone: str = "UTC",
) -> CoLocationData:
    """The recorded pairs as co-location data (the ``pairs`` dataset of the registry).

    ``zone``: the site's IANA zone; the pairs do not record it, and the default UTC places a
    model's hour channels wrong by the site's offset.
    """
    data = read_pairs(path, feature=feature, period_seconds=period_seconds).data
    return dataclasses.replace(data, zone=zone)


def _feature_directory(path: Path, feature: Feature | None) -> Path:
    if not path.is_dir():
        raise NoPairsError(
            f"pairs directory {path} does not exist: point at <state_dir>/pairs/<feature> of a "
            "gateway that records reference pairs"
        )
    if feature is not None and path.name != feature and (path / feature).is_dir():
        return path / feature
    return path


def _complete_rows(path: Path) -> tuple[int | None, int]:
    """(data rows to read or None for all, torn lines skipped); rows -1: no complete header.

    Every row ends with a newline, so bytes after the last newline are a row the writer did not
    finish. Only then are the complete lines counted.
    """
    with path.open("rb") as handle:
        size = handle.seek(0, 2)
        if size == 0:
            return -1, 0
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return None, 0
        handle.seek(0)
        newlines = sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 16), b""))
    return newlines - 1, 1


def _stuck_keys(path: Path, table: pd.DataFrame) -> pd.DataFrame:
    """(timestamp, sensor_id) of a file's rows published with quality ``stuck``."""
    separator = re.escape(QUALITY_SEPARATOR)
    one_of = rf"(?:^|{separator})\s*{Quality.STUCK.value}\s*(?:{separator}|$)"
    stuck = table["quality"].fillna("").astype("str").str.contains(one_of, regex=True)
    rows = table.loc[stuck.to_numpy(dtype=np.bool_)]
    return pd.DataFrame(
        {
            "timestamp": parse_timestamps(path, rows["timestamp"], "timestamp").astype(
                TIMESTAMP_DTYPE
            ),
            "sensor_id": rows["sensor_id"].astype("str").str.strip(),
        }
    )


def _flagged_runs(frame: pd.DataFrame, stuck: pd.DataFrame | None) -> npt.NDArray[np.bool_]:
    """Mask of the tidy frame's rows in a run (per sensor, in time order, of one raw value; the
    rule of ``tesla_gateway.contract.stuck``) that holds a row the gateway published as stuck."""
    mask = np.zeros(len(frame), dtype=np.bool_)
    if stuck is None or stuck.empty:
        return mask
    keys = pd.MultiIndex.from_frame(frame[["sensor_id", "timestamp"]])
    flagged = keys.isin(pd.MultiIndex.from_frame(stuck[["sensor_id", "timestamp"]]))
    sensors = frame["sensor_id"].to_numpy()
    # The tidy frame is sorted by sensor, then time: a run is a stretch of one sensor's rows
    # whose raw value repeats; it restarts where the value (or the sensor) changes.
    new_sensor = np.r_[True, sensors[1:] != sensors[:-1]]
    run = run_ids(frame["raw"].to_numpy(dtype=np.float64), starts=new_sensor)
    hit = np.unique(run[flagged])
    mask[np.isin(run, hit)] = True
    return mask


def _check_header(path: Path, columns: list[str]) -> None:
    unknown = [name for name in columns if name not in PAIRS_COLUMNS]
    missing = [name for name in (*REQUIRED_COLUMNS, *RECORDED_COLUMNS) if name not in columns]
    if unknown or missing:
        raise DataError(
            f"{path}: line 1 (header): not a pairs file (unknown {unknown}, missing {missing}); "
            f"expected {','.join(PAIRS_COLUMNS)}"
        )


def _iso(timestamp: pd.Timestamp) -> str:
    return timestamp.strftime("%Y-%m-%dT%H:%M:%SZ")
