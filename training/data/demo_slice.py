"""Cut the demo slice the product ships (``data/demo/``) from the Ispra co-location data.

The gateway demo replays real readings, so it needs a small, gap-poor stretch of real data in
the plain CSV format. This script makes that slice reproducible:
``python -m training.data.demo_slice [--data-dir DIR] [--output FILE]``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from tesla_gateway.contract.readings import COVARIATES
from training.data.cleaning import clean
from training.data.frame import unix_seconds
from training.data.ispra import load_ispra
from training.data.registry import default_data_dir

__all__ = ["DEMO_HOURS", "DEMO_SENSORS", "cut_demo_slice", "main", "write_demo_slice"]

DEMO_SENSORS: tuple[str, ...] = ("4065D0", "4065E0", "4065ED")
DEMO_HOURS = 30
DEFAULT_OUTPUT = Path(__file__).resolve().parents[2] / "data" / "demo" / "ispra_pm10_demo.csv"
_COLUMNS = ["timestamp", "sensor_id", "raw", "reference", *COVARIATES]


def cut_demo_slice(
    ispra_dir: Path, *, sensors: Sequence[str] = DEMO_SENSORS, hours: int = DEMO_HOURS
) -> pd.DataFrame:
    """The ``hours``-long stretch, starting on a full hour, where the sensor with the fewest
    complete rows (raw, reference, RH and temperature all valid after cleaning) has the most;
    the earliest such stretch wins ties. Values are rounded to 2 decimals."""
    data, _ = clean(load_ispra(ispra_dir, target="station"))
    frame = data.frame[data.frame["sensor_id"].isin(list(sensors))]
    complete = frame.dropna(subset=["raw", "reference", *COVARIATES])
    minutes = (unix_seconds(complete["timestamp"]) // 60).astype(np.int64)
    first, last = int(minutes.min()), int(minutes.max())
    span = last - first + 1
    window = hours * 60
    # Per sensor: cumulative count of complete minutes, to score every start in O(1).
    scores = np.full(max(span - window + 1, 0), np.iinfo(np.int64).max, dtype=np.int64)
    sensor_column = complete["sensor_id"].to_numpy(dtype=str)
    for sensor in sensors:
        present = np.zeros(span, dtype=np.int64)
        present[minutes[sensor_column == sensor] - first] = 1
        before = np.concatenate(([0], np.cumsum(present)))
        scores = np.minimum(scores, before[window:] - before[:-window])
    starts = np.flatnonzero((np.arange(scores.size) + first) % 60 == 0)
    best = int(starts[np.argmax(scores[starts])]) + first
    begin = pd.Timestamp(best * 60, unit="s", tz="UTC")
    end = begin + pd.Timedelta(hours=hours)
    stretch = frame[(frame["timestamp"] >= begin) & (frame["timestamp"] < end)]
    stretch = stretch.sort_values(["sensor_id", "timestamp"]).reset_index(drop=True)
    return stretch[_COLUMNS].round(dict.fromkeys(("raw", "reference", *COVARIATES), 2))


def write_demo_slice(ispra_dir: Path, output: Path = DEFAULT_OUTPUT) -> Path:
    """Write the slice as plain CSV (ISO-8601 UTC timestamps) and return its path."""
    stretch = cut_demo_slice(ispra_dir)
    text = stretch.assign(timestamp=stretch["timestamp"].dt.strftime("%Y-%m-%dT%H:%M:%SZ"))
    output.parent.mkdir(parents=True, exist_ok=True)
    text.to_csv(output, index=False, lineterminator="\n")
    return output


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; prints where the slice went and its size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="folder holding ispra-1min/ (default: $TESLA_DATA_DIR or ../shared/data)",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="CSV to write")
    arguments = parser.parse_args(argv)
    data_dir = arguments.data_dir or default_data_dir()
    path = write_demo_slice(data_dir / "ispra-1min", arguments.output)
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
