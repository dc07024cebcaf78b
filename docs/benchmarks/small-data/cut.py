"""Cut the small co-location slices the ladder figures were measured on (docs/training.md,
"With little data"), as the plain CSV a user brings: ``timestamp,sensor_id,raw,reference``
(plus ``rh,temp_c`` where the source has them). Run from the repository root:

    .venv/bin/python docs/benchmarks/small-data/cut.py ../shared/data /tmp/small-data
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

SLICES = {
    # the user: three nodes, two weeks of hourly co-location
    "antwerp-3x2w": ("antwerp-hourly", "pms5003_pm25_atm", "ref_pm25",
                     ("4047D7", "4065EA", "4067BD"), "2020-11-01", "2020-11-15"),
    # another user: four units, hourly, six weeks
    "antwerp-4x6w": ("antwerp-hourly", "pms5003_pm25_atm", "ref_pm25",
                     ("4049A6", "40642B", "4065EA", "4067BD"), "2020-10-15", "2020-11-26"),
    # three units with humidity and temperature, three days at one minute
    "ispra-3x3d": ("ispra-1min", "pms5003_pm10_atm", "ref_pm10",
                   ("40642E", "4065E0", "4065ED"), "2020-01-19", "2020-01-22"),
}  # fmt: skip
COLUMNS = ("timestamp", "sensor_id", "raw", "reference", "rh", "temp_c")


def cut(data: Path, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (folder, raw, reference, boxes, start, end) in SLICES.items():
        prefix = "Antwerp" if folder.startswith("antwerp") else "Ispra"
        parts = []
        for box in boxes:
            table = pd.read_csv(data / folder / f"{prefix}_{box}.csv", dtype={"sensor_id": str})
            time = pd.to_datetime(table["time_utc"], utc=True)
            within = (time >= pd.Timestamp(start, tz="UTC")) & (time < pd.Timestamp(end, tz="UTC"))
            kept = table[within]
            columns = {"time_utc": "timestamp", raw: "raw", reference: "reference",
                       "ref_rh": "rh", "ref_temp_c": "temp_c"}  # fmt: skip
            frame = kept.rename(columns=columns)
            frame["sensor_id"] = box
            parts.append(frame[[c for c in COLUMNS if c in frame]])
        path = out / f"{name}.csv"
        pd.concat(parts).to_csv(path, index=False)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in cut(Path(sys.argv[1]), Path(sys.argv[2])):
        print(path)
