"""The shipped demo slice: small, attributed, loadable, and reproducible from the real data."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.data import load_plain_csv
from training.data.demo_slice import DEFAULT_OUTPUT, DEMO_SENSORS, main

DEMO_DIR = DEFAULT_OUTPUT.parent


def test_shipped_slice_is_small_attributed_and_loads() -> None:
    total = sum(path.stat().st_size for path in DEMO_DIR.iterdir())
    assert total < 300_000
    readme = (DEMO_DIR / "README.md").read_text(encoding="utf-8")
    assert "van Poppel et al., *Scientific Data* 10 (2023)" in readme
    assert "doi:10.5281/zenodo.7256405" in readme
    assert "ec-jrc/airsenseur-calibration" in readme
    data = load_plain_csv(DEFAULT_OUTPUT, feature="pm10")
    assert data.period_seconds == 60
    assert data.sensor_ids == tuple(sorted(DEMO_SENSORS))
    assert data.covariates == ("rh", "temp_c")
    header = DEFAULT_OUTPUT.read_text(encoding="utf-8").splitlines()[0]
    assert header == "timestamp,sensor_id,raw,reference,rh,temp_c"
    for _, rows in data.frame.groupby("sensor_id"):
        span = rows["timestamp"].max() - rows["timestamp"].min()
        assert 28 <= span.total_seconds() / 3600 <= 30
        assert len(rows) > 0.95 * 30 * 60  # few gaps
        assert (rows["raw"].round(2) == rows["raw"]).all()


@pytest.mark.realdata
def test_script_reproduces_the_shipped_slice(shared_data: Path, tmp_path: Path) -> None:
    output = tmp_path / "demo.csv"
    assert main(["--data-dir", str(shared_data), "--output", str(output)]) == 0
    assert output.read_bytes() == DEFAULT_OUTPUT.read_bytes()
