"""A run whose loss becomes NaN is a failed run: never scored as RMSE 0, never exported or ranked.

Found in the paper-protocol run: iTransformer at Adam 1e-3, seed 1, diverged in its first epoch,
and its cell was stored as test RMSE 0.00 over n = 0 windows (the best in the table).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tesla_gateway.contract import manifest as manifest_schema
from tesla_gateway.contract.manifest import ErrorMetrics
from training.bench.grid import BenchConfig, DatasetSpec, SweepConfig
from training.bench.runner import run_bench
from training.errors import DivergedTrainingError, HarmfulModelError
from training.harm import check_not_harmful
from training.models import LinearConfig
from training.train import TrainConfig, train

pytestmark = pytest.mark.slow

DATA: dict[str, int | float | str] = {"n_sensors": 4, "days": 1, "seed": 5}
EXPLODING = 1e20  # Adam moves every weight by about the learning rate per step: inf, then NaN


def test_a_diverged_training_run_raises_and_says_what_to_change(tmp_path: Path) -> None:
    config = TrainConfig(
        dataset="synthetic", dataset_options=DATA, window_length=32, max_interpolated_periods=10,
        model=LinearConfig(), epochs=3, batch_size=64, learning_rate=EXPLODING,
    )  # fmt: skip
    with pytest.raises(DivergedTrainingError, match=r"epoch 1.*Lower the learning rate"):
        train(config, tmp_path / "run", verbose=0)
    assert not (tmp_path / "run" / "model.keras").exists()  # nothing to export by mistake


def test_the_guard_refuses_a_model_without_finite_values_even_when_forced() -> None:
    def scores(model_n: int, model_rmse: float) -> manifest_schema.TestMetrics:
        return manifest_schema.TestMetrics(
            raw=ErrorMetrics(rmse=15.0, mae=12.0, n=100),
            linear=ErrorMetrics(rmse=4.0, mae=3.0, n=100),
            model=ErrorMetrics(rmse=model_rmse, mae=model_rmse, n=model_n),
        )

    for forced in (False, True):
        with pytest.raises(HarmfulModelError, match=r"no finite value.*100 of 100 windows"):
            check_not_harmful(scores(0, 0.0), "v1", force=forced)
        with pytest.raises(HarmfulModelError, match=r"3 of 100 windows"):
            check_not_harmful(scores(97, 2.0), "v1", force=forced)
    check_not_harmful(scores(100, 2.0), "v1", force=False)


def test_the_bench_records_a_diverged_cell_and_reports_it_apart(tmp_path: Path) -> None:
    config = BenchConfig(
        datasets=(DatasetSpec(dataset="synthetic", options=DATA, max_interpolated_periods=10),),
        models=("linear",), ablations=False, covariates=False, epa=False, window_length=32,
        sweep=SweepConfig(enabled=False), epochs=1, max_train_windows=256,
        learning_rate=EXPLODING, case_study_models=(),
    )  # fmt: skip
    summary = run_bench(config, tmp_path, work_dir=tmp_path / "work", progress=False)
    cell = json.loads((tmp_path / "cells" / "synthetic__N32__linear__seed0.json").read_text())
    assert cell["status"] == "diverged" and cell["test"] is None
    assert "training diverged" in cell["reason"]
    assert cell["seconds"]["train"] > 0  # what the diverged run cost is kept
    assert summary.diverged == ["synthetic N=32 linear seed 0"] and not summary.skipped
    assert "synthetic N=32 linear seed 0" not in summary.computed
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "Runs that diverged" in report and "`linear` N = 32 (synthetic), seed 0" in report
    assert "| linear | 0.00" not in report
    again = run_bench(config, tmp_path, work_dir=tmp_path / "work", progress=False)
    assert again.diverged == ["synthetic N=32 linear seed 0"] and not again.computed  # stored


def test_a_cell_stored_as_done_over_no_window_is_computed_again(tmp_path: Path) -> None:
    """Cells written before the check (test RMSE 0.00, n = 0) are not reused as results."""
    from training.bench.cells import CellResult, CellStore
    from training.bench.grid import Cell

    cell = Cell(dataset="d", model="itransformer", window_length=360, seed=1)
    store = CellStore(tmp_path)
    common: dict[str, Any] = {
        "dataset": "d", "region": "r", "feature": "pm2_5", "model": "itransformer",
        "group": "paper", "window_length": 360, "seed": 1, "fingerprint": "f",
    }  # fmt: skip
    store.save(cell, CellResult(status="done", test=ErrorMetrics(rmse=0, mae=0, n=0), **common))
    assert store.load(cell, "f") is None
    store.save(cell, CellResult(status="done", test=ErrorMetrics(rmse=2, mae=1, n=9), **common))
    loaded = store.load(cell, "f")
    assert loaded is not None and loaded.test is not None and loaded.test.n == 9
