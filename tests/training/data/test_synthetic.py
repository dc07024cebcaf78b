"""The synthetic generator: reproducible, and physically plausible where models will notice."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from training.data import clean, generate_synthetic, to_grid
from training.data.synthetic import growth_factor
from training.errors import DataError


def test_same_seed_same_data_other_seed_other_data() -> None:
    first = generate_synthetic(n_sensors=3, days=1, seed=5)
    again = generate_synthetic(n_sensors=3, days=1, seed=5)
    other = generate_synthetic(n_sensors=3, days=1, seed=6)
    pd.testing.assert_frame_equal(first.frame, again.frame)
    assert not first.frame["raw"].equals(other.frame["raw"])


def test_shape_and_metadata() -> None:
    data = generate_synthetic(n_sensors=4, days=2, period_seconds=120, seed=0, feature="pm10")
    assert data.sensor_ids == ("SYN000", "SYN001", "SYN002", "SYN003")
    assert (data.feature, data.period_seconds) == ("pm10", 120)
    assert data.covariates == ("rh", "temp_c")
    assert "not a measurement" in data.attribution
    per_sensor = data.frame.groupby("sensor_id").size()
    assert (per_sensor <= 2 * 86_400 // 120).all()
    # Everything the generator writes passes the gateway's validity rules.
    _, report = clean(data)
    assert report.rows_dropped == {}
    assert report.values_nulled == {}


def test_dropouts_include_gaps_longer_than_an_hour() -> None:
    data = generate_synthetic(n_sensors=4, days=3, seed=0)
    longest = []
    for grid in to_grid(data).values():
        missing = np.concatenate(([0], (~grid.observed).astype(np.int8), [0]))
        edges = np.flatnonzero(np.diff(missing))
        lengths = edges[1::2] - edges[::2]
        assert lengths.size > 3
        assert lengths.min() <= 10
        longest.append(lengths.max())
    assert max(longest) > 60


def test_humidity_raises_the_raw_to_reference_ratio() -> None:
    data = generate_synthetic(n_sensors=4, days=4, seed=1)
    frame = data.frame.dropna(subset=["reference"])
    frame = frame[frame["reference"] > 5]
    ratio = frame["raw"] / frame["reference"]
    dry = ratio[frame["rh"] < 60].median()
    humid = ratio[frame["rh"] > 85].median()
    assert humid > 1.3 * dry
    # RH and temperature follow opposite diurnal cycles.
    assert np.corrcoef(frame["rh"], frame["temp_c"])[0, 1] < -0.5


def test_units_differ_and_reference_tracks_truth() -> None:
    data = generate_synthetic(n_sensors=4, days=2, seed=2)
    frame = data.frame.dropna(subset=["reference"])
    ratio = frame["raw"] / frame["reference"].clip(lower=1)
    gains = ratio.groupby(frame["sensor_id"]).median()
    assert gains.max() / gains.min() > 1.05
    # Every unit sees the same air: references of co-located units agree at the same minute.
    wide = frame.pivot_table(index="timestamp", columns="sensor_id", values="reference")
    assert wide.dropna().std(axis=1).max() == pytest.approx(0.0)


def test_growth_factor_law_and_saturation() -> None:
    rh = np.array([0.0, 50.0, 80.0, 90.0, 100.0])
    growth = growth_factor(rh, kappa=0.2)
    assert growth[0] == 1.0
    assert growth[1] == pytest.approx(1.2)  # 1 + 0.2 * 0.5 / 0.5
    assert np.all(np.diff(growth) > 0)
    assert np.isfinite(growth[-1])
    dense = generate_synthetic(n_sensors=1, days=1, seed=0, base_level=2000.0, saturation=1000.0)
    assert dense.frame["raw"].max() < 1000.0 * 1.3  # tanh ceiling plus noise


def test_rejects_impossible_requests() -> None:
    with pytest.raises(DataError):
        generate_synthetic(n_sensors=0)
    with pytest.raises(DataError):
        generate_synthetic(days=0.0001, period_seconds=3600)
