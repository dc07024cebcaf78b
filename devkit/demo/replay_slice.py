"""The bundled co-location slice (data/demo/): raw input and reference, per sensor and minute."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from devkit.demo import DemoError

__all__ = ["DemoSlice", "SliceRow", "default_slice_path", "load_slice"]

_COLUMNS = ("timestamp", "sensor_id", "raw", "reference", "rh", "temp_c")


@dataclass(frozen=True, slots=True)
class SliceRow:
    """One minute of one sensor: what the node measures, and what the station measured."""

    timestamp: float  # Unix seconds, start of the minute
    raw: float
    reference: float  # NaN when the station had no valid value
    rh: float
    temp_c: float


@dataclass(frozen=True, slots=True)
class DemoSlice:
    """Rows per sensor, oldest first; the reference is kept by the demo, never sent."""

    rows: dict[str, list[SliceRow]]

    @property
    def sensor_ids(self) -> list[str]:
        return sorted(self.rows)

    @property
    def start(self) -> float:
        return min(rows[0].timestamp for rows in self.rows.values())

    @property
    def end(self) -> float:
        return max(rows[-1].timestamp for rows in self.rows.values())

    def reference(self, sensor_id: str) -> dict[float, float]:
        return {row.timestamp: row.reference for row in self.rows[sensor_id]}


def default_slice_path() -> Path:
    """``data/demo/ispra_pm10_demo.csv`` of the source tree the package runs from."""
    return Path(__file__).resolve().parents[2] / "data" / "demo" / "ispra_pm10_demo.csv"


def load_slice(path: Path) -> DemoSlice:
    """Read the plain co-location CSV (data/demo/README.md)."""
    rows: dict[str, list[SliceRow]] = {}
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in _COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise DemoError(f"{path} lacks the columns {missing}; is it the demo slice?")
            for line, record in enumerate(reader, start=2):
                try:
                    row = SliceRow(
                        timestamp=_epoch(record["timestamp"]),
                        raw=float(record["raw"]),
                        reference=_number(record["reference"]),
                        rh=_number(record["rh"]),
                        temp_c=_number(record["temp_c"]),
                    )
                except ValueError as exc:
                    raise DemoError(f"{path} line {line}: {exc}") from exc
                rows.setdefault(record["sensor_id"], []).append(row)
    except FileNotFoundError as exc:
        raise DemoError(
            f"the demo data {path} is missing; run the demo from a clone of the repository"
        ) from exc
    if not rows:
        raise DemoError(f"{path} holds no readings")
    for sensor_rows in rows.values():
        sensor_rows.sort(key=lambda row: row.timestamp)
    return DemoSlice(rows)


def _epoch(text: str) -> float:
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no time zone")
    return parsed.timestamp()


def _number(text: str) -> float:
    return float(text) if text.strip() else math.nan
