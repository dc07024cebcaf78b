"""Checks on the real co-location data (skipped where ../shared/data is absent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tesla_gateway.contract.series import GapPolicy
from training.data import CoLocationData, WindowSet, clean, load_dataset, paper_split, to_grid

pytestmark = pytest.mark.realdata


def _raw_rmse(data: CoLocationData, sensor_id: str) -> float:
    rows = data.frame[data.frame["sensor_id"] == sensor_id].dropna(subset=["reference"])
    return float(np.sqrt(np.mean((rows["raw"] - rows["reference"]) ** 2)))


def test_ispra_counts_and_readme_figure(shared_data: Path) -> None:
    raw = load_dataset("ispra-1min", shared_data / "ispra-1min")
    assert raw.sensor_ids == ("406414", "40641B", "40642E", "4065D0", "4065E0", "4065ED")
    assert len(raw.frame) == 88_377
    data, report = clean(raw)
    assert report.rows_read == 88_377
    assert dict(report.rows_dropped) == {"raw:missing": 1087}
    assert dict(report.values_nulled) == {"reference:negative": 298}
    assert report.sensors_dropped == ()
    split = paper_split(data.sensor_ids)
    assert (split.validation, split.test) == ("4065E0", "4065ED")
    assert _raw_rmse(data, split.test) == pytest.approx(33.3, abs=0.2)  # the data README's figure


def test_ispra_opcn3_spikes_lose_only_the_target(shared_data: Path) -> None:
    raw = load_dataset("ispra-1min-opcn3", shared_data / "ispra-1min")
    data, report = clean(raw)
    assert raw.frame["reference"].max() > 1000
    assert data.frame["reference"].max() <= 1000
    assert report.rows_kept == 88_377 - 1087


@pytest.mark.parametrize(
    ("name", "expected"), [("antwerp-hourly-pm2_5", 9.57), ("antwerp-hourly-pm10", 13.79)]
)
def test_antwerp_spikes_dropped_and_readme_figures(
    shared_data: Path, name: str, expected: float
) -> None:
    raw = load_dataset(name, shared_data / "antwerp-hourly")
    assert raw.frame["raw"].max() > 3000
    data, report = clean(raw)
    assert report.rows_read == 46_634
    assert report.rows_dropped["raw:out_of_range"] == 384
    # Antwerp_4043AE's 814 hours of exactly 0.0 after its saturated week (a dead unit)
    assert report.rows_dropped["raw:stuck"] == 814
    frame = raw.frame
    dead = frame[frame["sensor_id"] == "Antwerp_4043AE"].set_index("timestamp")["raw"]
    assert (dead.loc["2020-08-27 10:00":"2020-09-30 07:00"] == 0.0).sum() == 814
    assert data.frame["raw"].max() <= 1000
    test = paper_split(data.sensor_ids).test
    assert test == "Antwerp_4067BD"
    assert _raw_rmse(data, test) == pytest.approx(expected, abs=0.05)


def test_ispra_windows_per_split(shared_data: Path) -> None:
    data, _ = clean(load_dataset("ispra-1min", shared_data / "ispra-1min"))
    grids = to_grid(data)
    split = paper_split(grids)
    policy = GapPolicy(max_interpolated_periods=10)
    train = WindowSet.build([grids[s] for s in split.train], 360, policy)
    test = WindowSet.build([grids[split.test]], 360, policy)
    assert len(train) == 45_582
    assert len(test) == 15_198
    x, y = train.gather(np.arange(0, len(train), 997))
    assert x.shape == (len(y), 360)
    assert np.isfinite(x).all() and np.isfinite(y).all()
